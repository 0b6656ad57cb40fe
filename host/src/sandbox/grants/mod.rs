//! Capabilities an operator grants a tool. Nothing is granted by default.
//!
//! Every grant is one unit, in its own file, with the same four steps
//! (Spin's factors, plus a description), written down as the [`Grant`]
//! trait:
//!
//! 1. **parse and validate** ([`Grant::from_config`]): its piece of a
//!    `[[tool]]` table in `airlock.toml`, checked, or a [`GrantError`]
//!    naming what is wrong;
//! 2. **link** ([`Grant::link`]): its imports are added to the host's
//!    linker once per host, whether or not any tool is granted anything
//!    (a tool that imports an interface it was not granted links, and every
//!    call through it is refused);
//! 3. **prepare** ([`Grant::prepare`]): per call, it puts exactly what it
//!    grants into the new call's [`CallSetup`];
//! 4. **describe** ([`Grant::describe`]): one line per thing it grants, for
//!    `airlock inspect`. Never a secret's value.
//!
//! The units: [`dirs`](DirGrant), [`env`](EnvGrant), [`http`](HttpGrant),
//! [`secrets`](SecretGrant), and the call [`limits`](crate::sandbox::Limits)
//! (parsed by [`LimitsConfig`], armed on every store by
//! [`crate::sandbox::Sandbox`], described by [`Limits::describe`]).
//!
//! [`Limits::describe`]: crate::sandbox::Limits::describe

mod dirs;
mod env;
mod http;
mod limits;
mod secrets;

use std::path::Path;
use std::sync::Arc;

use wasmtime::component::Linker;
use wasmtime_wasi::WasiCtxBuilder;

pub use dirs::{DirConfig, DirGrant, DirMode};
pub use env::EnvGrant;
pub use http::{HostPattern, HttpConfig, HttpGrant, is_non_public};
pub(crate) use http::{HttpHooks, ResolvedSecret, canonical, names_address};
pub use limits::LimitsConfig;
pub use secrets::{SecretConfig, SecretGrant};

use super::CallState;

/// The four steps every grant has. See the module documentation.
pub trait Grant: Sized {
    /// The grant's piece of a `[[tool]]` table, as the operator wrote it.
    type Config: serde::de::DeserializeOwned;

    /// Validates `config`. Relative paths in it start at `base` (the
    /// policy file's directory). Cheap and side-effect free, apart from
    /// checking that named files exist: it reads no secret.
    fn from_config(config: Self::Config, base: &Path) -> Result<Self, GrantError>;

    /// Adds the interfaces this grant serves to `linker`. Called once per
    /// host, not per tool or call.
    fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()>;

    /// Puts what this grant gives into a new call. Runs on every call, so
    /// it must be cheap; it is where values that may change between calls
    /// (environment variables, secrets) are read.
    fn prepare(&self, call: &mut CallSetup<'_>) -> Result<(), GrantError>;

    /// What the grant gives, one line per item, for `airlock inspect`.
    fn describe(&self) -> Vec<String>;
}

/// What a call is being given, filled in by each grant's
/// [`Grant::prepare`].
pub struct CallSetup<'a> {
    /// The call's WASI context: preopened directories, environment.
    pub(crate) wasi: &'a mut WasiCtxBuilder,
    /// Secrets resolved for this call, for the HTTP sender to inject.
    pub(crate) secrets: Vec<ResolvedSecret>,
}

impl std::fmt::Debug for CallSetup<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallSetup")
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

/// Everything one tool is granted.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// Host directories mapped into the guest.
    pub dirs: Vec<DirGrant>,
    /// Environment variables passed through by name.
    pub env: Vec<EnvGrant>,
    /// Where outgoing HTTP may go.
    pub http: HttpGrant,
    /// Secrets the host adds to outgoing requests.
    pub secrets: Vec<SecretGrant>,
}

impl Grants {
    /// No files, no environment, no network, no secrets.
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether nothing is granted: no directory, no variable, no host, no
    /// secret. What such a call can reach does not change between the
    /// moment its instance is made and the moment it is called.
    pub fn is_none(&self) -> bool {
        self.dirs.is_empty()
            && self.env.is_empty()
            && self.http.allowed().is_empty()
            && self.secrets.is_empty()
    }

    /// Whether a call can change something outside Airlock: it may send
    /// HTTP requests or write a directory. Reading files and the
    /// environment is not an effect.
    pub fn effectful(&self) -> bool {
        !self.http.allowed().is_empty() || self.dirs.iter().any(|d| d.mode() == DirMode::Rw)
    }

    /// Step 2 for every grant: links WASI (whose interfaces serve only what
    /// a call was prepared with) and each grant's own interfaces.
    pub(crate) fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        // All of WASI p2 is linked once. Its context starts empty for
        // every call (no preopens, no environment, no network); the grants
        // below only ever add to what `prepare` gives a call.
        wasmtime_wasi::p2::add_to_linker_async(linker)?;
        DirGrant::link(linker)?;
        EnvGrant::link(linker)?;
        HttpGrant::link(linker)?;
        SecretGrant::link(linker)?;
        Ok(())
    }

    /// Step 3 for every grant, for one call. Fails (and the call with it)
    /// if a grant cannot be honoured now: a granted directory that is
    /// gone, a secret whose variable is unset.
    pub(crate) fn prepare(&self, call: &mut CallSetup<'_>) -> Result<(), GrantError> {
        for dir in &self.dirs {
            dir.prepare(call)?;
        }
        for env in &self.env {
            env.prepare(call)?;
        }
        self.http.prepare(call)?;
        for secret in &self.secrets {
            secret.prepare(call)?;
        }
        Ok(())
    }

    /// Step 4 for every grant: `(grant, line)` pairs for `airlock inspect`.
    pub fn describe(&self) -> Vec<(&'static str, String)> {
        let mut lines = Vec::new();
        let mut add = |kind: &'static str, items: Vec<String>| {
            lines.extend(items.into_iter().map(|line| (kind, line)));
        };
        add("dirs", self.dirs.iter().flat_map(Grant::describe).collect());
        add("env", self.env.iter().flat_map(Grant::describe).collect());
        add("http", self.http.describe());
        add(
            "secrets",
            self.secrets.iter().flat_map(Grant::describe).collect(),
        );
        lines
    }
}

/// A grant the operator configured that cannot be honoured.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    /// A directory grant is unusable.
    #[error("directory {path}: {problem}")]
    Dir {
        /// The host path as configured.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// A directory grant's directory could not be opened for a call.
    #[error("directory {path}: cannot be opened: {source}")]
    DirUnavailable {
        /// The host path.
        path: String,
        /// Why it could not be opened.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// An environment grant names no valid variable.
    #[error("environment variable {name:?}: {problem}")]
    Env {
        /// The variable's name.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// An HTTP pattern cannot be used.
    #[error("HTTP pattern {pattern:?}: {problem}")]
    HostPattern {
        /// The pattern as written.
        pattern: String,
        /// What is wrong.
        problem: String,
    },
    /// A secret grant is malformed.
    #[error("secret {name:?}: {problem}")]
    Secret {
        /// The operator's variable holding the secret.
        name: String,
        /// What is wrong (never the value).
        problem: String,
    },
    /// A secret's variable is unset when a call needs it.
    #[error("secret {name:?}: the environment variable is not set (or empty)")]
    SecretUnset {
        /// The operator's variable holding the secret.
        name: String,
    },
}
