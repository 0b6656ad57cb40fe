//! Serving capabilities to calls. Nothing is granted by default.
//!
//! Every grant is one unit with the same four steps (Spin's factors, plus
//! a description). Steps 1 and 4 are data, the policy's
//! ([`Grant`], `crate::policy::grants`); steps 2 and 3 are here, as the
//! [`Capability`] trait, one file per grant:
//!
//! 1. **parse and validate** ([`Grant::from_config`]): its piece of a
//!    `[[tool]]` table in `airlock.toml`, checked, or a [`GrantError`]
//!    naming what is wrong;
//! 2. **link** ([`Capability::link`]): its imports are added to the host's
//!    linker once per host, whether or not any tool is granted anything
//!    (a tool that imports an interface it was not granted links, and every
//!    call through it is refused);
//! 3. **prepare** ([`Capability::prepare`]): per call, it puts exactly what
//!    it grants into the new call's [`CallSetup`];
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
pub(crate) use dirs::WriteBudget;
mod env;
mod http;
mod secrets;

use std::collections::BTreeMap;

use wasmtime::component::Linker;
use wasmtime_wasi::WasiCtxBuilder;

pub use crate::policy::grants::{
    DirConfig, DirGrant, DirMode, EnvGrant, Grant, GrantError, Grants, HostPattern, HttpConfig,
    HttpGrant, SecretConfig, SecretGrant, is_non_public,
};
pub use crate::policy::limits::LimitsConfig;
pub(crate) use http::{HttpHooks, ResolvedSecret};

use super::CallState;

/// How a grant ([`Grant`], the policy's) is served to calls: steps 2 and
/// 3. See the module documentation.
pub trait Capability: Grant {
    /// Adds the interfaces this grant serves to `linker`. Called once per
    /// host, not per tool or call.
    fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()>;

    /// Puts what this grant gives into a new call. Runs on every call, so
    /// it must be cheap; it is where values that may change between calls
    /// (environment variables, secrets) are read.
    fn prepare(&self, call: &mut CallSetup<'_>) -> Result<(), GrantError>;
}

/// What a call is being given, filled in by each grant's
/// [`Capability::prepare`].
pub struct CallSetup<'a> {
    /// The call's WASI context: preopened directories, environment.
    pub(crate) wasi: &'a mut WasiCtxBuilder,
    /// Secrets resolved for this call, for the HTTP sender to inject.
    pub(crate) secrets: Vec<ResolvedSecret>,
    /// A replayed call's environment as its tape recorded it (empty when
    /// it was not recorded: the variables are then read as they are now).
    pub(crate) recorded_env: Option<&'a BTreeMap<String, Option<String>>>,
    /// For a call that records (`None` otherwise: nothing is kept), the
    /// environment variables it was given, with their values, but those
    /// whose names look secret: what its tape keeps.
    pub(crate) env: Option<BTreeMap<String, Option<String>>>,
}

impl std::fmt::Debug for CallSetup<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallSetup")
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

/// Steps 2 and 3 for every grant of a tool.
impl Grants {
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
    /// gone, a secret whose variable is unset. A `replayed` call (one
    /// played back from its journal, which must change nothing outside
    /// it) gets no directory and no secret: its HTTP requests are refused
    /// too ([`HttpHooks`]).
    pub(crate) fn prepare(
        &self,
        call: &mut CallSetup<'_>,
        replayed: bool,
    ) -> Result<(), GrantError> {
        if replayed {
            for env in &self.env {
                env.prepare(call)?;
            }
            return Ok(());
        }
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
}
