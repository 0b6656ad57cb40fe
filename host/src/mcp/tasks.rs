//! Calls as tasks: the MCP tasks extension (`io.modelcontextprotocol/tasks`,
//! SEP-2663) for calls that run long.
//!
//! A client that declares the extension in a `tools/call` request's
//! capabilities may get a task instead of the result: when the call is
//! still running [`TaskSettings::after`] into its request, or as soon as
//! its tool asks its person or the model a question. (A tool that needs
//! approval first never becomes a task; neither does a tool that may ask,
//! for a client that declared tasks only at `initialize`: its questions
//! go the way they go without tasks.) The call runs as a keyed call
//! ([`CALL_META_KEY`](super::CALL_META_KEY)) whose key is the task's: its
//! intent is committed before the handle is given, so the task is in the
//! session's journal from its first moment.
//!
//! A task's id is `SESSION/CALL`: the Airlock session it runs on and the
//! call's id in that session's journal. `tasks/get` reads the call's
//! records (one indexed read, no lease) among the caller's own sessions,
//! so a task id of another user's session is unknown to the caller, and
//! answers on any host of a shared store and after a restart:
//!
//! - its outcome committed: `completed` with the result a call without a
//!   task would have had (a failed call's is an error result), or
//!   `cancelled`; a call interrupted by the death of the host that ran it
//!   is `failed` (none of its ops were applied);
//! - running in this process: `working`, with its latest progress report
//!   as the status message, or `input_required` while its questions wait
//!   for the client (`inputRequests`: `person-N` an elicitation, `model-N`
//!   a request for a completion, keys never reused in one task);
//! - running nowhere this process knows: the session is leased, as
//!   resuming it would (a dead holder's calls are answered
//!   "interrupted"); when another host holds it, `working`, or
//!   `input_required` with the questions its mail says wait
//!   ([`super::mail`]).
//!
//! `tasks/update` answers the questions a task waits on, by key (a key
//! that names no waiting question refuses the whole update); the answers
//! go to the tool as a mid-call answer would, and are journaled with the
//! call. `tasks/cancel` stops a task as the client's cancellation of a
//! request would, a waiting question answered "cancel". Both reach a task
//! running on another host of the store through its mail. A task is known
//! for [`TaskSettings::ttl`] after it started.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolResponse, CallToolResult, CreateTaskResult, DetailedTask, InputRequest, InputRequests,
    InputResponses, JsonObject, Task, TaskPayload, TaskStatus,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use tokio::sync::oneshot;

use super::auth::Caller;
use super::mail::{self, Keeping, Questions, TaskKey, Unchanged};
use super::{
    McpServer, NO_ELICITATION, NO_SAMPLING, ToolSet, approval_question, call_key, caller_of,
    error_result, lock, rounds, tool_result,
};
use crate::agent::{CallStart, KeyedCall};
use crate::journal::{CallStatus, StoreError, now_ms};
use crate::policy::TaskSettings;
use crate::sandbox::{Asker, CallEvent, CancelToken, Sampler};
use crate::session::{CallKey, SessionError, SessionStore};
use crate::spec::{Answer, Asked, SampleReply, SampleRequest};
use crate::tools::ToolCall;

/// Whether a request's own capabilities (`_meta`, the 2026-07-28
/// revision's) declare the tasks extension: one lookup in the request's
/// JSON, nothing decoded (every call of such a client asks).
pub(super) fn declares_tasks(meta: &rmcp::model::RequestMetaObject) -> bool {
    meta.get("io.modelcontextprotocol/clientCapabilities")
        .and_then(|caps| caps.get("extensions"))
        .and_then(|extensions| extensions.get(rmcp::model::TASKS_EXTENSION_ID))
        .is_some()
}

