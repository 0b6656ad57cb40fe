//! Serving the environment grant: the named variables, read when each
//! call starts.

use wasmtime::component::Linker;

use super::{CallSetup, Capability, EnvGrant, GrantError};
use crate::sandbox::CallState;

impl Capability for EnvGrant {
    /// `wasi:cli/environment` is part of the WASI base the host links once;
    /// a call sees only the variables `prepare` gave it.
    fn link(_linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        Ok(())
    }

    fn prepare(&self, call: &mut CallSetup<'_>) -> Result<(), GrantError> {
        if let Ok(value) = std::env::var(&self.name) {
            call.wasi.env(&self.name, value);
        }
        Ok(())
    }
}
