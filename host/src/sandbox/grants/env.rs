//! The environment grant: named variables from the host's environment.

use wasmtime_wasi::WasiCtxBuilder;

use super::GrantError;

/// One environment variable the tool may read, by name. Its value is read
/// from the host's environment when each call starts; an unset variable is
/// simply absent in the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvGrant {
    name: String,
}

impl EnvGrant {
    pub fn new(name: impl Into<String>) -> Result<Self, GrantError> {
        let name = name.into();
        let valid = !name.is_empty() && !name.contains('=') && !name.contains('\0');
        if !valid {
            return Err(GrantError::Env {
                name,
                problem: "not a valid variable name".into(),
            });
        }
        Ok(Self { name })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn prepare(&self, wasi: &mut WasiCtxBuilder) {
        if let Ok(value) = std::env::var(&self.name) {
            wasi.env(&self.name, value);
        }
    }
}