impl McpServer {
    /// Runs a call of tool `name` with `arguments` that may become a task:
    /// its result when it ends within [`TaskSettings::after`] (or before
    /// its intent is committed) without asking a question, else the
    /// task's handle, given once the call is in the journal; `asks` says
    /// whom the tool may ask. The call runs to its end either way; only
    /// `tasks/cancel`, or the client's cancellation of the request before
    /// the handle, stops it.
    pub(super) async fn call_as_task(
        &self,
        name: &str,
        arguments: String,
        asks: Asks,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let caller = caller_of(context);
        let prepared = async {
            let key = call_key(&context.meta)?;
            let permit = self.permit(caller)?;
            let session = self.session_for(&context.meta, caller).await?;
            Ok::<_, String>((key, permit, session))
        };
        let (key, permit, session) = match prepared.await {
            Ok(prepared) => prepared,
            Err(why) => return error_result(why).into(),
        };
        let Some(call_id) = key.or_else(fresh_call_id) else {
            session.done().await;
            return error_result("this server cannot name a task (no random source)".into()).into();
        };
        let id = task_id(&session.held().id, &call_id);
        let tools = Arc::clone(&self.tools);
        let (cancel, input, said) = tools.tasks.start(&id, session.held().user.as_deref(), asks);
        let approval = asks
            .approval
            .map(|can| approval(&tools, name, &arguments, task_asker(&input, can, &cancel)));
        let (begun, in_journal) = oneshot::channel();
        let (done, mut ended) = oneshot::channel();
        let (finish, finished) = tokio::sync::watch::channel(false);
        let mail_key = TaskKey {
            owner: session.held().user.clone(),
            session_id: session.held().id.clone(),
            call_id: call_id.clone(),
        };
        let call = ToolCall {
            id: call_id,
            name: name.to_owned(),
            arguments,
            retry: 0,
        };
        let caller = caller.cloned();
        let work = {
            let (tools, cancel, id) = (Arc::clone(&tools), cancel.clone(), id.clone());
            async move {
                let _permit = permit;
                let result = McpServer::call(
                    &tools,
                    &session,
                    call,
                    true,
                    cancel,
                    caller.as_ref(),
                    CallStart {
                        begun: Some(begun),
                        approval,
                    },
                )
                .await;
                session.done().await;
                tools.tasks.ended(&id);
                finish.send_replace(true);
                // The request may have gone (the client has the handle).
                let _ = done.send(result);
            }
        };
        tokio::spawn(work);
        let answer = |result: Result<CallToolResult, oneshot::error::RecvError>| {
            result
                .unwrap_or_else(|_| error_result("the call ended without an answer".into()))
                .into()
        };
        let after = tools.tasks.settings().after;
        // A question makes the call a task at once: only its client can
        // answer, through `tasks/update`.
        let due = async {
            if !after.is_zero() {
                tokio::select! {
                    () = tokio::time::sleep(after) => {}
                    () = input.asked.notified() => {}
                }
            }
            in_journal.await
        };
        let mut due = std::pin::pin!(due);
        // Told `due` only once the call's intent is committed; a call that
        // never was ends soon, with its result. With no wait, every such
        // call is a task, however soon it ends.
        let settled = async {
            if after.is_zero() {
                tokio::select! {
                    biased;
                    Ok(()) = &mut due => None,
                    result = &mut ended => Some(result),
                }
            } else {
                tokio::select! {
                    biased;
                    result = &mut ended => Some(result),
                    Ok(()) = &mut due => None,
                }
            }
        };
        let cancelled = tokio::select! {
            settled = settled => match settled {
                Some(result) => return answer(result),
                None => false,
            },
            () = context.ct.cancelled() => true,
        };
        if cancelled {
            cancel.cancel();
            return answer(ended.await);
        }
        // Before the handle: whoever has it finds the task's mail on every
        // host of the store.
        if let Some(store) = self.store() {
            mail::keep(Keeping {
                store,
                key: mail_key,
                input: Arc::clone(&input) as Arc<dyn Questions>,
                cancel: cancel.clone(),
                said,
                poll: tools.tasks.settings().poll,
                finished,
            })
            .await;
        }
        let now = now_ms();
        let task = tools
            .tasks
            .detailed(&id, now, now, None, TaskPayload::Working);
        CallToolResponse::Task(CreateTaskResult::new(task.task))
    }

