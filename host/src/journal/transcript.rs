//! The conversation so far ([`Transcript`]): the item log, and the
//! messages the model sees, rebuilt from the items of a journal of format
//! 2 ([`super::record`]) as they are added: a prompt's item is the user
//! message, a model turn's item and the calls it asked for are the
//! assistant message, and the output of a call the model asked for is its
//! tool message. A direct call (outside the agent loop) says nothing to
//! the model.

use serde::{Deserialize, Serialize};

use super::conversation::Message;
use super::record::{CallStatus, Event, Item, Role};
use crate::spec::ToolCall;

/// The conversation so far: the messages sent to the model and the item
/// log. Pass the same transcript to continue a conversation.
///
/// Its messages are those its items say (this module's `Speaker`), and the
/// messages a format-1 journal stored beside them; they are added as the
/// items are ([`Transcript::push_event`]), never written on their own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "TranscriptFields")]
pub struct Transcript {
    /// What the model has been sent and has answered, in order.
    pub messages: Vec<Message>,
    /// The item log, in order: every item, or — for a session resumed
    /// from a snapshot, or one that held
    /// [`MAX_HELD_ITEMS`](crate::session::MAX_HELD_ITEMS) — the calls
    /// still open when its closed calls were let go, and every item since.
    pub items: Vec<Event>,
    /// Items of the log not held in `items` (folded into a snapshot, or
    /// let go by a session; 0 while the whole log is held). The next item
    /// is numbered [`Transcript::next_item`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub items_folded: u64,
    /// Bytes of HTTP response bodies and files the log's calls recorded
    /// ([`crate::spec::Tape::recorded_bytes`]), every item counted, also
    /// those folded or let go (a snapshot of a version that did not count
    /// them counts from its own items on). Bounded by
    /// [`crate::spec::Tape::MAX_SESSION_RECORDED_BYTES`] when recorded.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recorded_bytes: u64,
    /// Where the rebuild of the messages from the items stands.
    #[serde(skip)]
    speaker: Speaker,
}

/// A transcript as its JSON has it.
#[derive(Deserialize)]
struct TranscriptFields {
    messages: Vec<Message>,
    items: Vec<Event>,
    #[serde(default)]
    items_folded: u64,
    /// Named for HTTP alone before files were recorded too.
    #[serde(default, alias = "recorded_bytes")]
    recorded_bytes: u64,
}

impl From<TranscriptFields> for Transcript {
    fn from(fields: TranscriptFields) -> Self {
        let mut transcript =
            Transcript::resumed(fields.messages, fields.items, fields.items_folded);
        // What the snapshot counted includes its held items' (none in
        // a snapshot of an older version: then these are counted).
        transcript.recorded_bytes = transcript.recorded_bytes.max(fields.recorded_bytes);
        transcript
    }
}

impl Transcript {
    /// A transcript that goes on after `messages`, holding `items` of its
    /// log and `items_folded` more.
    pub fn resumed(messages: Vec<Message>, items: Vec<Event>, items_folded: u64) -> Self {
        let recorded_bytes = items.iter().map(recorded_bytes).sum();
        Transcript {
            speaker: Speaker::after(&messages),
            messages,
            items,
            items_folded,
            recorded_bytes,
        }
    }

    /// Appends `event` to the log, and the message it completes (if any)
    /// to the conversation.
    pub fn push_event(&mut self, event: Event) {
        if let Some(message) = self.speaker.speak(&event) {
            self.messages.push(message);
        }
        self.recorded_bytes = self.recorded_bytes.saturating_add(recorded_bytes(&event));
        self.items.push(event);
    }

    /// Appends a message a format-1 journal stored as itself.
    pub(crate) fn push_stored_message(&mut self, message: Message) {
        self.speaker.heard(&message);
        self.messages.push(message);
    }

    /// Takes the messages and items held, the rebuild of the messages going
    /// on from where it stands: for a fold that hands on what each record
    /// or page said (an export, an import) instead of holding it all.
    pub(crate) fn take_said(&mut self) -> (Vec<Message>, Vec<Event>) {
        (
            std::mem::take(&mut self.messages),
            std::mem::take(&mut self.items),
        )
    }

    /// The number the next item of the log gets (`item_<n>`).
    pub fn next_item(&self) -> usize {
        usize::try_from(self.items_folded)
            .unwrap_or(usize::MAX)
            .saturating_add(self.items.len())
            .saturating_add(1)
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Bytes of HTTP response bodies and files `event` recorded: a call's
/// output's.
fn recorded_bytes(event: &Event) -> u64 {
    match &event.item {
        Item::FunctionCallOutput { guest, .. } => {
            guest.tape.as_ref().map_or(0, |tape| tape.recorded_bytes())
        }
        _ => 0,
    }
}

/// Where a rebuild of the conversation stands: the model turn still
/// waiting for the calls it asked for, and the model's calls not answered
/// yet. Small: a turn's calls, and the ids of the calls still open.
///
/// A turn's item and its calls are recorded together (one commit), so at
/// a commit's end no turn is waiting, and a speaker can be made again
/// from the messages said so far ([`Speaker::after`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Speaker {
    /// The turn being rebuilt: its text, the calls seen, how many are to
    /// come.
    turn: Option<(Option<String>, Vec<ToolCall>, u32)>,
    /// The model's calls not answered yet, by id, in the order asked.
    unanswered: Vec<String>,
}

impl Speaker {
    /// A speaker that goes on after `messages`.
    pub(crate) fn after(messages: &[Message]) -> Self {
        let mut speaker = Self::default();
        for message in messages {
            speaker.heard(message);
        }
        speaker
    }

    /// Notes a message said: one this speaker made, or one a format-1
    /// journal stored as itself.
    pub(crate) fn heard(&mut self, message: &Message) {
        match message {
            Message::Assistant { tool_calls, .. } => self
                .unanswered
                .extend(tool_calls.iter().map(|call| call.id.clone())),
            Message::Tool { call_id, .. } => {
                if let Some(at) = self.unanswered.iter().position(|id| id == call_id) {
                    self.unanswered.remove(at);
                }
            }
            Message::System { .. } | Message::User { .. } => {}
        }
    }

    /// The message `event` completes, if any.
    pub(crate) fn speak(&mut self, event: &Event) -> Option<Message> {
        let message = match &event.item {
            Item::Message {
                role,
                content,
                calls,
                ..
            } => match role {
                Role::System => Some(Message::System {
                    content: content.clone().unwrap_or_default(),
                }),
                Role::User => Some(Message::User {
                    content: content.clone().unwrap_or_default(),
                }),
                Role::Assistant if *calls == 0 => Some(Message::Assistant {
                    content: content.clone(),
                    tool_calls: Vec::new(),
                }),
                Role::Assistant => {
                    self.turn = Some((content.clone(), Vec::new(), *calls));
                    None
                }
            },
            Item::FunctionCall { call, .. } => {
                let (_, asked, left) = self.turn.as_mut()?;
                asked.push(call.clone());
                *left -= 1;
                if *left > 0 {
                    return None;
                }
                let (content, tool_calls, _) = self.turn.take()?;
                Some(Message::Assistant {
                    content,
                    tool_calls,
                })
            }
            Item::FunctionCallOutput {
                call_id,
                name,
                status,
                output,
                guest,
                ..
            } if self.unanswered.contains(call_id) => Some(Message::Tool {
                call_id: call_id.clone(),
                name: name.clone(),
                content: output.clone(),
                is_error: *status != CallStatus::Completed,
                shown: guest.shown.clone(),
            }),
            _ => None,
        };
        if let Some(message) = &message {
            self.heard(message);
        }
        message
    }
}
