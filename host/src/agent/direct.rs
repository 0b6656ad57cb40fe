//! Calls on a session outside the agent loop (`airlock call --session`,
//! MCP): journaled through the same recorder as the loop's calls, so a
//! call reads the same in the journal whoever made it. The session layer
//! stores and leases; running the tool is this layer's.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::Value;

use crate::journal::CallEnd;
use crate::journal::recorder::Recorder;
use crate::journal::{CallStatus, CalledBy, Conversation, Event, Flush, Item, StoreError};
use crate::sandbox::CancelToken;
use crate::session::Session;
use crate::tools::{CallError, CallFailure, CallOutcome, Host, ToolCall, call_end, guest_output};

/// A call on a session ([`Session::call`]) that failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SessionCallError {
    /// The call failed; its failure is committed, no op was applied.
    /// (Boxed: a failure carries what the tool wrote, showed and asked.)
    #[error(transparent)]
    Call(Box<CallFailure>),
    /// A commit failed: before the call ran (it did not run), or after
    /// (its ops are applied to the live deps but not stored).
    #[error("cannot save the session: {0}")]
    Store(#[from] StoreError),
    /// [`Session::call_once`] was given the id of an earlier call of
    /// another tool or other arguments; nothing ran.
    #[error(
        "call id {call_id} was already used in this session for another call (another tool or other arguments)"
    )]
    IdReused {
        /// The id.
        call_id: String,
    },
    /// The call's approval was refused ([`Session::call_once_telling`]):
    /// it is journaled as rejected, and nothing ran.
    #[error("{}", crate::journal::REJECTED_MESSAGE)]
    Rejected,
}

/// What a keyed call tells and waits for between committing its intent
/// and running ([`Session::call_once_telling`]).
#[derive(Default)]
pub struct CallStart<'a> {
    /// Told once the intent is committed.
    pub begun: Option<tokio::sync::oneshot::Sender<()>>,
    /// Waited for then, before the tool runs: `false` rejects the call.
    pub approval: Option<BoxFuture<'a, bool>>,
}

impl std::fmt::Debug for CallStart<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallStart")
            .field("begun", &self.begun.is_some())
            .field("approval", &self.approval.is_some())
            .finish()
    }
}

/// What a session holds of an earlier call with a given id.
enum Earlier {
    /// Nothing completed.
    None,
    /// It completed: its committed outcome.
    Completed(Box<CallOutcome>),
    /// The id was used for another tool or other arguments.
    Reused,
}

impl Session {
    /// Calls one tool outside the agent loop (for `airlock call --session`
    /// and MCP), journaled as the loop journals a call: its intent, then
    /// its output item and ops (under `host`'s rules as they are now; no
    /// tool message, as no model waits for one). The call counts in
    /// `usage.tool_calls` (and the tool sees itself counted). `by` is who
    /// asked, as their access token said, journaled with the intent.
    ///
    /// A call whose tool cannot have effects outside the sandbox (no
    /// effectful grant, or marked `idempotent`: the rule parallel turns
    /// use) is journaled in one commit after it ends, intent and output
    /// together: if the process dies while it runs, nothing of it was
    /// committed and nothing outside happened, so there is nothing to
    /// answer. Any other call commits its intent before it runs, so that a
    /// death mid-call is answered "interrupted" on resume.
    ///
    /// Cost: one commit (an fsync) for a pure call, two otherwise. A pure
    /// call that applied no op and whose tool can reach nothing outside
    /// ([`LoadedComponent::reaches_nothing`](crate::tools::LoadedComponent::reaches_nothing))
    /// and is not keyed commits without waiting for the disk
    /// ([`Flush::Deferred`]): a crash of the process loses nothing, a power
    /// cut at most its record.
    pub async fn call(
        &mut self,
        host: &Host,
        call: &ToolCall,
        cancel: &CancelToken,
        by: Option<&CalledBy>,
    ) -> Result<CallOutcome, SessionCallError> {
        self.call_journaled(host, call, cancel, by, false, CallStart::default())
            .await
    }

