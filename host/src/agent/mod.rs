//! The agent loop (DESIGN §5): model turns, tool dispatch, approval,
//! events, cancellation.
//!
//! Each iteration sends the conversation and the tool specs to the model.
//! Its tool calls run one at a time, in the order the model gave them, each
//! seeing the deps the calls before it left (three `increment` calls in one
//! turn leave 3). Every call ends with a tool message to the model: the
//! result, or what went wrong (unknown tool, bad arguments, a rejected
//! approval, a failed call), and the loop goes on. The run ends when the
//! model answers without tool calls, or with an error: `max_iterations`
//! model requests without an answer, a model failure, or cancellation. The
//! transcript (messages and item log) holds everything up to that point in
//! either case.

mod direct;
pub mod replay;
mod turn;

pub(crate) use direct::KeyedCall;
pub use direct::{CallStart, SessionCallError};

use std::sync::Arc;

use serde::Serialize;
use tokio::sync::mpsc;

use crate::context::{RunContext, Usage};
pub use crate::journal::REJECTED_MESSAGE;
use crate::journal::recorder::Recorder;
use crate::journal::{Conversation, Event, Item, Outcome, StoreError, Transcript};
use crate::kind::ErrorKind;
use crate::llm::{Model, ModelError};
use crate::policy::TurnPolicy;
use crate::sandbox::{Asker, CallEvent, CancelToken};
use crate::spec::ToolCall;
use crate::tools::Host;
use futures::future::BoxFuture;
use turn::Run;

/// Settings for a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentOptions {
    /// Model requests allowed in one run. Default 10.
    pub max_iterations: u32,
    /// Sent first when the transcript is empty.
    pub system_prompt: Option<String>,
    /// Most bytes (as JSON) of items one run may add to its transcript.
    /// Each call's output is already bounded by its limits; this bounds
    /// their sum, so a run holds a bounded amount of memory whatever its
    /// tools return. Past it the run ends with
    /// [`RunError::TranscriptTooLarge`]. Default 64 MiB.
    pub max_transcript_bytes: usize,
    /// How the calls of one model turn run: by default concurrently (at
    /// most [`TurnPolicy::max_parallel`] at once), with exactly the deps,
    /// results and events of running them one after another in the
    /// model's order. `parallel: false` runs them one after another.
    pub turn: TurnPolicy,
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            max_iterations: 10,
            system_prompt: None,
            max_transcript_bytes: 64 << 20,
            turn: TurnPolicy::default(),
        }
    }
}

/// What an approval handler decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run the call as the model asked.
    Approve,
    /// Do not run it; the model is told [`REJECTED_MESSAGE`].
    Reject,
    /// Run the call with these arguments (JSON text) instead.
    Edit(String),
}

/// Decides about calls of tools whose policy says `approval = "ask"`.
pub trait Approver: Send + Sync {
    /// Decides about one call, as the model asked for it. May take as long
    /// as a person needs; the run waits.
    fn decide<'a>(&'a self, call: &'a ToolCall) -> BoxFuture<'a, Decision>;
}

impl<F> Approver for F
where
    F: Fn(&ToolCall) -> Decision + Send + Sync,
{
    fn decide<'a>(&'a self, call: &'a ToolCall) -> BoxFuture<'a, Decision> {
        let decision = self(call);
        Box::pin(async move { decision })
    }
}

/// What a call reported while it ran ([`Agent::call_events`]).
#[derive(Debug, Clone)]
pub struct CallReport {
    /// The call's id.
    pub call_id: String,
    /// Its tool.
    pub tool: String,
    /// What it reported.
    pub event: CallEvent<'static>,
}

/// How a run ended, when it ended with an answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunOutcome {
    /// The model's final text.
    pub answer: String,
    /// Totals of the context after the run.
    pub usage: Usage,
    /// Model requests made in this run.
    pub iterations: u32,
    /// The run's id.
    pub run_id: String,
    /// The session's id.
    pub session_id: String,
}

/// A run that ended without an answer. The context and transcript hold
/// everything done up to that point.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The model made `limit` requests without a final answer.
    #[error(
        "no final answer after {limit} model request{}, the run's limit",
        if *limit == 1 { "" } else { "s" }
    )]
    MaxIterations {
        /// The limit.
        limit: u32,
    },
    /// A model request failed (after its retries).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The run was cancelled.
    #[error("the run was cancelled")]
    Cancelled,
    /// A commit to the session's store failed (the lease was lost, the
    /// disk is full, ...). What was committed before stays.
    #[error("cannot save the session: {0}")]
    Store(#[from] StoreError),
    /// The run's items grew past [`AgentOptions::max_transcript_bytes`].
    #[error("the run's transcript grew past {limit} bytes (max_transcript_bytes)")]
    TranscriptTooLarge {
        /// The limit.
        limit: usize,
    },
}

impl RunError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RunError::MaxIterations { .. } => ErrorKind::MaxIterations,
            RunError::Model(_) => ErrorKind::ModelError,
            RunError::Cancelled => ErrorKind::Cancelled,
            RunError::TranscriptTooLarge { .. } => ErrorKind::TranscriptTooLarge,
            RunError::Store(e) => e.kind(),
        }
    }
}

