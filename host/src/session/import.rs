//! Importing an export of any length in bounded memory.
//!
//! [`stage`] reads the document a value at a time, and never whole: first
//! as far as its `version` (so that a version this Airlock does not read
//! is named as such, wherever the field is and whatever else the file
//! holds; an export this Airlock writes names it first), then all of it.
//! The journal's records are scrubbed of hidden and secret-looking keys,
//! folded and written to an unnamed temporary file as they come; the
//! conversation the document lists beside them (`messages`, `items`) is
//! compared with the journal's by digest, never held. Only a document
//! whose every field agrees with its journal is staged, and
//! [`Staged::journal`] then gives the records back a page at a time for
//! [`SessionStore::insert`](super::SessionStore::insert), which writes them
//! in one transaction.
//!
//! Memory: a record, a page of records, and the fold's deps and usage,
//! never the session's length. Disk: the journal once more, until the
//! import ends.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufRead, BufReader, Read, Seek};

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

use super::export::{EXPORT_VERSION, ImportError, SessionExport, Spill};
use super::store::{RecordPages, SessionHeader};
use crate::context::{ContextRules, Usage};
use crate::journal::Message;
use crate::journal::{Event, Folded, Record, StoreError, secrets};

/// An export that was read whole and agrees with its journal, ready to be
/// inserted. Its records are in a temporary file, removed when `journal`
/// is dropped.
#[derive(Debug)]
pub struct Staged {
    /// The session's header (imported sessions are never ephemeral).
    pub header: SessionHeader,
    /// When its last record was committed.
    pub updated_at_ms: u64,
    /// How many records the journal holds.
    pub records: u64,
    /// The journal's records, scrubbed, a page at a time (for
    /// [`SessionStore::insert`](super::SessionStore::insert)).
    pub journal: SpilledRecords,
}

impl SessionExport {
    /// Parses an export: the version first (so an unknown version is named
    /// as such, whatever else the file holds), then the rest; then checks
    /// that the journal folds to what the file says. Secrets are removed
    /// before that check, in the journal and in the file's own fields.
    /// ([`stage`] does the same for a file of any length,
    /// without holding it.)
    pub fn parse(text: &str, rules: &ContextRules) -> Result<Self, ImportError> {
        let staged = stage(std::io::Cursor::new(text), rules)?;
        let mut pages = staged.journal;
        let mut journal = Vec::new();
        while let Some(page) = pages
            .next_page()
            .map_err(|e| ImportError::Stage(e.to_string()))?
        {
            journal.extend(page);
        }
        // The file's deps and conversation are the journal's fold: `stage`
        // checked them.
        let folded = Folded::fold(&journal)
            .map_err(|e| ImportError::Inconsistent(format!("journal {e}")))?;
        Ok(Self::of(
            staged.header,
            staged.updated_at_ms,
            folded,
            journal,
        ))
    }
}

/// Reads the export in `input` (from its start) and checks it, as
/// [`SessionExport::parse`] does, holding at most one record of it at a
/// time.
///
/// [`SessionExport::parse`]: super::export::SessionExport::parse
pub fn stage(input: impl Read + Seek, rules: &ContextRules) -> Result<Staged, ImportError> {
    stage_checked(input, rules, None)
}

/// [`stage`], for the store partition of `user` (`None`: the anonymous
/// one): an export of another user's session is
/// [`ImportError::WrongUser`], refused as soon as its `user_id` is read,
/// before its journal when the field comes first (as in every export
/// Airlock writes), so a large file of the wrong user is refused after
/// reading its first three fields, not all of it.
pub fn stage_for_user(
    input: impl Read + Seek,
    rules: &ContextRules,
    user: Option<&str>,
) -> Result<Staged, ImportError> {
    let staged = stage_checked(input, rules, Some(user))?;
    // A document without `user_id` is the anonymous bucket's, which only
    // the end of the document can tell.
    if staged.header.user_id.as_deref() == user {
        Ok(staged)
    } else {
        Err(ImportError::WrongUser(staged.header.user_id))
    }
}