    /// [`Session::call`], its items recorded as a keyed call's when
    /// `keyed`; its intent committed before it runs when it is keyed or its
    /// tool may have effects outside the sandbox, and then `begun` told.
    async fn call_journaled(
        &mut self,
        host: &Host,
        call: &ToolCall,
        cancel: &CancelToken,
        by: Option<&CalledBy>,
        keyed: bool,
        start: CallStart<'_>,
    ) -> Result<CallOutcome, SessionCallError> {
        let component = host.component_for(&call.name);
        let pure = component.is_none_or(|c| c.may_rerun());
        let intent_first = keyed || !pure;
        let deferrable = !keyed && component.is_some_and(|c| c.reaches_nothing());
        let started = Instant::now();
        let iteration = self.context().iteration;
        let mut recorder = Recorder::new(Conversation::from(&mut *self), false).keyed(keyed);
        recorder.call_asked(call, iteration, by);
        if intent_first {
            recorder.commit().await?;
            if let Some(begun) = start.begun {
                // Whoever waited may have stopped waiting.
                let _ = begun.send(());
            }
        }
        let approved = match start.approval {
            Some(approval) => approval.await,
            None => true,
        };
        if !approved && !cancel.is_cancelled() {
            let rules = host.context_rules();
            let rejected = CallEnd::Rejected(crate::journal::REJECTED_MESSAGE.to_owned());
            recorder.call_ended(call, rejected, Duration::ZERO, rules);
            recorder.commit_flushed(Flush::Now).await?;
            return Err(SessionCallError::Rejected);
        }
        // A call cancelled while its approval was asked for ends
        // cancelled, without running.
        let result = if approved {
            host.run_and_apply(recorder.ctx_mut(), call, Some(cancel), false)
                .await
        } else {
            Err(CallError::Cancelled.into())
        };
        recorder.call_ended(
            call,
            call_end(&result),
            started.elapsed(),
            host.context_rules(),
        );
        // A call that changed nothing (a failed one applied no op) and
        // could reach nothing need not wait for the disk.
        let changed = result
            .as_ref()
            .is_ok_and(|outcome| !outcome.updates.is_empty());
        let flush = if deferrable && !changed {
            Flush::Deferred
        } else {
            Flush::Now
        };
        recorder.commit_flushed(flush).await?;
        result.map_err(|failure| SessionCallError::Call(Box::new(failure)))
    }

    /// [`Session::call`], at most once per call id: when this session
    /// already holds a completed keyed call (one made through this method)
    /// with `call.id`, its outcome (result, ops, guest output, as
    /// committed) is returned and nothing runs. A client that lost the
    /// answer (a dropped connection, a host that died) retries with the
    /// same id, on any host, and its ops apply once. A call that failed,
    /// was cancelled or interrupted committed no op, so it runs again. The
    /// id must name the same tool and arguments
    /// ([`SessionCallError::IdReused`] otherwise). A keyed call always
    /// commits its intent before it runs, whatever its tool. A key finds
    /// keyed calls only: a [`Session::call`] or a model's call with the
    /// same id is not indexed, and is not its earlier call.
    ///
    /// Cost: one indexed read of the store for the call's records, beside
    /// [`Session::call`]'s. Only keyed calls' records are indexed, so an
    /// unkeyed call's commit pays nothing for it.
    pub async fn call_once(
        &mut self,
        host: &Host,
        call: &ToolCall,
        cancel: &CancelToken,
        by: Option<&CalledBy>,
    ) -> Result<CallOutcome, SessionCallError> {
        self.call_once_telling(host, call, cancel, by, CallStart::default())
            .await
    }

