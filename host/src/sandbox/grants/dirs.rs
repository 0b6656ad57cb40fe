//! Serving the directory grant: the granted directory, as checked when
//! the policy was read, preopened for each call.

use std::sync::Arc;

use wasmtime::component::Linker;
use wasmtime_wasi::FsPerms;

use super::{CallSetup, Capability, DirGrant, DirMode, GrantError};
use crate::sandbox::CallState;

impl Capability for DirGrant {
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
        let unavailable = |source: std::io::Error| GrantError::DirUnavailable {
            path: self.host.display().to_string(),
            source: Arc::new(source),
        };
        let path = self.handle.path_for_call(&self.host).map_err(unavailable)?;
        call.wasi
            .preopened_dir(&path, &self.guest, perms)
            .map(|_| ())
            .map_err(|e| unavailable(std::io::Error::other(e.to_string())))
    }
}