/// The most bytes of the file one value may take (within 8 KiB): a
/// journal record, a message or item of the lists beside it, the deps or
/// the metadata. Held whole while it is read, so a file cannot make an
/// import hold more; no session Airlock writes under its limits comes
/// near.
pub const MAX_VALUE_BYTES: u64 = 256 << 20;

/// [`stage`], refusing a `user_id` other than `owner`'s once it is read.
fn stage_checked(
    input: impl Read + Seek,
    rules: &ContextRules,
    owner: Option<Option<&str>>,
) -> Result<Staged, ImportError> {
    stage_within(input, rules, owner, MAX_VALUE_BYTES)
}

/// [`stage_checked`], no value of the file over `most` bytes.
fn stage_within(
    mut input: impl Read + Seek,
    rules: &ContextRules,
    owner: Option<Option<&str>>,
    most: u64,
) -> Result<Staged, ImportError> {
    let rewind =
        |input: &mut dyn Seek| input.rewind().map_err(|e| ImportError::Read(e.to_string()));
    rewind(&mut input)?;
    let version = read_version(&mut input)?;
    rewind(&mut input)?;
    let spill = Spill::new().map_err(|e| ImportError::Stage(e.to_string()))?;
    let gauge = Gauge::new(most);
    let mut journal = Journal {
        rules,
        gauge: gauge.clone(),
        spill,
        state: Folded::default(),
        next: 1,
        messages: ListDigest::default(),
        items: ListDigest::default(),
        failed: None,
        every_call_keyed: version < 2,
    };
    // Under the buffer, so the count costs a little per 8 KiB read, not
    // per byte parsed.
    let gauged = Gauged {
        inner: input,
        gauge,
    };
    let mut reader = serde_json::Deserializer::from_reader(BufReader::new(gauged));
    let fields = DocumentSeed {
        journal: &mut journal,
        rules,
        owner,
    }
    .deserialize(&mut reader)
    .and_then(|fields| reader.end().map(|()| fields));
    match fields {
        Ok(fields) => fields.check(journal),
        // A record that does not fold stopped the reader: that is the
        // error, not where the reader was.
        Err(e) => Err(journal.failed.take().unwrap_or_else(|| {
            if journal.gauge.passed() {
                let over = journal.gauge.over();
                ImportError::Invalid(format!("a value of the file {over}"))
            } else {
                json_error(e)
            }
        })),
    }
}

/// How many bytes of the file have been read, and how far the value being
/// read may go ([`Gauge::measured`]); shared by the reader that counts and
/// the seeds that read values.
#[derive(Clone)]
struct Gauge(std::rc::Rc<GaugeState>);

struct GaugeState {
    read: std::cell::Cell<u64>,
    /// Where what is being read must end by: `most` past where the value
    /// being read began, or else the last one ended (so a key, or what
    /// lies between values, is bounded too).
    until: std::cell::Cell<u64>,
    /// The most one value may take.
    most: u64,
}

impl Gauge {
    fn new(most: u64) -> Self {
        Self(std::rc::Rc::new(GaugeState {
            read: std::cell::Cell::new(0),
            until: std::cell::Cell::new(most),
            most,
        }))
    }

    /// `read` (one value of the file), refused by the reader once it has
    /// taken more than the most one may.
    fn measured<T>(&self, read: impl FnOnce() -> T) -> T {
        self.restart();
        let value = read();
        if !self.passed() {
            self.restart();
        }
        value
    }

    /// The bound, from here.
    fn restart(&self) {
        let state = &self.0;
        state.until.set(state.read.get().saturating_add(state.most));
    }

    /// Whether the value being read went past the most one may take.
    fn passed(&self) -> bool {
        self.0.read.get() > self.0.until.get()
    }