    /// Task `id` of `caller` as `tasks/get` answers it; an unknown task
    /// (never made, another user's, past its time to live) is an invalid
    /// parameter.
    pub(super) async fn task(
        &self,
        id: &str,
        caller: Option<&Caller>,
    ) -> Result<DetailedTask, ErrorData> {
        let unknown = || {
            let id = crate::text::truncate(id, 256);
            ErrorData::invalid_params(format!("unknown task {id:?}"), None)
        };
        let (session_id, call_id) = parse_task_id(id).ok_or_else(unknown)?;
        let user = self.user(caller);
        let store = self.store().ok_or_else(unknown)?;
        let tasks = &self.tools.tasks;
        // At most twice: a call open in the journal, running nowhere here,
        // is looked at again once its session has been leased.
        let mut leased = false;
        loop {
            let key = CallKey {
                owner: user.as_deref(),
                session_id,
                call_id,
            };
            let records = store
                .call_records(key)
                .await
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
            let events: Vec<_> = records
                .into_iter()
                .filter_map(|r| r.entry.into_event())
                .collect();
            let now = now_ms();
            let asked_ms = match KeyedCall::of(&events, call_id) {
                KeyedCall::Unknown => return Err(unknown()),
                KeyedCall::Open { asked_ms } | KeyedCall::Ended { asked_ms, .. }
                    if tasks.expired(asked_ms, now) =>
                {
                    return Err(unknown());
                }
                KeyedCall::Ended {
                    asked_ms,
                    ended_ms,
                    status,
                    outcome,
                    output,
                } => {
                    let payload = match (status, outcome) {
                        (CallStatus::Completed, Some(outcome)) => completed(&tool_result(*outcome)),
                        (CallStatus::Cancelled, _) => TaskPayload::Cancelled,
                        (CallStatus::Interrupted, _) => failed(&output),
                        _ => completed(&error_result(output)),
                    };
                    return Ok(tasks.detailed(id, asked_ms, ended_ms, None, payload));
                }
                KeyedCall::Open { asked_ms } => asked_ms,
            };
            if let Here::Running { said, waiting } = tasks.here(id, user.as_deref()) {
                let payload = match waiting {
                    Some(input_requests) => TaskPayload::InputRequired { input_requests },
                    None => TaskPayload::Working,
                };
                return Ok(tasks.detailed(id, asked_ms, now, said, payload));
            }
            let mail_key = TaskKey {
                owner: user.clone(),
                session_id: session_id.to_owned(),
                call_id: call_id.to_owned(),
            };
            let another_host = async || {
                let mail = mail::elsewhere(store.as_ref(), &mail_key)
                    .await
                    .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                let (waiting, said) = mail.unwrap_or_default();
                let said = said.or_else(|| Some("running on another host".to_owned()));
                let payload = if waiting.is_empty() {
                    TaskPayload::Working
                } else {
                    TaskPayload::InputRequired {
                        input_requests: waiting,
                    }
                };
                Ok(tasks.detailed(id, asked_ms, now, said, payload))
            };
            // Its host may be alive (another host of a shared store) or
            // dead: leasing the session tells, as resuming it would, and
            // answers a dead host's calls "interrupted".
            let Some(opener) = self.opener.as_ref().filter(|_| !leased) else {
                return another_host().await;
            };
            let host = self.tools.current();
            match opener
                .open(Some(session_id.to_owned()), user.as_deref(), &host)
                .await
            {
                Ok(mut session) => {
                    if let Err(e) = session.release().await {
                        tracing::warn!(error = %e, "cannot release a session");
                    }
                    leased = true;
                }
                Err(SessionError::Store(StoreError::InUse { .. })) => return another_host().await,
                Err(e) => return Err(ErrorData::internal_error(e.to_string(), None)),
            }
        }
    }

