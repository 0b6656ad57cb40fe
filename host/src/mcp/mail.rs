//! Task mail: how every host of a shared store sees and steers a task
//! whose call runs on one of them ([`TaskMail`]).
//!
//! Once a call becomes a task, the host that runs it keeps mail for it in
//! the store until it ends: it posts there the questions the call waits
//! on, and reads there, as often as clients are asked to poll
//! (`[mcp.tasks] poll_ms`), the answers and the cancellation other hosts
//! leave for it. So `tasks/get` shows a task's questions, and
//! `tasks/update` and `tasks/cancel` reach it, on any host of the store,
//! not only on the one that runs it. The mail goes when the task ends (or
//! with its session); a host that died leaves its tasks' mail, which goes
//! when another host takes the session's lease (and finds the tasks
//! interrupted).
//!
//! Every change is a swap of what was read for what is made of it (the
//! store's compare-and-set), made again when another host changed the mail
//! meanwhile, so no host's change is lost. Answers are kept until the
//! task's host takes them; it gives each to the question of its key while
//! that question waits (keys are never reused in one task), so an answer
//! taken twice is given once.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{InputRequests, InputResponses};
use tokio::sync::watch;

use crate::journal::StoreError;
use crate::sandbox::CancelToken;
use crate::session::{CallKey, SessionStore, TaskMail};

/// How many times a change is tried while other hosts change the same
/// mail first.
const MAX_SWAPS: usize = 16;

/// A task's call, as the store keys its mail.
#[derive(Debug, Clone)]
pub(super) struct TaskKey {
    pub(super) owner: Option<String>,
    pub(super) session_id: String,
    pub(super) call_id: String,
}

impl TaskKey {
    fn call(&self) -> CallKey<'_> {
        CallKey {
            owner: self.owner.as_deref(),
            session_id: &self.session_id,
            call_id: &self.call_id,
        }
    }
}

/// Why a change of mail was not made.
#[derive(Debug)]
pub(super) enum Unchanged {
    /// The store failed.
    Store(StoreError),
    /// What the change would make of the mail is refused, saying why.
    Refused(String),
    /// Other hosts changed the mail first, [`MAX_SWAPS`] times.
    Busy,
}

impl From<StoreError> for Unchanged {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// Changes task `key`'s mail by `change`, which is given the mail as it
/// is (`None`: there is none) and says what it becomes (`None`: none) and
/// what to return; no swap when it stays as it was. Made again on the
/// mail as it is then, when another host changed it first.
async fn change<T>(
    store: &dyn SessionStore,
    key: &TaskKey,
    mut change: impl FnMut(Option<&TaskMail>) -> Result<(Option<TaskMail>, T), String>,
) -> Result<T, Unchanged> {
    for _ in 0..MAX_SWAPS {
        let now = store.task_mail(key.call()).await?;
        let (next, made) = change(now.as_ref()).map_err(Unchanged::Refused)?;
        if next == now
            || store
                .swap_task_mail(key.call(), now.as_ref(), next.as_ref())
                .await?
        {
            return Ok(made);
        }
    }
    Err(Unchanged::Busy)
}

/// The questions a task's call waits on, as its host keeps them.
pub(super) trait Questions: Send + Sync + 'static {
    /// The questions waiting, if any.
    fn waiting(&self) -> Option<InputRequests>;
    /// Hands each of `responses` whose key names a waiting question to
    /// it, and drops the others.
    fn give(&self, responses: &InputResponses);
    /// Told when the questions waiting change.
    fn changed(&self) -> &tokio::sync::Notify;
}

/// What a task's host needs to keep its mail.
pub(super) struct Keeping {
    pub(super) store: Arc<dyn SessionStore>,
    pub(super) key: TaskKey,
    /// Its call's questions.
    pub(super) input: Arc<dyn Questions>,
    /// Stops its call.
    pub(super) cancel: CancelToken,
    /// How often it reads its mail.
    pub(super) poll: Duration,
    /// Turns `true` once the task has ended.
    pub(super) finished: watch::Receiver<bool>,
}

/// Posts the mail of a task that runs here (with the questions it waits
/// on now), and keeps it up in a task of its own until the task ends,
/// then removes it. Returns once the mail is posted (or could not be,
/// logged: the task is then seen whole only here, as by a store that
/// keeps no mail).
pub(super) async fn keep(keeping: Keeping) {
    let posted = change(keeping.store.as_ref(), &keeping.key, |_| {
        let mail = TaskMail {
            waiting: waiting_text(keeping.input.as_ref()),
            ..TaskMail::default()
        };
        Ok((Some(mail), ()))
    })
    .await;
    if let Err(e) = posted {
        tracing::warn!(task = %keeping.key.call_id, error = ?e, "cannot post a task's mail");
        return;
    }
    tokio::spawn(upkeep(keeping));
}

