//! Replaying a session's calls against another version of their tools
//! ([`Session::replay`]): what a new version would have done on the
//! sessions the old one served.
//!
//! Each journaled call of the named tools runs again in a fresh sandbox,
//! with the context view it had (deps as they were before it, its run,
//! session and user ids, metadata, usage, iteration and retry count), its
//! clocks and random numbers played back from its
//! [`Tape`](crate::spec::Tape), and its
//! questions and requests for a completion answered as they were. The
//! result and the ops are compared with what the journal holds. Nothing
//! is written: not to the session, and not outside the sandbox (a
//! replayed call gets no directory, no secret, and no HTTP request is
//! sent; a call that needs one cannot be reproduced, and says why).
//!
//! The journal is read a page at a time, by a reader that keeps a page
//! ahead, and folded as it goes (deps and usage, the calls asked for and
//! not yet answered), so memory is bounded by the deps, three pages and
//! the calls read ahead (a page's, and at most 32 more), not by the
//! journal's size. Calls run on `parallel` worker tasks; they
//! are reported in the journal's order. Replays of several sessions run
//! together within one [`CallBudget`] ([`Session::replay_within`]) run no
//! more calls at once than it holds.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;

use serde::Serialize;
use serde_json::Value;

use crate::context::{ContextOp, ContextRules, RunContext, Usage};
use crate::journal::secrets::{scrub_ops, scrub_value};
use crate::journal::{CallEnd, CallStatus, Captured, Entry, Item, Record, StoreError};
use crate::sandbox::{Asker, CancelToken, Sampler};
use crate::session::{Page, Session, SessionHeader, SessionStore};
use crate::spec::{Answer, SampleReply, ToolCall};
use crate::tools::{CallFailure, CallOutcome, Host, call_end};

/// What to replay: the calls of `tools` in one session.
#[derive(Debug, Clone, Copy)]
pub struct Replay<'a> {
    /// The session's owner (`None`: the anonymous bucket).
    pub owner: Option<&'a str>,
    /// The session.
    pub session_id: &'a str,
    /// The tools whose calls run again (by the names the journal has).
    pub tools: &'a BTreeSet<String>,
    /// How many calls run at once: at least 1, and at most
    /// [`MAX_PARALLEL`] (the most calls a replay ever holds at once; a
    /// larger number runs as many).
    pub parallel: usize,
}

/// One call, replayed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replayed {
    /// Its session.
    pub session_id: String,
    /// The number of its output's record.
    pub seq: u64,
    /// Its id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments as journaled, secret-looking keys removed.
    pub arguments: Value,
    /// How the replay compares with the journal.
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// How a replayed call compares with its journal.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// The same status, result (or error text) and ops.
    Same,
    /// Something differs.
    Different {
        /// What the journal holds.
        recorded: Ended,
        /// What the replay gave.
        replayed: Ended,
    },
    /// The call completed when it was made; replayed, it fails.
    Failed {
        /// What the journal holds.
        recorded: Ended,
        /// What the failure says.
        error: String,
    },
    /// The replay cannot be a reproduction: the call read more than was
    /// recorded (a clock past the tape's bound, files, HTTP), or asked
    /// more than it was answered.
    CannotReproduce {
        /// Why.
        why: String,
    },
}

impl Verdict {
    /// Its name: `same`, `different`, `failed`, `cannot_reproduce`.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Same => "same",
            Verdict::Different { .. } => "different",
            Verdict::Failed { .. } => "failed",
            Verdict::CannotReproduce { .. } => "cannot_reproduce",
        }
    }
}

/// How a call ended, as compared: its status, its result (the error
/// text, as a string, for a failure) and its ops (hidden and
/// secret-looking keys removed, as the journal keeps them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ended {
    /// `completed` or `failed`.
    pub status: CallStatus,
    /// The result, or the error text.
    pub result: Value,
    /// The ops, in order.
    pub ops: Vec<ContextOp>,
}

