//! Folding a journal back into a conversation's state, and answering the
//! calls it left open.
//!
//! The state (deps, messages, item log, usage) is the fold of the records
//! in order: deps start from the last [`Entry::Deps`] and take every
//! [`Item::ContextUpdate`]'s ops in order.

use serde_json::{Map, Value};

use super::conversation::Captured;
use super::conversation::Message;
use super::record::{CallStatus, Entry, Event, Item, Record};
use super::transcript::Transcript;
use crate::context::Usage;
use crate::kind::ErrorKind;

/// What a tool message says about a call that was asked for but never
/// answered: the process died while it ran, or the run ended (cancelled,
/// `max_iterations`) before it was started.
pub const INTERRUPTED_MESSAGE: &str =
    "Tool call was interrupted and not executed. Please retry if needed.";

/// A session's state: the fold of its journal.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Folded {
    /// Deps after every committed op.
    pub deps: Map<String, Value>,
    /// The conversation and the item log.
    pub transcript: Transcript,
    /// Usage totals.
    pub usage: Usage,
    /// The last model request's number.
    pub iteration: u32,
}

/// A journal whose records do not fold: the store holds something Airlock
/// did not write.
#[derive(Debug, Clone, thiserror::Error)]
#[error("record {seq}: {problem}")]
pub struct FoldError {
    /// The record at fault.
    pub seq: u64,
    /// What is wrong with it.
    pub problem: String,
}

impl Folded {
    /// Folds `records` in order. Their numbers must run 1, 2, 3, ...
    pub fn fold<'a>(records: impl IntoIterator<Item = &'a Record>) -> Result<Self, FoldError> {
        let mut state = Folded::default();
        state.fold_from(1, records)?;
        Ok(state)
    }

    /// Applies one entry.
    pub fn apply(&mut self, entry: &Entry) -> Result<(), String> {
        self.absorb(entry.clone())
    }

    /// [`Folded::apply`], taking the entry (nothing is copied).
    pub(crate) fn absorb(&mut self, entry: Entry) -> Result<(), String> {
        match entry {
            Entry::Deps { deps } => self.deps = deps,
            Entry::Event { event, .. } => {
                self.replay(&event)?;
                self.transcript.push_event(event);
            }
            Entry::Message { message } => self.transcript.push_stored_message(message),
            Entry::Item { event, .. } => {
                self.replay(&event)?;
                self.transcript.items.push(event);
            }
            Entry::Usage { usage, iteration } => {
                self.usage = usage;
                self.iteration = iteration;
            }
        }
        Ok(())
    }
}

impl Folded {
    /// Applies a `context_update` item's ops to deps.
    fn replay(&mut self, event: &Event) -> Result<(), String> {
        if let Item::ContextUpdate { ops, .. } = &event.item {
            crate::context::replay(&mut self.deps, ops).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// The log's function calls with no output, in order: an output closes
/// the earliest open call with its id.
pub(crate) fn open_calls(items: &[Event]) -> Vec<&Event> {
    open_call_positions(items)
        .into_iter()
        .map(|at| &items[at])
        .collect()
}

/// Where in `items` [`open_calls`] are, in order.
pub(crate) fn open_call_positions(items: &[Event]) -> Vec<usize> {
    let mut open: Vec<usize> = Vec::new();
    for (at, event) in items.iter().enumerate() {
        match &event.item {
            Item::FunctionCall { .. } => open.push(at),
            Item::FunctionCallOutput { call_id, .. } => {
                let closed = open.iter().position(|&asked| {
                    matches!(&items[asked].item, Item::FunctionCall { call, .. } if &call.id == call_id)
                });
                if let Some(closed) = closed {
                    open.remove(closed);
                }
            }
            _ => {}
        }
    }
    open
}

/// Calls asked for and never answered, in the order asked: (call id,
/// tool name, whether the model is waiting for a tool message).
///
/// Two sources: the model's tool calls that no tool message answers (the
/// process died mid-turn, or the run ended before it got to them), and
/// function-call items with no output item (a call outside the agent loop
/// that never finished). Ids may repeat across turns; an answer closes the
/// earliest open call with its id.
pub fn unanswered_calls(transcript: &Transcript) -> Vec<(String, String, bool)> {
    fn close(open: &mut Vec<(String, String, bool)>, id: &str) {
        if let Some(at) = open.iter().position(|(open_id, ..)| open_id == id) {
            open.remove(at);
        }
    }
    let mut asked: Vec<(String, String, bool)> = Vec::new();
    for message in &transcript.messages {
        match message {
            Message::Assistant { tool_calls, .. } => {
                asked.extend(
                    tool_calls
                        .iter()
                        .map(|c| (c.id.clone(), c.name.clone(), true)),
                );
            }
            Message::Tool { call_id, .. } => close(&mut asked, call_id),
            Message::User { .. } | Message::System { .. } => {}
        }
    }
    let mut started: Vec<(String, String, bool)> = open_calls(&transcript.items)
        .into_iter()
        .filter_map(|event| match &event.item {
            Item::FunctionCall { call, .. } => Some((call.id.clone(), call.name.clone(), false)),
            _ => None,
        })
        .collect();
    for (id, ..) in &asked {
        close(&mut started, id);
    }
    asked.extend(started);
    asked
}

/// The entries that answer every unanswered call with
/// [`INTERRUPTED_MESSAGE`]: an `interrupted` output item each (which is
/// the tool message for those the model waits on). Empty when nothing is
/// unanswered, so patching twice adds nothing. The answer to a call the
/// model did not ask for (one made directly, keyed or not) is indexed by
/// the call's id, as a keyed call's records are, so that what a key finds
/// (an MCP task's state) says the call was interrupted.
pub fn patch_entries(transcript: &Transcript, run_id: &str, now_ms: u64) -> Vec<Entry> {
    (transcript.next_item()..)
        .zip(unanswered_calls(transcript))
        .map(|(next_item, (call_id, name, by_model))| {
            let keyed = !by_model;
            let entry = |event| Entry::Event { event, keyed };
            entry(Event::numbered(
                next_item,
                run_id,
                now_ms,
                Item::FunctionCallOutput {
                    call_id,
                    name,
                    status: CallStatus::Interrupted,
                    output: INTERRUPTED_MESSAGE.to_owned(),
                    error_kind: Some(ErrorKind::Interrupted),
                    duration_us: 0,
                    arguments: None,
                    guest: Captured::default(),
                },
            ))
        })
        .collect()
}
