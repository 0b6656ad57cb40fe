//! A call's questions for a client of the 2026-07-28 revision:
//! `input_required` round trips. Such a client takes no request from the
//! server mid-call, so a call whose tool asks its person or the model
//! ends `input_required`, naming the question (an elicitation, or a
//! request for a completion); the client sends the call again with the
//! answer, and the call runs again from its start, every answer given so
//! far handed back in order, until it reaches its next question or its
//! end.
//!
//! What was answered travels in the result's `requestState`: JSON, with
//! an HMAC-SHA256 under the server's [`StateKey`] (drawn when the process
//! starts, or the operator's, shared by every host of a deployment and
//! kept across restarts), bound to the tool and its arguments. A state
//! that does not verify (forged, for another call, or sealed under
//! another key) is refused and the client must start the call over. Each round is a call of its
//! own in the session's journal (the ones that stopped at a question end
//! `cancelled`); a tool that has effects repeats them each round, which
//! is why a tool that may ask never runs twice in a parallel turn but may
//! here: the revision's protocol re-runs it.

// Sampling is deprecated by SEP-2577 for later revisions; a call of this
// revision still asks its client's model through it.
#![allow(deprecated)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

use base64::Engine;
use rmcp::model::{
    CreateMessageRequest, CreateMessageRequestParams, ElicitRequest, ElicitRequestParams,
    ElicitationSchema, InputRequest, InputRequests, InputRequiredResult, InputResponses,
    SamplingMessage,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{NO_ELICITATION, NO_SAMPLING, lock};
use crate::sandbox::{Asker, CancelToken, Sampler};
use crate::spec::{Answer, Asked, SampleReply, SampleRequest};

/// What a round trip carries from one round to the next.
#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    /// The tool and a digest of its arguments: a state opens only for the
    /// call it was made for.
    tool: String,
    arguments: String,
    /// The person's answers and the model's replies so far, in order.
    answers: Vec<Answer>,
    replies: Vec<SampleReply>,
    /// Whether the person approved the call (`approval = "ask"`).
    #[serde(default)]
    approved: bool,
}

/// Where a round stands on the call's approval (`approval = "ask"`).
#[derive(Debug)]
pub(super) enum Approval {
    /// The person allowed the call.
    Given,
    /// The person refused it.
    Refused,
    /// The person is to be asked first: the `input_required` result.
    Ask(InputRequiredResult),
}

/// The question a round stopped at.
#[derive(Debug)]
enum Waiting {
    Person(Asked),
    Model(SampleRequest),
}

/// One round of a call: what it may answer from earlier rounds, and the
/// question it stops at.
#[derive(Debug)]
pub(super) struct Round {
    state: Mutex<State>,
    answers: Mutex<VecDeque<Answer>>,
    replies: Mutex<VecDeque<SampleReply>>,
    waiting: Mutex<Option<Waiting>>,
    /// The call's token, cancelled when it stops at a question.
    cancel: OnceLock<CancelToken>,
    /// The person's answer to the approval question, in this round.
    approval: Option<Answer>,
    /// What the client declared it can do: ask its user, ask its model.
    person: bool,
    model: bool,
    /// What seals the state it hands on.
    key: StateKey,
}

/// The key that seals a server's round states.
#[derive(Clone)]
pub struct StateKey(Option<Arc<ring::hmac::Key>>);

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateKey(…)")
    }
}

/// The fewest bytes of an operator's state key.
pub const MIN_STATE_KEY: usize = 32;

impl StateKey {
    /// A key drawn now: states it seals open in this process only. None
    /// when the system's random source fails (then no state is sealed or
    /// opened: a call that asks is refused, never sealed with a key anyone
    /// could guess).
    pub fn random() -> Self {
        let rng = ring::rand::SystemRandom::new();
        Self(
            ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng)
                .ok()
                .map(Arc::new),
        )
    }

    /// The operator's key, the same on every host that serves the same
    /// clients: a state sealed by one opens on all, and after a restart.
    /// `None` when `secret` is shorter than [`MIN_STATE_KEY`] bytes.
    pub fn from_secret(secret: &[u8]) -> Option<Self> {
        (secret.len() >= MIN_STATE_KEY).then(|| {
            Self(Some(Arc::new(ring::hmac::Key::new(
                ring::hmac::HMAC_SHA256,
                secret,
            ))))
        })
    }

    fn get(&self) -> Option<&ring::hmac::Key> {
        self.0.as_deref()
    }
}

