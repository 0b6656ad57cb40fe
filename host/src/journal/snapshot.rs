//! Snapshots: a journal's fold up to a record, so that resuming reads the
//! newest snapshot and the records after it instead of every record.
//!
//! A snapshot holds what resuming needs and nothing that grows with the
//! session's age except the conversation itself: deps, the messages the
//! model sees, usage and iteration, how many items of the log it folded,
//! and the calls still open (intents with no answer, which a resume must
//! patch). Closed calls stay in the journal only (`sessions show`, export,
//! and a keyed retry's lookup read them there).
//!
//! Invariant: resuming from `Snapshot::of(fold(records[..=s]))` and
//! folding `records[s+1..]` gives the same deps, messages, usage,
//! iteration, open calls and next item number as folding every record
//! (the property `snapshot_plus_tail_is_the_whole_fold` checks it). A
//! snapshot is built from records, which hold no hidden or secret-looking
//! key, so neither does a snapshot.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::conversation::Message;
use super::fold::{FoldError, Folded, open_call_positions, open_calls};
use super::record::{Entry, Event, Record};
use super::transcript::Transcript;
use crate::context::Usage;

/// The snapshot format this version writes and reads.
pub const SNAPSHOT_VERSION: u32 = 1;

/// A journal's fold up to record `seq`, without its closed calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// [`SNAPSHOT_VERSION`] when written.
    pub version: u32,
    /// The last record folded.
    pub seq: u64,
    /// Deps after record `seq`.
    pub deps: Map<String, Value>,
    /// The conversation the model sees.
    pub messages: Vec<Message>,
    /// Items of the log folded and not held in `open`.
    pub items_folded: u64,
    /// The log's calls still open at record `seq`, in order.
    pub open: Vec<Event>,
    /// Usage totals.
    pub usage: Usage,
    /// The last model request's number.
    pub iteration: u32,
}

/// A stored snapshot that cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("snapshot at record {seq}: {problem}")]
pub struct SnapshotError {
    /// The record it claims to fold up to.
    pub seq: u64,
    /// What is wrong with it.
    pub problem: String,
}

impl Snapshot {
    /// `folded` (the fold of records 1..=`seq`) as a snapshot: its item
    /// log reduced to the calls still open.
    pub fn of(folded: &Folded, seq: u64) -> Self {
        let transcript = &folded.transcript;
        let open: Vec<Event> = open_calls(&transcript.items).into_iter().cloned().collect();
        let held = transcript.items.len() as u64;
        Snapshot {
            version: SNAPSHOT_VERSION,
            seq,
            deps: folded.deps.clone(),
            messages: transcript.messages.clone(),
            items_folded: transcript.items_folded + held - open.len() as u64,
            open,
            usage: folded.usage,
            iteration: folded.iteration,
        }
    }

    /// The snapshot as stored (JSON).
    pub fn encode(&self) -> String {
        // A snapshot is built of JSON values and plain fields: it always
        // serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A stored snapshot, which must claim to fold up to `seq`.
    pub fn decode(seq: u64, text: &str) -> Result<Self, SnapshotError> {
        let fail = |problem: String| SnapshotError { seq, problem };
        let version_error = |version: Option<u64>| match version {
            Some(v) => fail(format!("format {v}; this Airlock reads {SNAPSHOT_VERSION}")),
            None => fail("no format version".into()),
        };
        // One parse when the snapshot is good (every resume); the version
        // is looked at apart only to say why one is not.
        let snapshot: Snapshot =
            serde_json::from_str(text).map_err(|e| match serde_json::from_str::<Value>(text) {
                Ok(value) => match value.get("version").and_then(Value::as_u64) {
                    Some(v) if v == u64::from(SNAPSHOT_VERSION) => {
                        fail(format!("does not parse: {e}"))
                    }
                    other => version_error(other),
                },
                Err(_) => fail(format!("does not parse: {e}")),
            })?;
        if snapshot.version != SNAPSHOT_VERSION {
            return Err(version_error(Some(u64::from(snapshot.version))));
        }
        if snapshot.seq != seq {
            return Err(fail(format!(
                "it says it folds up to record {}",
                snapshot.seq
            )));
        }
        Ok(snapshot)
    }
}

impl Folded {
    /// The state `snapshot` holds, to fold the records after it onto.
    pub fn from_snapshot(snapshot: Snapshot) -> Self {
        Folded {
            deps: snapshot.deps,
            transcript: Transcript::resumed(
                snapshot.messages,
                snapshot.open,
                snapshot.items_folded,
            ),
            usage: snapshot.usage,
            iteration: snapshot.iteration,
        }
    }