    /// Stops task `id` of `caller`: one that has ended, or that runs on
    /// another host, cannot be (an invalid parameter, saying which).
    pub(super) async fn cancel_task(
        &self,
        id: &str,
        caller: Option<&Caller>,
    ) -> Result<(), ErrorData> {
        let task = self.task(id, caller).await?;
        if task.status().is_terminal() {
            return Err(ErrorData::invalid_params(
                format!("task {id:?} has already ended ({:?})", task.status()),
                None,
            ));
        }
        let user = self.user(caller);
        if self.tools.tasks.cancel(id, user.as_deref()) {
            return Ok(());
        }
        let left = match (self.store(), mail_key(id, user)) {
            (Some(store), Some(key)) => mail::leave_cancel(store.as_ref(), &key)
                .await
                .map_err(|e| unchanged(id, e))?,
            _ => false,
        };
        if left {
            Ok(())
        } else {
            Err(ErrorData::invalid_params(
                format!(
                    "task {id:?} runs on another host that does not read task mail; cancel it there"
                ),
                None,
            ))
        }
    }

    /// Answers the questions task `id` of `caller` waits on: a task that
    /// waits on none, or a key that names no waiting question, is an
    /// invalid parameter (nothing is answered then). A task waiting here
    /// is answered without reading the journal; any other is looked up
    /// as `tasks/get` does, for the error to say what it is.
    pub(super) async fn update_task(
        &self,
        id: &str,
        responses: &InputResponses,
        caller: Option<&Caller>,
    ) -> Result<(), ErrorData> {
        let refused = |why: String| ErrorData::invalid_params(why, None);
        let user = self.user(caller);
        if let Some(answered) = self.tools.tasks.answer(id, user.as_deref(), responses) {
            return answered.map_err(|why| refused(format!("task {id:?}: {why}")));
        }
        let task = self.task(id, caller).await?;
        // Waiting on another host: the answers are left in its mail.
        if let (TaskPayload::InputRequired { .. }, Some(store), Some(key)) =
            (&task.payload, self.store(), mail_key(id, user))
            && mail::leave_answers(store.as_ref(), &key, responses)
                .await
                .map_err(|e| unchanged(id, e))?
        {
            return Ok(());
        }
        Err(refused(format!("task {id:?} asks for no input")))
    }

    /// The store the caller's tasks are in: the opener's, or the server's
    /// own session's.
    fn store(&self) -> Option<Arc<dyn SessionStore>> {
        match (&self.opener, self.session.get()) {
            (Some(opener), _) => Some(Arc::clone(&opener.store)),
            (None, Some(held)) => Some(held.store.clone()),
            (None, None) => None,
        }
    }
}

/// The tasks running in this process, and the settings every task of it
/// follows.
#[derive(Debug, Default)]
pub(super) struct Tasks {
    settings: TaskSettings,
    live: Mutex<HashMap<String, Live>>,
}

/// A task running in this process.
#[derive(Debug)]
struct Live {
    /// Whose it is (the user of its session).
    user: Option<String>,
    /// Stops it.
    cancel: CancelToken,
    /// Its latest progress report, as a status message.
    said: Arc<Mutex<Option<String>>>,
    /// Its call's questions waiting for the client.
    input: Arc<Input>,
}

/// Whom a task's call may ask, as its tool needs and its client declared:
/// `None`, the tool does not ask; `Some(false)`, the client cannot answer
/// (the tool is told so).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Asks {
    /// Its person, whether the call may run (`approval = "ask"`), before
    /// the tool runs.
    pub(super) approval: Option<bool>,
    /// Its person (elicitation).
    pub(super) person: Option<bool>,
    /// The client's model (sampling).
    pub(super) model: Option<bool>,
}

/// A task's questions waiting for its client: `tasks/get` shows them as
/// `inputRequests`, `tasks/update` answers them.
#[derive(Debug, Default)]
pub(super) struct Input {
    open: Mutex<Open>,
    /// Told when a question is asked (the call becomes a task then).
    asked: tokio::sync::Notify,
    /// Told when the questions waiting change (one is asked, answered,
    /// or stops waiting): the task's mail posts them.
    changed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Open {
    /// Questions of each kind asked so far: the next key's number.
    people: u32,
    models: u32,
    waiting: BTreeMap<String, (InputRequest, Reply)>,
}

/// A question filed in an [`Input`]: no longer waiting once dropped.
struct Filed<'a> {
    input: &'a Input,
    key: String,
}