/// How many calls of each verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReplaySummary {
    /// Replayed and the same.
    pub same: u64,
    /// Replayed and different.
    pub different: u64,
    /// Completed when made, failing now.
    pub failed: u64,
    /// Not reproducible.
    pub cannot_reproduce: u64,
    /// Calls of the tools that were not replayed: rejected, cancelled or
    /// interrupted when made (they did not run to an end).
    pub skipped: u64,
}

impl ReplaySummary {
    /// Counts one verdict.
    pub fn count(&mut self, verdict: &Verdict) {
        let n = match verdict {
            Verdict::Same => &mut self.same,
            Verdict::Different { .. } => &mut self.different,
            Verdict::Failed { .. } => &mut self.failed,
            Verdict::CannotReproduce { .. } => &mut self.cannot_reproduce,
        };
        *n += 1;
    }

    /// Adds another summary's counts.
    pub fn add(&mut self, other: &ReplaySummary) {
        self.same += other.same;
        self.different += other.different;
        self.failed += other.failed;
        self.cannot_reproduce += other.cannot_reproduce;
        self.skipped += other.skipped;
    }

    /// Calls replayed.
    pub fn replayed(&self) -> u64 {
        self.same + self.different + self.failed + self.cannot_reproduce
    }
}

/// Why a session could not be replayed. Nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The store failed, or has no such session.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A record does not fold (the store holds what Airlock did not
    /// write).
    #[error("session {session_id}, record {seq}: {problem}")]
    Damaged {
        /// The session.
        session_id: String,
        /// The record.
        seq: u64,
        /// What is wrong.
        problem: String,
    },
}

/// How many records a page of the journal holds at most: the page being
/// folded, the next one (read, waiting for the fold) and the one after
/// (being read) are what a replay holds of the journal. A session of up
/// to about 30 calls (four records each, through `airlock call` or MCP)
/// is one page: a replay of many short sessions (what `--since 7d`
/// finds) reads each once.
const PAGE: u64 = 128;

/// How many calls may be read ahead of the first call not yet reported
/// (queued, running, or done and waiting for an earlier one): with a
/// page's calls, what a replay holds of calls, each with its copy of the
/// deps. Enough to keep the workers busy while the next page is read.
const AHEAD: usize = 32;

/// The most calls a replay runs at once: as many as it ever holds queued
/// (those read ahead, and a page's, each call two records at least).
/// Workers past it would only wait.
pub const MAX_PARALLEL: usize = AHEAD + PAGE as usize / 2;

/// Calls at once shared by replays that run together
/// ([`Session::replay_within`]), so that replaying several sessions at a
/// time runs no more calls at once than one replay would. Cloned, it is
/// the same budget.
#[derive(Debug, Clone)]
pub struct CallBudget(Arc<Semaphore>);

impl CallBudget {
    /// A budget of `calls` at once: at least 1, and at most
    /// [`MAX_PARALLEL`] (the most a replay holds at once; a larger number
    /// gives as many).
    pub fn new(calls: usize) -> Self {
        Self(Arc::new(Semaphore::new(calls.clamp(1, MAX_PARALLEL))))
    }
}

impl Session {
    /// Replays the calls of `replay.tools` in session `replay.session_id`
    /// against `host`'s components of those tools (see the module
    /// documentation), handing each to `each` in the journal's order.
    /// `host`'s context rules scrub the replayed ops as the journal's were.
    ///
    /// Cost: one read per page of the journal (128 records; a page with
    /// fewer is the last), the reader a page ahead of the fold so
    /// the workers do not wait for a read; one sandboxed call per
    /// replayed call, on `replay.parallel` worker tasks spawned once,
    /// which take the calls as pages are folded and wait only when none
    /// is left (no wait at a page's end, and no thread woken per call;
    /// each call takes and gives back a permit of a semaphore of
    /// `replay.parallel`, which it never waits for here);
    /// a copy of the deps per call of the tools that is followed by ops,
    /// for at most 32 calls read ahead of the first not yet reported and
    /// one page's (at most 64). A component that reads neither clocks nor
    /// random numbers is given instances prepared ahead, as a fresh call
    /// is.
    pub async fn replay(
        store: &dyn SessionStore,
        host: &Arc<Host>,
        replay: Replay<'_>,
        each: impl FnMut(Replayed),
    ) -> Result<ReplaySummary, ReplayError> {
        let budget = CallBudget::new(replay.parallel);
        Self::replay_within(store, host, replay, &budget, each).await
    }