    /// What is wrong with a value that went past it.
    fn over(&self) -> String {
        format!(
            "is over {} bytes; the most one value of a session file may take \
             (no session Airlock writes comes near)",
            self.0.most
        )
    }
}

/// A reader that counts what it reads into its [`Gauge`], and fails once
/// the value being read has taken more than it may: serde_json stops there,
/// holding no more of it. Read through a buffer, it counts what the buffer
/// takes, so a value is refused within a buffer's length (8 KiB) of the
/// bound.
struct Gauged<R> {
    inner: R,
    gauge: Gauge,
}

impl<R: Read> Read for Gauged<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let state = &self.gauge.0;
        state.read.set(state.read.get().saturating_add(n as u64));
        if self.gauge.passed() {
            return Err(std::io::Error::other(self.gauge.over()));
        }
        Ok(n)
    }
}

/// A JSON error reading the document: the reader's, or the document's.
fn json_error(e: serde_json::Error) -> ImportError {
    if e.is_io() {
        ImportError::Read(e.to_string())
    } else {
        ImportError::Invalid(e.to_string())
    }
}

/// The document's `version`, checked, reading the document only as far as
/// that field (the first of an export this Airlock writes), and nothing
/// else into memory. Version 1 (before keyed calls were marked) is read
/// too.
fn read_version(input: &mut (impl Read + Seek)) -> Result<u64, ImportError> {
    let mut reader = serde_json::Deserializer::from_reader(BufReader::new(input));
    let mut version = None;
    let read = VersionSeed(&mut version)
        .deserialize(&mut reader)
        .and_then(|()| reader.end());
    match (read, &version) {
        // Found: the rest is read by the second pass.
        (_, Some(found)) => match found.as_u64() {
            None => Err(ImportError::MissingVersion),
            Some(version @ 1..=EXPORT_VERSION) => Ok(version),
            Some(other) => Err(ImportError::UnsupportedVersion(other)),
        },
        (Ok(()), None) => Err(ImportError::MissingVersion),
        (Err(e), None) => Err(json_error(e)),
    }
}

/// A document's `version` field, into the slot it holds: the reader stops
/// (with an error) once it is found, and skips everything before it. A
/// document that is not an object has none.
struct VersionSeed<'a>(&'a mut Option<Value>);

impl<'de> DeserializeSeed<'de> for VersionSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for VersionSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a session export (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if key == "version" {
                *self.0 = Some(map.next_value::<Value>()?);
                return Err(de::Error::custom("the version is found"));
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// The journal as it is read: each record scrubbed, folded, spilled, and
/// the conversation it makes digested.
struct Journal<'r> {
    rules: &'r ContextRules,
    /// How much of the file the value being read has taken.
    gauge: Gauge,
    spill: Spill,
    state: Folded,
    /// The number the next record must have.
    next: u64,
    messages: ListDigest,
    items: ListDigest,
    /// Why reading stopped, when the journal itself was at fault (the
    /// reader's error then only says where).
    failed: Option<ImportError>,
    /// A version-1 journal's: every call's items are taken as a keyed
    /// call's, since a key then found any earlier call with its id.
    every_call_keyed: bool,
}

impl Journal<'_> {
    /// Stops the reader for `e`, kept as the error `stage` returns (the
    /// reader's own only says where it stopped).
    fn fail<E: de::Error>(&mut self, e: ImportError) -> E {
        let stopped = E::custom(&e);
        self.failed = Some(e);
        stopped
    }

    fn take(&mut self, record: Record) -> Result<(), ImportError> {
        let mut record = secrets::scrub_record(record, self.rules);
        if self.every_call_keyed {
            record.entry.mark_keyed();
        }
        let staging = |e: &dyn std::fmt::Display| ImportError::Stage(e.to_string());
        let line = serde_json::to_string(&record).map_err(|e| staging(&e))?;
        self.spill.push_line(&line).map_err(|e| staging(&e))?;
        self.state
            .fold_owned(self.next, vec![record])
            .map_err(|e| ImportError::Inconsistent(format!("journal {e}")))?;
        self.next += 1;
        let (said, logged) = self.state.transcript.take_said();
        for message in &said {
            self.messages.add(message);
        }
        for event in &logged {
            self.items.add(event);
        }
        Ok(())
    }
}

