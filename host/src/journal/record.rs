//! What a journal holds: the item log ([`Event`], [`Item`]), the
//! conversation ([`Transcript`]), and the records a store keeps
//! ([`Record`], [`Entry`]).
//!
//! The JSON forms are the journal's on-disk format and the event log's
//! wire format, version [`RECORD_FORMAT`]. Every type in them is the
//! journal's own ([`super::conversation`]); a test holds the encoding of
//! one record of each kind to a committed sample (`testdata/records.jsonl`),
//! so a change to any of them is seen.
//!
//! One record per fact: an item ([`Entry::Event`]) is the only record of
//! what it says, and the messages the model sees are rebuilt from the
//! items when a journal is folded (a prompt, a model turn and the calls it
//! asked for, each call's answer). An item's time is its record's. A
//! journal written by an older Airlock (format 1) stored each message
//! again beside its items ([`Entry::Message`], [`Entry::Item`]); it reads
//! back the same, and a session that has one goes on with format-2
//! records after it.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::conversation::{Captured, Message};
use crate::context::{ContextOp, Usage};
use crate::kind::ErrorKind;
use crate::spec::ToolCall;

/// The version of the records' JSON that this Airlock writes: a change
/// that an older Airlock could not read bumps it (and the stores' schema
/// version, so that an older Airlock refuses the store instead of
/// misreading it). 2: items only, messages rebuilt from them.
pub const RECORD_FORMAT: u32 = 2;

/// One item of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// `item_<n>`, unique within the session, in order.
    pub id: String,
    /// The run that recorded it.
    pub run_id: String,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub item: Item,
}

impl Event {
    /// The `n`th item of a transcript (`item_<n>`, counted from 1).
    pub fn numbered(n: usize, run_id: &str, at_ms: u64, item: Item) -> Self {
        Self {
            id: format!("item_{n}"),
            run_id: run_id.to_owned(),
            at_ms,
            item,
        }
    }
}

/// Who asked for a call, as their access token said: never the token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalledBy {
    /// The Airlock user (the token's subject or the policy's claim).
    pub user: String,
    /// The OAuth client the token was issued to, when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Item {
    /// A run began: the first item of every run.
    RunStarted {
        /// The model, as the provider names it.
        model: String,
    },
    /// A run ended: the last item of every run that ended, with an answer
    /// or an error (a run whose process died has none).
    RunEnded {
        /// `answered`, or the error's kind.
        outcome: Outcome,
        /// Model requests the run made.
        iterations: u32,
    },
    /// A message of the conversation: the run's instructions, the
    /// user's prompt, or a model turn (its text, and how many calls it
    /// asked for: the `function_call` items right after it).
    Message {
        /// Who said it.
        role: Role,
        /// The text (absent for a model turn that only called tools).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        /// The model request it belongs to (0 for the prompt).
        iteration: u32,
        /// A model turn's calls: the `function_call` items that follow it.
        /// Written only when not 0.
        #[serde(default, skip_serializing_if = "is_zero_u32")]
        calls: u32,
    },
    /// A tool call was asked for (by the model, or directly on a session):
    /// its intent, recorded before it runs. Written as `call_id`, `name`,
    /// `arguments` (the model's JSON text, verbatim).
    FunctionCall {
        /// The call.
        #[serde(flatten, with = "call_fields")]
        call: ToolCall,
        /// The model request that asked for it.
        iteration: u32,
        /// Who asked for a direct call over authenticated HTTP MCP (the
        /// token's user and client); absent for the model's calls and for
        /// callers no token names. Written only when present.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<CalledBy>,
    },
    /// How a tool call ended, and what the model is told.
    FunctionCallOutput {
        /// The model's id for the call.
        call_id: String,
        /// The tool.
        name: String,
        /// How it ended.
        status: CallStatus,
        /// What the model sees: the result JSON, or the error text.
        output: String,
        /// The failure's kind when the call did not complete.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_kind: Option<ErrorKind>,
        /// Wall-clock time, approval included.
        duration_us: u64,
        /// The arguments (JSON text) the call ran with when the person who
        /// approved it edited the ones it was asked with; absent when it
        /// ran with those. What a replay runs it with.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments: Option<String>,
        /// What the guest logged and printed, for failed calls too (empty
        /// when it never ran).
        #[serde(flatten)]
        guest: Captured,
    },
    /// The ops a successful call applied to deps, in order.
    ContextUpdate {
        /// The call that returned them.
        call_id: String,
        /// The ops, in the order applied (none on a hidden or
        /// secret-looking key).
        ops: Vec<ContextOp>,
    },
    /// The run itself failed (model error, max iterations, cancellation).
    Error {
        /// What kind of failure.
        kind: ErrorKind,
        /// What went wrong.
        message: String,
    },
}

