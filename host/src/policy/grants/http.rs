//! The HTTP grant's data: the allowlist and the per-call budgets, as the
//! policy holds them (the sender that enforces them is the sandbox's).

use std::path::Path;

use serde::Deserialize;

use super::pattern::{HostPattern, Scheme};
use super::{Grant, GrantError};

/// Default cap on a response body a tool may read: 10 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 10 << 20;
/// Default number of requests one call may send.
pub const DEFAULT_MAX_REQUESTS: u32 = 100;
/// Default number of connections one call may hold open at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 8;

/// A tool's HTTP settings, as written: `http = [...]`,
/// `max_response_bytes`, `max_requests` and `max_connections` in its
/// `[[tool]]` table.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct HttpConfig {
    /// Allowed destinations, `scheme://host[:port]`.
    pub allow: Vec<String>,
    /// Largest response body; default 10 MiB.
    pub max_response_bytes: Option<usize>,
    /// Requests per call; default 100.
    pub max_requests: Option<u32>,
    /// Connections open at once per call; default 8.
    pub max_connections: Option<usize>,
}

/// The hosts one tool may send HTTP requests to. Empty by default: every
/// request is refused.
#[derive(Debug, Clone)]
pub struct HttpGrant {
    allow: Vec<HostPattern>,
    /// Largest response body the tool may read.
    pub max_response_bytes: usize,
    /// Requests one call may send; past it a request fails with
    /// `connection-limit-reached`.
    pub max_requests: u32,
    /// Connections one call may hold open at once (a connection lasts
    /// until its response body is read or dropped); past it a request
    /// fails with `connection-limit-reached`.
    pub max_connections: usize,
}

impl Default for HttpGrant {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            max_requests: DEFAULT_MAX_REQUESTS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl HttpGrant {
    /// Allows exactly `allow`, with the default response cap.
    pub fn new(allow: Vec<HostPattern>) -> Self {
        Self {
            allow,
            ..Self::default()
        }
    }

    /// The allowed destinations.
    pub fn allowed(&self) -> &[HostPattern] {
        &self.allow
    }

    pub(crate) fn find(&self, scheme: Scheme, host: &str, port: u16) -> Option<&HostPattern> {
        self.allow.iter().find(|p| p.matches(scheme, host, port))
    }
}

impl Grant for HttpGrant {
    type Config = HttpConfig;

    fn from_config(config: HttpConfig, _base: &Path) -> Result<Self, GrantError> {
        let allow = config
            .allow
            .iter()
            .map(|p| HostPattern::parse(p))
            .collect::<Result<Vec<_>, _>>()?;
        let mut grant = Self::new(allow);
        if let Some(max) = config.max_response_bytes {
            grant.max_response_bytes = max;
        }
        if let Some(max) = config.max_requests {
            grant.max_requests = max;
        }
        if let Some(max) = config.max_connections {
            grant.max_connections = max;
        }
        Ok(grant)
    }

    fn describe(&self) -> Vec<String> {
        self.allow.iter().map(|p| p.as_str().to_owned()).collect()
    }
}