impl Drop for Filed<'_> {
    fn drop(&mut self) {
        let removed = lock(&self.input.open).waiting.remove(&self.key);
        if removed.is_some() {
            self.input.changed.notify_one();
        }
    }
}

/// Where a waiting question's answer goes.
#[derive(Debug)]
enum Reply {
    Person(oneshot::Sender<Answer>),
    Model(oneshot::Sender<SampleReply>),
}

impl Input {
    /// Files `request` under the next key of its kind and waits for its
    /// answer; `None` when the call is cancelled first. The question stops
    /// waiting when this ends, however it ends (answered, cancelled, or
    /// dropped with the call at its time limit).
    async fn wait<T>(
        &self,
        request: InputRequest,
        reply: fn(oneshot::Sender<T>) -> Reply,
        cancel: &CancelToken,
    ) -> Option<T> {
        let (sender, answered) = oneshot::channel();
        let key = {
            let mut open = lock(&self.open);
            let key = match &request {
                InputRequest::Elicitation(_) => {
                    open.people += 1;
                    format!("person-{}", open.people)
                }
                _ => {
                    open.models += 1;
                    format!("model-{}", open.models)
                }
            };
            open.waiting.insert(key.clone(), (request, reply(sender)));
            key
        };
        let _filed = Filed { input: self, key };
        self.asked.notify_one();
        self.changed.notify_one();
        tokio::select! {
            answer = answered => answer.ok(),
            () = cancel.cancelled() => None,
        }
    }

    /// The questions waiting, if any.
    fn waiting(&self) -> Option<InputRequests> {
        let open = lock(&self.open);
        (!open.waiting.is_empty()).then(|| {
            open.waiting
                .iter()
                .map(|(key, (request, _))| (key.clone(), request.clone()))
                .collect()
        })
    }

    /// Hands each of `responses` to the question of its key: all of them,
    /// or none when a key names no waiting question; `None` when no
    /// question waits.
    fn answer(&self, responses: &InputResponses) -> Option<Result<(), String>> {
        let mut open = lock(&self.open);
        if open.waiting.is_empty() {
            return None;
        }
        if let Some(why) = mail::stray_answer(responses, |key| open.waiting.contains_key(key)) {
            return Some(Err(why));
        }
        give(&mut open, responses);
        drop(open);
        self.changed.notify_one();
        Some(Ok(()))
    }
}

impl Questions for Input {
    fn waiting(&self) -> Option<InputRequests> {
        Input::waiting(self)
    }

    /// Answers another host left may have been given before (keys are
    /// never reused in one task): those are dropped.
    fn give(&self, responses: &InputResponses) {
        if give(&mut lock(&self.open), responses) {
            self.changed.notify_one();
        }
    }

    fn changed(&self) -> &tokio::sync::Notify {
        &self.changed
    }
}

/// Hands each of `responses` to the question of its key that waits in
/// `open`, if one does; whether any did.
fn give(open: &mut Open, responses: &InputResponses) -> bool {
    let mut gave = false;
    for (key, response) in responses {
        let Some((_, reply)) = open.waiting.remove(key) else {
            continue;
        };
        gave = true;
        // A call that has stopped meanwhile takes no answer.
        let _ = match reply {
            Reply::Person(sender) => sender.send(rounds::answer(response)).is_ok(),
            Reply::Model(sender) => sender.send(rounds::reply(response)).is_ok(),
        };
    }
    gave
}

/// The asker of a task's call: its questions wait in `input` (or are
/// answered unavailable when the client cannot ask its user).
fn task_asker(input: &Arc<Input>, can: bool, cancel: &CancelToken) -> Asker {
    let (input, cancel) = (Arc::clone(input), cancel.clone());
    Arc::new(move |asked: Asked| {
        let (input, cancel) = (Arc::clone(&input), cancel.clone());
        Box::pin(async move {
            if !can {
                return Answer::Unavailable {
                    why: NO_ELICITATION.into(),
                };
            }
            let request = rounds::person_request(asked);
            input
                .wait(request, Reply::Person, &cancel)
                .await
                .unwrap_or(Answer::Cancel)
        })
    })
}

