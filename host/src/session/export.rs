//! Versioned export and import of one session.
//!
//! ```json
//! {
//!   "version": 3,
//!   "session_id": "sess_…", "user_id": null,
//!   "created_at_ms": 1763900000000, "updated_at_ms": 1763900004000,
//!   "metadata": {},
//!   "deps": {…}, "usage": {…}, "iteration": 2,
//!   "messages": [ … ], "items": [ … ],
//!   "journal": [ {"seq": 1, "at_ms": …, "entry": "deps", "deps": {…}}, … ]
//! }
//! ```
//!
//! `journal` is the session itself; `deps`, `usage`, `iteration`,
//! `messages` and `items` are its fold, written out for readers. An import
//! checks that they agree, so a file edited in one place and not the other
//! is refused rather than half believed. Hidden and secret-looking keys are
//! removed on the way out and again on the way in.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::store::{Owner, Page, SessionHeader, SessionStore, StoredSession};
use crate::context::{ContextRules, Usage};
use crate::journal::Message;
use crate::journal::{Event, Folded, Record, StoreError, secrets};

/// The export format this version writes and reads: 3 holds journals
/// of record format 2 (items only, `"entry": "event"`; an older Airlock
/// refuses the version instead of misreading them); 2 marked a keyed
/// call's items (`"keyed": true` in their journal entries). Versions 1
/// and 2 are read too; in version 1 every call's items are taken as a
/// keyed call's (a key found any earlier call with its id).
pub const EXPORT_VERSION: u64 = 3;

/// A session as a versioned JSON document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionExport {
    /// Always [`EXPORT_VERSION`].
    pub version: u64,
    /// The session's id.
    pub session_id: String,
    /// Its owner (`null`: the anonymous bucket).
    pub user_id: Option<String>,
    /// When it was created (ms since the Unix epoch).
    pub created_at_ms: u64,
    /// When its last record was committed.
    pub updated_at_ms: u64,
    /// Opaque string pairs.
    pub metadata: BTreeMap<String, String>,
    /// Deps: the fold of the journal.
    pub deps: Map<String, Value>,
    /// Usage totals.
    pub usage: Usage,
    /// The last model request's number.
    pub iteration: u32,
    /// The conversation the model sees.
    pub messages: Vec<Message>,
    /// The item log.
    pub items: Vec<Event>,
    /// The journal: every record, in order.
    pub journal: Vec<Record>,
}

/// An export that cannot be imported. Nothing was imported.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// No `version`, or one that is not a whole number.
    #[error("missing or invalid version field")]
    MissingVersion,
    /// A version this Airlock does not read.
    #[error("unsupported version: {} ({})", .0, readable(*.0))]
    UnsupportedVersion(u64),
    /// Not JSON, or not the version's shape.
    #[error("invalid session file: {0}")]
    Invalid(String),
    /// The journal does not fold, or its fold is not what the file says.
    #[error("inconsistent session file: {0}")]
    Inconsistent(String),
    /// The file could not be read to its end.
    #[error("cannot read the session file: {0}")]
    Read(String),
    /// The journal could not be kept in a temporary file while the file
    /// is checked (a full disk, say).
    #[error("cannot stage the import in a temporary file: {0}")]
    Stage(String),
    /// The session belongs to another user than the one importing it
    /// ([`stage_for_user`](super::import::stage_for_user)): this one
    /// (`None`: the anonymous bucket).
    #[error("the session belongs to {}", owner(.0.as_deref()))]
    WrongUser(Option<String>),
}

/// What this Airlock reads, beside a `version` it does not.
fn readable(version: u64) -> String {
    let newer = if version > EXPORT_VERSION {
        "; a newer Airlock wrote this file"
    } else {
        ""
    };
    format!("this Airlock reads versions 1 to {EXPORT_VERSION}{newer}")
}

/// Whose a session is, in words.
fn owner(user: Option<&str>) -> String {
    user.map_or("the anonymous bucket".to_owned(), |u| format!("user {u:?}"))
}

impl SessionExport {
    /// The export of `session` (read from a store). Keys that are hidden by
    /// `rules` or look secret are removed, in deps and in every record.
    pub fn new(session: &StoredSession, rules: &ContextRules) -> Result<Self, ImportError> {
        let journal: Vec<Record> = session
            .records
            .iter()
            .map(|r| secrets::scrub_record(r.clone(), rules))
            .collect();
        let folded =
            Folded::fold(&journal).map_err(|e| ImportError::Inconsistent(e.to_string()))?;
        Ok(Self::of(
            session.header.clone(),
            session.updated_at_ms,
            folded,
            journal,
        ))
    }

