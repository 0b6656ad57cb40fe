//! What the SQL stores share: the partition key, records and headers as
//! column values, the lease columns and when they block, and a session
//! decoded back from its rows. No SQL here: each store writes its own.

use std::time::Duration;

use super::Holder;
use super::store::{Owner, SessionHeader, StoredSession, StoredSnapshot};
use crate::journal::{Entry, Record, StoreError, entry_from_json};
use crate::spec::Shown;

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
    // Both stores keep times as signed 64-bit numbers: a lease longer than
    // they can hold ends when they can still say (in some 292 million
    // years), rather than failing the open.
    let never = i64::MAX.unsigned_abs();
    now_ms
        .saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(never))
        .min(never)
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
    /// The entry, each of its blobs replaced by [`BLOB_MARK`] and the
    /// blob's digest.
    pub entry: String,
    /// The keyed call the entry is part of, indexed ([`Entry::call_key`]).
    pub call_id: Option<String>,
    /// The blobs the entry names, to keep once per session (empty as read:
    /// they are joined back into the entry by [`decode_records`]).
    pub blobs: Vec<Blob>,
}

/// The bytes of an image, a sound or a binary resource a call showed
/// (base64, as journaled), kept once per session however many records
/// hold it: the records name it by digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blob {
    /// The SHA-256 of `data`, hex.
    pub digest: String,
    /// The base64 text.
    pub data: String,
}

/// The mark's text, for both of its forms below.
macro_rules! blob_mark {
    () => {
        "sha256:"
    };
}

/// What stands for a blob in a stored entry, before its digest: a base64
/// text never holds a `:`, so no tool's bytes read as a mark.
pub(crate) const BLOB_MARK: &str = blob_mark!();

/// [`BLOB_MARK`] as it opens a JSON string in a stored entry's text: what
/// is searched for to find the entries that name a blob.
pub(crate) const QUOTED_MARK: &str = concat!("\"", blob_mark!());

/// The least base64 text kept apart as a blob: a smaller one stays in its
/// record (a digest and a lookup would cost more than it saves).
pub(crate) const MIN_BLOB: usize = 1024;

/// Records as rows.
pub(crate) fn encode(records: &[Record]) -> Result<Vec<Row>, StoreError> {
    records
        .iter()
        .map(|r| {
            let mut blobs = Vec::new();
            let apart = blobs_apart(&r.entry, &mut blobs).map_err(|()| StoreError::Backend {
                location: "session record".into(),
                message: format!(
                    "record {} shows bytes that are not base64 (they read as a stored blob's \
                     name): refused",
                    r.seq
                ),
            })?;
            serde_json::to_string(apart.as_ref().unwrap_or(&r.entry))
                .map(|entry| Row {
                    seq: r.seq,
                    at_ms: r.at_ms,
                    entry,
                    call_id: r.entry.call_key().map(str::to_owned),
                    blobs,
                })
                .map_err(|e| StoreError::Backend {
                    location: "session record".into(),
                    message: format!("record {} does not serialize: {e}", r.seq),
                })
        })
        .collect()
}

/// The base64 texts a call output's shown blocks hold (images, sounds,
/// binary resources), as places to read or replace.
fn blob_fields(entry: &mut Entry) -> Vec<&mut String> {
    let (Entry::Event { event, .. } | Entry::Item { event, .. }) = entry else {
        return Vec::new();
    };
    let crate::journal::Item::FunctionCallOutput { guest, .. } = &mut event.item else {
        return Vec::new();
    };
    guest.shown.iter_mut().filter_map(bytes_of).collect()
}

/// The base64 text a shown block holds, if it holds bytes.
fn bytes_of(block: &mut Shown) -> Option<&mut String> {
    match block {
        Shown::Image { data, .. } | Shown::Audio { data, .. } => Some(data),
        Shown::Resource {
            blob: Some(data), ..
        } => Some(data),
        _ => None,
    }
}

/// Puts back each blob `fields` name from what `find` gives for its
/// digest; the digest of one it lacks, if any.
fn join(fields: Vec<&mut String>, find: impl Fn(&str) -> Option<String>) -> Result<(), String> {
    for data in fields {
        let Some(digest) = data.strip_prefix(BLOB_MARK) else {
            continue;
        };
        *data = find(digest).ok_or_else(|| digest.to_owned())?;
    }
    Ok(())
}

/// `entry` with each blob of at least [`MIN_BLOB`] replaced by its mark,
/// the blobs pushed to `blobs`; `None` when it has none. Only an entry
/// that shows something is copied. `Err` for bytes that already read as
/// a mark (not base64: only an imported file can hold them), which would
/// name a blob on the way back.
fn blobs_apart(entry: &Entry, blobs: &mut Vec<Blob>) -> Result<Option<Entry>, ()> {
    use sha2::Digest;
    let shows = matches!(entry, Entry::Event { event, .. } | Entry::Item { event, .. }
        if matches!(&event.item, crate::journal::Item::FunctionCallOutput { guest, .. }
            if !guest.shown.is_empty()));
    if !shows {
        return Ok(None);
    }
    let mut apart = entry.clone();
    let mut any = false;
    for data in blob_fields(&mut apart) {
        if data.starts_with(BLOB_MARK) {
            return Err(());
        }
        if data.len() < MIN_BLOB {
            continue;
        }
        let digest = hex::encode(sha2::Sha256::digest(data.as_bytes()));
        let text = std::mem::replace(data, format!("{BLOB_MARK}{digest}"));
        if !blobs.iter().any(|b| b.digest == digest) {
            blobs.push(Blob { digest, data: text });
        }
        any = true;
    }
    Ok(any.then_some(apart))
}