    /// [`Session::call_once`], telling `start.begun` once the call's
    /// intent is committed and before the tool runs: from then on the call
    /// is in the store ([`SessionStore::call_records`] finds it), and a
    /// handle to it (an MCP task) outlives this process. A call answered
    /// from an earlier one, or that fails before its intent is committed,
    /// never tells `begun` (it drops it).
    ///
    /// With `start.approval`, the call waits for it once its intent is
    /// committed (and `begun` told), before the tool runs: refused, the
    /// call is journaled as rejected and nothing runs
    /// ([`SessionCallError::Rejected`]); refused because `cancel` was
    /// fired meanwhile, it ends cancelled. The wait holds the session, as
    /// the call does.
    ///
    /// [`SessionStore::call_records`]: crate::session::SessionStore::call_records
    pub async fn call_once_telling(
        &mut self,
        host: &Host,
        call: &ToolCall,
        cancel: &CancelToken,
        by: Option<&CalledBy>,
        start: CallStart<'_>,
    ) -> Result<CallOutcome, SessionCallError> {
        let events = self.keyed_call_items(&call.id).await?;
        match earlier_call(&events, call) {
            Earlier::Completed(done) => Ok(*done),
            Earlier::Reused => Err(SessionCallError::IdReused {
                call_id: call.id.clone(),
            }),
            Earlier::None => {
                self.call_journaled(host, call, cancel, by, true, start)
                    .await
            }
        }
    }
}

/// What `items` (a session's records about `call`'s id) hold of a call
/// with `call`'s id.
fn earlier_call(items: &[Event], call: &ToolCall) -> Earlier {
    let same_id = |id: &str| id == call.id;
    let reused = items.iter().any(|e| {
        matches!(&e.item, Item::FunctionCall { call: earlier, .. }
            if same_id(&earlier.id)
                && (earlier.name != call.name || earlier.arguments != call.arguments))
    });
    if reused {
        return Earlier::Reused;
    }
    match completed(items, &call.id) {
        Some(done) => Earlier::Completed(Box::new(done)),
        None => Earlier::None,
    }
}

/// The outcome of the call `call_id` among `items`, as committed, if it
/// completed.
fn completed(items: &[Event], call_id: &str) -> Option<CallOutcome> {
    let same_id = |id: &str| id == call_id;
    let (output, guest, duration_us) = items.iter().rev().find_map(|e| match &e.item {
        Item::FunctionCallOutput {
            call_id,
            status: CallStatus::Completed,
            output,
            guest,
            duration_us,
            ..
        } if same_id(call_id) => Some((output, guest, *duration_us)),
        _ => None,
    })?;
    let updates = items
        .iter()
        .filter_map(|e| match &e.item {
            Item::ContextUpdate { call_id, ops } if same_id(call_id) => Some(ops.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    Some(CallOutcome {
        result: serde_json::from_str(output).unwrap_or_else(|_| Value::String(output.clone())),
        updates,
        output: guest_output(guest),
        duration: Duration::from_micros(duration_us),
    })
}

/// What a session's records say of one keyed call
/// ([`SessionStore::call_records`](crate::session::SessionStore::call_records)).
#[derive(Debug)]
pub(crate) enum KeyedCall {
    /// No record of it.
    Unknown,
    /// Asked for at `asked_ms` (ms since the epoch), not ended.
    Open {
        /// When its intent was recorded.
        asked_ms: u64,
    },
    /// Ended.
    Ended {
        /// When its intent was recorded.
        asked_ms: u64,
        /// When its outcome was.
        ended_ms: u64,
        /// How it ended.
        status: CallStatus,
        /// Its outcome, when it completed.
        outcome: Option<Box<CallOutcome>>,
        /// What the model would see: the result JSON or the error text.
        output: String,
    },
}

impl KeyedCall {
    /// What `events` (the records of keyed call `call_id`) say of it.
    pub(crate) fn of(events: &[Event], call_id: &str) -> Self {
        let asked = events.iter().find_map(|e| match &e.item {
            Item::FunctionCall { call, .. } if call.id == call_id => Some(e.at_ms),
            _ => None,
        });
        let Some(asked_ms) = asked else {
            return Self::Unknown;
        };
        let ended = events.iter().rev().find_map(|e| match &e.item {
            Item::FunctionCallOutput {
                call_id: id,
                status,
                output,
                ..
            } if id == call_id => Some((e.at_ms, *status, output.clone())),
            _ => None,
        });
        match ended {
            None => Self::Open { asked_ms },
            Some((ended_ms, status, output)) => Self::Ended {
                asked_ms,
                ended_ms,
                status,
                outcome: completed(events, call_id).map(Box::new),
                output,
            },
        }
    }
}