    /// Folds `tail` (numbered on from `snapshot.seq + 1`) onto `snapshot`.
    pub fn resume<'a>(
        snapshot: Snapshot,
        tail: impl IntoIterator<Item = &'a Record>,
    ) -> Result<Self, FoldError> {
        let from = snapshot.seq + 1;
        let mut state = Folded::from_snapshot(snapshot);
        state.fold_from(from, tail)?;
        Ok(state)
    }

    /// Folds `records`, numbered on from `first`, onto this state.
    pub fn fold_from<'a>(
        &mut self,
        first: u64,
        records: impl IntoIterator<Item = &'a Record>,
    ) -> Result<(), FoldError> {
        for (expected, record) in (first..).zip(records) {
            self.fold_one(expected, record.seq, record.entry.clone())?;
        }
        Ok(())
    }

    /// [`Folded::fold_from`], taking the records (nothing is copied).
    pub(crate) fn fold_owned(&mut self, first: u64, records: Vec<Record>) -> Result<(), FoldError> {
        for (expected, record) in (first..).zip(records) {
            self.fold_one(expected, record.seq, record.entry)?;
        }
        Ok(())
    }

    fn fold_one(&mut self, expected: u64, seq: u64, entry: Entry) -> Result<(), FoldError> {
        if seq != expected {
            return Err(FoldError {
                seq,
                problem: format!("out of order: expected record {expected}"),
            });
        }
        self.absorb(entry)
            .map_err(|problem| FoldError { seq, problem })
    }
}

