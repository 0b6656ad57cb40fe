//! Capabilities an operator grants a tool. Nothing is granted by default.
//!
//! Each grant is one unit with the same three steps (Spin's factors):
//!
//! 1. **link**: its imports are added to the host's linker once
//!    ([`crate::tools::Host`] links all of WASI and `wasi:http`; with
//!    nothing granted, every call through them is refused);
//! 2. **validate**: its constructor checks the operator's configuration
//!    and fails with a [`GrantError`] naming what is wrong;
//! 3. **prepare**: per instance, it puts exactly what it grants into the
//!    new call's WASI context or HTTP hooks.

mod dirs;
mod env;
mod http;
mod secrets;

pub use dirs::{DirGrant, DirMode};
pub use env::EnvGrant;
pub(crate) use http::HttpHooks;
pub use http::{HostPattern, HttpGrant, is_non_public};
pub use secrets::SecretGrant;

use wasmtime_wasi::WasiCtxBuilder;

/// Everything one tool is granted.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    pub dirs: Vec<DirGrant>,
    pub env: Vec<EnvGrant>,
    pub http: HttpGrant,
    pub secrets: Vec<SecretGrant>,
}

impl Grants {
    /// No files, no environment, no network, no secrets.
    pub fn none() -> Self {
        Self::default()
    }

    /// Puts the file and environment grants into a new call's WASI context.
    /// HTTP and secrets are prepared in [`HttpHooks`].
    pub(crate) fn prepare(&self, wasi: &mut WasiCtxBuilder) -> Result<(), GrantError> {
        for dir in &self.dirs {
            dir.prepare(wasi)?;
        }
        for env in &self.env {
            env.prepare(wasi);
        }
        Ok(())
    }
}

/// A grant the operator configured that cannot be honoured.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GrantError {
    #[error("directory {path}: {problem}")]
    Dir { path: String, problem: String },
    #[error("environment variable {name:?}: {problem}")]
    Env { name: String, problem: String },
    #[error("HTTP pattern {pattern:?}: {problem}")]
    HostPattern { pattern: String, problem: String },
    #[error("secret {name:?}: {problem}")]
    Secret { name: String, problem: String },
}
