//! What the SQL stores share: the partition key, records and headers as
//! column values, the lease columns and when they block, and a session
//! decoded back from its rows. No SQL here: each store writes its own.

use std::time::Duration;

use super::Holder;
use super::store::{Owner, SessionHeader, StoredSession, StoredSnapshot};
use crate::journal::{Entry, Record, StoreError};

/// A failure inside a store operation: the store's own verdict, or its
/// backend's error `E` (which the store turns into [`StoreError::Backend`]).
pub(crate) enum Failure<E> {
    Store(StoreError),
    Backend(E),
}

impl<E> From<StoreError> for Failure<E> {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

/// Which of a session's records a read returns.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Span {
    /// The newest snapshot and the records after it.
    FromSnapshot,
    /// At most `limit` records after record `after`.
    Page { after: u64, limit: u64 },
}

impl Span {
    /// The records `page` names.
    pub(crate) fn page(page: &super::store::Page<'_>) -> Self {
        Span::Page {
            after: page.after,
            limit: page.limit,
        }
    }
}

impl Span {
    /// Whether the snapshot is read.
    pub(crate) fn snapshot(self) -> bool {
        matches!(self, Span::FromSnapshot)
    }

    /// The records after this one and how many at most, given the
    /// snapshot read (if any).
    pub(crate) fn bounds(self, snapshot_seq: u64) -> (i64, i64) {
        let big = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        match self {
            Span::FromSnapshot => (big(snapshot_seq), i64::MAX),
            Span::Page { after, limit } => (big(after), big(limit)),
        }
    }
}

/// When a lease taken or renewed at `now_ms` expires.
pub(crate) fn expiry(now_ms: u64, ttl: Duration) -> u64 {
    now_ms.saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
}

/// The partition key: the user id, or `""` for the anonymous bucket (user
/// ids are never empty).
pub(crate) fn owner_key(owner: Owner<'_>) -> String {
    owner_key_of(owner).to_owned()
}

/// [`owner_key`], borrowed.
pub(crate) fn owner_key_of(owner: Owner<'_>) -> &str {
    owner.unwrap_or_default()
}

/// The owner a partition key stands for.
pub(crate) fn owner_of(key: String) -> Option<String> {
    (!key.is_empty()).then_some(key)
}

/// One journal record as columns: its number, time and entry (JSON text,
/// kept byte for byte: key order is part of deps).
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub seq: u64,
    pub at_ms: u64,
    pub entry: String,
    /// The keyed call the entry is part of, indexed ([`Entry::call_key`]).
    pub call_id: Option<String>,
}

/// Records as rows.
pub(crate) fn encode(records: &[Record]) -> Result<Vec<Row>, StoreError> {
    records
        .iter()
        .map(|r| {
            serde_json::to_string(&r.entry)
                .map(|entry| Row {
                    seq: r.seq,
                    at_ms: r.at_ms,
                    entry,
                    call_id: r.entry.call_key().map(str::to_owned),
                })
                .map_err(|e| StoreError::Backend {
                    location: "session record".into(),
                    message: format!("record {} does not serialize: {e}", r.seq),
                })
        })
        .collect()
}

/// A session's row and journal, encoded for inserting.
#[derive(Debug)]
pub(crate) struct NewSession {
    pub owner: String,
    pub session_id: String,
    pub created_at_ms: u64,
    /// The metadata as a JSON object of strings.
    pub metadata: String,
    pub ephemeral: bool,
    pub rows: Vec<Row>,
}

impl NewSession {
    pub(crate) fn of(header: &SessionHeader, records: &[Record]) -> Result<Self, StoreError> {
        let metadata = header
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        Ok(Self {
            owner: owner_key(header.user_id.as_deref()),
            session_id: header.session_id.clone(),
            created_at_ms: header.created_at_ms,
            metadata: serde_json::Value::Object(metadata).to_string(),
            ephemeral: header.ephemeral,
            rows: encode(records)?,
        })
    }