    /// [`Session::replay`], each call run only while it holds a place of
    /// `budget`: replays of several sessions run together (each with
    /// `replay.parallel` workers, and its own reader and fold) run no more
    /// calls at once than `budget` holds, and a session's calls take the
    /// places another's do not. Cost: a semaphore's permit taken and given
    /// back per call.
    pub async fn replay_within(
        store: &dyn SessionStore,
        host: &Arc<Host>,
        replay: Replay<'_>,
        budget: &CallBudget,
        mut each: impl FnMut(Replayed),
    ) -> Result<ReplaySummary, ReplayError> {
        let page = |after, limit| Page {
            owner: replay.owner,
            session_id: replay.session_id,
            after,
            limit,
        };
        let damaged = |(seq, problem)| ReplayError::Damaged {
            session_id: replay.session_id.to_owned(),
            seq,
            problem,
        };
        let shared = Arc::new(Shared::default());
        // Dropped with the replay (an error, or its caller gave up): the
        // calls stop.
        let mut workers = JoinSet::new();
        for _ in 0..replay.parallel.clamp(1, MAX_PARALLEL) {
            let budget = Arc::clone(&budget.0);
            workers.spawn(work(Arc::clone(host), Arc::clone(&shared), budget));
        }
        let mut report = Report {
            waiting: VecDeque::new(),
            summary: ReplaySummary::default(),
            each: &mut each,
        };
        let first = store.read_page(page(0, PAGE)).await?;
        let mut follow = Follow::new(&first.header, replay.tools);
        // The reader reads on from there, a page ahead of the fold (one
        // waits in `pages`). It stops after a page with fewer records than it asked for (the
        // journal held no more when it was read), after an error, or once
        // the fold is gone; the fold takes the end of `pages` for the
        // journal's end.
        let (pages, read) = tokio::sync::mpsc::channel(1);
        let after = first.records.last().map(|r| r.seq);
        let more = first.records.len() as u64 >= PAGE;
        // Moved in: `pages` is dropped when the reader ends.
        let reader = async move {
            let (Some(mut after), true) = (after, more) else {
                return;
            };
            loop {
                let next = store.read_page(page(after, PAGE)).await;
                let records = next.as_ref().map_or(&[][..], |r| &r.records[..]);
                let last = records.last().map(|r| r.seq);
                let full = records.len() as u64 >= PAGE;
                if pages.send(next).await.is_err() {
                    return;
                }
                let (Some(last), true) = (last, full) else {
                    return;
                };
                after = last;
            }
        };
        let fold = async {
            // Owned here: once the fold ends (an error too), the reader's
            // next send fails and it stops.
            let mut read = read;
            let mut records = first.records;
            loop {
                let last = records.last().map(|r| r.seq);
                let mut jobs = Vec::new();
                for record in std::mem::take(&mut records) {
                    jobs.extend(follow.absorb(record).map_err(damaged)?);
                }
                if last.is_none() {
                    jobs.extend(follow.pending.take());
                }
                report.waiting.extend(jobs.iter().map(Job::place));
                shared.queue(jobs);
                if last.is_none() {
                    shared.close();
                    report.until(&shared, 0).await;
                    return Ok::<_, ReplayError>(());
                }
                // This page's calls run, and are reported, while the
                // reader reads on.
                report.until(&shared, AHEAD).await;
                // The reader ends after the journal's last page or an
                // error, each sent.
                records = match read.recv().await {
                    Some(next) => next?.records,
                    None => Vec::new(),
                };
            }
        };
        let ((), folded) = tokio::join!(reader, fold);
        folded?;
        let mut summary = report.summary;
        summary.skipped = follow.skipped;
        Ok(summary)
    }
}

