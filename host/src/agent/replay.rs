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
//! The journal is read a page at a time and folded as it goes (deps and
//! usage, the calls asked for and not yet answered), so memory is bounded
//! by the deps and one page's calls, not by the journal's size. Calls
//! run on `parallel` worker tasks; they are reported in the journal's
//! order.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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
    /// How many calls run at once (at least 1).
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

/// How many records a page of the journal holds: two pages (the one
/// whose calls run, the next one read meanwhile) and their calls are what
/// a replay holds.
const PAGE: u64 = 128;

impl Session {
    /// Replays the calls of `replay.tools` in session `replay.session_id`
    /// against `host`'s components of those tools (see the module
    /// documentation), handing each to `each` in the journal's order.
    /// `host`'s context rules scrub the replayed ops as the journal's were.
    ///
    /// Cost: one read per page of the journal (128 records), the next
    /// page read while the calls of this one run; one sandboxed call per
    /// replayed call, on `replay.parallel` worker tasks (spawned per page,
    /// not per call); a copy of the deps per call of the tools that is
    /// followed by ops. A component that reads neither clocks nor random
    /// numbers is given instances prepared ahead, as a fresh call is.
    pub async fn replay(
        store: &dyn SessionStore,
        host: &Arc<Host>,
        replay: Replay<'_>,
        mut each: impl FnMut(Replayed),
    ) -> Result<ReplaySummary, ReplayError> {
        let parallel = replay.parallel.max(1);
        let page = |after| Page {
            owner: replay.owner,
            session_id: replay.session_id,
            after,
            limit: PAGE,
        };
        let damaged = |(seq, problem)| ReplayError::Damaged {
            session_id: replay.session_id.to_owned(),
            seq,
            problem,
        };
        let mut summary = ReplaySummary::default();
        let mut read = store.read_page(page(0)).await?;
        let mut follow = Follow::new(&read.header, replay.tools);
        loop {
            let last = read.records.last().map(|r| r.seq);
            let mut jobs = Vec::new();
            for record in std::mem::take(&mut read.records) {
                jobs.extend(follow.absorb(record).map_err(damaged)?);
            }
            if last.is_none() {
                jobs.extend(follow.pending.take());
            }
            // This page's calls run while the next page is read.
            let (done, next) = match last {
                Some(last) => {
                    let (done, next) =
                        tokio::join!(run_all(host, jobs, parallel), store.read_page(page(last)));
                    (done, Some(next?))
                }
                None => (run_all(host, jobs, parallel).await, None),
            };
            for call in done {
                summary.count(&call.verdict);
                each(call);
            }
            match next {
                Some(next) => read = next,
                None => break,
            }
        }
        summary.skipped = follow.skipped;
        Ok(summary)
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
                    guest,
                    ..
                } => {
                    let asked = self.asked.remove(&call_id);
                    if let Some((call, iteration, run_id)) = asked {
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

/// Runs `jobs` again, `parallel` at a time (each worker task takes the
/// next job until none is left: one task per worker, not per call), and
/// gives them back in order.
async fn run_all(host: &Arc<Host>, jobs: Vec<Job>, parallel: usize) -> Vec<Replayed> {
    let mut calls: Vec<Replayed> = jobs.iter().map(Job::place).collect();
    if jobs.is_empty() {
        return calls;
    }
    let workers = parallel.min(jobs.len());
    let queue = Arc::new(Mutex::new(
        jobs.into_iter().enumerate().collect::<VecDeque<_>>(),
    ));
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (queue, host) = (Arc::clone(&queue), Arc::clone(host));
            tokio::spawn(async move {
                let mut done = Vec::new();
                loop {
                    let next = queue.lock().ok().and_then(|mut q| q.pop_front());
                    let Some((at, job)) = next else {
                        break;
                    };
                    done.push((at, run(&host, job).await));
                }
                done
            })
        })
        .collect();
    for task in tasks {
        match task.await {
            Ok(done) => {
                for (at, verdict) in done {
                    calls[at].verdict = verdict;
                }
            }
            // Its calls keep the verdict they were made with.
            Err(e) => tracing::warn!(error = %e, "a replay worker stopped"),
        }
    }
    calls
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
        CallEnd::Rejected => Ended {
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
