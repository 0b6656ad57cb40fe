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

pub mod events;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

pub use events::{CallStatus, Event, Item, Role};

use crate::context::{RunContext, Usage};
use crate::llm::{BoxFuture, Message, Model, ModelError, ModelToolCall};
use crate::policy::{Approval, TurnPolicy};
use crate::sandbox::{CancelToken, GuestOutput};
use crate::session::{Entry, Journal, Session, StoreError, secrets};
use crate::spec::ToolSpec;
use crate::tools::{CallError, CallFailure, CallOutcome, Host, Ran, ToolCall};

/// What the model is told when the approval handler rejects a call.
pub const REJECTED_MESSAGE: &str = "Tool call was rejected by approval handler.";

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

/// A tool call waiting for approval.
#[derive(Debug, Clone, Copy)]
pub struct PendingCall<'a> {
    /// The model's id for the call.
    pub call_id: &'a str,
    /// The tool.
    pub name: &'a str,
    /// The model's arguments, as JSON text.
    pub arguments: &'a str,
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
    /// Decides about one call. May take as long as a person needs; the
    /// run waits.
    fn decide<'a>(&'a self, call: PendingCall<'a>) -> BoxFuture<'a, Decision>;
}

impl<F> Approver for F
where
    F: Fn(PendingCall<'_>) -> Decision + Send + Sync,
{
    fn decide<'a>(&'a self, call: PendingCall<'a>) -> BoxFuture<'a, Decision> {
        let decision = self(call);
        Box::pin(async move { decision })
    }
}

/// The conversation so far: the messages sent to the model and the item
/// log. Pass the same transcript to continue a conversation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    /// What the model has been sent and has answered, in order.
    pub messages: Vec<Message>,
    /// The item log, in order.
    pub items: Vec<Event>,
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
    #[error("no final answer after {limit} model requests (max_iterations)")]
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
    /// A stable `snake_case` name for the kind of failure.
    pub fn kind(&self) -> &'static str {
        match self {
            RunError::MaxIterations { .. } => "max_iterations",
            RunError::Model(_) => "model_error",
            RunError::Cancelled => "cancelled",
            RunError::TranscriptTooLarge { .. } => "transcript_too_large",
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
    events: Option<mpsc::UnboundedSender<Event>>,
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
            events: None,
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
        self.run_with(ctx, transcript, None, prompt).await
    }

    /// [`Agent::run`] on a durable session: every step is committed to its
    /// store as the run goes (the prompt; each model reply; each tool
    /// call's intent before it runs; its output, ops and tool message
    /// together after), and events are sent once committed. A run whose
    /// commit fails ends with [`RunError::Store`]; once the session's lease
    /// is lost, nothing more of it is committed.
    pub async fn run_session(
        &self,
        session: &mut Session,
        prompt: &str,
    ) -> Result<RunOutcome, RunError> {
        let Session {
            ctx,
            transcript,
            journal,
            ..
        } = session;
        self.run_with(ctx, transcript, Some(journal), prompt).await
    }

    async fn run_with(
        &self,
        ctx: &mut RunContext,
        transcript: &mut Transcript,
        journal: Option<&mut Journal>,
        prompt: &str,
    ) -> Result<RunOutcome, RunError> {
        ctx.start_run();
        let mut run = Run {
            agent: self,
            ctx,
            transcript,
            journal,
            pending: Vec::new(),
            unsent: Vec::new(),
            failures: HashMap::new(),
            recorded_bytes: 0,
        };
        run.record(Item::RunStarted {
            model: self.model.name(),
        });
        let result = run.drive(prompt).await;
        let outcome = match &result {
            Ok(_) => "answered".to_owned(),
            Err(e) => {
                run.record(Item::Error {
                    kind: e.kind().to_owned(),
                    message: e.to_string(),
                });
                e.kind().to_owned()
            }
        };
        let iterations = run.ctx.iteration;
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
}

struct Run<'r> {
    agent: &'r Agent,
    ctx: &'r mut RunContext,
    transcript: &'r mut Transcript,
    /// Where the run is committed; `None` for an in-memory run.
    journal: Option<&'r mut Journal>,
    /// What the next commit writes.
    pending: Vec<Entry>,
    /// Events the next commit makes visible.
    unsent: Vec<Event>,
    /// Failed calls per tool in this run: the `retry` a tool sees.
    failures: HashMap<String, u32>,
    /// Bytes of the items this run recorded.
    recorded_bytes: usize,
}

