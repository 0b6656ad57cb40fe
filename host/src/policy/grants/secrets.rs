//! The secret grant: a value from the operator's environment, added by the
//! host as a header on requests to the origins it is bound to.
//!
//! In `airlock.toml`:
//! `secrets = [{ env = "GITHUB_TOKEN", origins = ["https://api.github.com"] }]`
//! (`header` defaults to `authorization`, `format` to `Bearer {}`). An
//! origin is `scheme://host[:port]` as in the HTTP allowlist (`*.` for
//! subdomains); a bare host name means `https://` on port 443.
//!
//! Invariants: a secret's value never enters the guest. It is not in the
//! guest's environment, deps, arguments, logs or errors; it is written only
//! into outgoing request headers, after the guest has handed the request
//! over, and only for requests to a bound origin: the same scheme, host and
//! port. It never goes out in cleartext: an `http://` origin is refused
//! unless the entry says `cleartext_loopback = true` and the origin's host
//! is `localhost` or a loopback address, and even then the header is added
//! only when every address the request may connect to is loopback. `Debug`
//! prints it redacted. The value is read when a call is prepared, not when
//! the policy loads, so a policy can be loaded and inspected without the
//! secret set.

use std::path::Path;

use http::{HeaderName, HeaderValue};
use serde::Deserialize;

use super::pattern::Scheme;
use super::{Grant, GrantError, HostPattern};

/// One entry of a tool's `secrets` list, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretConfig {
    /// The operator's environment variable holding the value (or, for
    /// [`SecretGrant::with_value`], a label for it).
    pub env: String,
    /// Origins the secret is sent to: `scheme://host[:port]`, or a bare
    /// host name for `https://host`. (`hosts` is accepted as an alias.)
    #[serde(alias = "hosts")]
    pub origins: Vec<String>,
    /// The header it is sent in. Default `authorization`.
    #[serde(default = "default_header")]
    pub header: String,
    /// The header value, with `{}` for the secret. Default `Bearer {}`.
    #[serde(default = "default_format")]
    pub format: String,
    /// Allow `http://` origins on `localhost` or a loopback address, for a
    /// test server on this machine. Default false: cleartext is refused.
    #[serde(default)]
    pub cleartext_loopback: bool,
}

impl SecretConfig {
    /// A secret from variable `env` for `origins`, in the default header
    /// and format, cleartext refused.
    pub fn new(env: impl Into<String>, origins: Vec<String>) -> Self {
        Self {
            env: env.into(),
            origins,
            header: default_header(),
            format: default_format(),
            cleartext_loopback: false,
        }
    }
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
    /// Given by an embedder.
    Value(std::sync::Arc<str>),
}

/// Secrets this short are redacted from responses only in their formatted
/// form: redacting every occurrence of a few characters would mangle
/// ordinary text.
pub(crate) const MIN_REDACTED_BYTES: usize = 6;

/// A secret bound to origins.
#[derive(Clone)]
pub struct SecretGrant {
    /// The operator's environment variable (or the embedder's label).
    pub(crate) name: String,
    source: Source,
    format: String,
    pub(crate) header: HeaderName,
    pub(crate) origins: std::sync::Arc<[HostPattern]>,
}

impl std::fmt::Debug for SecretGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretGrant")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .field("header", &self.header)
            .field("origins", &self.origins)
            .finish()
    }
}

impl SecretGrant {
    /// A secret read from the operator's environment variable
    /// `config.env` each time a call is prepared. The variable need not be
    /// set yet; a call that needs it while it is unset fails with
    /// [`GrantError::SecretUnset`].
    pub fn from_env(config: SecretConfig) -> Result<Self, GrantError> {
        Self::build(config, Source::Env)
    }

    /// A secret with an explicit value, for embedders that keep secrets
    /// elsewhere than the environment; `config.env` only labels it.
    pub fn with_value(config: SecretConfig, secret: &str) -> Result<Self, GrantError> {
        header_value(&config.env, &config.format, secret)?;
        Self::build(config, Source::Value(secret.into()))
    }

    fn build(config: SecretConfig, source: Source) -> Result<Self, GrantError> {
        let name = config.env;
        let err = |problem: String| GrantError::Secret {
            name: name.clone(),
            problem,
        };
        if !config.format.contains("{}") {
            return Err(err(format!(
                "the format {:?} has no `{{}}` for the value",
                config.format
            )));
        }
        if config.origins.is_empty() {
            return Err(err("bind it to at least one origin".into()));
        }
        let origins = config
            .origins
            .iter()
            .map(|origin| {
                let full = if origin.contains("://") {
                    origin.clone()
                } else {
                    format!("https://{origin}")
                };
                let pattern = HostPattern::parse(&full).map_err(|e| match e {
                    GrantError::HostPattern { problem, .. } => err(format!(
                        "origin {origin:?}: {problem} (like https://api.example.com or *.example.com)"
                    )),
                    other => other,
                })?;
                if pattern.scheme() == Scheme::Http && !config.cleartext_loopback {
                    return Err(err(format!(
                        "origin {origin:?} would send the secret in cleartext; use https://, or set \
                         cleartext_loopback = true for a test server on this machine"
                    )));
                }
                if pattern.scheme() == Scheme::Http && !pattern.is_loopback() {
                    return Err(err(format!(
                        "origin {origin:?}: cleartext_loopback allows only localhost and loopback addresses"
                    )));
                }
                Ok(pattern)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let header = HeaderName::try_from(config.header.as_str())
            .map_err(|_| err(format!("{:?} is not a header name", config.header)))?;
        Ok(Self {
            name: name.clone(),
            source,
            format: config.format,
            header,
            origins: origins.into(),
        })
    }

    /// The operator's environment variable (or the embedder's label).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The origins the secret is sent to.
    pub fn origins(&self) -> &[HostPattern] {
        &self.origins
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

    /// The secret as of now: its formatted header value, and the raw value.
    pub(crate) fn resolve(&self) -> Result<(HeaderValue, String), GrantError> {
        let raw = match &self.source {
            Source::Value(value) => value.to_string(),
            Source::Env => std::env::var(&self.name)
                .ok()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| GrantError::SecretUnset {
                    name: self.name.clone(),
                })?,
        };
        Ok((header_value(&self.name, &self.format, &raw)?, raw))
    }

    /// The formatted header value as of now.
    fn value(&self) -> Result<HeaderValue, GrantError> {
        self.resolve().map(|(value, _)| value)
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
        Self::from_env(config)
    }

    fn describe(&self) -> Vec<String> {
        let state = if self.is_set() { "set" } else { "not set" };
        vec![format!(
            "{} ({state}) -> header {} on {}",
            self.name,
            self.header,
            self.origins
                .iter()
                .map(HostPattern::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        )]
    }
}