/// The blobs of `rows`, each once.
pub(crate) fn distinct_blobs(rows: &[Row]) -> Vec<&Blob> {
    let mut distinct: Vec<&Blob> = Vec::new();
    for blob in rows.iter().flat_map(|row| &row.blobs) {
        if !distinct.iter().any(|b| b.digest == blob.digest) {
            distinct.push(blob);
        }
    }
    distinct
}

/// The base64 texts the tool messages of `snapshot` hold (what calls
/// showed), as places to read or replace.
fn snapshot_fields(snapshot: &mut crate::journal::Snapshot) -> Vec<&mut String> {
    snapshot
        .messages
        .iter_mut()
        .filter_map(|message| match message {
            crate::journal::Message::Tool { shown, .. } => Some(shown),
            _ => None,
        })
        .flatten()
        .filter_map(bytes_of)
        .collect()
}

/// `snapshot` as stored: its encoding with each blob of at least
/// [`MIN_BLOB`] named by digest, and those blobs. `snapshot` is as it
/// was after (its blobs are moved out for the encoding and back).
pub(crate) fn snapshot_apart(
    snapshot: &mut crate::journal::Snapshot,
) -> (String, std::collections::BTreeMap<String, String>) {
    use sha2::Digest;
    let mut blobs = std::collections::BTreeMap::new();
    let mut taken = Vec::new();
    for data in snapshot_fields(snapshot) {
        if data.len() < MIN_BLOB {
            continue;
        }
        let digest = hex::encode(sha2::Sha256::digest(data.as_bytes()));
        let mark = format!("{BLOB_MARK}{digest}");
        let text = std::mem::replace(data, mark);
        blobs.entry(digest).or_insert_with(|| text.clone());
        taken.push(text);
    }
    let body = snapshot.encode();
    let mut taken = taken.into_iter();
    for data in snapshot_fields(snapshot) {
        // A base64 text never starts with the mark.
        if data.starts_with(BLOB_MARK)
            && let Some(text) = taken.next()
        {
            *data = text;
        }
    }
    (body, blobs)
}

/// Puts the blobs `snapshot` names back from `blobs`; the digest of one
/// missing, if any.
pub(crate) fn snapshot_join(
    snapshot: &mut crate::journal::Snapshot,
    blobs: &std::collections::BTreeMap<String, String>,
) -> Result<(), String> {
    join(snapshot_fields(snapshot), |digest| {
        blobs.get(digest).cloned()
    })
}

/// Gives `snapshot` the blobs (of `blobs`, all a read found) its body
/// names.
pub(crate) fn snapshot_blobs(
    snapshot: &mut StoredSnapshot,
    blobs: &std::collections::HashMap<String, String>,
) {
    let mut named = Vec::new();
    marks_in(&snapshot.body, &mut named);
    snapshot.blobs = named
        .into_iter()
        .filter_map(|digest| Some((digest.clone(), blobs.get(&digest)?.clone())))
        .collect();
}

/// The digests of the marks in `text` (see [`wanted_blobs`]), added to
/// `wanted`.
pub(crate) fn marks_in(text: &str, wanted: &mut Vec<String>) {
    let mut rest = text;
    while let Some(at) = rest.find(QUOTED_MARK) {
        rest = &rest[at + QUOTED_MARK.len()..];
        let digest = rest
            .get(..64)
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()) && rest[64..].starts_with('"'));
        if let Some(digest) = digest
            && !wanted.iter().any(|w| w == digest)
        {
            wanted.push(digest.to_owned());
        }
    }
}

/// The digests of the blobs `rows` name (a row may name some twice, and
/// a text that merely looks like a mark is named too: looking it up finds
/// nothing and costs a lookup).
pub(crate) fn wanted_blobs(rows: &[Row]) -> Vec<String> {
    let mut wanted = Vec::new();
    for row in rows {
        marks_in(&row.entry, &mut wanted);
    }
    wanted
}

/// Puts the blobs `entry` names back from `blobs` (digest to base64);
/// the digest of one missing, if any.
fn join_blobs(
    entry: &mut Entry,
    blobs: &std::collections::HashMap<String, String>,
) -> Result<(), String> {
    join(blob_fields(entry), |digest| blobs.get(digest).cloned())
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

/// The records of `rows` (in order), their blobs joined back from
/// `blobs` (digest to base64: those [`wanted_blobs`] named);
/// [`StoreError::Corrupt`] names the one that does not parse, or whose
/// blob the store lacks.
pub(crate) fn decode_records(
    session_id: &str,
    rows: impl IntoIterator<Item = Row>,
    blobs: &std::collections::HashMap<String, String>,
) -> Result<Vec<Record>, StoreError> {
    let corrupt = |problem: String| StoreError::Corrupt {
        session_id: session_id.to_owned(),
        problem,
    };
    rows.into_iter()
        .map(|row| {
            let mut entry = entry_from_json(&row.entry)
                .map_err(|e| corrupt(format!("record {} does not parse: {e}", row.seq)))?;
            join_blobs(&mut entry, blobs).map_err(|digest| {
                corrupt(format!(
                    "record {} names blob {BLOB_MARK}{digest}, which the store lacks",
                    row.seq
                ))
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
    entry_from_json(entry).ok()?.call_id().map(str::to_owned)
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
    blobs: &std::collections::HashMap<String, String>,
) -> Result<StoredSession, StoreError> {
    let corrupt = |problem: String| StoreError::Corrupt {
        session_id: session_id.to_owned(),
        problem,
    };
    let metadata = serde_json::from_str(&header.metadata)
        .map_err(|e| corrupt(format!("its metadata does not parse: {e}")))?;
    let records = decode_records(session_id, rows, blobs)?;
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