/// The replay's report: the calls queued and not yet reported, in the
/// journal's order, each handed to `each` once it and all before it
/// ended.
struct Report<'a, F> {
    waiting: VecDeque<Replayed>,
    summary: ReplaySummary,
    each: &'a mut F,
}

impl<F: FnMut(Replayed)> Report<'_, F> {
    /// Reports the calls that ended, waiting until at most `most` are
    /// left.
    async fn until(&mut self, shared: &Shared, most: usize) {
        loop {
            let told = shared.told.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            // `waiting` holds a place for each call `done` holds.
            let verdicts = shared.state().take_done(most);
            for verdict in verdicts {
                if let Some(mut call) = self.waiting.pop_front() {
                    call.verdict = verdict;
                    self.summary.count(&call.verdict);
                    (self.each)(call);
                }
            }
            if self.waiting.len() <= most {
                break;
            }
            told.await;
        }
    }
}

/// What the replay and its workers share.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// A call was queued, or the queue closed.
    queued: Notify,
    /// As many calls ended as the replay waits for.
    told: Notify,
}

#[derive(Default)]
struct State {
    /// The calls to run, numbered in the journal's order.
    queue: VecDeque<(u64, Job)>,
    /// No more calls come.
    closed: bool,
    /// The verdicts of the calls from the `first`th not yet reported
    /// (`None`: not yet ended).
    done: VecDeque<Option<Verdict>>,
    first: u64,
    /// How many of those, from the `first`th, have ended.
    ended: usize,
    /// The replay waits until `ended` is this many.
    wanted: Option<usize>,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `jobs` for the workers.
    fn queue(&self, jobs: Vec<Job>) {
        if jobs.is_empty() {
            return;
        }
        {
            let mut state = self.state();
            for job in jobs {
                let at = state.first + state.done.len() as u64;
                state.queue.push_back((at, job));
                state.done.push_back(None);
            }
        }
        self.queued.notify_waiters();
    }

    /// No more calls come: a worker that finds none left ends.
    fn close(&self) {
        self.state().closed = true;
        self.queued.notify_waiters();
    }
}

impl State {
    /// The verdicts of the first calls not yet reported, as far as they
    /// have all ended; when more than `most` are left, the replay waits
    /// until enough more have ended (a worker wakes it once, not per
    /// call).
    fn take_done(&mut self, most: usize) -> Vec<Verdict> {
        let verdicts: Vec<Verdict> = self.done.drain(..self.ended).flatten().collect();
        self.first += self.ended as u64;
        self.ended = 0;
        let left = self.done.len();
        self.wanted = (left > most).then(|| left - most);
        verdicts
    }

    /// Call `at`'s verdict; whether the replay waits for it (with those
    /// before it).
    fn ended(&mut self, at: u64, verdict: Verdict) -> bool {
        let slot = at
            .checked_sub(self.first)
            .and_then(|at| usize::try_from(at).ok())
            .and_then(|at| self.done.get_mut(at));
        if let Some(slot) = slot {
            *slot = Some(verdict);
        }
        while let Some(Some(_)) = self.done.get(self.ended) {
            self.ended += 1;
        }
        let wake = self.wanted.is_some_and(|wanted| self.ended >= wanted);
        if wake {
            self.wanted = None;
        }
        wake
    }
}

