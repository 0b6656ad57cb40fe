//! The directory grant: a host directory mapped to a guest path.
//!
//! In `airlock.toml`: `dirs = [{ host = "data", guest = "/data", mode = "ro" }]`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use super::{Grant, GrantError};

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
///
/// Invariant: a grant is bound to the directory that was checked when it
/// was made, not to its path. The directory is opened once, in
/// [`DirGrant::new`], and every call is given that same directory (on
/// Linux through `/proc/self/fd`, which names the open directory itself,
/// not a path to it). Renaming it, or replacing it or any directory above
/// it with a symlink, cannot redirect the grant; a removed directory stays
/// an empty one that nothing can be created in. Cost: one open file
/// descriptor per grant for the grant's life.
#[derive(Debug, Clone)]
pub struct DirGrant {
    pub(crate) host: PathBuf,
    pub(crate) guest: String,
    pub(crate) mode: DirMode,
    pub(crate) handle: Arc<BoundDir>,
}

impl PartialEq for DirGrant {
    fn eq(&self, other: &Self) -> bool {
        self.host == other.host && self.guest == other.guest && self.mode == other.mode
    }
}

impl Eq for DirGrant {}

/// The directory a grant was checked against, held open.
#[derive(Debug)]
pub(crate) struct BoundDir {
    file: std::fs::File,
    /// `(device, inode)` as checked, compared on every call where the
    /// directory cannot be reopened through its descriptor.
    #[cfg_attr(target_os = "linux", allow(dead_code))]
    identity: (u64, u64),
}

impl BoundDir {
    fn open(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let file = std::fs::File::open(path)?;
        let meta = file.metadata()?;
        if !meta.is_dir() {
            return Err(std::io::Error::other("is not a directory"));
        }
        let bound = Self {
            file,
            identity: (meta.dev(), meta.ino()),
        };
        // Fail at load, not on the first call, where /proc is missing.
        let reopened = std::fs::metadata(bound.path_for_call(path)?)?;
        if (reopened.dev(), reopened.ino()) != (meta.dev(), meta.ino()) {
            return Err(std::io::Error::other(
                "the directory changed while it was being opened",
            ));
        }
        Ok(bound)
    }

    /// A path that opens exactly this directory.
    #[cfg(target_os = "linux")]
    pub(crate) fn path_for_call(&self, _configured: &Path) -> std::io::Result<PathBuf> {
        use std::os::fd::AsRawFd;
        let path = PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()));
        if !path.exists() {
            return Err(std::io::Error::other(
                "/proc is not mounted; directory grants need it to stay bound to the checked directory",
            ));
        }
        Ok(path)
    }

    /// Elsewhere, the configured path, if it still leads to the directory
    /// that was checked. (Between this check and the open there is a
    /// window; Linux has none.)
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn path_for_call(&self, configured: &Path) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let now = std::fs::metadata(configured)?;
        if (now.dev(), now.ino()) != self.identity {
            return Err(std::io::Error::other(
                "it is no longer the directory that was granted (replaced or moved)",
            ));
        }
        Ok(configured.to_path_buf())
    }
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
        let handle = BoundDir::open(&host).map_err(|e| err(format!("cannot be opened: {e}")))?;
        Ok(Self {
            host,
            guest,
            mode,
            handle: Arc::new(handle),
        })
    }

    /// The host directory's canonical path when the grant was made. The
    /// grant stays bound to that directory even if the path later leads
    /// elsewhere.
    pub fn host(&self) -> &Path {
        &self.host
    }

    /// Whether `other` lies strictly inside this grant's directory (by
    /// canonical path, as checked at load).
    pub fn contains(&self, other: &DirGrant) -> bool {
        other.host != self.host && other.host.starts_with(&self.host)
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
        Self::new(
            crate::fs::tidy_join(base, &config.host),
            config.guest,
            config.mode,
        )
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