/// The document's fields other than its journal, as read.
#[derive(Default)]
struct Fields {
    version: Option<()>,
    session_id: Option<String>,
    user_id: Option<Option<String>>,
    created_at_ms: Option<u64>,
    updated_at_ms: Option<u64>,
    metadata: Option<BTreeMap<String, String>>,
    deps: Option<Map<String, Value>>,
    usage: Option<Usage>,
    iteration: Option<u32>,
    messages: Option<ListDigest>,
    items: Option<ListDigest>,
    journal: Option<()>,
}

/// Every field of the document, for errors naming one that is not.
const FIELDS: &[&str] = &[
    "version",
    "session_id",
    "user_id",
    "created_at_ms",
    "updated_at_ms",
    "metadata",
    "deps",
    "usage",
    "iteration",
    "messages",
    "items",
    "journal",
];

impl Fields {
    /// The staged import, if every field is there and agrees with the
    /// journal.
    fn check(self, journal: Journal<'_>) -> Result<Staged, ImportError> {
        let missing = |name: &str| ImportError::Invalid(format!("missing field `{name}`"));
        let session_id = self.session_id.ok_or_else(|| missing("session_id"))?;
        let user_id = self.user_id.unwrap_or_default();
        let created_at_ms = self.created_at_ms.ok_or_else(|| missing("created_at_ms"))?;
        let updated_at_ms = self.updated_at_ms.ok_or_else(|| missing("updated_at_ms"))?;
        let metadata = self.metadata.ok_or_else(|| missing("metadata"))?;
        let deps = self.deps.ok_or_else(|| missing("deps"))?;
        let usage = self.usage.ok_or_else(|| missing("usage"))?;
        let iteration = self.iteration.ok_or_else(|| missing("iteration"))?;
        let messages = self.messages.ok_or_else(|| missing("messages"))?;
        let items = self.items.ok_or_else(|| missing("items"))?;
        self.journal.ok_or_else(|| missing("journal"))?;
        super::check_session_id(&session_id).map_err(|e| ImportError::Invalid(e.to_string()))?;
        if let Some(user) = &user_id {
            super::check_user_id(user).map_err(|e| ImportError::Invalid(e.to_string()))?;
        }
        let deps = secrets::scrub_deps(&deps, journal.rules);
        let folded = &journal.state;
        let disagree = |field: &str| {
            ImportError::Inconsistent(format!("`{field}` is not what the journal says"))
        };
        if folded.deps != deps {
            return Err(disagree("deps"));
        }
        if folded.usage != usage {
            return Err(disagree("usage"));
        }
        if folded.iteration != iteration {
            return Err(disagree("iteration"));
        }
        if journal.messages.finish() != messages.finish() {
            return Err(disagree("messages"));
        }
        if journal.items.finish() != items.finish() {
            return Err(disagree("items"));
        }
        Ok(Staged {
            header: SessionHeader {
                session_id,
                user_id,
                created_at_ms,
                metadata,
                ephemeral: false,
            },
            updated_at_ms,
            records: journal.next - 1,
            journal: SpilledRecords {
                lines: journal
                    .spill
                    .into_reader()
                    .map_err(|e| ImportError::Stage(e.to_string()))?
                    .lines(),
            },
        })
    }
}

/// Reads the document's fields, the journal into [`Journal`].
struct DocumentSeed<'a, 'r> {
    journal: &'a mut Journal<'r>,
    rules: &'r ContextRules,
    /// The user the document must belong to, when the caller knows it.
    owner: Option<Option<&'r str>>,
}