/// A [`ToolCall`] as a `function_call` item's fields: the id as `call_id`
/// (the item's own `id` is its place in the log).
mod call_fields {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::spec::ToolCall;

    #[derive(Serialize)]
    struct Fields<'a> {
        call_id: &'a str,
        name: &'a str,
        arguments: &'a str,
    }

    #[derive(Deserialize)]
    struct Owned {
        call_id: String,
        name: String,
        arguments: String,
    }

    pub fn serialize<S: Serializer>(call: &ToolCall, serializer: S) -> Result<S::Ok, S::Error> {
        Fields {
            call_id: &call.id,
            name: &call.name,
            arguments: &call.arguments,
        }
        .serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ToolCall, D::Error> {
        let Owned {
            call_id,
            name,
            arguments,
        } = Owned::deserialize(deserializer)?;
        Ok(ToolCall {
            id: call_id,
            name,
            arguments,
            retry: 0,
        })
    }
}

/// How a run ended: `answered`, or the kind of error that ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The model answered.
    Answered,
    /// The run failed.
    Failed(ErrorKind),
}

impl Outcome {
    /// `answered`, or the error kind's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::Failed(kind) => kind.as_str(),
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Outcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Outcome {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        if text == "answered" {
            return Ok(Outcome::Answered);
        }
        text.parse()
            .map(Outcome::Failed)
            .map_err(serde::de::Error::custom)
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The run's instructions for the model.
    System,
    /// The person (the prompt).
    User,
    /// The model.
    Assistant,
}

/// How a tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// The tool ran and its ops were applied.
    Completed,
    /// The call failed; no op was applied.
    Failed,
    /// The approval handler rejected the call; it did not run.
    Rejected,
    /// The run was cancelled while the call ran; no op was applied.
    Cancelled,
    /// The call was asked for but never answered (the process died while it
    /// ran, or the run ended first); it may or may not have run, and no op
    /// of it was applied. Recorded when the session is next opened.
    Interrupted,
}

impl CallStatus {
    /// The status as serialized: `completed`, `failed`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            CallStatus::Completed => "completed",
            CallStatus::Failed => "failed",
            CallStatus::Rejected => "rejected",
            CallStatus::Cancelled => "cancelled",
            CallStatus::Interrupted => "interrupted",
        }
    }
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !b
}

/// One entry of the journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "entry", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Entry {
    /// Deps replaced whole: a new session's starting deps, or the
    /// embedder's change between runs. Hidden and secret-looking keys are
    /// already removed.
    Deps {
        /// The new deps.
        deps: Map<String, Value>,
    },
    /// An item appended to the log (format 2): the only record of what it
    /// says; the messages the model sees are rebuilt from these. Stored
    /// without its own time, which is its record's. A `context_update`
    /// item's ops are applied to deps when the journal is folded.
    Event {
        /// The item.
        #[serde(with = "timeless")]
        event: Event,
        /// Whether the item is part of a keyed call (one made at most once
        /// per id, [`Session::call_once`](crate::session::Session::call_once)):
        /// its intent, output or ops. A store indexes these by the call's
        /// id ([`Entry::call_key`]), and a retry with that id finds them;
        /// other calls' items are not indexed, so that an unkeyed call's
        /// commit writes no entry at a random place of an index. Written
        /// only when true. A store reads every record it indexes back
        /// marked.
        #[serde(default, skip_serializing_if = "is_false")]
        keyed: bool,
    },
    /// Format 1 (read, never written): a message appended to the
    /// conversation the model sees, stored beside the items that say the
    /// same.
    Message {
        /// The message.
        message: Message,
    },
    /// Format 1 (read, never written): an item, with its own time, whose
    /// message (if any) was stored as an [`Entry::Message`] too.
    Item {
        /// The item.
        event: Event,
        /// As [`Entry::Event`]'s.
        #[serde(default, skip_serializing_if = "is_false")]
        keyed: bool,
    },
    /// Usage totals and the iteration from here on.
    Usage {
        /// The totals.
        usage: Usage,
        /// The model request the run is at.
        iteration: u32,
    },
}

impl Entry {
    /// An item of the log, not part of a keyed call.
    pub fn item(event: Event) -> Self {
        Entry::Event {
            event,
            keyed: false,
        }
    }

