//! Task mail: how every host of a shared store sees and steers a task
//! whose call runs on one of them ([`TaskMail`]).
//!
//! Once a call becomes a task, the host that runs it keeps mail for it in
//! the store until it ends: it posts there the questions the call waits
//! on and its latest progress report, and reads there, as often as
//! clients are asked to poll (`[mcp.tasks] poll_ms`), the answers and the
//! cancellation other hosts leave for it. So `tasks/get` shows a task's questions, and
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

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{InputRequests, InputResponses};
use tokio::sync::watch;

use super::lock;
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
    /// Its call's latest progress report.
    pub(super) said: Arc<Mutex<Option<String>>>,
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
            status: lock(&keeping.said).clone(),
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
/// change and its latest progress report (at most once a poll); then
/// removes it.
async fn upkeep(keeping: Keeping) {
    let Keeping {
        store,
        key,
        input,
        cancel,
        said,
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
                    Err(e) => tracing::warn!(
                        task = %key.call_id,
                        error = %e,
                        "a task's mail holds answers that are not answers"
                    ),
                }
            }
            let next = TaskMail {
                waiting: waiting_text(input.as_ref()),
                answers: None,
                cancelled: now.cancelled,
                status: lock(&said).clone(),
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

/// What task `key`'s mail says of it: the questions it waits on that no
/// answer left for it names (none while it waits on none), and its
/// latest progress report as its host posted it; `None` without mail (no
/// host that keeps mail runs it).
pub(super) async fn elsewhere(
    store: &dyn SessionStore,
    key: &TaskKey,
) -> Result<Option<(InputRequests, Option<String>)>, StoreError> {
    let Some(mail) = store.task_mail(key.call()).await? else {
        return Ok(None);
    };
    Ok(Some((open_questions(&mail), mail.status)))
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

/// Why `responses` cannot be given, when one of their keys names no
/// question that `waits` (its key cut short: a client may send any): an
/// update gives all of its answers or none.
pub(super) fn stray_answer(
    responses: &InputResponses,
    waits: impl Fn(&str) -> bool,
) -> Option<String> {
    let key = responses.keys().find(|key| !waits(key))?;
    let key = crate::text::truncate(key, 128);
    Some(format!("no question {key:?} is waiting"))
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
        if let Some(why) = stray_answer(responses, |key| open.contains_key(key)) {
            return Err(why);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::SqliteStore;

    /// Questions a test sets, and the answers given to them.
    #[derive(Default)]
    struct Asked {
        waiting: Mutex<Option<InputRequests>>,
        given: Mutex<Vec<InputResponses>>,
        changed: tokio::sync::Notify,
    }

    impl Questions for Asked {
        fn waiting(&self) -> Option<InputRequests> {
            lock(&self.waiting).clone()
        }

        fn give(&self, responses: &InputResponses) {
            let mut waiting = lock(&self.waiting);
            let Some(open) = waiting.as_mut() else {
                return;
            };
            let taken: InputResponses = responses
                .iter()
                .filter(|(key, _)| open.remove(*key).is_some())
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect();
            if open.is_empty() {
                *waiting = None;
            }
            if !taken.is_empty() {
                lock(&self.given).push(taken);
            }
        }

        fn changed(&self) -> &tokio::sync::Notify {
            &self.changed
        }
    }

    /// The first of `read`'s readings (one every 5 ms, for at most a
    /// minute) that `done` takes; the last one past the minute.
    async fn until<T>(mut read: impl AsyncFnMut() -> T, done: impl Fn(&T) -> bool) -> T {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let now = read().await;
            if done(&now) || std::time::Instant::now() > deadline {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A task's host posts its questions and its latest progress report
    /// when it starts keeping the mail, and again as they change; an
    /// answer another host leaves is given once, to the question it
    /// names; a cancellation left there stops the call; the mail goes
    /// when the task ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tasks_host_posts_what_it_waits_on_and_takes_what_is_left_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn SessionStore> =
            Arc::new(SqliteStore::open(dir.path().join("mail.db")).unwrap());
        crate::session::leased_for_test(store.as_ref(), "s").await;
        let key = TaskKey {
            owner: None,
            session_id: "s".into(),
            call_id: "t".into(),
        };
        let question: InputRequests = serde_json::from_value(serde_json::json!({
            "person-1": {"method": "elicitation/create",
                         "params": {"message": "Name?", "requestedSchema": {"type": "object", "properties": {}}}}
        }))
        .unwrap();
        let asked = Arc::new(Asked::default());
        *lock(&asked.waiting) = Some(question.clone());
        let said = Arc::new(Mutex::new(Some("1 of 3".to_owned())));
        let cancel = CancelToken::new();
        let (finish, finished) = watch::channel(false);
        keep(Keeping {
            store: Arc::clone(&store),
            key: key.clone(),
            input: Arc::clone(&asked) as Arc<dyn Questions>,
            cancel: cancel.clone(),
            said: Arc::clone(&said),
            poll: Duration::from_millis(10),
            finished,
        })
        .await;
        // Posted before `keep` returns.
        let seen = elsewhere(store.as_ref(), &key).await.unwrap();
        assert_eq!(seen, Some((question.clone(), Some("1 of 3".to_owned()))));

        // Progress goes out at the next poll.
        *lock(&said) = Some("2 of 3".to_owned());
        let seen = until(
            async || elsewhere(store.as_ref(), &key).await.unwrap(),
            |seen| {
                seen.as_ref()
                    .is_some_and(|(_, said)| said.as_deref() == Some("2 of 3"))
            },
        )
        .await;
        assert_eq!(seen, Some((question.clone(), Some("2 of 3".to_owned()))));

        // Left answers: one naming no question is refused, nothing left.
        let wrong: InputResponses = [("model-1".to_owned(), serde_json::json!({}))].into();
        let refused = leave_answers(store.as_ref(), &key, &wrong).await;
        assert!(
            matches!(&refused, Err(Unchanged::Refused(why)) if why.contains("model-1")),
            "{refused:?}"
        );
        let answer: InputResponses = [(
            "person-1".to_owned(),
            serde_json::json!({"action": "decline"}),
        )]
        .into();
        assert!(leave_answers(store.as_ref(), &key, &answer).await.unwrap());
        // Shown no more, whether its host has taken it yet or not (it
        // gives answers before it posts what still waits).
        let (open, _) = elsewhere(store.as_ref(), &key)
            .await
            .unwrap()
            .unwrap_or_default();
        assert!(open.is_empty(), "{open:?}");
        let given = until(
            async || lock(&asked.given).clone(),
            |given| !given.is_empty(),
        )
        .await;
        assert_eq!(given, std::slice::from_ref(&answer));
        let seen = until(
            async || elsewhere(store.as_ref(), &key).await.unwrap(),
            |seen| seen.as_ref().is_some_and(|(open, _)| open.is_empty()),
        )
        .await;
        assert_eq!(
            seen,
            Some((InputRequests::new(), Some("2 of 3".to_owned())))
        );
        assert!(
            leave_answers(store.as_ref(), &key, &answer).await.is_err(),
            "person-1 waits no more"
        );

        assert!(leave_cancel(store.as_ref(), &key).await.unwrap());
        until(async || cancel.is_cancelled(), |stopped| *stopped).await;
        assert!(cancel.is_cancelled());
        assert_eq!(lock(&asked.given).len(), 1, "each answer given once");

        finish.send_replace(true);
        let gone = until(
            async || store.task_mail(key.call()).await.unwrap(),
            Option::is_none,
        )
        .await;
        assert_eq!(gone, None);
        assert!(!leave_cancel(store.as_ref(), &key).await.unwrap());
    }
}