impl<'de> DeserializeSeed<'de> for DocumentSeed<'_, '_> {
    type Value = Fields;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Fields, D::Error> {
        deserializer.deserialize_map(self)
    }
}

/// Reads field `name` into `slot` with `read`, refused if the document
/// named the field before (before it is read: a journal is never read
/// twice).
fn once<T, E: de::Error>(
    slot: &mut Option<T>,
    name: &'static str,
    read: impl FnOnce() -> Result<T, E>,
) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::duplicate_field(name));
    }
    *slot = Some(read()?);
    Ok(())
}

impl<'de> Visitor<'de> for DocumentSeed<'_, '_> {
    type Value = Fields;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a session export (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
        let mut fields = Fields::default();
        while let Some(key) = map.next_key::<String>()? {
            let f = &mut fields;
            match key.as_str() {
                "version" => once(&mut f.version, "version", || {
                    map.next_value::<IgnoredAny>().map(drop)
                })?,
                "session_id" => once(&mut f.session_id, "session_id", || map.next_value())?,
                "user_id" => once(&mut f.user_id, "user_id", || {
                    let user: Option<String> = map.next_value()?;
                    match self.owner {
                        Some(owner) if user.as_deref() != owner => {
                            Err(self.journal.fail(ImportError::WrongUser(user)))
                        }
                        _ => Ok(user),
                    }
                })?,
                "created_at_ms" => {
                    once(&mut f.created_at_ms, "created_at_ms", || map.next_value())?
                }
                "updated_at_ms" => {
                    once(&mut f.updated_at_ms, "updated_at_ms", || map.next_value())?
                }
                "metadata" => once(&mut f.metadata, "metadata", || {
                    self.journal.gauge.measured(|| map.next_value())
                })?,
                "deps" => once(&mut f.deps, "deps", || {
                    self.journal.gauge.measured(|| map.next_value())
                })?,
                "usage" => once(&mut f.usage, "usage", || map.next_value())?,
                "iteration" => once(&mut f.iteration, "iteration", || map.next_value())?,
                "messages" => once(&mut f.messages, "messages", || {
                    map.next_value_seed(Digested::<Message> {
                        rules: self.rules,
                        gauge: &self.journal.gauge,
                        of: std::marker::PhantomData,
                    })
                })?,
                "items" => once(&mut f.items, "items", || {
                    map.next_value_seed(Digested::<Event> {
                        rules: self.rules,
                        gauge: &self.journal.gauge,
                        of: std::marker::PhantomData,
                    })
                })?,
                "journal" => once(&mut f.journal, "journal", || {
                    map.next_value_seed(JournalSeed(&mut *self.journal))
                })?,
                other => return Err(de::Error::unknown_field(other, FIELDS)),
            }
        }
        Ok(fields)
    }
}

/// The journal's records, each handed to [`Journal::take`] as it is read.
struct JournalSeed<'a, 'r>(&'a mut Journal<'r>);

impl<'de> DeserializeSeed<'de> for JournalSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for JournalSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of journal records")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        loop {
            let next = self.0.gauge.measured(|| seq.next_element::<Record>());
            let record = match next {
                Ok(Some(record)) => record,
                Ok(None) => return Ok(()),
                Err(_) if self.0.gauge.passed() => {
                    let at = self.0.next;
                    let over = format!("journal record {at} {}", self.0.gauge.over());
                    return Err(self.0.fail(ImportError::Invalid(over)));
                }
                Err(e) => return Err(e),
            };
            if let Err(e) = self.0.take(record) {
                return Err(self.0.fail(e));
            }
        }
    }
}

/// A list of `T`s, digested one at a time (an item's deps scrubbed first,
/// as the journal's are).
struct Digested<'r, T> {
    rules: &'r ContextRules,
    gauge: &'r Gauge,
    of: std::marker::PhantomData<T>,
}

