//! The secret grant: a value from the operator's environment, added by the
//! host as a header on requests to the hosts it is bound to.
//!
//! In `airlock.toml`:
//! `secrets = [{ env = "GITHUB_TOKEN", hosts = ["api.github.com"] }]`
//! (`header` defaults to `authorization`, `format` to `Bearer {}`).
//!
//! Invariant: a secret's value never enters the guest. It is not in the
//! guest's environment, deps, arguments, logs or errors; it is written only
//! into outgoing request headers, after the guest has handed the request
//! over, and only for bound hosts. `Debug` prints it redacted. The value is
//! read when a call is prepared, not when the policy loads, so a policy can
//! be loaded and inspected without the secret set.

use std::path::Path;

use http::{HeaderName, HeaderValue};
use serde::Deserialize;
use wasmtime::component::Linker;

use super::{CallSetup, Grant, GrantError, ResolvedSecret};
use crate::sandbox::CallState;

/// One entry of a tool's `secrets` list, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretConfig {
    /// The operator's environment variable holding the value.
    pub env: String,
    /// Host names the secret is sent to (`*.example.com` for subdomains).
    pub hosts: Vec<String>,
    /// The header it is sent in. Default `authorization`.
    #[serde(default = "default_header")]
    pub header: String,
    /// The header value, with `{}` for the secret. Default `Bearer {}`.
    #[serde(default = "default_format")]
    pub format: String,
}

fn default_header() -> String {
    "authorization".into()
}

fn default_format() -> String {
    "Bearer {}".into()
}

/// Where a secret's value comes from.
#[derive(Clone)]
enum Source {
    /// Read from the operator's environment when a call is prepared.
    Env,
    /// Given by an embedder, already formatted.
    Value(HeaderValue),
}

/// A secret bound to hosts.
#[derive(Clone)]
pub struct SecretGrant {
    /// The operator's environment variable (or the embedder's label).
    name: String,
    source: Source,
    format: String,
    header: HeaderName,
    /// Lower-case host names; a leading `*.` matches any subdomain.
    hosts: Vec<String>,
}

impl std::fmt::Debug for SecretGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretGrant")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .field("header", &self.header)
            .field("hosts", &self.hosts)
            .finish()
    }
}

impl SecretGrant {
    /// A secret read from the operator's environment variable `name` each
    /// time a call is prepared, formatted as `format` with `{}` replaced by
    /// the value (for example `Bearer {}`). The variable need not be set
    /// yet; a call that needs it while it is unset fails with
    /// [`GrantError::SecretUnset`].
    pub fn from_env(
        name: &str,
        header: &str,
        format: &str,
        hosts: Vec<String>,
    ) -> Result<Self, GrantError> {
        Self::build(name, Source::Env, header, format, hosts)
    }

    /// A secret with an explicit value, for embedders that keep secrets
    /// elsewhere than the environment.
    pub fn new(
        name: &str,
        secret: &str,
        header: &str,
        format: &str,
        hosts: Vec<String>,
    ) -> Result<Self, GrantError> {
        let value = header_value(name, format, secret)?;
        Self::build(name, Source::Value(value), header, format, hosts)
    }

    fn build(
        name: &str,
        source: Source,
        header: &str,
        format: &str,
        hosts: Vec<String>,
    ) -> Result<Self, GrantError> {
        let err = |problem: String| GrantError::Secret {
            name: name.to_owned(),
            problem,
        };
        if !format.contains("{}") {
            return Err(err(format!(
                "the format {format:?} has no `{{}}` for the value"
            )));
        }
        if hosts.is_empty() {
            return Err(err("bind it to at least one host".into()));
        }
        let hosts = hosts
            .into_iter()
            .map(|h| {
                let h = h.to_ascii_lowercase();
                let domain = h.strip_prefix("*.").unwrap_or(&h);
                if domain.is_empty() || domain.contains(['*', '/', ':']) {
                    Err(err(format!(
                        "{h:?} is not a host name (like api.example.com or *.example.com)"
                    )))
                } else {
                    Ok(h)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let header = HeaderName::try_from(header)
            .map_err(|_| err(format!("{header:?} is not a header name")))?;
        Ok(Self {
            name: name.to_owned(),
            source,
            format: format.to_owned(),
            header,
            hosts,
        })
    }

    /// The operator's environment variable (or the embedder's label).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The hosts the secret is sent to.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The header the secret is sent in.
    pub fn header_name(&self) -> &HeaderName {
        &self.header
    }

    /// Whether the secret has a value now (its variable is set, or the
    /// embedder gave one). Never reveals the value.
    pub fn is_set(&self) -> bool {
        self.value().is_ok()
    }

    /// The formatted header value as of now.
    fn value(&self) -> Result<HeaderValue, GrantError> {
        match &self.source {
            Source::Value(value) => Ok(value.clone()),
            Source::Env => {
                let secret = std::env::var(&self.name)
                    .ok()
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| GrantError::SecretUnset {
                        name: self.name.clone(),
                    })?;
                header_value(&self.name, &self.format, &secret)
            }
        }
    }

    /// Whether `text` contains the secret's header value (for redaction
    /// checks in tests and audits).
    pub fn appears_in(&self, text: &str) -> bool {
        self.value()
            .is_ok_and(|v| v.to_str().is_ok_and(|v| !v.is_empty() && text.contains(v)))
    }
}

/// The header value for `secret` in `format`. The error never echoes it.
fn header_value(name: &str, format: &str, secret: &str) -> Result<HeaderValue, GrantError> {
    let mut value =
        HeaderValue::try_from(format.replace("{}", secret)).map_err(|_| GrantError::Secret {
            name: name.to_owned(),
            problem: "the value cannot be sent in a header (control characters?)".into(),
        })?;
    value.set_sensitive(true);
    Ok(value)
}

impl Grant for SecretGrant {
    type Config = SecretConfig;

    fn from_config(config: SecretConfig, _base: &Path) -> Result<Self, GrantError> {
        Self::from_env(&config.env, &config.header, &config.format, config.hosts)
    }

    /// Secrets add no interface: the HTTP grant's sender injects them.
    fn link(_linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        Ok(())
    }

    fn prepare(&self, call: &mut CallSetup<'_>) -> Result<(), GrantError> {
        call.secrets.push(ResolvedSecret {
            header: self.header.clone(),
            value: self.value()?,
            hosts: self.hosts.clone(),
        });
        Ok(())
    }

    fn describe(&self) -> Vec<String> {
        let state = if self.is_set() { "set" } else { "not set" };
        vec![format!(
            "{} ({state}) -> header {} on {}",
            self.name,
            self.header,
            self.hosts.join(", ")
        )]
    }
}
