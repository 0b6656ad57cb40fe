//! The directory grant: a host directory mapped to a guest path.
//!
//! In `airlock.toml`: `dirs = [{ host = "data", guest = "/data", mode = "ro" }]`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use wasmtime::component::Linker;
use wasmtime_wasi::FsPerms;

use super::{CallSetup, Grant, GrantError};
use crate::sandbox::CallState;

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

/// One entry of a tool's `dirs` list, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirConfig {
    /// The host directory, relative to the policy file.
    pub host: PathBuf,
    /// Where the tool sees it; an absolute guest path.
    pub guest: String,
    /// `ro` (default) or `rw`.
    #[serde(default)]
    pub mode: DirMode,
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

    /// The host directory, canonical.
    pub fn host(&self) -> &Path {
        &self.host
    }

    /// Where the tool sees the directory.
    pub fn guest(&self) -> &str {
        &self.guest
    }

    /// Read-only or read-write.
    pub fn mode(&self) -> DirMode {
        self.mode
    }
}

impl Grant for DirGrant {
    type Config = DirConfig;

    fn from_config(config: DirConfig, base: &Path) -> Result<Self, GrantError> {
        Self::new(base.join(&config.host), config.guest, config.mode)
    }

    /// `wasi:filesystem` is part of the WASI base the host links once; a
    /// call sees only the directories `prepare` preopened for it.
    fn link(_linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        Ok(())
    }

    fn prepare(&self, call: &mut CallSetup<'_>) -> Result<(), GrantError> {
        let perms = match self.mode {
            DirMode::Ro => FsPerms::ReadOnly,
            DirMode::Rw => FsPerms::ReadWrite,
        };
        call.wasi
            .preopened_dir(&self.host, &self.guest, perms)
            .map(|_| ())
            .map_err(|e| GrantError::DirUnavailable {
                path: self.host.display().to_string(),
                source: Arc::new(std::io::Error::other(e.to_string())),
            })
    }

    fn describe(&self) -> Vec<String> {
        vec![format!(
            "{} <- {} ({})",
            self.guest,
            self.host.display(),
            self.mode
        )]
    }
}
