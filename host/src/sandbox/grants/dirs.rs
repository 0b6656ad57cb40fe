//! The directory grant: a host directory mapped to a guest path.

use std::path::{Path, PathBuf};

use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::GrantError;

/// Whether a granted directory may be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DirMode {
    /// Read files and list directories only (the default).
    #[default]
    Ro,
    /// Also create, write, rename and delete inside it.
    Rw,
}

impl std::fmt::Display for DirMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DirMode::Ro => "read-only",
            DirMode::Rw => "read-write",
        })
    }
}

/// A host directory the tool sees at `guest`. Paths cannot escape it:
/// `..`, absolute paths and symlinks that lead outside are refused by the
/// capability-based filesystem under WASI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirGrant {
    host: PathBuf,
    guest: String,
    mode: DirMode,
}

impl DirGrant {
    /// Checks that `host` is an existing directory and `guest` an absolute
    /// guest path.
    pub fn new(
        host: impl AsRef<Path>,
        guest: impl Into<String>,
        mode: DirMode,
    ) -> Result<Self, GrantError> {
        let shown = host.as_ref().display().to_string();
        let err = |problem: String| GrantError::Dir {
            path: shown.clone(),
            problem,
        };
        let host = host
            .as_ref()
            .canonicalize()
            .map_err(|e| err(format!("cannot be used: {e}")))?;
        if !host.is_dir() {
            return Err(err("is not a directory".into()));
        }
        let guest = guest.into();
        if !guest.starts_with('/') {
            return Err(err(format!("guest path {guest:?} must be absolute")));
        }
        Ok(Self { host, guest, mode })
    }

    pub fn host(&self) -> &Path {
        &self.host
    }

    pub fn guest(&self) -> &str {
        &self.guest
    }

    pub fn mode(&self) -> DirMode {
        self.mode
    }

    pub(crate) fn prepare(&self, wasi: &mut WasiCtxBuilder) -> Result<(), GrantError> {
        let perms = match self.mode {
            DirMode::Ro => FsPerms::ReadOnly,
            DirMode::Rw => FsPerms::ReadWrite,
        };
        wasi.preopened_dir(&self.host, &self.guest, perms)
            .map(|_| ())
            .map_err(|e| GrantError::Dir {
                path: self.host.display().to_string(),
                problem: format!("cannot be opened: {e}"),
            })
    }
}
