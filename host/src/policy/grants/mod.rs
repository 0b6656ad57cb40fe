//! Capabilities an operator grants a tool, as the policy holds them.
//! Nothing is granted by default.
//!
//! Each grant parses and checks its own piece of a `[[tool]]` table
//! ([`Grant::from_config`]) and describes itself for `airlock inspect`
//! ([`Grant::describe`], never a secret's value). How a call is given
//! what a grant allows is the sandbox's (`crate::sandbox::grants`).

pub(crate) mod address;
mod dirs;
mod env;
mod http;
mod pattern;
mod secrets;

use std::path::Path;
use std::sync::Arc;

pub(crate) use address::{canonical, names_address};
pub use address::{is_loopback_host, is_non_public};
pub use dirs::{DirConfig, DirGrant, DirMode};
pub use env::EnvGrant;
pub use http::{
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_REQUESTS, DEFAULT_MAX_RESPONSE_BYTES, HttpConfig,
    HttpGrant,
};
pub use pattern::HostPattern;
pub(crate) use pattern::Scheme;
pub(crate) use secrets::MIN_REDACTED_BYTES;
pub use secrets::{SecretConfig, SecretGrant};

/// What every grant is as data: parsed from its piece of a `[[tool]]`
/// table (step 1) and described (step 4). Serving it to a call (steps 2
/// and 3) is the sandbox's (`crate::sandbox::grants::Capability`).
pub trait Grant: Sized {
    /// The grant's piece of a `[[tool]]` table, as the operator wrote it.
    type Config: serde::de::DeserializeOwned;

    /// Validates `config`. Relative paths in it start at `base` (the
    /// policy file's directory). Cheap and side-effect free, apart from
    /// checking that named files exist: it reads no secret.
    fn from_config(config: Self::Config, base: &Path) -> Result<Self, GrantError>;

    /// What the grant gives, one line per item, for `airlock inspect`.
    fn describe(&self) -> Vec<String>;
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
    /// The URI schemes its shown links and resources may use (`show`);
    /// empty: `https` only. Not access to anything: the client decides
    /// what to fetch.
    pub uri_schemes: Vec<String>,
    /// Whether its calls may ask the person they work for (`ask = true`).
    pub ask_user: bool,
    /// What its calls may ask the model (`sample = { … }`); `None`:
    /// nothing.
    pub sampling: Option<SampleGrant>,
    /// Whether what its calls read through these grants is journaled with
    /// each call, so that a replay gives it back (`record = true`): each
    /// HTTP response (status, headers, body as the tool read it, secrets
    /// already redacted), and each path of a granted directory as the
    /// call first found it (a file it opened with its bytes) and each
    /// listing it read. At most
    /// [`Tape::MAX_RECORDED_BYTES`](crate::spec::Tape::MAX_RECORDED_BYTES)
    /// of bodies and files a call.
    pub record: bool,
}

/// Whether `text` is a URI scheme (RFC 3986: a letter, then letters,
/// digits, `+`, `-` or `.`).
pub fn is_uri_scheme(text: &str) -> bool {
    text.starts_with(|c: char| c.is_ascii_alphabetic())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// How much a call may ask the model (`sample = { max_tokens,
/// max_requests }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleGrant {
    /// The most tokens one reply may take (a request for more gets this).
    pub max_tokens: u32,
    /// The most requests one call may make; the next fails it.
    pub max_requests: u32,
}

impl SampleGrant {
    /// `sample = {}`: replies of up to 1,024 tokens, 4 a call.
    pub const DEFAULT: SampleGrant = SampleGrant {
        max_tokens: 1024,
        max_requests: 4,
    };
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

    /// Step 4 for every grant: `(grant, line)` pairs for `airlock inspect`.
    pub fn describe(&self) -> Vec<(&'static str, String)> {
        let mut lines = Vec::new();
        let mut add = |kind: &'static str, items: Vec<String>| {
            lines.extend(items.into_iter().map(|line| (kind, line)));
        };
        let recorded = |mut items: Vec<String>, what: &str| {
            if self.record && !items.is_empty() {
                items.push(format!(
                    "{what} recorded in the journal, for replay (record = true)"
                ));
            }
            items
        };
        add(
            "dirs",
            recorded(
                self.dirs.iter().flat_map(Grant::describe).collect(),
                "files read",
            ),
        );
        add("env", self.env.iter().flat_map(Grant::describe).collect());
        add("http", recorded(self.http.describe(), "responses"));
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