    /// The item this entry holds, in either format.
    pub fn event(&self) -> Option<&Event> {
        match self {
            Entry::Event { event, .. } | Entry::Item { event, .. } => Some(event),
            _ => None,
        }
    }

    /// [`Entry::event`], taken.
    pub fn into_event(self) -> Option<Event> {
        match self {
            Entry::Event { event, .. } | Entry::Item { event, .. } => Some(event),
            _ => None,
        }
    }

    /// [`Entry::event`], to change.
    pub fn event_mut(&mut self) -> Option<&mut Event> {
        match self {
            Entry::Event { event, .. } | Entry::Item { event, .. } => Some(event),
            _ => None,
        }
    }

    /// The tool call this entry is about, if it is a call's intent, output
    /// or ops, keyed or not.
    pub fn call_id(&self) -> Option<&str> {
        match &self.event()?.item {
            Item::FunctionCall { call, .. } => Some(&call.id),
            Item::FunctionCallOutput { call_id, .. } | Item::ContextUpdate { call_id, .. } => {
                Some(call_id)
            }
            _ => None,
        }
    }

    /// Marks the entry as part of a keyed call when it is a call's intent,
    /// output or ops (anything else stays as it is): what a record indexed
    /// before the marks existed, or one from a version-1 export, is taken
    /// as.
    pub fn mark_keyed(&mut self) {
        if self.call_id().is_some()
            && let Entry::Event { keyed, .. } | Entry::Item { keyed, .. } = self
        {
            *keyed = true;
        }
    }

    /// The id a retry of a keyed call finds this entry by: its call's id
    /// when it is part of a keyed call, what a store indexes so that the
    /// retry reads the call's records and not the whole journal.
    pub fn call_key(&self) -> Option<&str> {
        match self {
            Entry::Event { keyed: true, .. } | Entry::Item { keyed: true, .. } => self.call_id(),
            _ => None,
        }
    }
}

/// An entry with its place in the journal. Numbers and times are
/// Airlock's, never the store's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "RecordFields")]
pub struct Record {
    /// 1 for the first record of the session, then one more for each.
    pub seq: u64,
    /// When it was recorded, in milliseconds since the Unix epoch: an
    /// item's own time, and the commit's for anything else.
    pub at_ms: u64,
    /// What it says.
    #[serde(flatten)]
    pub entry: Entry,
}

impl Record {
    /// The record `seq` of `entry` at `at_ms`; an item stored without its
    /// time (format 2) takes the record's.
    pub fn new(seq: u64, at_ms: u64, mut entry: Entry) -> Self {
        if let Entry::Event { event, .. } = &mut entry {
            event.at_ms = at_ms;
        }
        Self { seq, at_ms, entry }
    }

    /// The record `seq` of `entry`, committed at `now_ms`: an item keeps
    /// its own time.
    pub fn committed(seq: u64, now_ms: u64, entry: Entry) -> Self {
        let at_ms = match &entry {
            Entry::Event { event, .. } => event.at_ms,
            _ => now_ms,
        };
        Self { seq, at_ms, entry }
    }
}

/// A record as its JSON has it.
#[derive(Deserialize)]
struct RecordFields {
    seq: u64,
    at_ms: u64,
    #[serde(flatten)]
    entry: Entry,
}

impl From<RecordFields> for Record {
    fn from(fields: RecordFields) -> Self {
        Record::new(fields.seq, fields.at_ms, fields.entry)
    }
}

/// An [`Event`] as an [`Entry::Event`] stores it: without its time, which
/// is its record's ([`Record::new`] puts it back).
mod timeless {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{Event, Item};

    #[derive(Serialize)]
    struct Fields<'a> {
        id: &'a str,
        run_id: &'a str,
        #[serde(flatten)]
        item: &'a Item,
    }

    #[derive(Deserialize)]
    struct Owned {
        id: String,
        run_id: String,
        #[serde(flatten)]
        item: Item,
    }

    pub fn serialize<S: Serializer>(event: &Event, serializer: S) -> Result<S::Ok, S::Error> {
        Fields {
            id: &event.id,
            run_id: &event.run_id,
            item: &event.item,
        }
        .serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Event, D::Error> {
        let Owned { id, run_id, item } = Owned::deserialize(deserializer)?;
        Ok(Event {
            id,
            run_id,
            at_ms: 0,
            item,
        })
    }
}