    /// The number of the last record (0 for none).
    pub(crate) fn head(&self) -> u64 {
        self.rows.last().map_or(0, |r| r.seq)
    }
}

/// A session's lease columns.
#[derive(Debug)]
pub(crate) struct LeaseRow {
    pub holder: Option<String>,
    pub token: u64,
    pub expires_ms: u64,
}

impl LeaseRow {
    /// How long the lease still blocks others, if it does: it has a holder,
    /// has not expired, and its holder is not known to be gone.
    pub(crate) fn blocks(&self, now_ms: u64) -> Option<u64> {
        let holder = self.holder.as_deref()?;
        (self.expires_ms > now_ms && !holder.parse().is_ok_and(|h: Holder| h.is_gone()))
            .then(|| self.expires_ms - now_ms)
    }

    /// Until when the lease blocks others, if it does at `now_ms` (what a
    /// listing shows).
    pub(crate) fn blocking_until(&self, now_ms: u64) -> Option<u64> {
        self.blocks(now_ms).map(|_| self.expires_ms)
    }

    /// The lease blocking a request at `now_ms`, as the error to return.
    pub(crate) fn check_free(&self, session_id: &str, now_ms: u64) -> Result<(), StoreError> {
        match self.blocks(now_ms) {
            Some(expires_in_ms) => Err(StoreError::InUse {
                session_id: session_id.to_owned(),
                expires_in_ms,
            }),
            None => Ok(()),
        }
    }
}

/// A session's header columns.
#[derive(Debug)]
pub(crate) struct HeaderRow {
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    pub metadata: String,
    pub ephemeral: bool,
}

/// The records of `rows` (in order); [`StoreError::Corrupt`] names the
/// one that does not parse.
pub(crate) fn decode_records(
    session_id: &str,
    rows: impl IntoIterator<Item = Row>,
) -> Result<Vec<Record>, StoreError> {
    rows.into_iter()
        .map(|row| {
            let mut entry: Entry =
                serde_json::from_str(&row.entry).map_err(|e| StoreError::Corrupt {
                    session_id: session_id.to_owned(),
                    problem: format!("record {} does not parse: {e}", row.seq),
                })?;
            // Indexed is keyed: a record stored before keyed calls were
            // marked, indexed then, reads back marked, so that an export of
            // it still says what a key finds.
            if row.call_id.is_some() {
                entry.mark_keyed();
            }
            Ok(Record::new(row.seq, row.at_ms, entry))
        })
        .collect()
}

/// The call id of a record stored before the column existed (a
/// migration's backfill): `None` for an entry about no call, or one that
/// does not parse (the fold reports that one when it is read). Every
/// call's, keyed or not: a key then found any earlier call with its id,
/// and still does.
pub(crate) fn call_id_of(entry: &str) -> Option<String> {
    serde_json::from_str::<Entry>(entry)
        .ok()?
        .call_id()
        .map(str::to_owned)
}

/// A session from its header row, its snapshot (if read) and its
/// records' rows (in order); [`StoreError::Corrupt`] names what does not
/// parse.
pub(crate) fn decode_session(
    owner: &str,
    session_id: &str,
    header: HeaderRow,
    snapshot: Option<StoredSnapshot>,
    rows: impl IntoIterator<Item = Row>,
) -> Result<StoredSession, StoreError> {
    let corrupt = |problem: String| StoreError::Corrupt {
        session_id: session_id.to_owned(),
        problem,
    };
    let metadata = serde_json::from_str(&header.metadata)
        .map_err(|e| corrupt(format!("its metadata does not parse: {e}")))?;
    let records = decode_records(session_id, rows)?;
    Ok(StoredSession {
        header: SessionHeader {
            session_id: session_id.to_owned(),
            user_id: owner_of(owner.to_owned()),
            created_at_ms: header.created_at_ms,
            metadata,
            ephemeral: header.ephemeral,
        },
        updated_at_ms: header.updated_at_ms,
        snapshot,
        records,
    })
}
