//! Serving the environment grant: the named variables, read when each
//! call starts (a replayed call's, as its tape recorded them, when it
//! did).

use wasmtime::component::Linker;

use super::{CallSetup, Capability, EnvGrant, GrantError};
use crate::sandbox::CallState;

impl Capability for EnvGrant {
    /// `wasi:cli/environment` is part of the WASI base the host links once;
    /// a call sees only the variables `prepare` gave it.
    fn link(_linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        Ok(())
    }

    /// The variable as the host has it now; for a replayed call whose
    /// tape recorded it, as recorded. Kept for the tape of a call that
    /// records, unless its name looks secret.
    fn prepare(&self, call: &mut CallSetup<'_>) -> Result<(), GrantError> {
        let value = match call.recorded_env.and_then(|env| env.get(&self.name)) {
            Some(recorded) => recorded.clone(),
            None => std::env::var(&self.name).ok(),
        };
        if let Some(value) = &value {
            call.wasi.env(&self.name, value);
        }
        // What a name that looks secret holds is never journaled.
        if let Some(kept) = &mut call.env
            && !crate::journal::secrets::is_secret_key(&self.name)
        {
            kept.insert(self.name.clone(), value);
        }
        Ok(())
    }
}
