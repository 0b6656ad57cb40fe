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

/// [`stage`], refusing a `user_id` other than `owner`'s once it is read.
fn stage_checked(
    mut input: impl Read + Seek,
    rules: &ContextRules,
    owner: Option<Option<&str>>,
) -> Result<Staged, ImportError> {
    let rewind =
        |input: &mut dyn Seek| input.rewind().map_err(|e| ImportError::Read(e.to_string()));
    rewind(&mut input)?;
    let version = read_version(&mut input)?;
    rewind(&mut input)?;
    let spill = Spill::new().map_err(|e| ImportError::Stage(e.to_string()))?;
    let mut journal = Journal {
        rules,
        spill,
        state: Folded::default(),
        next: 1,
        messages: ListDigest::default(),
        items: ListDigest::default(),
        failed: None,
        every_call_keyed: version < 2,
    };
    let mut reader = serde_json::Deserializer::from_reader(BufReader::new(input));
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
        Err(e) => Err(journal.failed.take().unwrap_or_else(|| json_error(e))),
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
                "metadata" => once(&mut f.metadata, "metadata", || map.next_value())?,
                "deps" => once(&mut f.deps, "deps", || map.next_value())?,
                "usage" => once(&mut f.usage, "usage", || map.next_value())?,
                "iteration" => once(&mut f.iteration, "iteration", || map.next_value())?,
                "messages" => once(&mut f.messages, "messages", || {
                    map.next_value_seed(Digested::<Message> {
                        rules: self.rules,
                        of: std::marker::PhantomData,
                    })
                })?,
                "items" => once(&mut f.items, "items", || {
                    map.next_value_seed(Digested::<Event> {
                        rules: self.rules,
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
        while let Some(record) = seq.next_element::<Record>()? {
            if let Err(e) = self.0.take(record) {
                return Err(self.0.fail(e));
            }
        }
        Ok(())
    }
}

/// A list of `T`s, digested one at a time (an item's deps scrubbed first,
/// as the journal's are).
struct Digested<'r, T> {
    rules: &'r ContextRules,
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
        while let Some(mut element) = seq.next_element::<T>()? {
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
