//! One run of the loop: model turns, and each turn's calls settled in the
//! model's order (parallel or not), recorded through the journal.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Agent, CallReport, Decision, RunError, RunOutcome};
use crate::context::Usage;
use crate::journal::CallEnd;
use crate::journal::recorder::Recorder;
use crate::journal::{Item, Role};
use crate::llm::Model;
use crate::policy::Approval;
use crate::sandbox::{CallEvent, CancelToken, Observer, Sampler};
use crate::spec::{SampleReply, SampleRequest};
use crate::spec::{ToolCall, ToolSpec};
use crate::tools::{CallError, CallFailure, CallOutcome, Ran, call_end};

/// A run in progress: the agent, the conversation it records into, and
/// the failures per tool so far (the `retry` a tool sees).
pub(super) struct Run<'a, 'c> {
    agent: &'a Agent,
    recorder: Recorder<'c>,
    failures: HashMap<String, u32>,
    /// Who answers the calls' questions to the model, and what its
    /// answers cost, when a tool may ask it.
    asking: Option<Asking>,
}

/// The model's answers to a run's calls: who gives them, and what they
/// cost (added to the run's usage as each call ends).
struct Asking {
    sampler: Sampler,
    used: Arc<std::sync::Mutex<Usage>>,
}

impl<'a, 'c> Run<'a, 'c> {
    pub(super) fn new(agent: &'a Agent, recorder: Recorder<'c>) -> Self {
        let samples = agent
            .host
            .components()
            .iter()
            .any(|c| c.grants().sampling.is_some());
        let asking = samples.then(|| {
            let used = Arc::new(std::sync::Mutex::new(Usage::default()));
            Asking {
                sampler: sampler(Arc::clone(&agent.model), Arc::clone(&used)),
                used,
            }
        });
        Self {
            agent,
            recorder,
            failures: HashMap::new(),
            asking,
        }
    }