impl Transcript {
    /// Keeps of the item log only the calls still open, counting the rest
    /// in `items_folded`: the form a snapshot holds, so that a fold kept
    /// beside a session does not grow with its item log. In place: the
    /// log keeps its allocation for the items that follow.
    pub(crate) fn compact(&mut self) {
        let before = self.items.len();
        let open = open_call_positions(&self.items);
        let mut at = 0;
        self.items.retain(|_| {
            let keep = open.binary_search(&at).is_ok();
            at += 1;
            keep
        });
        self.items_folded += (before - self.items.len()) as u64;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::context::ContextOp;
    use crate::journal::record::{CallStatus, Item};
    use crate::journal::unanswered_calls;
    use crate::spec::ToolCall;

    /// A call id from a small set, so that ids repeat across turns.
    fn id() -> impl Strategy<Value = String> {
        (0..4u8).prop_map(|n| format!("call_{n}"))
    }

    fn call(id: String) -> ToolCall {
        ToolCall {
            id,
            ..ToolCall::new("t", "{}")
        }
    }

    /// Any entry a journal holds, items numbered later.
    fn entry() -> impl Strategy<Value = Entry> {
        let item = |item: Item| Entry::item(Event::numbered(0, "run", 0, item));
        prop_oneof![
            (0..3u8, 0..100i64).prop_map(|(k, v)| Entry::Deps {
                deps: json!({format!("k{k}"): v})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            }),
            id().prop_map(|id| Entry::Message {
                message: Message::Assistant {
                    content: None,
                    tool_calls: vec![call(id)],
                },
            }),
            id().prop_map(|call_id| Entry::Message {
                message: Message::Tool {
                    call_id,
                    name: "t".into(),
                    content: "ok".into(),
                    is_error: false,
                    shown: Vec::new(),
                },
            }),
            id().prop_map(move |id| item(Item::FunctionCall {
                call: call(id),
                iteration: 1,
                by: None,
            })),
            id().prop_map(move |call_id| item(Item::FunctionCallOutput {
                call_id,
                name: "t".into(),
                status: CallStatus::Completed,
                output: "{}".into(),
                error_kind: None,
                duration_us: 1,
                arguments: None,
                guest: Default::default(),
            })),
            (id(), 0..3u8, 0..100i64, any::<bool>()).prop_map(move |(call_id, k, v, delete)| {
                let key = format!("k{k}");
                let op = if delete {
                    ContextOp::Delete { key }
                } else {
                    ContextOp::Set {
                        key,
                        value: json!(v),
                    }
                };
                item(Item::ContextUpdate {
                    call_id,
                    ops: vec![op],
                })
            }),
            (0..1000u64, 0..50u32).prop_map(|(tokens, iteration)| Entry::Usage {
                usage: Usage {
                    requests: iteration,
                    input_tokens: tokens,
                    ..Usage::default()
                },
                iteration,
            }),
        ]
    }

    /// A journal: the entries as records 1, 2, 3, ..., items numbered in
    /// order as the recorder numbers them.
    fn journal(entries: Vec<Entry>) -> Vec<Record> {
        let mut items = 0;
        entries
            .into_iter()
            .zip(1..)
            .map(|(mut entry, seq)| {
                if let Some(event) = entry.event_mut() {
                    items += 1;
                    event.id = format!("item_{items}");
                }
                Record {
                    seq,
                    at_ms: seq,
                    entry,
                }
            })
            .collect()
    }

    proptest! {
        /// Resuming from a snapshot taken anywhere (through its stored
        /// encoding) and folding the rest gives what folding every record
        /// gives: deps, messages, usage, iteration, the calls a resume
        /// must answer, and the next item's number. Snapshots taken on top
        /// of snapshots too.
        #[test]
        fn snapshot_plus_tail_is_the_whole_fold(
            entries in prop::collection::vec(entry(), 0..60),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 1..4),
        ) {
            let records = journal(entries);
            let whole = Folded::fold(&records).unwrap();
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(records.len() + 1)).collect();
            cuts.sort_unstable();
            // Snapshot at each cut in turn, each taken from the state the
            // previous one resumed to.
            let mut state = Folded::default();
            let mut at = 0;
            for cut in cuts {
                state.fold_from(at as u64 + 1, &records[at..cut]).unwrap();
                // As the writer keeps it: compacted after each commit.
                state.transcript.compact();
                let snapshot = Snapshot::of(&state, cut as u64);
                let stored = snapshot.encode();
                state = Folded::from_snapshot(Snapshot::decode(cut as u64, &stored).unwrap());
                at = cut;
            }
            state.fold_owned(at as u64 + 1, records[at..].to_vec()).unwrap();
            prop_assert_eq!(&state.deps, &whole.deps);
            prop_assert_eq!(&state.transcript.messages, &whole.transcript.messages);
            prop_assert_eq!(state.usage, whole.usage);
            prop_assert_eq!(state.iteration, whole.iteration);
            prop_assert_eq!(unanswered_calls(&state.transcript), unanswered_calls(&whole.transcript));
            prop_assert_eq!(state.transcript.next_item(), whole.transcript.next_item());
        }
    }

    #[test]
    fn a_snapshot_it_cannot_read_is_refused_by_name() {
        let good = Snapshot::of(&Folded::default(), 7).encode();
        for (text, problem) in [
            ("not json".to_owned(), "does not parse"),
            (good.replace("\"version\":1", "\"version\":2"), "format 2"),
            (good.replace("\"version\":1,", ""), "no format version"),
            (
                good.replace("\"seq\":7", "\"seq\":6"),
                "folds up to record 6",
            ),
            (good.replace("\"deps\":{}", "\"deps\":[]"), "does not parse"),
        ] {
            let e = Snapshot::decode(7, &text).unwrap_err();
            assert!(e.to_string().contains(problem), "{e}");
            assert!(e.to_string().starts_with("snapshot at record 7"), "{e}");
        }
    }
}