/// A worker: runs the queued calls one at a time, each while it holds a
/// place of `budget`, waiting only when none is queued (or for a place),
/// until the queue closes.
async fn work(host: Arc<Host>, shared: Arc<Shared>, budget: Arc<Semaphore>) {
    loop {
        let queued = shared.queued.notified();
        tokio::pin!(queued);
        queued.as_mut().enable();
        let next = {
            let mut state = shared.state();
            let next = state.queue.pop_front();
            if next.is_none() && state.closed {
                return;
            }
            next
        };
        let Some((at, job)) = next else {
            queued.await;
            continue;
        };
        // Never closed: the place is always had.
        let _place = budget.acquire().await.ok();
        let verdict = match AssertUnwindSafe(run(&host, job)).catch_unwind().await {
            Ok(verdict) => verdict,
            Err(_) => {
                tracing::warn!("a replayed call panicked");
                Verdict::CannotReproduce {
                    why: "its replay stopped before it ended".to_owned(),
                }
            }
        };
        if shared.state().ended(at, verdict) {
            shared.told.notify_one();
        }
    }
}

/// The journal folded as far as it was read: what a call's view needs.
struct Follow<'a> {
    /// Deps, ids and metadata; usage and iteration as last committed.
    ctx: RunContext,
    tools: &'a BTreeSet<String>,
    /// Calls of the tools asked for and not yet answered: id → (the
    /// call, its iteration, its run).
    asked: HashMap<String, (ToolCall, u32, String)>,
    /// Failed calls per (run, tool) so far: the retry count a call of
    /// the model sees.
    failures: HashMap<(String, String), u32>,
    /// A call whose output was read, waiting for its ops (the next
    /// record, when it has any).
    pending: Option<Job>,
    skipped: u64,
}

impl<'a> Follow<'a> {
    fn new(header: &SessionHeader, tools: &'a BTreeSet<String>) -> Self {
        let mut ctx = RunContext::default().with_session_id(&header.session_id);
        if let Some(user) = &header.user_id {
            ctx = ctx.with_user_id(user);
        }
        for (key, value) in &header.metadata {
            ctx = ctx.with_metadata(key, value);
        }
        Self {
            ctx,
            tools,
            asked: HashMap::new(),
            failures: HashMap::new(),
            pending: None,
            skipped: 0,
        }
    }

    /// Folds one record; a call ready to run, if this record completes
    /// one. A record that does not fold: its number and why.
    fn absorb(&mut self, record: Record) -> Result<Option<Job>, (u64, String)> {
        let seq = record.seq;
        let damaged = |problem: String| (seq, problem);
        let mut ready = None;
        if let Some(mut job) = self.pending.take() {
            match record.entry.event().map(|e| &e.item) {
                Some(Item::ContextUpdate { call_id, ops }) if *call_id == job.call.id => {
                    job.recorded.ops = ops.clone();
                }
                _ => {}
            }
            ready = Some(job);
        }
        match record.entry {
            Entry::Deps { deps } => *self.ctx.deps_mut() = deps,
            Entry::Usage { usage, iteration } => {
                self.ctx.usage = usage;
                self.ctx.iteration = iteration;
            }
            Entry::Message { .. } => {}
            Entry::Event { event, .. } | Entry::Item { event, .. } => match event.item {
                Item::FunctionCall {
                    call, iteration, ..
                } if self.tools.contains(&call.name) => {
                    self.asked
                        .insert(call.id.clone(), (call, iteration, event.run_id));
                }
                Item::FunctionCallOutput {
                    call_id,
                    name,
                    status,
                    output,
                    arguments,
                    guest,
                    ..
                } => {
                    let asked = self.asked.remove(&call_id);
                    if let Some((mut call, iteration, run_id)) = asked {
                        // It ran with what its approval edited them to.
                        if let Some(edited) = arguments {
                            call.arguments = edited;
                        }
                        if matches!(status, CallStatus::Completed | CallStatus::Failed) {
                            self.pending =
                                Some(self.job(seq, call, iteration, run_id, status, output, guest));
                        } else {
                            self.skipped += 1;
                        }
                    }
                    if status == CallStatus::Failed {
                        *self.failures.entry((event.run_id, name)).or_default() += 1;
                    }
                }
                Item::ContextUpdate { ops, .. } => {
                    crate::context::replay(self.ctx.deps_mut(), &ops)
                        .map_err(|e| damaged(e.to_string()))?;
                }
                _ => {}
            },
        }
        Ok(ready)
    }

