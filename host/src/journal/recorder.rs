//! Recording a conversation as it goes: its items (the messages the
//! model sees are rebuilt from them), committed through the
//! conversation's sink; and the one way a tool call is recorded, for the
//! agent loop and a session's direct calls alike.

use std::time::Duration;

use super::conversation::{CallEnd, Captured};
use super::record::{CallStatus, CalledBy, Entry, Event, Item, Role, now_ms};
use super::secrets;
use super::sink::{Conversation, Flush, Sink, StoreError};
use super::transcript::Transcript;
use crate::context::{ContextRules, RunContext};
use crate::spec::{Tape, ToolCall};

/// What the model is told when the approval handler rejects a call.
pub const REJECTED_MESSAGE: &str = "Tool call was rejected by approval handler.";

/// What the model is told of a call the run's cancellation stopped.
pub const CANCELLED_MESSAGE: &str = "Tool call was cancelled.";

/// Records into a [`Conversation`]: each item and message is added to the
/// transcript at once, and to the next commit when the conversation has a
/// sink.
pub(crate) struct Recorder<'c> {
    ctx: &'c mut RunContext,
    transcript: &'c mut Transcript,
    sink: Option<&'c mut dyn Sink>,
    /// What the next commit writes.
    pending: Vec<Entry>,
    /// Events the next commit makes visible, when someone watches.
    unsent: Option<Vec<Event>>,
    /// Bytes (as JSON) of the items recorded through this recorder, up to
    /// the last `uncounted`.
    recorded_bytes: usize,
    /// Items recorded through this recorder and not counted in
    /// `recorded_bytes` yet: the transcript's last ones, as nothing else
    /// writes the transcript while the recorder holds it. Counted when
    /// asked, so that a recorder nobody asks (a session's direct call)
    /// serializes nothing to count.
    uncounted: usize,
    /// Whether the items it records are a keyed call's ([`Entry::Event`]'s
    /// `keyed`).
    keyed: bool,
}

impl<'c> Recorder<'c> {
    /// A recorder for `conversation`; with `watched`, [`Recorder::commit`]
    /// returns the events it made visible.
    pub(crate) fn new(conversation: Conversation<'c>, watched: bool) -> Self {
        Self {
            ctx: conversation.ctx,
            transcript: conversation.transcript,
            sink: conversation.sink,
            pending: Vec::new(),
            unsent: watched.then(Vec::new),
            recorded_bytes: 0,
            uncounted: 0,
            keyed: false,
        }
    }

    /// The same recorder, recording each item as part of a keyed call
    /// (made at most once per id), so that the store indexes it by the
    /// call's id: for a recorder that records one call and nothing else.
    pub(crate) fn keyed(mut self, keyed: bool) -> Self {
        self.keyed = keyed;
        self
    }

    pub(crate) fn ctx(&self) -> &RunContext {
        self.ctx
    }

    pub(crate) fn ctx_mut(&mut self) -> &mut RunContext {
        self.ctx
    }

    pub(crate) fn transcript(&self) -> &Transcript {
        self.transcript
    }

    /// Bytes (as JSON) of the items recorded so far. Costs a
    /// serialization of each item recorded since the last ask.
    pub(crate) fn recorded_bytes(&mut self) -> usize {
        let items = &self.transcript.items;
        for event in &items[items.len().saturating_sub(self.uncounted)..] {
            self.recorded_bytes = self.recorded_bytes.saturating_add(crate::json::len(event));
        }
        self.uncounted = 0;
        self.recorded_bytes
    }

    /// Appends `item` to the log, numbered after the last.
    pub(crate) fn record(&mut self, item: Item) {
        let event = Event::numbered(
            self.transcript.next_item(),
            self.ctx.run_id(),
            now_ms(),
            item,
        );
        self.uncounted += 1;
        if self.sink.is_some() {
            self.pending.push(Entry::Event {
                event: event.clone(),
                keyed: self.keyed,
            });
        }
        if let Some(unsent) = &mut self.unsent {
            unsent.push(event.clone());
        }
        self.transcript.push_event(event);
    }

