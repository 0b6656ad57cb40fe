//! Retention (a policy's `[sessions]`): how long a session store keeps
//! sessions, and which of its commits wait for the disk (`sync`).
//!
//! A session is pruned when it was last updated longer ago than its
//! retention: `ttl` for every session, `ephemeral_ttl` (shorter, by
//! default a day) for one made for a single unnamed run. The store does
//! the pruning ([`crate::session::SessionStore::prune`]), and never
//! touches a session whose lease has not expired.

use std::time::Duration;

use serde::Deserialize;

use crate::journal::Durability;

/// How long an ephemeral session is kept after its last update unless the
/// policy says otherwise (`[sessions] ephemeral_ttl`).
pub const DEFAULT_EPHEMERAL_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// A policy's `[sessions]`: how long sessions are kept, and which commits
/// wait for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Every session is pruned this long after its last update (`None`:
    /// kept until removed or pruned by hand).
    pub ttl: Option<Duration>,
    /// An ephemeral session is pruned this long after its last update
    /// (when the store prunes at all), or after `ttl` if that is shorter.
    pub ephemeral_ttl: Duration,
    /// `sync`: which commits of the store wait for the disk (`None`: not
    /// said, [`Durability::ByEffect`]).
    pub sync: Option<Durability>,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            ttl: None,
            ephemeral_ttl: DEFAULT_EPHEMERAL_TTL,
            sync: None,
        }
    }
}

impl Retention {
    /// The cutoffs (ms since the epoch) that keep sessions updated within
    /// `older_than` of `now_ms`, and ephemeral ones within `ephemeral_ttl`
    /// (or `older_than` if shorter): (every session, ephemeral sessions).
    pub fn cutoffs(&self, older_than: Duration, now_ms: u64) -> (u64, u64) {
        let before = |age: Duration| {
            now_ms.saturating_sub(u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
        };
        (
            before(older_than),
            before(older_than.min(self.ephemeral_ttl)),
        )
    }
}

/// `[sessions]` as written: durations like `30d`, `12h`, `90m`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetentionFile {
    ttl: Option<String>,
    ephemeral_ttl: Option<String>,
    sync: Option<String>,
}

impl RetentionFile {
    pub(crate) fn retention(self) -> Result<Retention, String> {
        let parse = |name: &str, text: &str| match humantime::parse_duration(text) {
            Ok(d) if !d.is_zero() => Ok(d),
            Ok(_) => Err(format!("[sessions] {name} must be longer than 0")),
            Err(e) => Err(format!(
                "[sessions] {name} = {:?}: {e} (write it like \"30d\", \"12h\")",
                crate::text::truncate(text, 40)
            )),
        };
        Ok(Retention {
            ttl: self.ttl.as_deref().map(|t| parse("ttl", t)).transpose()?,
            ephemeral_ttl: match self.ephemeral_ttl.as_deref() {
                Some(t) => parse("ephemeral_ttl", t)?,
                None => DEFAULT_EPHEMERAL_TTL,
            },
            sync: match self.sync.as_deref() {
                None => None,
                Some(name) => Some(Durability::from_name(name).ok_or_else(|| {
                    format!(
                        "[sessions] sync = {:?}: not one of {}",
                        crate::text::truncate(name, 40),
                        Durability::ALL
                            .map(|d| format!("\"{}\"", d.name()))
                            .join(", ")
                    )
                })?),
            },
        })
    }
}

/// `--older-than 30d` on the command line.
pub fn parse_age(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (write it like \"30d\", \"12h\")"))
}