    /// The call whose output is record `seq`, with the view it had.
    #[expect(
        clippy::too_many_arguments,
        reason = "the fields of one journaled call"
    )]
    fn job(
        &self,
        seq: u64,
        mut call: ToolCall,
        iteration: u32,
        run_id: String,
        status: CallStatus,
        output: String,
        guest: Captured,
    ) -> Job {
        // The model's calls (iteration 1 on) see their tool's failures
        // in the run so far; a direct call sees 0.
        if iteration > 0 {
            let key = (run_id.clone(), call.name.clone());
            call.retry = self.failures.get(&key).copied().unwrap_or(0);
        }
        let mut ctx = self.ctx.clone().with_run_id(run_id);
        ctx.iteration = iteration;
        // The call counted itself before it ran; the count was committed
        // with its output.
        ctx.usage = Usage {
            tool_calls: ctx.usage.tool_calls.saturating_add(1),
            ..ctx.usage
        };
        let result = match status {
            CallStatus::Completed => serde_json::from_str(&output).unwrap_or(Value::String(output)),
            _ => Value::String(output),
        };
        Job {
            seq,
            call,
            ctx,
            recorded: Ended {
                status,
                result,
                ops: Vec::new(),
            },
            guest,
        }
    }
}

/// A call to run again.
struct Job {
    seq: u64,
    call: ToolCall,
    /// The view it had.
    ctx: RunContext,
    /// How it ended (its ops filled in once read).
    recorded: Ended,
    /// What it wrote, read and was answered.
    guest: Captured,
}

impl Job {
    /// Where it is and what it was asked, with the verdict a replay that
    /// never ends gives it.
    fn place(&self) -> Replayed {
        let mut arguments = serde_json::from_str(&self.call.arguments)
            .unwrap_or_else(|_| Value::String(self.call.arguments.clone()));
        scrub_value(&mut arguments);
        Replayed {
            session_id: self.ctx.session_id().to_owned(),
            seq: self.seq,
            call_id: self.call.id.clone(),
            tool: self.call.name.clone(),
            arguments,
            verdict: Verdict::CannotReproduce {
                why: "its replay stopped before it ended".to_owned(),
            },
        }
    }
}

/// Runs `job` again and compares.
async fn run(host: &Host, job: Job) -> Verdict {
    let Job {
        call,
        mut ctx,
        recorded,
        guest,
        ..
    } = job;
    let tape = guest.tape.map(|tape| *tape).unwrap_or_default();
    if let Some(past) = &tape.past {
        return Verdict::CannotReproduce {
            why: format!("it {past} when it ran"),
        };
    }
    let short: Arc<Mutex<Option<String>>> = Arc::default();
    let cancel = CancelToken::replaying(
        tape,
        answers(guest.asked, Arc::clone(&short)),
        replies(guest.sampled, Arc::clone(&short)),
    );
    let ran = host.run_only(&ctx, &call, &cancel, false).await;
    let result = host.apply_ran(&mut ctx, &call, ran);
    let output = match &result {
        Ok(outcome) => &outcome.output,
        Err(failure) => &failure.output,
    };
    let asked_more = short.lock().ok().and_then(|mut s| s.take());
    if let Some(why) = output.tape.past.clone().or(asked_more) {
        return Verdict::CannotReproduce { why };
    }
    compare(recorded, &result, host.context_rules())
}