    /// Records a model turn: its text and the calls it asked for, whose
    /// items are their intents (recorded here, before any of them runs;
    /// each is counted in `usage.tool_calls` when the loop reaches it,
    /// [`Recorder::count_call`]).
    pub(crate) fn model_turn(
        &mut self,
        content: Option<String>,
        calls: &[ToolCall],
        iteration: u32,
    ) {
        self.record(Item::Message {
            role: Role::Assistant,
            content,
            iteration,
            calls: u32::try_from(calls.len()).unwrap_or(u32::MAX),
        });
        for call in calls {
            self.record(Item::FunctionCall {
                call: call.clone(),
                iteration,
                by: None,
            });
        }
    }

    /// Counts a call in `usage.tool_calls` (the tool sees itself counted).
    pub(crate) fn count_call(&mut self) {
        self.ctx.usage.tool_calls = self.ctx.usage.tool_calls.saturating_add(1);
    }

    /// Commits what was recorded since the last commit (with the usage
    /// totals) in one transaction, on disk before it returns; the events
    /// it made visible, when watched. An event a watcher sees is stored.
    pub(crate) async fn commit(&mut self) -> Result<Vec<Event>, StoreError> {
        self.commit_flushed(Flush::Now).await
    }

    /// [`Recorder::commit`], on disk as `flush` says.
    pub(crate) async fn commit_flushed(&mut self, flush: Flush) -> Result<Vec<Event>, StoreError> {
        if let Some(sink) = self.sink.as_deref_mut() {
            let entries = std::mem::take(&mut self.pending);
            sink.commit(self.ctx, entries, flush).await?;
        }
        Ok(self.unsent.as_mut().map(std::mem::take).unwrap_or_default())
    }

    /// Records that `call` was asked for outside a model turn (a direct
    /// call), before it runs (its intent), and counts it in
    /// `usage.tool_calls`, and who asked, when known. No model is told
    /// how it ends.
    pub(crate) fn call_asked(&mut self, call: &ToolCall, iteration: u32, by: Option<&CalledBy>) {
        self.record(Item::FunctionCall {
            call: call.clone(),
            iteration,
            by: by.cloned(),
        });
        self.count_call();
    }

    /// `guest` as its call's output keeps it: what its tape recorded of
    /// HTTP and files let go when keeping it would take the session past
    /// [`Tape::MAX_SESSION_RECORDED_BYTES`] (the call then cannot be
    /// reproduced, and its tape says why).
    fn within_session_bound(&self, mut guest: Captured) -> Captured {
        if let Some(tape) = guest.tape.as_mut() {
            let bytes = tape.recorded_bytes();
            let kept = self.transcript.recorded_bytes.saturating_add(bytes);
            if bytes > 0 && kept > Tape::MAX_SESSION_RECORDED_BYTES {
                tape.forget_recorded(|| {
                    format!(
                        "its session had recorded {} MiB of HTTP responses and files, the most a session keeps",
                        Tape::MAX_SESSION_RECORDED_BYTES >> 20
                    )
                });
            }
        }
        guest
    }

    /// Records how `call` ended, after `took`: its output item (the result
    /// or the failure text, the failure's kind, what the guest wrote), then
    /// the ops it applied (less hidden and secret-looking keys, under
    /// `rules`; none recorded when none is left). The output of a call the
    /// model asked for is its tool message.
    pub(crate) fn call_ended(
        &mut self,
        call: &ToolCall,
        ended: CallEnd<'_>,
        took: Duration,
        rules: &ContextRules,
    ) -> CallStatus {
        self.call_ended_as(call, None, ended, took, rules)
    }

