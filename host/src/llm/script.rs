//! The `script` provider: the model's turns, read from a JSON file, played
//! back in order. It drives the real loop offline (the demo, tests) and can
//! replay a recorded run.
//!
//! ```json
//! {
//!   "turns": [
//!     {"text": "Let me count.", "tool_calls": [
//!       {"name": "increment", "arguments": {"name": "vowels"}},
//!       {"id": "call_2", "name": "increment", "arguments": "{\"name\": \"vowels\"}"}
//!     ]},
//!     {"text": "There are 2 vowels.", "usage": {"input_tokens": 120, "output_tokens": 9}}
//!   ]
//! }
//! ```
//!
//! `arguments` is an object, or a string sent verbatim (which may be
//! invalid JSON, to test how tools and the loop cope). Ids default to
//! `call_<turn>_<n>`. A run that asks for more turns than the file has
//! fails with an error naming the file.
//!
//! A tool that asks the model (`ask-model`) gets the replies of
//! `"samples": [{"text": "…", "usage": {…}}]` in order (past the last, it
//! is refused); one that asks its person (`ask-user`) gets the answers of
//! `"answers": [{"action": "accept", "content": {…}}, {"action":
//! "decline"}, …]` in order (past the last, `unavailable`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Deserialize;
use serde_json::Value;

use super::{Message, Model, ModelError, ModelReply, TokenUsage};
use crate::spec::{ToolCall, ToolSpec};
use futures::future::BoxFuture;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    /// A note for readers of the script; the loop ignores it.
    #[serde(default, rename = "description")]
    _description: Option<String>,
    turns: Vec<Turn>,
    /// The model's replies to tools that ask it (`ask-model`), in order.
    #[serde(default)]
    samples: Vec<Sample>,
    /// The person's answers to tools' questions (`ask-user`), in order.
    #[serde(default)]
    answers: Vec<crate::spec::Answer>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sample {
    text: String,
    #[serde(default)]
    usage: TokenUsage,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Turn {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_calls: Vec<Call>,
    #[serde(default)]
    usage: TokenUsage,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    #[serde(default)]
    id: Option<String>,
    name: String,
    #[serde(default = "empty_object")]
    arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// Plays a script's turns back, one per model request.
#[derive(Debug)]
pub struct ScriptModel {
    path: PathBuf,
    turns: Vec<Turn>,
    next: AtomicUsize,
    samples: Vec<Sample>,
    next_sample: AtomicUsize,
    answers: Vec<crate::spec::Answer>,
    next_answer: AtomicUsize,
}

impl ScriptModel {
    /// Reads and checks the script at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let err = |message: String| ModelError::Script {
            path: path.display().to_string(),
            message,
        };
        let text =
            crate::fs::read_settings_text(path).map_err(|e| err(format!("cannot read: {e}")))?;
        let file: ScriptFile =
            serde_json::from_str(&text).map_err(|e| err(format!("not a valid script: {e}")))?;
        for (t, turn) in file.turns.iter().enumerate() {
            for call in &turn.tool_calls {
                if !(call.arguments.is_object() || call.arguments.is_string()) {
                    return Err(err(format!(
                        "turn {}: tool call {:?}: arguments must be an object or a string",
                        t + 1,
                        call.name
                    )));
                }
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            turns: file.turns,
            next: AtomicUsize::new(0),
            samples: file.samples,
            next_sample: AtomicUsize::new(0),
            answers: file.answers,
            next_answer: AtomicUsize::new(0),
        })
    }

    /// The script's next answer to a tool's question; `unavailable` once
    /// they run out.
    pub fn answer(&self) -> crate::spec::Answer {
        let index = self.next_answer.fetch_add(1, Ordering::SeqCst);
        self.answers
            .get(index)
            .cloned()
            .unwrap_or_else(|| crate::spec::Answer::Unavailable {
                why: format!(
                    "the script {} has {} answers, and this is question {}",
                    self.path.display(),
                    self.answers.len(),
                    index + 1
                ),
            })
    }

    fn error(&self, message: String) -> ModelError {
        ModelError::Script {
            path: self.path.display().to_string(),
            message,
        }
    }
}

impl Model for ScriptModel {
    fn name(&self) -> String {
        format!("script:{}", self.path.display())
    }

    fn complete<'a>(
        &'a self,
        _messages: &'a [Message],
        _tools: &'a [ToolSpec],
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
        let index = self.next.fetch_add(1, Ordering::SeqCst);
        let reply = match self.turns.get(index) {
            None => Err(self.error(format!(
                "ran out of turns: the run asked for turn {} but the script has {}",
                index + 1,
                self.turns.len()
            ))),
            Some(turn) => Ok(ModelReply {
                content: turn.text.clone(),
                tool_calls: turn
                    .tool_calls
                    .iter()
                    .enumerate()
                    .map(|(n, call)| ToolCall {
                        id: call
                            .id
                            .clone()
                            .unwrap_or_else(|| format!("call_{}_{}", index + 1, n + 1)),
                        name: call.name.clone(),
                        arguments: match &call.arguments {
                            Value::String(raw) => raw.clone(),
                            other => other.to_string(),
                        },
                        retry: 0,
                    })
                    .collect(),
                usage: turn.usage,
            }),
        };
        Box::pin(async move { reply })
    }

    fn sample<'a>(
        &'a self,
        _request: &'a crate::spec::SampleRequest,
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
        let index = self.next_sample.fetch_add(1, Ordering::SeqCst);
        let reply = match self.samples.get(index) {
            None => Err(self.error(format!(
                "ran out of samples: a tool asked the model for sample {} but the script has {}",
                index + 1,
                self.samples.len()
            ))),
            Some(sample) => Ok(ModelReply {
                content: Some(sample.text.clone()),
                tool_calls: Vec::new(),
                usage: sample.usage,
            }),
        };
        Box::pin(async move { reply })
    }

    fn check_tools(&self, available: &[String]) -> Result<(), ModelError> {
        for (t, turn) in self.turns.iter().enumerate() {
            for call in &turn.tool_calls {
                if !available.contains(&call.name) {
                    return Err(self.error(format!(
                        "turn {}: tool {:?} is not loaded; loaded: {}",
                        t + 1,
                        call.name,
                        if available.is_empty() {
                            "none".to_owned()
                        } else {
                            available.join(", ")
                        }
                    )));
                }
            }
        }
        Ok(())
    }
}