/// The verdict on a replay that ended with `result`.
fn compare(
    recorded: Ended,
    result: &Result<CallOutcome, CallFailure>,
    rules: &ContextRules,
) -> Verdict {
    let replayed = match call_end(result) {
        CallEnd::Completed { result, ops, .. } => Ended {
            status: CallStatus::Completed,
            result: result.clone(),
            ops: scrub_ops(ops, rules),
        },
        CallEnd::Failed { text, .. } if recorded.status == CallStatus::Completed => {
            return Verdict::Failed {
                recorded,
                error: text,
            };
        }
        CallEnd::Failed { text, .. } => Ended {
            status: CallStatus::Failed,
            result: Value::String(text),
            ops: Vec::new(),
        },
        CallEnd::Rejected(_) => Ended {
            status: CallStatus::Rejected,
            result: Value::Null,
            ops: Vec::new(),
        },
    };
    if replayed == recorded {
        Verdict::Same
    } else {
        Verdict::Different { recorded, replayed }
    }
}

/// Answers a replayed call's questions with the recorded answers, in
/// order; past them, cancels and notes it in `short`.
fn answers(asked: Vec<crate::spec::Asked>, short: Arc<Mutex<Option<String>>>) -> Asker {
    let given = asked.into_iter().map(|a| a.answer).collect();
    let next = in_order(given, short, "asks its person", |_| Answer::Cancel);
    Arc::new(move |_question| {
        let answer = next();
        Box::pin(async move { answer })
    })
}

/// Answers a replayed call's requests for a completion with the recorded
/// replies, in order; past them, refuses and notes it in `short`.
fn replies(sampled: Vec<crate::spec::Sampled>, short: Arc<Mutex<Option<String>>>) -> Sampler {
    let given = sampled.into_iter().map(|s| s.reply).collect();
    let next = in_order(given, short, "asks the model", |why| SampleReply::Refused {
        why: why.to_owned(),
    });
    Arc::new(move |_request| {
        let reply = next();
        Box::pin(async move { reply })
    })
}

/// What was `given`, one at a time in order; past it, `past` of why the
/// call cannot be reproduced (`what` it did more often), noted in `short`.
fn in_order<T: Clone + Send + Sync + 'static>(
    given: Vec<T>,
    short: Arc<Mutex<Option<String>>>,
    what: &'static str,
    past: fn(&str) -> T,
) -> impl Fn() -> T + Send + Sync + 'static {
    let next = AtomicUsize::new(0);
    move || {
        let at = next.fetch_add(1, Ordering::SeqCst);
        given.get(at).cloned().unwrap_or_else(|| {
            let why = format!(
                "{what} more often than when it was recorded ({} times)",
                given.len()
            );
            let value = past(&why);
            note(&short, why);
            value
        })
    }
}

fn note(short: &Mutex<Option<String>>, why: String) {
    if let Ok(mut short) = short.lock() {
        short.get_or_insert(why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replay_is_woken_once_enough_calls_ended_in_order() {
        let mut state = State::default();
        state.done.extend([None, None, None, None]);
        assert!(!state.ended(1, Verdict::Same), "none waits");
        // Four waiting, two may be left: two more must end, in order.
        assert!(state.take_done(2).is_empty());
        assert_eq!(state.wanted, Some(2));
        assert!(!state.ended(2, Verdict::Same), "the first has not ended");
        assert!(state.ended(0, Verdict::Same), "0, 1 and 2 have");
        assert_eq!(state.take_done(2).len(), 3);
        assert_eq!((state.first, state.wanted), (3, None));
        // What was reported is not counted again, nor woken for twice.
        assert!(state.take_done(0).is_empty());
        assert!(state.ended(3, Verdict::Same));
        assert!(!state.ended(3, Verdict::Same));
        assert_eq!(state.take_done(0).len(), 1);
        assert_eq!((state.first, state.wanted), (4, None));
    }

    #[test]
    fn recorded_answers_come_back_in_order_then_run_short() {
        let short: Arc<Mutex<Option<String>>> = Arc::default();
        let next = in_order(vec![1, 2], Arc::clone(&short), "asks its person", |_| 0);
        assert_eq!((next(), next()), (1, 2));
        assert!(short.lock().unwrap().is_none());
        assert_eq!(next(), 0);
        assert_eq!(
            short.lock().unwrap().as_deref(),
            Some("asks its person more often than when it was recorded (2 times)")
        );
    }
}