    /// The export of a session whose (scrubbed) `journal` folds to
    /// `folded`.
    pub(super) fn of(
        header: SessionHeader,
        updated_at_ms: u64,
        folded: Folded,
        journal: Vec<Record>,
    ) -> Self {
        Self {
            version: EXPORT_VERSION,
            session_id: header.session_id,
            user_id: header.user_id,
            created_at_ms: header.created_at_ms,
            updated_at_ms,
            metadata: header.metadata,
            deps: folded.deps,
            usage: folded.usage,
            iteration: folded.iteration,
            messages: folded.transcript.messages,
            items: folded.transcript.items,
            journal,
        }
    }

    /// The session's header. An imported session is kept like a named
    /// one (never ephemeral: someone chose to keep it).
    pub fn header(&self) -> SessionHeader {
        SessionHeader {
            session_id: self.session_id.clone(),
            user_id: self.user_id.clone(),
            created_at_ms: self.created_at_ms,
            metadata: self.metadata.clone(),
            ephemeral: false,
        }
    }
}

/// How many records a streamed export reads at a time.
const EXPORT_PAGE: u64 = 64;

/// What a streamed export failed on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Writing the document failed.
    #[error("cannot write the export: {0}")]
    Write(#[from] std::io::Error),
}

/// A session's journal read a page at a time, each page's records
/// scrubbed of hidden and secret-looking keys and folded as they come:
/// memory is a page and the fold's deps, usage and open calls, never the
/// session's length (the fold keeps no transcript).
#[derive(Debug)]
pub struct JournalPages<'a> {
    store: &'a dyn SessionStore,
    owner: Owner<'a>,
    rules: &'a ContextRules,
    /// The session's header, as read before its first page.
    pub header: SessionHeader,
    /// When its last record was committed, as read before its first page.
    pub updated_at_ms: u64,
    /// The fold so far; its transcript holds what the last page said.
    state: Folded,
    last: u64,
    done: bool,
}

impl<'a> JournalPages<'a> {
    /// Reads the header of `owner`'s session `session_id`; no record yet.
    pub async fn open(
        store: &'a dyn SessionStore,
        owner: Owner<'a>,
        session_id: &str,
        rules: &'a ContextRules,
    ) -> Result<Self, StoreError> {
        let first = store
            .read_page(Page {
                owner,
                session_id,
                after: 0,
                limit: 0,
            })
            .await?;
        Ok(Self {
            store,
            owner,
            rules,
            header: first.header,
            updated_at_ms: first.updated_at_ms,
            state: Folded::default(),
            last: 0,
            done: false,
        })
    }

    /// The next page of records (at most 64), scrubbed and
    /// folded; `None` after the last.
    pub async fn next(&mut self) -> Result<Option<Vec<Record>>, StoreError> {
        if self.done {
            return Ok(None);
        }
        // What the previous page said, if nobody took it.
        self.state.transcript.take_said();
        let session_id = &self.header.session_id;
        let page = self
            .store
            .read_page(Page {
                owner: self.owner,
                session_id,
                after: self.last,
                limit: EXPORT_PAGE,
            })
            .await?;
        let records: Vec<Record> = page
            .records
            .into_iter()
            .map(|r| secrets::scrub_record(r, self.rules))
            .collect();
        self.state
            .fold_from(self.last + 1, &records)
            .map_err(|e| StoreError::Corrupt {
                session_id: session_id.clone(),
                problem: e.to_string(),
            })?;
        self.done = (records.len() as u64) < EXPORT_PAGE;
        match records.last() {
            Some(record) => self.last = record.seq,
            None => return Ok(None),
        }
        Ok(Some(records))
    }

    /// The messages and the items of the last page read (what its
    /// records say), taken.
    pub fn take_said(&mut self) -> (Vec<Message>, Vec<Event>) {
        self.state.transcript.take_said()
    }

    /// The fold of the pages read so far (deps, usage, iteration; no
    /// transcript).
    pub fn folded(&self) -> &Folded {
        &self.state
    }

    /// The number of the last record read.
    pub fn last(&self) -> u64 {
        self.last
    }
}