/// Airlock's clock for journal times and leases: milliseconds since the
/// Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Captured, CapturedLog};

    /// A record of every kind, each field set: format 2's, then the two
    /// that only format-1 journals hold.
    fn one_of_each() -> Vec<Record> {
        let call = ToolCall {
            id: "c1".into(),
            name: "increment".into(),
            arguments: r#"{"name":"v"}"#.into(),
            retry: 0,
        };
        let event = |n: usize, item: Item| Event::numbered(n, "run_1", 0, item);
        let logged = |n: usize, item: Item| Entry::Event {
            event: event(n, item),
            keyed: n == 6,
        };
        let said = |role: Role, content: &str, calls: u32| Item::Message {
            role,
            content: Some(content.into()),
            iteration: u32::from(role == Role::Assistant),
            calls,
        };
        let deps: Map<String, Value> = serde_json::from_str(r#"{"counters":{"v":1}}"#).unwrap();
        let entries = vec![
            Entry::Deps { deps },
            logged(1, said(Role::System, "be brief", 0)),
            logged(2, said(Role::User, "count", 0)),
            logged(3, Item::RunStarted { model: "m".into() }),
            logged(4, said(Role::Assistant, "calling", 1)),
            logged(
                5,
                Item::FunctionCall {
                    call: call.clone(),
                    iteration: 1,
                    by: Some(CalledBy {
                        user: "ann".into(),
                        client: Some("ann-laptop".into()),
                    }),
                },
            ),
            logged(
                6,
                Item::FunctionCallOutput {
                    call_id: "c1".into(),
                    name: "increment".into(),
                    status: CallStatus::Failed,
                    output: "Error (failed): no".into(),
                    error_kind: Some(ErrorKind::Failed),
                    duration_us: 1234,
                    arguments: Some(r#"{"name":"w"}"#.into()),
                    guest: Captured {
                        logs: vec![CapturedLog {
                            level: "warn".into(),
                            message: "careful".into(),
                        }],
                        stdout: "out".into(),
                        stderr: "err".into(),
                        refusals: vec!["GET http://10.0.0.1/: not granted".into()],
                        shown: vec![
                            crate::spec::Shown::Image {
                                data: "iVBORw0KGgo=".into(),
                                mime_type: "image/png".into(),
                            },
                            crate::spec::Shown::Resource {
                                uri: "https://example.com/r".into(),
                                mime_type: Some("text/plain".into()),
                                text: Some("r".into()),
                                blob: None,
                            },
                        ],
                        sampled: vec![crate::spec::Sampled {
                            request: crate::spec::SampleRequest {
                                messages: vec![("user".into(), "hi".into())],
                                system: None,
                                max_tokens: 10,
                            },
                            reply: crate::spec::SampleReply::Answered {
                                text: "hello".into(),
                                model: "m".into(),
                                stop_reason: None,
                            },
                        }],
                        asked: vec![crate::spec::Asked {
                            message: "who?".into(),
                            schema: serde_json::json!({"type": "object"}),
                            answer: crate::spec::Answer::Accept {
                                content: serde_json::json!({"name": "ann"}),
                            },
                        }],
                        tape: Some(Box::new(crate::spec::Tape {
                            wall: vec![1_780_000_000_000_000_000],
                            monotonic: vec![5, 17],
                            random: Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=".into()),
                            insecure: None,
                            seed: Some("000102030405060708090a0b0c0d0e0f".into()),
                            http: vec![crate::spec::Exchange {
                                method: "GET".into(),
                                url: "https://example.com/r".into(),
                                request_sha256: None,
                                status: 200,
                                headers: vec![("content-type".into(), "text/plain".into())],
                                body: "aGk=".into(),
                            }],
                            files: vec![crate::spec::FileSeen {
                                dir: "/data".into(),
                                path: "sub/a.txt".into(),
                                kind: crate::spec::SeenKind::File,
                                size: Some(2),
                                modified: Some(1_780_000_000_000_000_000),
                                body: Some("aGk=".into()),
                            }],
                            listings: vec![crate::spec::Listing {
                                dir: "/data".into(),
                                path: "sub".into(),
                                entries: vec![("a.txt".into(), "regular-file".into())],
                                ended: true,
                            }],
                            env: [
                                ("TZ".to_owned(), Some("UTC".to_owned())),
                                ("LANG".to_owned(), None),
                            ]
                            .into(),
                            past: None,
                        })),
                    },
                },
            ),
            logged(
                7,
                Item::ContextUpdate {
                    call_id: "c1".into(),
                    ops: vec![
                        ContextOp::Set {
                            key: "a".into(),
                            value: Value::from(1),
                        },
                        ContextOp::Merge {
                            key: "b".into(),
                            value: serde_json::json!({"x": true}),
                        },
                        ContextOp::Append {
                            key: "c".into(),
                            value: Value::from("n"),
                        },
                        ContextOp::Delete { key: "d".into() },
                    ],
                },
            ),
            logged(
                8,
                Item::Error {
                    kind: ErrorKind::ModelError,
                    message: "the model failed".into(),
                },
            ),
            logged(
                9,
                Item::RunEnded {
                    outcome: Outcome::Failed(ErrorKind::ModelError),
                    iterations: 1,
                },
            ),
            Entry::Usage {
                usage: Usage {
                    requests: 1,
                    tool_calls: 1,
                    input_tokens: 10,
                    output_tokens: 2,
                },
                iteration: 1,
            },
            Entry::Message {
                message: Message::Assistant {
                    content: Some("calling".into()),
                    tool_calls: vec![call],
                },
            },
            Entry::Item {
                event: Event::numbered(
                    10,
                    "run_1",
                    1_600_000_000_000,
                    said(Role::User, "again", 0),
                ),
                keyed: false,
            },
        ];
        entries
            .into_iter()
            .zip(1..)
            .map(|(entry, seq)| Record::new(seq, 1_700_000_000_000 + seq, entry))
            .collect()
    }

    /// Format 2's items say the messages the model sees: the prompt, the
    /// turn with the call it asked for, and the call's output.
    #[test]
    fn the_items_say_the_messages() {
        let folded = crate::journal::Folded::fold(&one_of_each()[..10]).unwrap();
        let roles: Vec<&str> = folded
            .transcript
            .messages
            .iter()
            .map(|m| match m {
                Message::System { .. } => "system",
                Message::User { .. } => "user",
                Message::Assistant { tool_calls, .. } if tool_calls.len() == 1 => "assistant+1",
                Message::Assistant { .. } => "assistant",
                Message::Tool { is_error: true, .. } => "tool error",
                Message::Tool { .. } => "tool",
            })
            .collect();
        assert_eq!(roles, ["system", "user", "assistant+1", "tool error"]);
        assert_eq!(folded.transcript.items.len(), 9);
    }

    /// The records' JSON is the committed sample of format
    /// [`RECORD_FORMAT`], byte for byte, and reads back as written: a
    /// field added to a type the records hold, or one renamed, fails
    /// here. (`AIRLOCK_BLESS=1` rewrites the sample, for a change that
    /// bumps the format.)
    #[test]
    fn records_are_written_as_the_committed_sample_of_their_format() {
        assert_eq!(RECORD_FORMAT, 2, "a new format needs its own sample");
        let sample = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/journal/testdata/records.jsonl"
        );
        let records = one_of_each();
        let written: String = records
            .iter()
            .map(|r| serde_json::to_string(r).unwrap() + "\n")
            .collect();
        if std::env::var_os("AIRLOCK_BLESS").is_some() {
            std::fs::write(sample, &written).unwrap();
        }
        let committed = std::fs::read_to_string(sample).unwrap();
        assert_eq!(written, committed, "the journal's stored format changed");
        let read: Vec<Record> = committed
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(read, records);
    }

    #[test]
    fn a_function_call_item_keeps_its_wire_form() {
        let item = Item::FunctionCall {
            call: ToolCall {
                id: "c1".into(),
                name: "increment".into(),
                arguments: r#"{"name":"v"}"#.into(),
                retry: 3,
            },
            iteration: 2,
            by: None,
        };
        let text = serde_json::to_string(&item).unwrap();
        assert_eq!(
            text,
            r#"{"type":"function_call","call_id":"c1","name":"increment","arguments":"{\"name\":\"v\"}","iteration":2}"#
        );
        let back: Item = serde_json::from_str(&text).unwrap();
        let Item::FunctionCall {
            call, iteration, ..
        } = back
        else {
            panic!("{back:?}")
        };
        assert_eq!((call.id.as_str(), call.retry, iteration), ("c1", 0, 2));
    }

    #[test]
    fn outcomes_and_kinds_keep_their_names() {
        let ended = Item::RunEnded {
            outcome: Outcome::Failed(ErrorKind::MaxIterations),
            iterations: 3,
        };
        let text = serde_json::to_string(&ended).unwrap();
        assert_eq!(
            text,
            r#"{"type":"run_ended","outcome":"max_iterations","iterations":3}"#
        );
        assert_eq!(serde_json::from_str::<Item>(&text).unwrap(), ended);
        let answered: Outcome = serde_json::from_str(r#""answered""#).unwrap();
        assert_eq!(answered, Outcome::Answered);
        assert!(serde_json::from_str::<Outcome>(r#""bogus""#).is_err());
    }
}