/// Keeps a task's mail until the task ends: gives the answers left there
/// to its questions, stops it when asked to, posts its questions as they
/// change; then removes it.
async fn upkeep(keeping: Keeping) {
    let Keeping {
        store,
        key,
        input,
        cancel,
        poll,
        mut finished,
    } = keeping;
    loop {
        let read = change(store.as_ref(), &key, |now| {
            let Some(now) = now else {
                // Removed with its session: nothing more to keep.
                return Err("the mail is gone".into());
            };
            if now.cancelled {
                cancel.cancel();
            }
            if let Some(answers) = &now.answers {
                match serde_json::from_str::<InputResponses>(answers) {
                    Ok(answers) => input.give(&answers),
                    Err(e) => tracing::warn!(task = %key.call_id, error = %e, "a task's mail holds answers that are not answers"),
                }
            }
            let next = TaskMail {
                waiting: waiting_text(input.as_ref()),
                answers: None,
                cancelled: now.cancelled,
            };
            Ok((Some(next), ()))
        })
        .await;
        match read {
            Ok(()) => {}
            Err(Unchanged::Refused(_)) => return,
            Err(e) => tracing::warn!(task = %key.call_id, error = ?e, "cannot read a task's mail"),
        }
        tokio::select! {
            _ = finished.wait_for(|ended| *ended) => break,
            () = input.changed().notified() => {}
            () = tokio::time::sleep(poll) => {}
        }
    }
    if let Err(e) = change(store.as_ref(), &key, |_| Ok((None, ()))).await {
        tracing::warn!(task = %key.call_id, error = ?e, "cannot remove an ended task's mail");
    }
}

/// The questions `input` waits on, as mail holds them; `None` for none.
fn waiting_text(input: &dyn Questions) -> Option<String> {
    let waiting = input.waiting()?;
    serde_json::to_string(&waiting).ok()
}

/// What task `key`'s mail says: `None` without mail (no host that keeps
/// mail runs it); else the questions it waits on that no answer left for
/// it names (none while it waits on none).
pub(super) async fn waiting_elsewhere(
    store: &dyn SessionStore,
    key: &TaskKey,
) -> Result<Option<InputRequests>, StoreError> {
    let Some(mail) = store.task_mail(key.call()).await? else {
        return Ok(None);
    };
    Ok(Some(open_questions(&mail)))
}

/// The questions `mail` says wait and no answer in it names yet.
fn open_questions(mail: &TaskMail) -> InputRequests {
    let mut waiting: InputRequests = mail
        .waiting
        .as_deref()
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    let answered: InputResponses = mail
        .answers
        .as_deref()
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    waiting.retain(|key, _| !answered.contains_key(key));
    waiting
}

/// Leaves `responses` in task `key`'s mail for its host: all of them, or
/// none when a key names no question the mail says waits unanswered
/// (refused, saying which). `false` when the task has no mail.
pub(super) async fn leave_answers(
    store: &dyn SessionStore,
    key: &TaskKey,
    responses: &InputResponses,
) -> Result<bool, Unchanged> {
    change(store, key, |now| {
        let Some(now) = now else {
            return Ok((None, false));
        };
        let open = open_questions(now);
        if let Some(key) = responses.keys().find(|k| !open.contains_key(*k)) {
            return Err(format!("no question {key:?} is waiting"));
        }
        let mut answers: InputResponses = now
            .answers
            .as_deref()
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_default();
        answers.extend(responses.iter().map(|(k, v)| (k.clone(), v.clone())));
        let text = serde_json::to_string(&answers).map_err(|e| e.to_string())?;
        let next = TaskMail {
            answers: Some(text),
            ..now.clone()
        };
        Ok((Some(next), true))
    })
    .await
}

/// Asks task `key`'s host, through its mail, to stop it; `false` when the
/// task has no mail.
pub(super) async fn leave_cancel(
    store: &dyn SessionStore,
    key: &TaskKey,
) -> Result<bool, Unchanged> {
    change(store, key, |now| {
        Ok(match now {
            None => (None, false),
            Some(now) => (
                Some(TaskMail {
                    cancelled: true,
                    ..now.clone()
                }),
                true,
            ),
        })
    })
    .await
}