/// Writes the export of `owner`'s session `session_id` to `out` (the same
/// document as [`SessionExport`], a field or an array element a line, and
/// then each of `extra`'s fields), reading its journal once, a page at a
/// time ([`JournalPages`]): memory is bounded by a page and the session's
/// deps, not by the session's length. The messages and items, which the
/// document lists after the journal, are kept in two unnamed temporary
/// files meanwhile (disk, not memory). Keys hidden by `rules` or
/// secret-looking are removed. Returns how many records it wrote.
pub async fn write_export(
    store: &dyn SessionStore,
    owner: Owner<'_>,
    session_id: &str,
    rules: &ContextRules,
    extra: &[(&str, Value)],
    out: &mut dyn std::io::Write,
) -> Result<u64, ExportError> {
    let mut pages = JournalPages::open(store, owner, session_id, rules).await?;
    let header = &pages.header;
    writeln!(out, "{{\"version\": {EXPORT_VERSION},")?;
    for (key, value) in [
        ("session_id", json_line(&header.session_id)?),
        ("user_id", json_line(&header.user_id)?),
        ("created_at_ms", json_line(&header.created_at_ms)?),
        ("updated_at_ms", json_line(&pages.updated_at_ms)?),
        ("metadata", json_line(&header.metadata)?),
    ] {
        writeln!(out, "\"{key}\": {value},")?;
    }
    let mut messages = Spill::new()?;
    let mut items = Spill::new()?;
    writeln!(out, "\"journal\": [")?;
    while let Some(records) = pages.next().await? {
        for record in &records {
            let comma = if record.seq == 1 { "" } else { "," };
            writeln!(out, "{comma}{}", json_line(record)?)?;
        }
        let (said, logged) = pages.take_said();
        for message in &said {
            messages.push_json(message)?;
        }
        for event in &logged {
            items.push_json(event)?;
        }
    }
    writeln!(out, "],")?;
    for (key, spill) in [("messages", messages), ("items", items)] {
        writeln!(out, "\"{key}\": [")?;
        spill.copy_to(out)?;
        writeln!(out, "],")?;
    }
    let state = pages.folded();
    write!(
        out,
        "\"deps\": {},\n\"usage\": {},\n\"iteration\": {}",
        json_line(&state.deps)?,
        json_line(&state.usage)?,
        state.iteration
    )?;
    for (key, value) in extra {
        write!(out, ",\n{}: {}", json_line(key)?, json_line(value)?)?;
    }
    writeln!(out, "\n}}")?;
    out.flush()?;
    Ok(pages.last())
}

/// Lines written to an unnamed temporary file, to be copied out later
/// (disk, not memory): an array's elements, or any text a line at a time.
#[derive(Debug)]
pub struct Spill {
    file: std::io::BufWriter<std::fs::File>,
    written: u64,
}

impl Spill {
    /// An empty spill.
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            file: std::io::BufWriter::new(tempfile::tempfile()?),
            written: 0,
        })
    }

    /// `value` as JSON, the next element of an array.
    fn push_json(&mut self, value: &impl Serialize) -> std::io::Result<()> {
        let comma = if self.written == 0 { "" } else { "," };
        let line = format!("{comma}{}", json_line(value)?);
        self.push_line(&line)
    }

    /// `line` and a newline.
    pub fn push_line(&mut self, line: &str) -> std::io::Result<()> {
        use std::io::Write;
        writeln!(self.file, "{line}")?;
        self.written += 1;
        Ok(())
    }

    /// Copies every line written to `out`.
    pub fn copy_to(self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        std::io::copy(&mut self.into_reader()?, out)?;
        Ok(())
    }

    /// Every line written, to be read from the first.
    pub fn into_reader(self) -> std::io::Result<std::io::BufReader<std::fs::File>> {
        use std::io::Seek;
        let mut file = self.file.into_inner().map_err(|e| e.into_error())?;
        file.rewind()?;
        Ok(std::io::BufReader::new(file))
    }
}

/// `value` as one line of JSON that a terminal shows rather than acts on
/// ([`crate::text::safe_json`]).
fn json_line(value: &impl Serialize) -> Result<String, std::io::Error> {
    let text = serde_json::to_string(value).map_err(std::io::Error::other)?;
    Ok(crate::text::safe_json(&text).into_owned())
}