impl Run<'_> {
    fn record(&mut self, item: Item) {
        let event = Event::numbered(
            self.transcript.items.len() + 1,
            self.ctx.run_id(),
            events::now_ms(),
            item,
        );
        self.recorded_bytes = self.recorded_bytes.saturating_add(crate::json::len(&event));
        if self.journal.is_some() {
            self.pending.push(Entry::Item {
                event: event.clone(),
            });
        }
        if self.agent.events.is_some() {
            self.unsent.push(event.clone());
        }
        self.transcript.items.push(event);
    }

    fn push_message(&mut self, message: Message) {
        if self.journal.is_some() {
            self.pending.push(Entry::Message {
                message: message.clone(),
            });
        }
        self.transcript.messages.push(message);
    }

    /// Commits what was recorded since the last commit (with the usage
    /// totals), then sends its events: an event a watcher sees is stored.
    async fn commit(&mut self) -> Result<(), RunError> {
        if let Some(journal) = self.journal.as_deref_mut() {
            let entries = std::mem::take(&mut self.pending);
            journal.commit(self.ctx, entries).await?;
        }
        if let Some(sender) = &self.agent.events {
            for event in self.unsent.drain(..) {
                // A dropped receiver only means nobody is watching.
                let _ = sender.send(event);
            }
        }
        Ok(())
    }

    /// Ends the run once its items outgrow the bound. Checked after each
    /// call's output is recorded, before anything more is asked or run.
    fn check_size(&self) -> Result<(), RunError> {
        let limit = self.agent.options.max_transcript_bytes;
        if self.recorded_bytes > limit {
            return Err(RunError::TranscriptTooLarge { limit });
        }
        Ok(())
    }

    async fn drive(&mut self, prompt: &str) -> Result<RunOutcome, RunError> {
        let agent = self.agent;
        agent.model.check_tools(&agent.host.tool_names())?;
        let specs: Vec<ToolSpec> = agent.host.tools().cloned().collect();
        if self.transcript.messages.is_empty()
            && let Some(system) = &agent.options.system_prompt
        {
            self.push_message(Message::System {
                content: system.clone(),
            });
        }
        self.push_message(Message::User {
            content: prompt.to_owned(),
        });
        self.record(Item::Message {
            role: Role::User,
            content: Some(prompt.to_owned()),
            iteration: 0,
        });
        self.commit().await?;

        let mut iteration = 0;
        loop {
            if agent.cancel.is_cancelled() {
                return Err(RunError::Cancelled);
            }
            if iteration >= agent.options.max_iterations {
                return Err(RunError::MaxIterations {
                    limit: agent.options.max_iterations,
                });
            }
            iteration += 1;
            self.ctx.iteration = iteration;
            self.ctx.usage.requests += 1;
            let reply = tokio::select! {
                reply = agent.model.complete(&self.transcript.messages, &specs) => reply?,
                () = agent.cancel.cancelled() => return Err(RunError::Cancelled),
            };
            self.ctx.usage.input_tokens += reply.usage.input_tokens;
            self.ctx.usage.output_tokens += reply.usage.output_tokens;
            self.push_message(Message::Assistant {
                content: reply.content.clone(),
                tool_calls: reply.tool_calls.clone(),
            });
            if reply.content.is_some() || reply.tool_calls.is_empty() {
                self.record(Item::Message {
                    role: Role::Assistant,
                    content: reply.content.clone(),
                    iteration,
                });
            }
            self.commit().await?;
            if reply.tool_calls.is_empty() {
                return Ok(RunOutcome {
                    answer: reply.content.unwrap_or_default(),
                    usage: self.ctx.usage,
                    iterations: iteration,
                    run_id: self.ctx.run_id().to_owned(),
                    session_id: self.ctx.session_id().to_owned(),
                });
            }
            self.run_turn(&reply.tool_calls, iteration).await?;
            self.check_size()?;
        }
    }

    /// Runs the calls of one model turn, as if one after another in the
    /// model's order (DESIGN §3, optimistic execution).
    ///
    /// In parallel mode, every call that may run twice (no approval, and no
    /// effectful grant unless marked idempotent) starts at once against
    /// the deps as the turn began, seeing the usage and retry count it would
    /// see in order; at most `max_parallel` run together. Then, in order,
    /// each call is settled: its intent committed (as in sequential mode),
    /// then a speculative one whose reads (through `get`, `keys`, `retry`)
    /// no earlier call of the turn changed is taken as it ran, its ops
    /// checked against the deps as they are now; one that read a changed
    /// key runs again now. Any other call runs in its turn, once every
    /// earlier call has committed, as in sequential mode. The deps,
    /// results, events and commits are those of the sequential run; only a
    /// speculative call may have started before its intent was committed
    /// (it has no effect to recover from, or is idempotent).
    async fn run_turn(&mut self, calls: &[ModelToolCall], iteration: u32) -> Result<(), RunError> {
        let turn = self.agent.options.turn;
        if !turn.parallel || turn.max_parallel < 2 || calls.len() < 2 {
            for call in calls {
                self.check_size()?;
                self.dispatch(call, iteration).await?;
            }
            return Ok(());
        }
        let mut speculations = self.speculate(calls, turn.max_parallel);
        let mut written = BTreeSet::new();
        for (k, call) in calls.iter().enumerate() {
            self.check_size()?;
            // The intent is committed as in sequential mode: when every
            // earlier call has settled, whether or not this one runs yet.
            self.record_intent(call, iteration);
            self.commit().await?;
            let ran = match speculations.take(k) {
                Some((task, request)) => task.await.ok().map(|ran| (ran, request)),
                None => None,
            };
            let current_retry = self.retry_of(&call.name);
            let still_valid = |ran: &Ran, request: &ToolCall| {
                !self.agent.cancel.is_cancelled()
                    && !ran.reads.depends_on(&written)
                    && (!ran.reads.read_retry() || request.retry == current_retry)
            };
            let settled = match ran {
                Some((ran, request)) if still_valid(&ran, &request) => {
                    let took = u64::try_from(ran.duration.as_micros()).unwrap_or(u64::MAX);
                    let result = self.agent.host.apply_ran(self.ctx, &request, ran);
                    self.settle(call, result, took)
                }
                _ => self.run_call(call).await,
            };
            self.commit().await?;
            written.extend(settled?);
        }
        Ok(())
    }

    /// Starts the calls of a turn that may run speculatively.
    fn speculate(&self, calls: &[ModelToolCall], max_parallel: usize) -> Speculations {
        let agent = self.agent;
        let limit = Arc::new(tokio::sync::Semaphore::new(max_parallel));
        let tasks = calls
            .iter()
            .enumerate()
            .map(|(k, call)| {
                let may = agent
                    .host
                    .component_for(&call.name)
                    .is_none_or(|c| c.approval() == Approval::Never && c.may_rerun());
                if !may {
                    return None;
                }
                // What the call would see in order: counted with the calls
                // before it, and the retry count as the turn began.
                let mut view = self.ctx.clone();
                let before = u32::try_from(k).unwrap_or(u32::MAX);
                view.usage.tool_calls = view
                    .usage
                    .tool_calls
                    .saturating_add(before)
                    .saturating_add(1);
                let request = self.request(call, call.arguments.clone());
                let (host, cancel, limit, run) = (
                    Arc::clone(&agent.host),
                    agent.cancel.clone(),
                    Arc::clone(&limit),
                    request.clone(),
                );
                let task = tokio::spawn(async move {
                    // The semaphore is never closed.
                    let _permit = limit.acquire_owned().await;
                    host.run_only(&view, &run, &cancel, true).await
                });
                Some((task, request))
            })
            .collect();
        Speculations { tasks }
    }

    /// The retry count a call of `tool` sees now.
    fn retry_of(&self, tool: &str) -> u32 {
        self.failures.get(tool).copied().unwrap_or(0)
    }

    /// The host's request for the model's `call` with `arguments` (the
    /// model's, or as the approver edited them), at the retry count it
    /// sees now.
    fn request(&self, call: &ModelToolCall, arguments: String) -> ToolCall {
        ToolCall {
            id: call.id.clone(),
            name: call.name.clone(),
            arguments,
            retry: self.retry_of(&call.name),
        }
    }

    /// Runs one tool call and tells the model how it went: its intent is
    /// committed first, its output (with its ops and the tool message)
    /// after. Only cancellation and a failed commit end the run from here.
    /// The keys it wrote.
    async fn dispatch(
        &mut self,
        call: &ModelToolCall,
        iteration: u32,
    ) -> Result<BTreeSet<String>, RunError> {
        self.record_intent(call, iteration);
        self.commit().await?;
        let result = self.run_call(call).await;
        self.commit().await?;
        result
    }

    /// Records that the model's call is about to be settled, and counts it.
    fn record_intent(&mut self, call: &ModelToolCall, iteration: u32) {
        self.record(Item::FunctionCall {
            call_id: call.id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
            iteration,
        });
        self.ctx.usage.tool_calls += 1;
    }

    async fn run_call(&mut self, call: &ModelToolCall) -> Result<BTreeSet<String>, RunError> {
        let agent = self.agent;
        let started = Instant::now();

        let mut arguments = call.arguments.clone();
        let approval = agent
            .host
            .component_for(&call.name)
            .map_or(Approval::Never, |c| c.approval());
        if approval == Approval::Ask {
            let pending = PendingCall {
                call_id: &call.id,
                name: &call.name,
                arguments: &call.arguments,
            };
            let decision = match &agent.approver {
                Some(approver) => approver.decide(pending).await,
                None => Decision::Reject,
            };
            match decision {
                Decision::Approve => {}
                Decision::Edit(edited) => arguments = edited,
                Decision::Reject => {
                    self.answer(
                        call,
                        CallStatus::Rejected,
                        REJECTED_MESSAGE.to_owned(),
                        None,
                        micros(started),
                        GuestOutput::default(),
                    );
                    return Ok(BTreeSet::new());
                }
            }
        }

        let request = self.request(call, arguments);
        let result = agent
            .host
            .call_counted(self.ctx, &request, &agent.cancel)
            .await;
        self.settle(call, result, micros(started))
    }

    /// Records how a call ended (and its ops) and tells the model; the
    /// keys it wrote. Cancellation ends the run.
    fn settle(
        &mut self,
        call: &ModelToolCall,
        result: Result<CallOutcome, CallFailure>,
        took: u64,
    ) -> Result<BTreeSet<String>, RunError> {
        let agent = self.agent;
        match result {
            Ok(outcome) => {
                let text = outcome.result.to_string();
                self.answer(
                    call,
                    CallStatus::Completed,
                    text,
                    None,
                    took,
                    outcome.output,
                );
                if !outcome.updates.is_empty() {
                    // What is stored and shown: no hidden or secret-looking
                    // key (the live deps have them all).
                    let ops = secrets::scrub_ops(&outcome.updates, agent.host.context_rules());
                    self.record(Item::ContextUpdate {
                        call_id: call.id.clone(),
                        ops,
                    });
                }
                Ok(outcome
                    .updates
                    .iter()
                    .map(|op| op.key().to_owned())
                    .collect())
            }
            Err(CallFailure {
                error: CallError::Cancelled,
                output,
            }) => {
                self.answer(
                    call,
                    CallStatus::Cancelled,
                    "Tool call was cancelled.".into(),
                    Some("cancelled"),
                    took,
                    output,
                );
                Err(RunError::Cancelled)
            }
            Err(CallFailure { error, output }) => {
                *self.failures.entry(call.name.clone()).or_default() += 1;
                let text = match &error {
                    CallError::Retry(message) => {
                        format!("Error (retry): {message}. Please try again.")
                    }
                    other => format!("Error ({}): {other}", other.kind()),
                };
                self.answer(
                    call,
                    CallStatus::Failed,
                    text,
                    Some(error.kind()),
                    took,
                    output,
                );
                Ok(BTreeSet::new())
            }
        }
    }

    /// Records a call's output event and sends the model the tool message.
    fn answer(
        &mut self,
        call: &ModelToolCall,
        status: CallStatus,
        output: String,
        kind: Option<&str>,
        duration_us: u64,
        guest: GuestOutput,
    ) {
        self.record(Item::FunctionCallOutput {
            call_id: call.id.clone(),
            name: call.name.clone(),
            status,
            output: output.clone(),
            error_kind: kind.map(str::to_owned),
            duration_us,
            guest,
        });
        self.tell_model(call, output, status != CallStatus::Completed);
    }

    fn tell_model(&mut self, call: &ModelToolCall, content: String, is_error: bool) {
        self.push_message(Message::Tool {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content,
            is_error,
        });
    }
}

/// The speculative calls of a turn, by position (`None`: runs in its
/// turn), with the request each ran (and so the retry count it saw).
/// Those not yet taken are stopped when this is dropped (the run ended
/// early).
struct Speculations {
    tasks: Vec<Option<(tokio::task::JoinHandle<Ran>, ToolCall)>>,
}

impl Speculations {
    fn take(&mut self, k: usize) -> Option<(tokio::task::JoinHandle<Ran>, ToolCall)> {
        self.tasks.get_mut(k).and_then(Option::take)
    }
}

impl Drop for Speculations {
    fn drop(&mut self) {
        for (task, _) in self.tasks.iter().flatten() {
            task.abort();
        }
    }
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}