/// Whether a task's call of tool `name` with `arguments` may run, asked
/// through `asker` as the task's first question (its person's accept
/// approves); unanswered within the tool's time limit, it may not.
fn approval(
    tools: &ToolSet,
    name: &str,
    arguments: &str,
    asker: Asker,
) -> futures::future::BoxFuture<'static, bool> {
    let limit = tools
        .current()
        .component_for(name)
        .map_or(crate::policy::limits::MAX_TIMEOUT, |c| c.limits().timeout);
    let question = Asked {
        message: approval_question(name, arguments),
        schema: serde_json::json!({"type": "object", "properties": {}}),
        answer: Answer::Cancel,
    };
    Box::pin(async move {
        let answer = tokio::time::timeout(limit, asker(question)).await;
        matches!(answer, Ok(Answer::Accept { .. }))
    })
}

/// The sampler of a task's call, as [`task_asker`] for the model.
fn task_sampler(input: &Arc<Input>, can: bool, cancel: &CancelToken) -> Sampler {
    let (input, cancel) = (Arc::clone(input), cancel.clone());
    Arc::new(move |request: SampleRequest| {
        let (input, cancel) = (Arc::clone(&input), cancel.clone());
        Box::pin(async move {
            if !can {
                return SampleReply::Refused {
                    why: NO_SAMPLING.into(),
                };
            }
            let request = rounds::model_request(request);
            input
                .wait(request, Reply::Model, &cancel)
                .await
                .unwrap_or_else(|| SampleReply::Refused {
                    why: "the task was cancelled".into(),
                })
        })
    })
}

/// What this process knows of a task beside its journal.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Here {
    /// It runs here: its latest progress report, and the questions it
    /// waits on, if any.
    Running {
        said: Option<String>,
        waiting: Option<InputRequests>,
    },
    /// It does not run here.
    Not,
}

impl Tasks {
    /// Tasks that follow `settings`.
    pub(super) fn new(settings: TaskSettings) -> Self {
        Self {
            settings,
            live: Mutex::new(HashMap::new()),
        }
    }

    /// The settings every task follows.
    pub(super) fn settings(&self) -> TaskSettings {
        self.settings
    }

