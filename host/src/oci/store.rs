//! The store of pulled components: by digest, private to this user.
//!
//! `components/sha256/<hex>.wasm` holds a component's bytes, written only
//! after they matched their digest (the download goes to a temporary file
//! beside it and is renamed into place); `manifests/sha256-<hex>.json` a
//! manifest's bytes as the registry served them, from which every offline
//! start derives the component again (hashed on each read: a few KiB);
//! `signatures/sha256-<hex>.json` the signatures read for a manifest, to
//! check them again offline. Like
//! the compile cache, the directory must be this user's alone (a
//! component found here is trusted to be what its name says, without
//! hashing it again on every start): it is created 0700, and a directory
//! or entry others could write is refused.

use std::path::{Path, PathBuf};

use super::OciError;
use super::signature::Signature;
use crate::sandbox::cache::{UnsafeCache, check_private, create_private_dir};

/// The pulled components, by digest.
#[derive(Debug, Clone)]
pub struct OciStore {
    dir: PathBuf,
}

impl OciStore {
    /// The store at `dir`.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// `$AIRLOCK_OCI_DIR`, else `oci` in the compile cache's directory
    /// (`$AIRLOCK_CACHE_DIR/oci`, else `~/.cache/airlock/oci`); `None` when
    /// none is known.
    pub fn from_env() -> Option<Self> {
        if let Some(dir) = std::env::var_os("AIRLOCK_OCI_DIR").filter(|d| !d.is_empty()) {
            return Some(Self::in_dir(PathBuf::from(dir)));
        }
        crate::sandbox::CompileCache::from_env()
            .dir()
            .map(|dir| Self::in_dir(dir.join("oci")))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn fail(&self, path: &Path, problem: impl std::fmt::Display) -> OciError {
        OciError::Store {
            path: path.to_path_buf(),
            problem: problem.to_string(),
        }
    }

    /// The store's error for what [`check_private`] refused.
    fn unsafe_store(refused: UnsafeCache) -> OciError {
        OciError::UnsafeStore {
            path: refused.path,
            problem: refused.problem,
            fix: refused.fix,
        }
    }

    /// Creates (0700) and checks the directory and `sub`.
    fn private_dir(&self, sub: &str) -> Result<PathBuf, OciError> {
        let dir = self.dir.join(sub);
        for d in [&self.dir, &dir] {
            create_private_dir(d).map_err(|e| self.fail(d, e))?;
            check_private(d, false).map_err(Self::unsafe_store)?;
        }
        Ok(dir)
    }

    fn component_path(&self, digest: &str) -> PathBuf {
        self.dir
            .join("components")
            .join(digest.replace(':', "/"))
            .with_extension("wasm")
    }

    /// The file of the component with `digest`, if the store holds it (and
    /// it is private).
    pub fn component(&self, digest: &str) -> Result<Option<PathBuf>, OciError> {
        let path = self.component_path(digest);
        if !path.is_file() {
            return Ok(None);
        }
        for checked in [&self.dir, &path] {
            check_private(checked, checked == &path).map_err(Self::unsafe_store)?;
        }
        Ok(Some(path))
    }

    /// A temporary file for a download of the component `digest`, in the
    /// store (so that keeping it is a rename).
    pub(crate) fn download(&self, digest: &str) -> Result<tempfile::NamedTempFile, OciError> {
        let path = self.component_path(digest);
        let dir = path.parent().unwrap_or(&self.dir);
        self.private_dir("components")?;
        let dir_created = std::fs::create_dir_all(dir).map_err(|e| self.fail(dir, e));
        dir_created?;
        tempfile::Builder::new()
            .prefix(".download-")
            .tempfile_in(dir)
            .map_err(|e| self.fail(dir, e))
    }

    /// Keeps a download whose bytes matched `digest`: fsynced, renamed into
    /// place, readable by this user only.
    pub(crate) fn keep(
        &self,
        download: tempfile::NamedTempFile,
        digest: &str,
    ) -> Result<PathBuf, OciError> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.component_path(digest);
        let file = download.as_file();
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .and_then(|()| file.sync_all())
            .map_err(|e| self.fail(&path, e))?;
        download
            .persist(&path)
            .map_err(|e| self.fail(&path, e.error))?;
        Ok(path)
    }

    fn manifest_path(&self, digest: &str) -> PathBuf {
        self.dir
            .join("manifests")
            .join(format!("{}.json", digest.replace(':', "-")))
    }

    /// The bytes of the manifest `digest`, as kept when it was pulled
    /// (`None` when the store has none: pulled by an Airlock that kept
    /// none, or never). Hashed as read: bytes that are not the digest's
    /// are an error, never a manifest.
    pub fn manifest(&self, digest: &str) -> Result<Option<Vec<u8>>, OciError> {
        let path = self.manifest_path(digest);
        check_private(&path, true).map_err(Self::unsafe_store)?;
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.fail(&path, e)),
        };
        let found = super::manifest::sha256_digest(&bytes);
        if found != digest {
            return Err(self.fail(
                &path,
                format!("holds manifest {found}, not {digest}; remove it and pull again"),
            ));
        }
        Ok(Some(bytes))
    }

    /// Keeps the bytes of manifest `digest` (already checked against it).
    pub(crate) fn keep_manifest(&self, digest: &str, bytes: &[u8]) -> Result<(), OciError> {
        self.private_dir("manifests")?;
        let path = self.manifest_path(digest);
        crate::fs::write_atomic(&path, bytes).map_err(|e| self.fail(&path, e))
    }

    fn signatures_path(&self, manifest_digest: &str) -> PathBuf {
        self.dir
            .join("signatures")
            .join(format!("{}.json", manifest_digest.replace(':', "-")))
    }

    /// The signatures read for `manifest_digest` when it was pulled.
    pub fn signatures(&self, manifest_digest: &str) -> Vec<Signature> {
        let path = self.signatures_path(manifest_digest);
        if check_private(&path, true).is_err() {
            return Vec::new();
        }
        std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    /// Keeps the signatures of `manifest_digest` (only those that
    /// verified).
    pub(crate) fn keep_signatures(
        &self,
        manifest_digest: &str,
        signatures: &[Signature],
    ) -> Result<(), OciError> {
        self.private_dir("signatures")?;
        let path = self.signatures_path(manifest_digest);
        let bytes = serde_json::to_vec(signatures).map_err(|e| self.fail(&path, e))?;
        crate::fs::write_atomic(&path, &bytes).map_err(|e| self.fail(&path, e))
    }
}