impl<'de, T: Deserialize<'de> + Serialize + Scrub> DeserializeSeed<'de> for Digested<'_, T> {
    type Value = ListDigest;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<ListDigest, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de, T: Deserialize<'de> + Serialize + Scrub> Visitor<'de> for Digested<'_, T> {
    type Value = ListDigest;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ListDigest, A::Error> {
        let mut digest = ListDigest::default();
        while let Some(mut element) = self.gauge.measured(|| seq.next_element::<T>())? {
            element.scrub(self.rules);
            digest.add(&element);
        }
        Ok(digest)
    }
}

/// What is removed from a listed value before it is compared with the
/// journal's.
trait Scrub {
    fn scrub(&mut self, rules: &ContextRules);
}

impl Scrub for Message {
    fn scrub(&mut self, _: &ContextRules) {}
}

impl Scrub for Event {
    fn scrub(&mut self, rules: &ContextRules) {
        secrets::scrub_event(self, rules);
    }
}

/// A digest of a list of values: equal for two lists whose values are
/// equal as JSON, in the same order (object keys in any order).
#[derive(Default)]
struct ListDigest {
    hasher: Sha256,
}

impl ListDigest {
    fn add(&mut self, value: &impl Serialize) {
        // Messages and events always serialize (they were just read).
        let value = serde_json::to_value(value).unwrap_or(Value::Null);
        // Each value ends with a newline, which canonical JSON never holds:
        // the digest tells lists of different lengths apart.
        canonical(&value, &mut self.hasher);
        self.hasher.update(b"\n");
    }

    fn finish(self) -> [u8; 32] {
        self.hasher.finalize().into()
    }
}

/// Feeds `value` to `hasher` as JSON with every object's keys sorted.
/// Recursion is bounded by the parser's depth limit (128), which every
/// value here was read under.
fn canonical(value: &Value, hasher: &mut Sha256) {
    match value {
        Value::Array(values) => {
            hasher.update(b"[");
            for (at, value) in values.iter().enumerate() {
                if at > 0 {
                    hasher.update(b",");
                }
                canonical(value, hasher);
            }
            hasher.update(b"]");
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            hasher.update(b"{");
            for (at, key) in keys.into_iter().enumerate() {
                if at > 0 {
                    hasher.update(b",");
                }
                hasher.update(Value::String(key.clone()).to_string().as_bytes());
                hasher.update(b":");
                if let Some(value) = map.get(key) {
                    canonical(value, hasher);
                }
            }
            hasher.update(b"}");
        }
        scalar => hasher.update(scalar.to_string().as_bytes()),
    }
}

/// The staged journal read back a page at a time ([`RecordPages`]): at most
/// [`PAGE_RECORDS`] records or about [`PAGE_BYTES`] of them.
#[derive(Debug)]
pub struct SpilledRecords {
    lines: std::io::Lines<BufReader<std::fs::File>>,
}

/// The most records a page of a staged journal holds.
pub const PAGE_RECORDS: usize = 256;

/// A page of a staged journal ends after the record that takes it past
/// this many bytes.
pub const PAGE_BYTES: usize = 4 << 20;

