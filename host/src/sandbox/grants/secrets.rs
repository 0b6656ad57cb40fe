//! The secret grant: a value from the operator's environment, added by the
//! host as a header on requests to the hosts it is bound to.
//!
//! Invariant: a secret's value never enters the guest. It is not in the
//! guest's environment, deps, arguments, logs or errors; it is written only
//! into outgoing request headers, after the guest has handed the request
//! over, and only for bound hosts. `Debug` prints it redacted.

use http::{HeaderName, HeaderValue};

use super::GrantError;

/// A secret bound to hosts.
#[derive(Clone)]
pub struct SecretGrant {
    /// The operator's environment variable the value came from.
    name: String,
    value: HeaderValue,
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
    /// Reads the secret from the operator's environment variable `name` and
    /// formats the header value: `format` with `{}` replaced by the secret
    /// (for example `Bearer {}`).
    pub fn from_env(
        name: &str,
        header: &str,
        format: &str,
        hosts: Vec<String>,
    ) -> Result<Self, GrantError> {
        let secret = std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| GrantError::Secret {
                name: name.to_owned(),
                problem: "the environment variable is not set (or empty)".into(),
            })?;
        Self::new(name, &secret, header, format, hosts)
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
        // The error must not echo the value.
        let mut value = HeaderValue::try_from(format.replace("{}", secret)).map_err(|_| {
            err("the value cannot be sent in a header (control characters?)".into())
        })?;
        value.set_sensitive(true);
        Ok(Self {
            name: name.to_owned(),
            value,
            header,
            hosts,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    pub fn header_name(&self) -> &HeaderName {
        &self.header
    }

    pub(crate) fn binds(&self, host: &str) -> bool {
        self.hosts
            .iter()
            .any(|pattern| match pattern.strip_prefix("*.") {
                Some(domain) => super::http::is_subdomain(host, domain),
                None => pattern == host,
            })
    }

    pub(crate) fn header(&self) -> (HeaderName, HeaderValue) {
        (self.header.clone(), self.value.clone())
    }

    /// Whether `text` contains the secret's header value (for redaction
    /// checks in tests and audits).
    pub fn appears_in(&self, text: &str) -> bool {
        self.value
            .to_str()
            .is_ok_and(|v| !v.is_empty() && text.contains(v))
    }
}