/// Runs prompts against a model with the host's tools.
///
/// An `Agent` owns shares of its host and model (`Arc`), so it is `'static`
/// and can be moved into a spawned task; many agents may share one host.
/// [`Agent::run`] takes `&self`: one agent can serve several runs at once,
/// each on its own context and transcript.
pub struct Agent {
    host: Arc<Host>,
    model: Arc<dyn Model>,
    options: AgentOptions,
    approver: Option<Arc<dyn Approver>>,
    /// Who answers the tools' questions (`ask-user`).
    asker: Option<Asker>,
    events: Option<mpsc::UnboundedSender<Event>>,
    /// Who hears what calls report as they run.
    call_events: Option<mpsc::UnboundedSender<CallReport>>,
    cancel: CancelToken,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("model", &self.model.name())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// An agent with the default options, no approver (calls of
    /// `approval = "ask"` tools are rejected), no event stream.
    pub fn new(host: Arc<Host>, model: Arc<dyn Model>) -> Self {
        Self {
            host,
            model,
            options: AgentOptions::default(),
            approver: None,
            asker: None,
            events: None,
            call_events: None,
            cancel: CancelToken::new(),
        }
    }

    /// Replaces the options.
    pub fn options(mut self, options: AgentOptions) -> Self {
        self.options = options;
        self
    }

    /// The handler for `approval = "ask"` tools. Without one, their calls
    /// are rejected.
    pub fn approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.approver = Some(approver);
        self
    }

    /// Who answers the questions of tools whose policy lets them ask
    /// (`ask = true`): a person at a terminal, a script. Without one, they
    /// are told `unavailable`. A tool whose policy lets it ask the model
    /// (`sample`) is answered by the agent's own model
    /// ([`Model::sample`]), its requests and tokens counted in the run's
    /// usage.
    pub fn asker(mut self, asker: Asker) -> Self {
        self.asker = Some(asker);
        self
    }

    /// Hands what each call reports while it runs (its `log` records and
    /// `progress.report`s) to `sender`, as it happens. Not journaled
    /// (the call's records are, with its output); a call run twice by a
    /// parallel turn reports twice.
    pub fn call_events(mut self, sender: mpsc::UnboundedSender<CallReport>) -> Self {
        self.call_events = Some(sender);
        self
    }

    /// Streams every event to `sender` as it is recorded.
    pub fn events(mut self, sender: mpsc::UnboundedSender<Event>) -> Self {
        self.events = Some(sender);
        self
    }

    /// Cancelling `token` stops the model request or tool call in flight
    /// and ends the run with [`RunError::Cancelled`].
    pub fn cancel_token(mut self, token: CancelToken) -> Self {
        self.cancel = token;
        self
    }

    /// Runs `prompt` to an answer. Appends to `transcript` and updates
    /// `ctx` (deps through tool ops, usage, iteration) as it goes. The run
    /// gets a fresh run id ([`RunContext::start_run`]), whatever runs
    /// `ctx` saw before. Nothing is stored: for a durable conversation, use
    /// [`Agent::run_session`].
    pub async fn run(
        &self,
        ctx: &mut RunContext,
        transcript: &mut Transcript,
        prompt: &str,
    ) -> Result<RunOutcome, RunError> {
        let conversation = Conversation {
            ctx,
            transcript,
            sink: None,
        };
        self.run_session(conversation, prompt).await
    }

    /// [`Agent::run`] on a durable conversation (`&mut Session`, or any
    /// [`Conversation`] with a sink): every step is committed as the run
    /// goes (the prompt; each model reply; each tool call's intent before
    /// it runs; its output, ops and tool message together after), and
    /// events are sent once committed. A run whose commit fails ends with
    /// [`RunError::Store`]; once the session's lease is lost, nothing more
    /// of it is committed.
    pub async fn run_session<'c>(
        &self,
        conversation: impl Into<Conversation<'c>>,
        prompt: &str,
    ) -> Result<RunOutcome, RunError> {
        let mut recorder = Recorder::new(conversation.into(), self.events.is_some());
        recorder.ctx_mut().start_run();
        let mut run = Run::new(self, recorder);
        run.record(Item::RunStarted {
            model: self.model.name(),
        });
        let result = run.drive(prompt).await;
        let outcome = match &result {
            Ok(_) => Outcome::Answered,
            Err(e) => {
                run.record(Item::Error {
                    kind: e.kind(),
                    message: e.to_string(),
                });
                Outcome::Failed(e.kind())
            }
        };
        let iterations = run.iteration();
        run.record(Item::RunEnded {
            outcome,
            iterations,
        });
        match (run.commit().await, result) {
            (Err(e), Ok(_)) => Err(e),
            (Err(e), Err(first)) => {
                tracing::warn!(error = %e, "cannot commit the end of a failed run");
                Err(first)
            }
            (Ok(()), result) => result,
        }
    }

    /// Sends committed events to the watcher, if any.
    fn send(&self, events: Vec<Event>) {
        if let Some(sender) = &self.events {
            for event in events {
                // A dropped receiver only means nobody is watching.
                let _ = sender.send(event);
            }
        }
    }
}