    /// Files task `id` of `user` as running, and returns the token that
    /// runs (and stops) its call, where its questions wait, and its latest
    /// progress report: the token keeps the call's progress reports as the
    /// task's status message, and files the questions `asks` allows.
    pub(super) fn start(
        &self,
        id: &str,
        user: Option<&str>,
        asks: Asks,
    ) -> (CancelToken, Arc<Input>, Arc<Mutex<Option<String>>>) {
        let said = Arc::new(Mutex::new(None));
        let told = Arc::clone(&said);
        let input = Arc::new(Input::default());
        let stops = CancelToken::new();
        let asker = asks.person.map(|can| task_asker(&input, can, &stops));
        let sampler = asks.model.map(|can| task_sampler(&input, can, &stops));
        let observer = move |event: CallEvent<'_>| {
            if let CallEvent::Progress(report) = event {
                *lock(&told) = Some(report.to_string());
            }
        };
        let cancel = stops.watched_with(Some(Box::new(observer)), asker, sampler);
        let live = Live {
            user: user.map(str::to_owned),
            cancel: cancel.clone(),
            said: Arc::clone(&said),
            input: Arc::clone(&input),
        };
        lock(&self.live).insert(id.to_owned(), live);
        (cancel, input, said)
    }

    /// Task `id` has ended (its outcome is committed, or could not be).
    pub(super) fn ended(&self, id: &str) {
        lock(&self.live).remove(id);
    }

    /// What this process knows of task `id` of `user`.
    pub(super) fn here(&self, id: &str, user: Option<&str>) -> Here {
        self.with_live(id, user, |live| Here::Running {
            said: lock(&live.said).clone(),
            waiting: live.input.waiting(),
        })
        .unwrap_or(Here::Not)
    }

    /// Answers the questions task `id` of `user` waits on (see
    /// [`Input::answer`]); `None` when it waits on none here.
    pub(super) fn answer(
        &self,
        id: &str,
        user: Option<&str>,
        responses: &InputResponses,
    ) -> Option<Result<(), String>> {
        self.with_live(id, user, |live| Arc::clone(&live.input))?
            .answer(responses)
    }

    /// Stops task `id` of `user` if it runs here; whether it does.
    pub(super) fn cancel(&self, id: &str, user: Option<&str>) -> bool {
        self.with_live(id, user, |live| live.cancel.cancel())
            .is_some()
    }

    /// What `f` makes of task `id` of `user`, when it runs here (another
    /// user's is not there).
    fn with_live<R>(&self, id: &str, user: Option<&str>, f: impl FnOnce(&Live) -> R) -> Option<R> {
        lock(&self.live)
            .get(id)
            .filter(|live| live.user.as_deref() == user)
            .map(f)
    }

    /// Task `id` as a client sees it: started at `started_ms`, last
    /// changed at `updated_ms`, now `payload`.
    pub(super) fn detailed(
        &self,
        id: &str,
        started_ms: u64,
        updated_ms: u64,
        message: Option<String>,
        payload: TaskPayload,
    ) -> DetailedTask {
        let mut task = Task::new(
            id,
            TaskStatus::Working,
            iso(started_ms),
            iso(updated_ms.max(started_ms)),
        )
        .with_ttl_ms(millis(self.settings.ttl))
        .with_poll_interval_ms(millis(self.settings.poll));
        task.status_message = message;
        DetailedTask::new(task, payload)
    }

    /// Whether a task started at `started_ms` is past its time to live at
    /// `now_ms` (then it is unknown).
    pub(super) fn expired(&self, started_ms: u64, now_ms: u64) -> bool {
        now_ms.saturating_sub(started_ms) > millis(self.settings.ttl)
    }
}

/// The key of task `id`'s mail, for `user`; `None` for an id this server
/// never gives.
fn mail_key(id: &str, user: Option<String>) -> Option<TaskKey> {
    let (session_id, call_id) = parse_task_id(id)?;
    Some(TaskKey {
        owner: user,
        session_id: session_id.to_owned(),
        call_id: call_id.to_owned(),
    })
}

/// Task `id`'s mail was not changed, as the client is told: refused (an
/// invalid parameter, saying why) or not made (an internal error).
fn unchanged(id: &str, why: Unchanged) -> ErrorData {
    match why {
        Unchanged::Refused(why) => ErrorData::invalid_params(format!("task {id:?}: {why}"), None),
        Unchanged::Store(e) => ErrorData::internal_error(e.to_string(), None),
        Unchanged::Busy => ErrorData::internal_error(
            format!("task {id:?}: its mail is changed by other hosts; try again"),
            None,
        ),
    }
}

/// A task id: the session and the call, `SESSION/CALL` (a session id has
/// no `/`).
pub(super) fn task_id(session: &str, call: &str) -> String {
    format!("{session}/{call}")
}

/// The session and call task `id` names; `None` for an id this server
/// never gives.
pub(super) fn parse_task_id(id: &str) -> Option<(&str, &str)> {
    let (session, call) = id.split_once('/')?;
    let session_ok = crate::session::check_session_id(session).is_ok();
    let call_ok = (1..=128).contains(&call.len()) && call.bytes().all(|b| b.is_ascii_graphic());
    (session_ok && call_ok).then_some((session, call))
}

/// A fresh call id for a task the client did not key: 128 random bits.
/// `None` when the system's random source fails.
pub(super) fn fresh_call_id() -> Option<String> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
    Some(format!("task-{}", hex::encode(bytes)))
}

