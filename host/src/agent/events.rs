//! The run's item log: an append-only list of what happened, in order.
//! Streamed as it happens (JSON lines in the CLI) and kept with the run.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::context::ContextOp;
use crate::sandbox::GuestOutput;

/// One item of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// `item_<n>`, unique within the run, in order.
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
        /// `answered`, or the error's kind (`RunError::kind`).
        outcome: String,
        /// Model requests the run made.
        iterations: u32,
    },
    /// A message of the conversation: the user's prompt or the model's text.
    Message {
        /// Who said it.
        role: Role,
        /// The text (absent for a model turn that only called tools).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        /// The model request it belongs to (0 for the prompt).
        iteration: u32,
    },
    /// The model asked for a tool call.
    FunctionCall {
        /// The model's id for the call.
        call_id: String,
        /// The tool.
        name: String,
        /// The model's arguments, verbatim.
        arguments: String,
        /// The model request that asked for it.
        iteration: u32,
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
        /// `CallError::kind()` when the call failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_kind: Option<String>,
        /// Wall-clock time, approval included.
        duration_us: u64,
        /// What the guest logged and printed, for failed calls too (empty
        /// when it never ran).
        #[serde(flatten)]
        guest: GuestOutput,
    },
    /// The ops a successful call applied to deps, in order.
    ContextUpdate {
        /// The call that returned them.
        call_id: String,
        /// The ops, in the order applied.
        ops: Vec<ContextOp>,
    },
    /// The run itself failed (model error, max iterations, cancellation).
    Error {
        /// `RunError::kind`.
        kind: String,
        /// What went wrong.
        message: String,
    },
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
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

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
