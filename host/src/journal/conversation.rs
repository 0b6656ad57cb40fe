//! The conversation as the journal stores it: the messages a model sees,
//! what a tool wrote while it ran, and how a call ended. The journal owns
//! these types; the layers that make them (providers, the sandbox, the
//! tools) convert into them, so nothing they add changes what is stored
//! (`Record`'s format is checked against a committed sample in the
//! journal's tests).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::context::ContextOp;
use crate::kind::ErrorKind;
use crate::spec::ToolCall;

/// One message of a conversation, in provider-neutral form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// Instructions for the model.
    System {
        /// The text.
        content: String,
    },
    /// The person's prompt.
    User {
        /// The text.
        content: String,
    },
    /// The model's turn: text, tool calls, or both.
    Assistant {
        /// The text, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        /// The calls it asked for, in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The answer to one tool call.
    Tool {
        /// The call it answers.
        call_id: String,
        /// The tool.
        name: String,
        /// The result JSON, or the error text.
        content: String,
        /// Whether the call failed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
        /// What the call showed beside its result (images, audio, links,
        /// resources): a provider sends what its API carries and names
        /// the rest in the text ([`tool_text`]).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        shown: Vec<crate::spec::Shown>,
    },
}

/// A tool message's text for a provider: its `content`, and a line
/// naming what the call showed that the provider does not carry (each
/// block of `shown` for which `carried` is false).
pub fn tool_text(
    content: &str,
    shown: &[crate::spec::Shown],
    carried: impl Fn(&crate::spec::Shown) -> bool,
) -> String {
    let left: Vec<String> = shown
        .iter()
        .filter(|block| !carried(block))
        .map(crate::spec::Shown::describe)
        .collect();
    if left.is_empty() {
        return content.to_owned();
    }
    format!(
        "{content}\n[the tool also showed its user {}, not included here]",
        left.join("; ")
    )
}

/// What a tool wrote while it ran (and what the host refused it), as a
/// `function_call_output` item keeps it: each part bounded by the call's
/// `max_output_bytes` when it was captured.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Captured {
    /// Records from the `log` interface, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<CapturedLog>,
    /// What the tool wrote to stdout.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stdout: String,
    /// What the tool wrote to stderr.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stderr: String,
    /// What the tool asked for that the host refused, each with why.
    /// Written by the host, never by the tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<String>,
    /// What a completed call showed beside its result (`show`), as the
    /// host checked it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shown: Vec<crate::spec::Shown>,
    /// The questions the call asked its person, and the answers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asked: Vec<crate::spec::Asked>,
    /// The completions the call asked the model for, and the replies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sampled: Vec<crate::spec::Sampled>,
    /// What it read of the clocks and random numbers, for a replay
    /// (`None`: nothing; boxed, as most calls have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tape: Option<Box<crate::spec::Tape>>,
}

/// One record a tool logged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapturedLog {
    /// Its level, as the `log` interface names it: `trace`, `debug`,
    /// `info`, `warn` or `error`.
    pub level: String,
    /// Its text, as the tool wrote it.
    pub message: String,
}

/// How a call that was asked for ended, as the journal records it.
#[derive(Debug, Clone)]
pub enum CallEnd<'a> {
    /// It completed: its result, the ops it applied to the context (all
    /// of them; the recorder leaves out hidden and secret-looking keys),
    /// what it wrote.
    Completed {
        /// The tool's result.
        result: &'a Value,
        /// The ops applied, in order.
        ops: &'a [ContextOp],
        /// What it wrote.
        output: Captured,
    },
    /// It failed, or was cancelled.
    Failed {
        /// What the model (or client) is told.
        text: String,
        /// The failure's kind.
        kind: ErrorKind,
        /// Whether the run's cancellation stopped it.
        cancelled: bool,
        /// What it wrote before it failed.
        output: Captured,
    },
    /// It never ran: the approval handler rejected it
    /// ([`REJECTED_MESSAGE`](crate::journal::REJECTED_MESSAGE)), or its turn
    /// asked for more calls than run. What the model (or client) is told.
    Rejected(String),
}