/// A call's result as a task's `completed` payload.
pub(super) fn completed(result: &rmcp::model::CallToolResult) -> TaskPayload {
    let result = match serde_json::to_value(result) {
        Ok(serde_json::Value::Object(object)) => object,
        _ => JsonObject::new(),
    };
    TaskPayload::Completed { result }
}

/// A `failed` payload: the JSON-RPC error `message` (an internal error).
pub(super) fn failed(message: &str) -> TaskPayload {
    let error = JsonObject::from_iter([
        ("code".to_owned(), (-32603).into()),
        ("message".to_owned(), message.into()),
    ]);
    TaskPayload::Failed { error }
}

/// Milliseconds since the Unix epoch as ISO 8601 (UTC).
fn iso(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(String::new, |t| {
            t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        })
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_name_a_session_and_a_call() {
        let id = task_id("s-1", "task-00ff");
        assert_eq!(parse_task_id(&id), Some(("s-1", "task-00ff")));
        // A call key may hold a `/`; a session id never does.
        assert_eq!(parse_task_id("s/a/b"), Some(("s", "a/b")));
        for bad in ["", "nosep", "/call", "s/", "s p/call", "s/\u{7f}"] {
            assert_eq!(parse_task_id(bad), None, "{bad:?}");
        }
        let fresh = fresh_call_id().unwrap();
        assert_eq!(fresh.len(), "task-".len() + 32);
        assert_ne!(fresh, fresh_call_id().unwrap());
    }

    #[tokio::test]
    async fn an_update_answers_all_its_keys_or_none_and_a_cancel_answers_cancel() {
        let input = Arc::new(Input::default());
        let cancel = CancelToken::new();
        let asker = task_asker(&input, true, &cancel);
        let question = || Asked {
            message: "Your name?".into(),
            schema: serde_json::json!({"type": "object", "properties": {}}),
            answer: Answer::Cancel,
        };
        let accept = serde_json::json!({"action": "accept", "content": {"name": "Ada"}});
        let first = tokio::spawn(asker(question()));
        input.asked.notified().await;
        let keys = |input: &Input| input.waiting().map(|w| w.into_keys().collect::<Vec<_>>());
        assert_eq!(keys(&input), Some(vec!["person-1".to_owned()]));
        let mixed = InputResponses::from([
            ("person-1".to_owned(), accept.clone()),
            ("person-9".to_owned(), accept.clone()),
        ]);
        assert_eq!(
            input.answer(&mixed),
            Some(Err("no question \"person-9\" is waiting".to_owned()))
        );
        assert_eq!(keys(&input), Some(vec!["person-1".to_owned()]));
        let right = InputResponses::from([("person-1".to_owned(), accept)]);
        assert_eq!(input.answer(&right), Some(Ok(())));
        let content = serde_json::json!({"name": "Ada"});
        assert_eq!(first.await.unwrap(), Answer::Accept { content });
        assert_eq!(keys(&input), None);

        // The next question has a key of its own; cancelled, it is
        // answered `cancel`.
        let second = tokio::spawn(asker(question()));
        input.asked.notified().await;
        assert_eq!(keys(&input), Some(vec!["person-2".to_owned()]));
        cancel.cancel();
        assert_eq!(second.await.unwrap(), Answer::Cancel);
        assert_eq!(keys(&input), None);
    }

    #[test]
    fn a_task_expires_after_its_ttl() {
        let tasks = Tasks::new(TaskSettings {
            ttl: std::time::Duration::from_secs(10),
            ..TaskSettings::default()
        });
        assert!(!tasks.expired(1_000, 11_000));
        assert!(tasks.expired(1_000, 11_001));
        let task = tasks.detailed("s/c", 0, 1, Some("1 of 2".into()), TaskPayload::Working);
        let wire = serde_json::to_value(&task).unwrap();
        assert_eq!(wire["status"], "working");
        assert_eq!(wire["createdAt"], "1970-01-01T00:00:00.000Z");
        assert_eq!(wire["ttlMs"], 10_000);
        assert_eq!(wire["statusMessage"], "1 of 2");
    }
}