    /// The token `call` runs with: the agent's own, unless someone answers
    /// its questions or hears what it reports; then one of its own that
    /// does so (its events named by the call), cancelled with the agent's.
    fn token_for(&self, call: &ToolCall) -> CancelToken {
        let agent = self.agent;
        let asks = agent.host.component_for(&call.name).is_some_and(|c| {
            let grants = c.grants();
            grants.ask_user || grants.sampling.is_some()
        });
        if !asks && agent.call_events.is_none() {
            return agent.cancel.clone();
        }
        let observer = agent.call_events.clone().map(|sender| {
            let (id, tool) = (call.id.clone(), call.name.clone());
            Box::new(move |event: CallEvent<'_>| {
                let _ = sender.send(CallReport {
                    call_id: id.clone(),
                    tool: tool.clone(),
                    event: event.into_owned(),
                });
            }) as Observer
        });
        agent.cancel.watched_with(
            observer,
            agent.asker.clone(),
            self.asking.as_ref().map(|a| Arc::clone(&a.sampler)),
        )
    }

    /// Adds what the model's answers to the calls' questions cost since
    /// the last time to the run's usage.
    fn count_sampled(&mut self) {
        let Some(asking) = &self.asking else {
            return;
        };
        let used = std::mem::take(
            &mut *asking
                .used
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let usage = &mut self.recorder.ctx_mut().usage;
        usage.requests = usage.requests.saturating_add(used.requests);
        usage.input_tokens = usage.input_tokens.saturating_add(used.input_tokens);
        usage.output_tokens = usage.output_tokens.saturating_add(used.output_tokens);
    }

    pub(super) fn record(&mut self, item: Item) {
        self.recorder.record(item);
    }

    /// The model request the run is at.
    pub(super) fn iteration(&self) -> u32 {
        self.recorder.ctx().iteration
    }

    /// Commits what was recorded since the last commit, then sends its
    /// events: an event a watcher sees is stored.
    pub(super) async fn commit(&mut self) -> Result<(), RunError> {
        let events = self.recorder.commit().await?;
        self.agent.send(events);
        Ok(())
    }

    /// Ends the run once its items outgrow the bound. Checked after each
    /// call's output is recorded, before anything more is asked or run.
    fn check_size(&mut self) -> Result<(), RunError> {
        let limit = self.agent.options.max_transcript_bytes;
        if self.recorder.recorded_bytes() > limit {
            return Err(RunError::TranscriptTooLarge { limit });
        }
        Ok(())
    }

    pub(super) async fn drive(&mut self, prompt: &str) -> Result<RunOutcome, RunError> {
        let agent = self.agent;
        agent.model.check_tools(&agent.host.tool_names())?;
        let specs: Vec<ToolSpec> = agent.host.tools().cloned().collect();
        if self.recorder.transcript().messages.is_empty()
            && let Some(system) = &agent.options.system_prompt
        {
            self.record(Item::Message {
                role: Role::System,
                content: Some(system.clone()),
                iteration: 0,
                calls: 0,
            });
        }
        self.record(Item::Message {
            role: Role::User,
            content: Some(prompt.to_owned()),
            iteration: 0,
            calls: 0,
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
            let ctx = self.recorder.ctx_mut();
            ctx.iteration = iteration;
            ctx.usage.requests += 1;
            let reply = tokio::select! {
                reply = agent.model.complete(&self.recorder.transcript().messages, &specs) => reply?,
                () = agent.cancel.cancelled() => return Err(RunError::Cancelled),
            };
            let ctx = self.recorder.ctx_mut();
            ctx.usage.input_tokens += reply.usage.input_tokens;
            ctx.usage.output_tokens += reply.usage.output_tokens;
            self.recorder
                .model_turn(reply.content.clone(), &reply.tool_calls, iteration);
            self.commit().await?;
            if reply.tool_calls.is_empty() {
                let ctx = self.recorder.ctx();
                return Ok(RunOutcome {
                    answer: reply.content.unwrap_or_default(),
                    usage: ctx.usage,
                    iterations: iteration,
                    run_id: ctx.run_id().to_owned(),
                    session_id: ctx.session_id().to_owned(),
                });
            }
            self.run_turn(&reply.tool_calls).await?;
            self.check_size()?;
        }
    }

    /// Runs the calls of one model turn, as if one after another in the
    /// model's order (DESIGN §3, optimistic execution).
    ///
    /// In parallel mode, every call that may run twice (no approval, and no
    /// effectful grant unless marked idempotent) starts ahead of its turn
    /// against the deps as the turn began, seeing the usage and retry count
    /// it would see in order, once the turn is within `max_parallel` calls
    /// of it (so at most that many run, or wait with their results, at
    /// once; see [`Speculations`]). Then, in order,
    /// each call is settled: a speculative one whose reads (through `get`,
    /// `keys`, `retry`) no earlier call of the turn changed is taken as it
    /// ran, its ops checked against the deps as they are now; one that
    /// read a changed key runs again now. Any other call runs in its turn,
    /// once every earlier call has committed, as in sequential mode. Every
    /// call's intent was committed with the model's turn, before any of
    /// them started. The deps, results, events and commits are those of
    /// the sequential run. Calls past the turn's `max_calls` are not run:
    /// each is answered, `rejected`, with why.
    async fn run_turn(&mut self, calls: &[ToolCall]) -> Result<(), RunError> {
        let turn = self.agent.options.turn;
        let (run, past) = calls.split_at(calls.len().min(turn.max_calls.max(1)));
        let parallel = turn.parallel && turn.max_parallel >= 2 && run.len() >= 2;
        let mut speculations = parallel.then(|| self.speculate(run, turn.max_parallel));
        let mut written = BTreeSet::new();
        for (k, call) in run.iter().enumerate() {
            self.check_size()?;
            // Its intent was committed with the model's turn; it counts
            // when the turn reaches it, whether or not it runs yet.
            self.recorder.count_call();
            let ahead = speculations.as_mut().and_then(|s| s.take(k, self));
            let settled = match ahead {
                Some((task, request)) => match task.await {
                    Ok(ran) if self.still_valid(&ran, &request, &written) => {
                        let took = ran.duration;
                        let result =
                            self.agent
                                .host
                                .apply_ran(self.recorder.ctx_mut(), &request, ran);
                        self.settle(&request, None, result, took)
                    }
                    _ => self.run_call(call).await,
                },
                None => self.run_call(call).await,
            };
            self.commit().await?;
            written.extend(settled?);
        }
        if past.is_empty() {
            return Ok(());
        }
        // The model is told of each call past the turn's bound, none run.
        let why = format!(
            "Tool call was not run: this turn asked for {} tool calls, and a turn runs at most \
             {} (the policy's [turn] max_calls). Ask for it again in a later turn.",
            calls.len(),
            run.len()
        );
        let rules = self.agent.host.context_rules();
        for call in past {
            self.check_size()?;
            self.recorder.count_call();
            let rejected = CallEnd::Rejected(why.clone());
            self.recorder
                .call_ended(call, rejected, Duration::ZERO, rules);
        }
        self.commit().await
    }

    /// Whether a speculative call's run stands: the run is not cancelled,
    /// and no earlier call of the turn wrote what it read (its keys, or
    /// its retry count).
    fn still_valid(&self, ran: &Ran, request: &ToolCall, written: &BTreeSet<String>) -> bool {
        !self.agent.cancel.is_cancelled()
            && !ran.reads.depends_on(written)
            && (!ran.reads.read_retry() || request.retry == self.retry_of(&request.name))
    }

    /// Plans the calls of a turn that may run speculatively, at most
    /// `window` of them started ahead of the call the turn is at
    /// ([`Speculations::take`]).
    fn speculate(&self, calls: &[ToolCall], window: usize) -> Speculations {
        let agent = self.agent;
        let planned = calls
            .iter()
            .map(|call| {
                let may = agent
                    .host
                    .component_for(&call.name)
                    .is_none_or(|c| c.approval() == Approval::Never && c.may_rerun());
                // With the retry count as the turn began.
                may.then(|| Slot::Planned(self.request(call, call.arguments.clone())))
            })
            .collect();
        Speculations {
            start: self.recorder.ctx().clone(),
            slots: planned,
            next: 0,
            window,
        }
    }

    /// Starts speculative call `request`, at position `k` of its turn:
    /// what it would see in order, counted with the calls before it, on
    /// the context as the turn began (`start`).
    fn start(
        &self,
        start: &crate::context::RunContext,
        k: usize,
        request: &ToolCall,
    ) -> tokio::task::JoinHandle<Ran> {
        let mut view = start.clone();
        let before = u32::try_from(k).unwrap_or(u32::MAX);
        view.usage.tool_calls = view
            .usage
            .tool_calls
            .saturating_add(before)
            .saturating_add(1);
        let cancel = self.token_for(request);
        let (host, run) = (Arc::clone(&self.agent.host), request.clone());
        tokio::spawn(async move { host.run_only(&view, &run, &cancel, true).await })
    }

    /// The retry count a call of `tool` sees now.
    fn retry_of(&self, tool: &str) -> u32 {
        self.failures.get(tool).copied().unwrap_or(0)
    }

    /// The host's request for the model's `call` with `arguments` (the
    /// model's, or as the approver edited them), at the retry count it
    /// sees now.
    fn request(&self, call: &ToolCall, arguments: String) -> ToolCall {
        ToolCall {
            id: call.id.clone(),
            name: call.name.clone(),
            arguments,
            retry: self.retry_of(&call.name),
        }
    }

    /// Runs one call whose intent is committed (asking for approval first
    /// when its tool needs it); the keys it wrote. Only cancellation ends
    /// the run from here.
    /// A call's duration is its own: the time a person took to approve it
    /// is not in it, and a rejected call took none.
    async fn run_call(&mut self, call: &ToolCall) -> Result<BTreeSet<String>, RunError> {
        let agent = self.agent;
        let mut arguments = call.arguments.clone();
        let approval = agent
            .host
            .component_for(&call.name)
            .map_or(Approval::Never, |c| c.approval());
        if approval == Approval::Ask {
            let decision = match &agent.approver {
                Some(approver) => approver.decide(call).await,
                None => Decision::Reject,
            };
            match decision {
                Decision::Approve => {}
                Decision::Edit(edited) => arguments = edited,
                Decision::Reject => {
                    let rules = agent.host.context_rules();
                    let rejected = CallEnd::Rejected(crate::journal::REJECTED_MESSAGE.to_owned());
                    self.recorder
                        .call_ended(call, rejected, Duration::ZERO, rules);
                    return Ok(BTreeSet::new());
                }
            }
        }
        let started = Instant::now();
        let edited = arguments != call.arguments;
        let request = self.request(call, arguments);
        let cancel = self.token_for(&request);
        let result = agent
            .host
            .run_and_apply(self.recorder.ctx_mut(), &request, Some(&cancel), false)
            .await;
        let edited = edited.then_some(request.arguments.as_str());
        self.settle(&request, edited, result, started.elapsed())
    }

    /// Records how a call ended (and its ops, and its arguments when
    /// they were `edited` at its approval) and tells the model; the keys
    /// it wrote. A failure counts against its tool's retries; cancellation
    /// ends the run.
    fn settle(
        &mut self,
        call: &ToolCall,
        edited: Option<&str>,
        result: Result<CallOutcome, CallFailure>,
        took: Duration,
    ) -> Result<BTreeSet<String>, RunError> {
        self.count_sampled();
        let rules = self.agent.host.context_rules();
        self.recorder
            .call_ended_as(call, edited, call_end(&result), took, rules);
        match result {
            Ok(outcome) => Ok(outcome
                .updates
                .iter()
                .map(|op| op.key().to_owned())
                .collect()),
            Err(CallFailure {
                error: CallError::Cancelled,
                ..
            }) => Err(RunError::Cancelled),
            Err(_) => {
                *self.failures.entry(call.name.clone()).or_default() += 1;
                Ok(BTreeSet::new())
            }
        }
    }
}

/// Answers a call's requests for a completion with `model`, adding what
/// each answer cost to `used`.
fn sampler(model: Arc<dyn Model>, used: Arc<std::sync::Mutex<Usage>>) -> Sampler {
    Arc::new(move |request: SampleRequest| {
        let (model, used) = (Arc::clone(&model), Arc::clone(&used));
        Box::pin(async move {
            match model.sample(&request).await {
                Ok(reply) => {
                    let mut usage = used
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    usage.requests = usage.requests.saturating_add(1);
                    usage.input_tokens =
                        usage.input_tokens.saturating_add(reply.usage.input_tokens);
                    usage.output_tokens = usage
                        .output_tokens
                        .saturating_add(reply.usage.output_tokens);
                    SampleReply::Answered {
                        text: reply.content.unwrap_or_default(),
                        model: model.name(),
                        stop_reason: None,
                    }
                }
                Err(e) => SampleReply::Refused {
                    why: format!("the run's model did not answer: {e}"),
                },
            }
        })
    })
}

/// The speculative calls of a turn, by position (`None`: runs in its
/// turn), each with the request it runs (and so the retry count it saw).
///
/// Invariant: at most `window` of them are started and not yet taken, all
/// within the `window` positions from the call the turn is at. A call is
/// started only once the turn comes within `window` of it, so a turn of
/// any number of calls holds at most `window` results waiting for their
/// turn (not one per call), and runs at most `window` calls at once.
/// Those started and not taken are stopped when this is dropped (the run
/// ended early).
struct Speculations {
    /// The context as the turn began (its deps shared, not copied): what
    /// each call started ahead sees.
    start: crate::context::RunContext,
    slots: Vec<Option<Slot>>,
    /// The first position not yet started (or passed over).
    next: usize,
    window: usize,
}

enum Slot {
    Planned(ToolCall),
    Started(tokio::task::JoinHandle<Ran>, ToolCall),
}

impl Speculations {
    /// Call `k`'s speculative run, if it has one, once the calls within
    /// `window` of it are started (by `run`). Taken in order: `k` is the
    /// call the turn is at.
    fn take(
        &mut self,
        k: usize,
        run: &Run<'_, '_>,
    ) -> Option<(tokio::task::JoinHandle<Ran>, ToolCall)> {
        let end = k.saturating_add(self.window).min(self.slots.len());
        while self.next < end {
            let at = self.next;
            if let Some(Slot::Planned(request)) = self.slots[at].take() {
                let task = run.start(&self.start, at, &request);
                self.slots[at] = Some(Slot::Started(task, request));
            }
            self.next += 1;
        }
        match self.slots.get_mut(k).and_then(Option::take) {
            Some(Slot::Started(task, request)) => Some((task, request)),
            // Not reached: every slot before `end` was started.
            Some(Slot::Planned(_)) | None => None,
        }
    }
}

impl Drop for Speculations {
    fn drop(&mut self) {
        for slot in self.slots.iter().flatten() {
            if let Slot::Started(task, _) = slot {
                task.abort();
            }
        }
    }
}