    /// [`Recorder::call_ended`], for a call that ran with `edited`
    /// arguments (JSON text) in place of those it was asked with: they
    /// are kept with its output, as what it ran with.
    pub(crate) fn call_ended_as(
        &mut self,
        call: &ToolCall,
        edited: Option<&str>,
        ended: CallEnd<'_>,
        took: Duration,
        rules: &ContextRules,
    ) -> CallStatus {
        let (status, output, error_kind, guest, ops) = match ended {
            CallEnd::Rejected(why) => (
                CallStatus::Rejected,
                why,
                None,
                Captured::default(),
                Vec::new(),
            ),
            CallEnd::Completed {
                result,
                ops,
                output,
            } => (
                CallStatus::Completed,
                result.to_string(),
                None,
                output,
                secrets::scrub_ops(ops, rules),
            ),
            CallEnd::Failed {
                text,
                kind,
                cancelled,
                output,
            } => (
                if cancelled {
                    CallStatus::Cancelled
                } else {
                    CallStatus::Failed
                },
                text,
                Some(kind),
                output,
                Vec::new(),
            ),
        };
        let guest = self.within_session_bound(guest);
        self.record(Item::FunctionCallOutput {
            call_id: call.id.clone(),
            name: call.name.clone(),
            status,
            output,
            error_kind,
            duration_us: u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            arguments: edited.map(str::to_owned),
            guest,
        });
        if !ops.is_empty() {
            self.record(Item::ContextUpdate {
                call_id: call.id.clone(),
                ops,
            });
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::sink::Conversation;
    use crate::spec::Exchange;

    /// A completed call's output whose tape recorded one response of
    /// `bytes` bytes.
    fn recording(bytes: usize) -> Captured {
        use base64::Engine as _;
        let body = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; bytes]);
        Captured {
            tape: Some(Box::new(Tape {
                http: vec![Exchange {
                    method: "GET".into(),
                    url: "http://example.test/".into(),
                    request_sha256: None,
                    status: 200,
                    headers: Vec::new(),
                    body,
                }],
                ..Tape::default()
            })),
            ..Captured::default()
        }
    }

    fn tape_of(transcript: &Transcript) -> Tape {
        match &transcript.items.last().map(|e| &e.item) {
            Some(Item::FunctionCallOutput { guest, .. }) => {
                guest.tape.as_deref().cloned().unwrap_or_default()
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_session_keeps_a_bounded_total_of_recorded_http() {
        let mut ctx = RunContext::default();
        let mut transcript = Transcript::default();
        let call = ToolCall::new("fetch", "{}");
        let result = serde_json::json!(1);
        let mut end = |transcript: &mut Transcript, bytes: usize| {
            let mut recorder = Recorder::new(
                Conversation {
                    ctx: &mut ctx,
                    transcript,
                    sink: None,
                },
                false,
            );
            let ended = CallEnd::Completed {
                result: &result,
                ops: &[],
                output: recording(bytes),
            };
            recorder.call_ended(&call, ended, Duration::ZERO, &ContextRules::default());
        };
        // 1,000 bytes (a length base64 pads) are counted as read.
        end(&mut transcript, 1000);
        assert_eq!(transcript.recorded_bytes, 1000);
        assert_eq!(tape_of(&transcript).http.len(), 1);

        // Up to the bound exactly: kept.
        let room = Tape::MAX_SESSION_RECORDED_BYTES - 1000 - 1;
        transcript.recorded_bytes += room;
        end(&mut transcript, 1);
        assert_eq!(tape_of(&transcript).http.len(), 1);
        assert_eq!(transcript.recorded_bytes, Tape::MAX_SESSION_RECORDED_BYTES);

        // One byte past it: nothing kept, the call cannot be reproduced.
        end(&mut transcript, 1);
        let tape = tape_of(&transcript);
        assert!(tape.http.is_empty());
        let past = tape.past.unwrap();
        assert!(
            past.contains("64 MiB of HTTP responses and files"),
            "{past}"
        );
        assert_eq!(transcript.recorded_bytes, Tape::MAX_SESSION_RECORDED_BYTES);

        // The count survives a snapshot of the transcript.
        let json = serde_json::to_string(&transcript).unwrap();
        let back: Transcript = serde_json::from_str(&json).unwrap();
        assert_eq!(back.recorded_bytes, Tape::MAX_SESSION_RECORDED_BYTES);
    }
}
