//! The journal: what a conversation records, below both the agent loop
//! and sessions.
//!
//! A conversation is a context, a transcript (the messages the model sees
//! and the item log) and, when it is durable, a [`Sink`] its records are
//! committed to. Everything recorded goes through one recorder, so a tool
//! call reads the same in the journal whether the agent loop ran it or a
//! session's direct call did (`airlock call --session`, MCP):
//!
//! 1. its intent, a `function_call` item, committed before it runs (a
//!    model's calls with the model's turn, before any of them runs);
//! 2. its end, committed together after it: the `function_call_output`
//!    item (result or failure text, failure kind, what the guest wrote;
//!    for a call the model asked for, its tool message) and the
//!    `context_update` item with the ops it applied (less hidden and
//!    secret-looking keys: [`secrets`]).
//!
//! Each fact is recorded once: the messages the model sees are rebuilt
//! from the items ([`Transcript`]).
//!
//! A journal is a list of [`Record`]s numbered from 1 without gaps; its
//! state is their fold ([`Folded`]). A call with an intent and no end was
//! interrupted; [`patch_entries`] answers it (once).
//!
//! Nothing here knows how records are stored: [`crate::session`] keeps
//! them in a store and leases them to one run at a time.

mod conversation;
mod decode;
mod fold;
mod record;
pub(crate) mod recorder;
pub mod secrets;
mod sink;
mod snapshot;
mod transcript;

pub use conversation::{CallEnd, Captured, CapturedLog, Message, tool_text};
pub use decode::entry_from_json;
pub use fold::{FoldError, Folded, INTERRUPTED_MESSAGE, patch_entries, unanswered_calls};
pub use record::{
    CallStatus, CalledBy, Entry, Event, Item, Outcome, RECORD_FORMAT, Record, Role, now_ms,
};
pub use recorder::{CANCELLED_MESSAGE, REJECTED_MESSAGE};
pub use sink::{Conversation, Durability, Flush, Sink, StoreError};
pub use snapshot::{SNAPSHOT_VERSION, Snapshot, SnapshotError};
pub use transcript::Transcript;
