//! Where a conversation's records go as it runs ([`Sink`]), and what
//! committing them can fail with ([`StoreError`]).
//!
//! The agent loop and a session's direct calls record through a
//! [`Conversation`]: the live context, the transcript, and a sink (a
//! leased session's journal) or none (an in-memory run).

use crate::context::RunContext;
use crate::kind::ErrorKind;
use futures::future::BoxFuture;

use super::record::Entry;
use super::transcript::Transcript;

/// How soon a commit must reach the disk.
///
/// Every commit is atomic and, once it returns, survives a crash of the
/// process. What differs is a power cut: a [`Flush::Now`] commit is on
/// disk before it returns; a [`Flush::Deferred`] one is written without
/// waiting for the disk and reaches it with the next commit that does
/// wait (or the store's next checkpoint), so a power cut can lose the
/// deferred commits since the last waited one, never one before it nor a
/// part of one. The store's [`Durability`] may wait for every commit
/// anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flush {
    /// On disk before the commit returns: anything that changed state,
    /// reached outside the sandbox, or holds what a person or model said.
    #[default]
    Now,
    /// Written at once, on disk with the next commit that waits: a call
    /// that changed nothing and could reach nothing outside, whose loss
    /// in a power cut loses only its record (running it again does no
    /// harm). Saves the disk's flush, about 0.4 ms on a common SSD.
    Deferred,
}

/// Which commits wait for the disk: what a power cut can lose. Every
/// commit survives a crash of the process whatever this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every commit is on disk before it returns (`every-call`).
    EveryCall,
    /// A commit that asks for [`Flush::Now`] is on disk before it returns;
    /// a [`Flush::Deferred`] one (a call that changed nothing and could
    /// reach nothing) reaches the disk with the next that waits
    /// (`by-effect`, the default). A power cut loses at most the deferred
    /// commits after the last one that waited.
    #[default]
    ByEffect,
    /// No commit waits for the disk; the store's checkpoints do (`never`).
    /// A power cut may lose the last commits of any kind.
    Never,
}

impl Durability {
    /// Every durability, by name.
    pub const ALL: [Durability; 3] = [
        Durability::EveryCall,
        Durability::ByEffect,
        Durability::Never,
    ];

    /// The name the policy's `[sessions] sync` and `AIRLOCK_STORE_SYNC`
    /// use: `every-call`, `by-effect`, `never`.
    pub fn name(self) -> &'static str {
        match self {
            Durability::EveryCall => "every-call",
            Durability::ByEffect => "by-effect",
            Durability::Never => "never",
        }
    }

    /// The durability named `name` (also `full` for `every-call` and
    /// `normal` for `never`, the names of earlier versions).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "full" => Some(Durability::EveryCall),
            "normal" => Some(Durability::Never),
            name => Self::ALL.into_iter().find(|d| d.name() == name),
        }
    }
}

/// The write side of a durable conversation: a leased session's journal.
///
/// Implemented by [`crate::Session`]; an embedder may implement it to
/// record conversations elsewhere.
pub trait Sink: Send {
    /// Commits `entries` in order as one transaction, with `ctx`'s usage
    /// totals and iteration when they changed since the last commit, on
    /// disk as `flush` says. Nothing is committed once the sink's lease is
    /// lost ([`StoreError::LeaseLost`]).
    fn commit<'a>(
        &'a mut self,
        ctx: &'a RunContext,
        entries: Vec<Entry>,
        flush: Flush,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// A conversation to record into: the live context (its deps keep hidden
/// and secret-looking keys; nothing recorded does), the transcript, and
/// where its records are committed (`None`: nowhere, an in-memory run).
pub struct Conversation<'c> {
    /// The live context.
    pub ctx: &'c mut RunContext,
    /// The messages and the item log so far.
    pub transcript: &'c mut Transcript,
    /// Where records are committed.
    pub sink: Option<&'c mut dyn Sink>,
}

impl std::fmt::Debug for Conversation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conversation")
            .field("session_id", &self.ctx.session_id())
            .field("items", &self.transcript.items.len())
            .field("durable", &self.sink.is_some())
            .finish()
    }
}

/// `ms` as a person reads it: `29 s`, `0.4 s`.
fn seconds(ms: u64) -> String {
    if ms >= 10_000 {
        format!("{} s", ms.div_ceil(1000))
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// A store operation that failed: reading, leasing, or committing a
/// journal.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Another run holds the session's lease.
    #[error(
        "session is in use: {session_id} is being run elsewhere (its lease expires in {} unless renewed)",
        seconds(*expires_in_ms)
    )]
    InUse {
        /// The session.
        session_id: String,
        /// Until the lease expires, unless its holder renews it.
        expires_in_ms: u64,
    },
    /// The owner has no session with that id.
    #[error("no session {session_id}")]
    NotFound {
        /// The session asked for.
        session_id: String,
    },
    /// The owner already has a session with that id.
    #[error("session {session_id} already exists")]
    AlreadyExists {
        /// The session.
        session_id: String,
    },
    /// The lease expired and another run took the session; nothing more
    /// was saved.
    #[error(
        "lost the lease on session {session_id}: another run took it over; this run's later changes were not saved"
    )]
    LeaseLost {
        /// The session.
        session_id: String,
    },
    /// The stored journal does not fold.
    #[error("session {session_id} is damaged: {problem}")]
    Corrupt {
        /// The session.
        session_id: String,
        /// What is wrong, naming the record.
        problem: String,
    },
    /// The store is not one Airlock can use: not a file (a directory, a
    /// device, a pipe), not a database, damaged, a database of another
    /// program, or written by a newer Airlock.
    #[error("{location}: not a session store this Airlock can use: {problem}")]
    NotAStore {
        /// Where the store is.
        location: String,
        /// Why.
        problem: String,
    },
    /// The backend failed (cannot open, I/O, a full disk, ...).
    #[error("{location}: {message}")]
    Backend {
        /// Where the store is.
        location: String,
        /// What went wrong.
        message: String,
    },
}

impl StoreError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::InUse { .. } => ErrorKind::SessionInUse,
            StoreError::NotFound { .. } => ErrorKind::SessionNotFound,
            StoreError::AlreadyExists { .. } => ErrorKind::SessionExists,
            StoreError::LeaseLost { .. } => ErrorKind::LeaseLost,
            StoreError::Corrupt { .. } => ErrorKind::SessionDamaged,
            StoreError::NotAStore { .. } => ErrorKind::InvalidStore,
            StoreError::Backend { .. } => ErrorKind::StoreError,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_says_seconds() {
        let in_use = |ms| {
            StoreError::InUse {
                session_id: "s".into(),
                expires_in_ms: ms,
            }
            .to_string()
        };
        assert!(
            in_use(29_112).contains("expires in 30 s unless"),
            "{}",
            in_use(29_112)
        );
        assert!(in_use(400).contains("expires in 0.4 s unless"));
    }
}
