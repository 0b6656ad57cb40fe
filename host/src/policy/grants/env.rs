//! The environment grant: named variables from the host's environment.
//!
//! In `airlock.toml`: `env = ["TZ", "LANG"]`.

use std::path::Path;

use super::{Grant, GrantError};

/// One environment variable the tool may read, by name. Its value is read
/// from the host's environment when each call starts; an unset variable is
/// simply absent in the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvGrant {
    pub(crate) name: String,
}

impl EnvGrant {
    /// Grants the variable `name`; refuses a name no variable can have.
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

    /// The variable's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Grant for EnvGrant {
    type Config = String;

    fn from_config(name: String, _base: &Path) -> Result<Self, GrantError> {
        Self::new(name)
    }

    fn describe(&self) -> Vec<String> {
        vec![self.name.clone()]
    }
}
