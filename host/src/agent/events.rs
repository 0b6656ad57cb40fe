//! The run's item log: an append-only list of what happened, in order.
//! Streamed as it happens (JSON lines in the CLI) and kept with the run.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::context::ContextOp;
use crate::sandbox::LogRecord;

/// One item of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// `item_<n>`, unique within the run, in order.
    pub id: String,
    pub run_id: String,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    #[serde(flatten)]
    pub item: Item,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Item {
    /// A message of the conversation: the user's prompt or the model's text.
    Message {
        role: Role,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        iteration: u32,
    },
    /// The model asked for a tool call.
    FunctionCall {
        call_id: String,
        name: String,
        arguments: String,
        iteration: u32,
    },
    /// How a tool call ended, and what the model is told.
    FunctionCallOutput {
        call_id: String,
        name: String,
        status: CallStatus,
        /// What the model sees: the result JSON, or the error text.
        output: String,
        /// `CallError::kind()` when the call failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_kind: Option<String>,
        duration_us: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        logs: Vec<LogRecord>,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        stdout: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        stderr: String,
    },
    /// The ops a successful call applied to deps, in order.
    ContextUpdate {
        call_id: String,
        ops: Vec<ContextOp>,
    },
    /// The run itself failed (model error, max iterations, cancellation).
    Error { kind: String, message: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
}

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
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