/// The SHA-256 of `text`, hex.
fn digest(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

impl Round {
    /// The round of a call of `tool` with `arguments` (JSON text) that the
    /// client sent with `state` and `responses` (none on the first);
    /// why not, when they do not fit the call.
    pub(super) fn resume(
        tool: &str,
        arguments: &str,
        state: Option<&str>,
        responses: Option<&InputResponses>,
        client: &rmcp::model::ClientCapabilities,
        key: &StateKey,
    ) -> Result<Self, String> {
        if key.get().is_none() {
            return Err("this server cannot seal a requestState (no random source)".into());
        }
        let mut opened = match state {
            None => State {
                tool: tool.to_owned(),
                arguments: digest(arguments),
                ..State::default()
            },
            Some(sealed) => open(sealed, key)?,
        };
        if opened.tool != tool || opened.arguments != digest(arguments) {
            return Err(
                "the requestState is for another call: send the call again without it".into(),
            );
        }
        let mut approval = None;
        for (id, response) in responses.into_iter().flatten() {
            match id.split_once('-') {
                _ if id == "approval" => approval = Some(answer(response)),
                Some(("person", _)) => opened.answers.push(answer(response)),
                Some(("model", _)) => opened.replies.push(reply(response)),
                _ => {
                    let id = crate::text::truncate(id, 128);
                    return Err(format!("no question of this call is named {id:?}"));
                }
            }
        }
        Ok(Self {
            answers: Mutex::new(opened.answers.iter().cloned().collect()),
            replies: Mutex::new(opened.replies.iter().cloned().collect()),
            state: Mutex::new(opened),
            waiting: Mutex::new(None),
            cancel: OnceLock::new(),
            approval,
            person: client.elicitation.is_some(),
            model: client.sampling.is_some(),
            key: key.clone(),
        })
    }

    /// Where the call's approval stands: given in an earlier round or
    /// this one, refused now, or to be asked (`question`).
    pub(super) fn approval(&self, question: String) -> Approval {
        let mut state = lock(&self.state);
        if state.approved {
            return Approval::Given;
        }
        match &self.approval {
            Some(Answer::Accept { .. }) => {
                state.approved = true;
                Approval::Given
            }
            Some(_) => Approval::Refused,
            None if !self.person => Approval::Refused,
            None => {
                let params = ElicitRequestParams::FormElicitationParams {
                    meta: None,
                    message: question,
                    requested_schema: ElicitationSchema::new(Default::default()),
                };
                let requests = InputRequests::from([(
                    "approval".to_owned(),
                    InputRequest::Elicitation(ElicitRequest::new(params)),
                )]);
                Approval::Ask(InputRequiredResult::new(
                    Some(requests),
                    Some(seal(&state, &self.key)),
                ))
            }
        }
    }

    /// The call's token, to stop it at a question.
    pub(super) fn runs_with(&self, cancel: &CancelToken) {
        let _ = self.cancel.set(cancel.clone());
    }

    /// Answers the call's questions from earlier rounds; stops it at the
    /// first one not answered yet.
    pub(super) fn asker(self: &Arc<Self>) -> Asker {
        let round = Arc::clone(self);
        Arc::new(move |asked: Asked| {
            let next = lock(&round.answers).pop_front();
            let answer = next.unwrap_or_else(|| {
                if !round.person {
                    return Answer::Unavailable {
                        why: NO_ELICITATION.into(),
                    };
                }
                round.stop(Waiting::Person(asked));
                Answer::Cancel
            });
            Box::pin(async move { answer })
        })
    }

    /// Answers the call's requests for a completion from earlier rounds;
    /// stops it at the first one not answered yet.
    pub(super) fn sampler(self: &Arc<Self>) -> Sampler {
        let round = Arc::clone(self);
        Arc::new(move |request: SampleRequest| {
            let next = lock(&round.replies).pop_front();
            let reply = next.unwrap_or_else(|| {
                if !round.model {
                    return SampleReply::Refused {
                        why: NO_SAMPLING.into(),
                    };
                }
                round.stop(Waiting::Model(request));
                SampleReply::Refused {
                    why: "waiting for the client's model".into(),
                }
            });
            Box::pin(async move { reply })
        })
    }

    fn stop(&self, waiting: Waiting) {
        *lock(&self.waiting) = Some(waiting);
        if let Some(cancel) = self.cancel.get() {
            cancel.cancel();
        }
    }

    /// The `input_required` result, when the call stopped at a question.
    pub(super) fn input_required(&self) -> Option<InputRequiredResult> {
        let waiting = lock(&self.waiting).take()?;
        let state = lock(&self.state);
        let (id, request) = match waiting {
            Waiting::Person(asked) => (
                format!("person-{}", state.answers.len() + 1),
                person_request(asked),
            ),
            Waiting::Model(request) => (
                format!("model-{}", state.replies.len() + 1),
                model_request(request),
            ),
        };
        let requests = InputRequests::from([(id, request)]);
        Some(InputRequiredResult::new(
            Some(requests),
            Some(seal(&state, &self.key)),
        ))
    }
}

/// `state` as JSON and its HMAC, both base64url (empty without a key:
/// it opens nowhere).
fn seal(state: &State, key: &StateKey) -> String {
    let Some(key) = key.get() else {
        return String::new();
    };
    let json = serde_json::to_vec(state).unwrap_or_default();
    let tag = ring::hmac::sign(key, &json);
    format!("{}.{}", B64.encode(&json), B64.encode(tag.as_ref()))
}

/// The state `sealed` holds, when its HMAC verifies under `key`.
fn open(sealed: &str, key: &StateKey) -> Result<State, String> {
    let refused = || {
        "the requestState does not verify (forged, or sealed by another server or before a \
         restart, without a shared state key): send the call again without it"
            .to_owned()
    };
    let key = key.get().ok_or_else(refused)?;
    let (json, tag) = sealed.split_once('.').ok_or_else(refused)?;
    let json = B64.decode(json).map_err(|_| refused())?;
    let tag = B64.decode(tag).map_err(|_| refused())?;
    ring::hmac::verify(key, &json, &tag).map_err(|_| refused())?;
    serde_json::from_slice(&json).map_err(|_| refused())
}

/// A tool's question as the input request a client answers (a schema MCP
/// elicitation cannot carry is sent as an empty form).
pub(super) fn person_request(asked: Asked) -> InputRequest {
    let schema: ElicitationSchema = serde_json::from_value(asked.schema)
        .unwrap_or_else(|_| ElicitationSchema::new(Default::default()));
    let params = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: asked.message,
        requested_schema: schema,
    };
    InputRequest::Elicitation(ElicitRequest::new(params))
}