impl RecordPages for SpilledRecords {
    fn next_page(&mut self) -> Result<Option<Vec<Record>>, StoreError> {
        let failed = |message: String| StoreError::Backend {
            location: "the staged import".into(),
            message,
        };
        let mut page = Vec::new();
        let mut bytes = 0;
        while page.len() < PAGE_RECORDS && bytes < PAGE_BYTES {
            let Some(line) = self.lines.next() else {
                break;
            };
            let line = line.map_err(|e| failed(e.to_string()))?;
            bytes += line.len();
            page.push(serde_json::from_str(&line).map_err(|e| failed(e.to_string()))?);
        }
        Ok((!page.is_empty()).then_some(page))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An export of one call whose result is `long` bytes of text.
    fn export(long: usize) -> String {
        let text = "x".repeat(long);
        let output = serde_json::to_string(&text).unwrap();
        let output_json = serde_json::to_string(&output).unwrap();
        let call = r#"{"id":"item_1","run_id":"run_1","type":"function_call","call_id":"c1","name":"say","arguments":"{}","iteration":0}"#;
        let out = format!(
            r#"{{"id":"item_2","run_id":"run_1","type":"function_call_output","call_id":"c1","name":"say","status":"completed","output":{output_json},"duration_us":1}}"#
        );
        let with_at = |item: &str, at: u64| {
            item.replacen(r#","type""#, &format!(r#","at_ms":{at},"type""#), 1)
        };
        format!(
            r#"{{"version": 3, "session_id": "s", "user_id": null, "created_at_ms": 1, "updated_at_ms": 2,
            "metadata": {{}},
            "journal": [{{"seq":1,"at_ms":1,"entry":"deps","deps":{{}}}},
              {{"seq":2,"at_ms":1,"entry":"event","event":{call}}},
              {{"seq":3,"at_ms":2,"entry":"event","event":{out}}}],
            "messages": [],
            "items": [{}, {}],
            "deps": {{}}, "usage": {{"requests":0,"tool_calls":0,"input_tokens":0,"output_tokens":0,"total_tokens":0}}, "iteration": 0}}"#,
            with_at(call, 1),
            with_at(&out, 2)
        )
    }

    fn staged(text: &str, most: u64) -> Result<Staged, ImportError> {
        stage_within(
            std::io::Cursor::new(text),
            &ContextRules::default(),
            None,
            most,
        )
    }

    /// A value of the file over the bound is refused once it passes it,
    /// naming what it was; at the bound, the file imports. The bound is
    /// per value, not per file.
    #[test]
    fn no_value_of_a_session_file_may_pass_the_bound() {
        let text = export(40_000);
        let whole = staged(&text, 1 << 20).unwrap();
        assert_eq!(whole.records, 3);
        // Each value is under 41,000 bytes; the file is over 80,000.
        assert!(text.len() > 80_000);
        assert!(staged(&text, 60_000).is_ok());
        let refused = staged(&text, 20_000).unwrap_err().to_string();
        assert_eq!(
            refused,
            "invalid session file: journal record 3 is over 20000 bytes; the most one value \
             of a session file may take (no session Airlock writes comes near)"
        );
        // The deps, and a listed item, alike.
        let big_deps = text.replacen(
            r#""deps": {}, "usage""#,
            &format!(r#""deps": {{"k": "{}"}}, "usage""#, "y".repeat(80_000)),
            1,
        );
        let refused = staged(&big_deps, 60_000).unwrap_err().to_string();
        assert!(
            refused.starts_with("invalid session file: a value of the file is over 60000 bytes"),
            "{refused}"
        );
        let listed = export(40_000).replacen(
            r#""messages": []"#,
            &format!(
                r#""messages": [{{"role":"user","content":"{}"}}]"#,
                "z".repeat(80_000)
            ),
            1,
        );
        let refused = staged(&listed, 60_000).unwrap_err().to_string();
        assert!(refused.contains("is over 60000 bytes"), "{refused}");
        // A field that is no list's element, and a key, alike.
        let long_id = text.replacen(
            r#""session_id": "s""#,
            &format!(r#""session_id": "{}""#, "s".repeat(80_000)),
            1,
        );
        let refused = staged(&long_id, 60_000).unwrap_err().to_string();
        assert!(refused.contains("is over 60000 bytes"), "{refused}");
        let long_key = text.replacen(
            r#""iteration": 0"#,
            &format!(r#""{}": 0"#, "k".repeat(80_000)),
            1,
        );
        let refused = staged(&long_key, 60_000).unwrap_err().to_string();
        assert!(refused.contains("is over 60000 bytes"), "{refused}");
    }
}
