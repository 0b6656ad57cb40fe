//! A session made from the start of another's history ([`Session::fork`]).

use std::sync::Arc;

use super::store::{Fork, Page, SessionStore};
use super::{InvalidId, Session, SessionError, SessionOptions, check_session_id};
use crate::context::ContextRules;
use crate::journal::{StoreError, now_ms};

/// Where a fork ends: its last record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForkPoint {
    /// Record `n` (counted from 1, as `sessions show --json` numbers them).
    Record(u64),
    /// The last record of call `id` (its output, or its ops): the history
    /// up to and including that call.
    Call(String),
}

/// Why a fork was not made. Nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForkError {
    /// A session id that cannot be used.
    #[error(transparent)]
    InvalidId(#[from] InvalidId),
    /// The store refused or failed (no such session, the new id taken).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The fork point is past the session's end (or 0).
    #[error("session {session_id} has no record {at}: {}", numbered(*records))]
    NoRecord {
        /// The session.
        session_id: String,
        /// The record asked for.
        at: u64,
        /// How many records it has.
        records: u64,
    },
    /// The session has no call with that id.
    #[error("session {session_id} has no call {call_id}")]
    NoCall {
        /// The session.
        session_id: String,
        /// The call asked for.
        call_id: String,
    },
}

/// What a session of `records` records numbers them.
fn numbered(records: u64) -> String {
    match records {
        0 => "it has none".to_owned(),
        1 => "it has one, record 1".to_owned(),
        n => format!("its records are numbered 1 to {n}"),
    }
}

impl From<SessionError> for ForkError {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::InvalidId(e) => ForkError::InvalidId(e),
            SessionError::Store(e) => ForkError::Store(e),
        }
    }
}

/// How many records a page of the scan for a call holds.
const PAGE: u64 = 512;

impl Session {
    /// Makes session `to` of `owner` whose history is session `from`'s up
    /// to `at`: its records (copied inside the store, in one transaction:
    /// a fork is all there or not at all), the blobs they name, and its
    /// metadata. Then opens it, as a resume would, so that a call still
    /// open at the fork point is answered "interrupted" (none of its ops
    /// were in it), and lets it go. Both sessions go on independently. `rules` are those of
    /// the host that will run it (as for [`Session::open`]). Returns the
    /// number of records taken from `from`.
    ///
    /// Cost: one statement per table in the store, and a scan of the
    /// copied records for the blobs they name (the store's own text
    /// search; only records naming one come back); a fork at a call reads
    /// `from`'s journal a page at a time to find it.
    pub async fn fork(
        store: Arc<dyn SessionStore>,
        owner: Option<&str>,
        from: &str,
        at: &ForkPoint,
        to: &str,
        rules: &ContextRules,
    ) -> Result<u64, ForkError> {
        check_session_id(to)?;
        let at = match at {
            ForkPoint::Record(n) => {
                let page = Page {
                    owner,
                    session_id: from,
                    after: n.saturating_sub(1),
                    limit: 1,
                };
                let there = *n > 0 && !store.read_page(page).await?.records.is_empty();
                if !there {
                    // Only to say how many there are.
                    let records = store
                        .list(owner)
                        .await?
                        .into_iter()
                        .find(|s| s.session_id == from)
                        .map_or(0, |s| s.records);
                    return Err(ForkError::NoRecord {
                        session_id: from.to_owned(),
                        at: *n,
                        records,
                    });
                }
                *n
            }
            ForkPoint::Call(id) => last_record_of(store.as_ref(), owner, from, id).await?,
        };
        let fork = Fork {
            owner,
            from,
            at,
            to,
            now_ms: now_ms(),
        };
        let held = store.fork(fork).await?;
        let options = SessionOptions {
            user_id: owner.map(str::to_owned),
            session_id: Some(to.to_owned()),
            ..SessionOptions::default()
        };
        let session = Session::open(store, options, rules).await?;
        session.close().await?;
        Ok(held)
    }
}

/// The number of the last record of call `call_id` in session `from`.
async fn last_record_of(
    store: &dyn SessionStore,
    owner: Option<&str>,
    from: &str,
    call_id: &str,
) -> Result<u64, ForkError> {
    let mut after = 0;
    let mut last = None;
    loop {
        let page = Page {
            owner,
            session_id: from,
            after,
            limit: PAGE,
        };
        let records = store.read_page(page).await?.records;
        let Some(end) = records.last().map(|r| r.seq) else {
            break;
        };
        for record in &records {
            if record.entry.call_id() == Some(call_id) {
                last = Some(record.seq);
            }
        }
        after = end;
    }
    last.ok_or_else(|| ForkError::NoCall {
        session_id: from.to_owned(),
        call_id: call_id.to_owned(),
    })
}