/// A tool's request for a completion as the input request a client answers.
pub(super) fn model_request(request: SampleRequest) -> InputRequest {
    InputRequest::CreateMessage(CreateMessageRequest::new(sample_params(request)))
}

/// A client's answer to an elicitation (`{"action": …, "content": …}`).
pub(super) fn answer(response: &Value) -> Answer {
    match response.get("action").and_then(Value::as_str) {
        Some("accept") => Answer::Accept {
            content: response
                .get("content")
                .cloned()
                .unwrap_or_else(|| Value::Object(Default::default())),
        },
        Some("decline") => Answer::Decline,
        Some("cancel") => Answer::Cancel,
        _ => Answer::Unavailable {
            why: "the client's answer is not an elicitation result".into(),
        },
    }
}

/// A client's reply to a request for a completion (a `CreateMessageResult`).
pub(super) fn reply(response: &Value) -> SampleReply {
    let content = &response["content"];
    let texts: Vec<&str> = match content {
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).collect(),
        block => block["text"].as_str().into_iter().collect(),
    };
    match response["model"].as_str() {
        Some(model) if !texts.is_empty() => SampleReply::Answered {
            text: texts.join("\n"),
            model: model.to_owned(),
            stop_reason: response["stopReason"].as_str().map(str::to_owned),
        },
        _ => SampleReply::Refused {
            why: "the client's reply is not a completion".into(),
        },
    }
}

/// A request for a completion as MCP carries it.
pub(super) fn sample_params(request: SampleRequest) -> CreateMessageRequestParams {
    use rmcp::model::Role;
    let messages = request
        .messages
        .into_iter()
        .map(|(role, text)| {
            let role = if role == "assistant" {
                Role::Assistant
            } else {
                Role::User
            };
            SamplingMessage::new(role, rmcp::model::SamplingMessageContentBlock::text(text))
        })
        .collect();
    let mut params = CreateMessageRequestParams::new(messages, request.max_tokens);
    params.system_prompt = request.system;
    params
}
