//! Serving the loaded tools over the Model Context Protocol (DESIGN §7).
//!
//! [`McpServer`] answers `tools/list` from the components' `describe` and
//! `tools/call` through exactly the path of `airlock run`: the same
//! sandbox, policy, argument check and op validation, on a durable
//! [`Session`]. Every failure of a call (unknown tool, bad arguments, a
//! trap, a timeout, a limit, rejected ops, an approval the client cannot
//! give) is a tool result with `isError: true` and the message, never a
//! protocol error.
//!
//! A server works on one session (given, as stdio's `--session`, or
//! opened at the first request that needs it, one per MCP session over
//! HTTP); a request may name another in `_meta` ([`SESSION_META_KEY`]).
//! The ops of one call are committed and seen by the next, and the
//! session's deps (less hidden and secret-looking keys) are the resource
//! [`DEPS_URI`]. Calls on one session run one at a time, in the order they
//! arrive; calls on different sessions run concurrently. The tools
//! ([`ToolSet`]) can be replaced while serving; clients are told with
//! `notifications/tools/list_changed`.

pub mod auth;
pub mod http;
pub mod limits;
mod mail;
mod offers;
pub mod relay;
mod rounds;
mod tasks;

use std::sync::Arc;

use rmcp::model::ServerNotification;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams, CompleteResult,
    ContentBlock, ElicitRequestParams, ElicitationAction, ElicitationSchema,
    GetPromptRequestParams, GetPromptResponse, Implementation, InitializeRequestParams,
    InitializeResult, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProgressToken,
    ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    RequestId, RequestMetaObject, Resource, ResourceContents, ServerCapabilities, ServerConfig,
    SubscribeRequestParams, Tool, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, Peer, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;
use tokio::sync::{Mutex, OnceCell};

use self::auth::Caller;
use self::limits::UserLimiter;
use self::relay::{LogThreshold, Relay};
use self::rounds::Round;
pub use self::rounds::{MIN_STATE_KEY, StateKey};
use crate::agent::{CallStart, SessionCallError};
use crate::journal::{CalledBy, REJECTED_MESSAGE};
use crate::policy::{Approval, TaskSettings};
use crate::sandbox::{Asker, CancelToken, Sampler};
use crate::session::{Session, SessionError, SessionOptions, SessionStore};
use crate::spec::{Answer, Asked, SampleReply, SampleRequest, Shown};
use crate::tools::{CallError, Host, ToolCall, failure_text};

/// The resource that shows the session's deps.
pub const DEPS_URI: &str = "airlock://session/deps";

/// The `_meta` key with which a request names the Airlock session it works
/// on (for clients of the stateless protocol revision, which has no MCP
/// session): `{"_meta": {"airlock/session": "ID"}}`. The session is opened
/// (created if missing) for the request and released after it.
pub const SESSION_META_KEY: &str = "airlock/session";

/// The `_meta` key with which a request names its call, so that a retry
/// runs it at most once: `{"_meta": {"airlock/call": "KEY"}}`. When the
/// session already holds a completed call with that key (the client never
/// got the answer: the connection dropped, the host died), the committed
/// result is returned and the tool does not run again; on any host of a
/// shared store. A key is the call's id in the journal: 1 to 128 printable
/// ASCII characters, used again only for the same tool and arguments.
pub const CALL_META_KEY: &str = "airlock/call";

/// The `_meta` key of a `tools/call` result that says how long the call
/// itself took in the server, in microseconds: the journaled call, from
/// its intent's commit to its outcome's, tool included. What a client
/// measures beyond it is the protocol's.
pub const DURATION_META_KEY: &str = "airlock/duration_us";

/// What a tool that asks its person is told when its client cannot ask.
const NO_ELICITATION: &str = "this client cannot ask its user (it declared no elicitation)";

/// What a tool that asks the model is told when its client has none.
const NO_SAMPLING: &str = "this client cannot ask its model (it declared no sampling)";

/// Opens Airlock sessions for an MCP server: the store, the owner and the
/// starting deps; the id is the caller's, and the hidden keys are those of
/// the host serving when the session is opened.
#[derive(Debug, Clone)]
pub struct SessionOpener {
    store: Arc<dyn SessionStore>,
    options: SessionOptions,
}

impl SessionOpener {
    /// Sessions in `store` opened with `options` (its `session_id` is
    /// replaced by each caller's).
    pub fn new(store: Arc<dyn SessionStore>, options: SessionOptions) -> Self {
        Self { store, options }
    }

    /// Opens (or creates) session `id` (a fresh one when `None`) of
    /// `user` (the opener's own when `None`), writing no key `host`'s
    /// rules hide.
    pub async fn open(
        &self,
        id: Option<String>,
        user: Option<&str>,
        host: &Host,
    ) -> Result<Session, SessionError> {
        let mut options = self.options.clone();
        options.session_id = id;
        if let Some(user) = user {
            options.user_id = Some(user.to_owned());
        }
        Session::open(Arc::clone(&self.store), options, host.context_rules()).await
    }

    /// The user whose sessions it opens when no caller names one.
    pub fn user(&self) -> Option<&str> {
        self.options.user_id.as_deref()
    }
}

/// The tools a server serves: a host that can be replaced while serving
/// (a changed component reloaded), and the clients to tell when it is.
#[derive(Debug)]
pub struct ToolSet {
    host: std::sync::RwLock<Arc<Host>>,
    peers: Mutex<Vec<Peer<RoleServer>>>,
    /// The `subscriptions/listen` requests open, by number: told of list
    /// changes they accepted.
    listeners: Mutex<Vec<(u64, rmcp::service::SubscriptionSink)>>,
    /// Who waits to hear that a resource changed.
    watchers: offers::Watchers,
    /// The calls running as tasks.
    tasks: tasks::Tasks,
    /// What seals the state of a call's rounds.
    state_key: StateKey,
    /// The seconds of the calls that relay what they report.
    seconds: relay::Seconds,
    /// What runs on these tools.
    running: limits::Running,
}

/// How a server serves, beside its tools: what [`ToolSet::with`] takes.
#[derive(Debug, Clone, Default)]
pub struct Serving {
    /// When a call becomes a task.
    pub tasks: TaskSettings,
    /// What seals the state of a 2026-07-28 client's rounds: `None` draws
    /// a key for this process (a round then continues only on it).
    pub state_key: Option<StateKey>,
}

impl ToolSet {
    /// Serves `host`'s tools as [`Serving`]'s defaults say.
    pub fn new(host: Arc<Host>) -> Arc<Self> {
        Self::with(host, Serving::default())
    }

    /// Serves `host`'s tools as `serving` says.
    pub fn with(host: Arc<Host>, serving: Serving) -> Arc<Self> {
        Arc::new(Self {
            host: std::sync::RwLock::new(host),
            peers: Mutex::new(Vec::new()),
            listeners: Mutex::new(Vec::new()),
            watchers: offers::Watchers::default(),
            tasks: tasks::Tasks::new(serving.tasks),
            state_key: serving.state_key.unwrap_or_else(StateKey::random),
            seconds: relay::Seconds::default(),
            running: limits::Running::default(),
        })
    }

    /// How many calls run on these tools now, in this process (with the
    /// resource reads, prompts and completions): those answered in their
    /// request, and those no request waits for (tasks, and calls whose
    /// client went away, which run to their end).
    pub fn running(&self) -> usize {
        self.running.count()
    }

    /// Waits until no call runs on these tools ([`running`](Self::running)
    /// is 0): at once when none does; a call that starts meanwhile is
    /// waited for too. What a stopping server waits for beside its open
    /// connections, since a task goes on with no connection open.
    pub async fn calls_ended(&self) {
        self.running.ended().await;
    }

    /// The host serving now. A call keeps the host it started with.
    pub fn current(&self) -> Arc<Host> {
        let host = self
            .host
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(&host)
    }

    /// Serves `host` from now on and sends every connected client
    /// `notifications/tools/list_changed` (forgetting those gone).
    pub async fn replace(&self, host: Arc<Host>) {
        *self
            .host
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = host;
        let mut peers = self.peers.lock().await;
        let mut live = Vec::with_capacity(peers.len());
        for peer in peers.drain(..) {
            if peer.notify_tool_list_changed().await.is_ok() {
                // What the components offer beside tools may have changed
                // with them.
                let resources = peer.notify_resource_list_changed().await;
                let prompts = peer.notify_prompt_list_changed().await;
                if resources.is_err() || prompts.is_err() {
                    tracing::debug!("cannot tell a client the lists changed");
                }
                live.push(peer);
            }
        }
        *peers = live;
        drop(peers);
        let mut listeners = self.listeners.lock().await;
        let mut live = Vec::with_capacity(listeners.len());
        for (by, sink) in listeners.drain(..) {
            let mut open = true;
            for note in [
                ServerNotification::ToolListChangedNotification(Default::default()),
                ServerNotification::ResourceListChangedNotification(Default::default()),
                ServerNotification::PromptListChangedNotification(Default::default()),
            ] {
                // A change the listener did not accept is not sent.
                if let Err(rmcp::service::SubscriptionSendError::SubscriptionClosed) =
                    sink.send(note).await
                {
                    open = false;
                }
            }
            if open {
                live.push((by, sink));
            }
        }
        *listeners = live;
    }

    /// Tells listener `by` of the list changes it accepted, from now on.
    async fn listen(&self, by: u64, sink: rmcp::service::SubscriptionSink) {
        self.listeners.lock().await.push((by, sink));
    }

    /// Listener `by` has ended.
    async fn unlisten(&self, by: u64) {
        self.listeners.lock().await.retain(|(n, _)| *n != by);
    }

    /// Remembers a client to notify, forgetting those whose connection
    /// has closed (so the list stays as long as the live clients).
    async fn register(&self, peer: Peer<RoleServer>) {
        let mut peers = self.peers.lock().await;
        peers.retain(|known| !known.is_transport_closed());
        peers.push(peer);
    }
}

/// An MCP server for the tools of one host, on one session.
#[derive(Debug)]
pub struct McpServer {
    tools: Arc<ToolSet>,
    /// The server's session: given (stdio's `--session`), or opened by
    /// `opener` at the first request that needs it (one per MCP session
    /// over HTTP).
    session: OnceCell<Held>,
    /// Opens the server's session, and sessions named in a request's
    /// `_meta`; `None` refuses those.
    opener: Option<SessionOpener>,
    /// Whose the server's session is, when a token said (its caller's,
    /// over authenticated HTTP): the opener's user otherwise.
    owner: Option<String>,
    /// What each user may run at once; `None` counts nothing.
    limiter: Option<Arc<UserLimiter>>,
    /// The least level of the tools' log records its client hears
    /// (`logging/setLevel`).
    log_threshold: LogThreshold,
    /// Its number among the process's MCP servers (what names its
    /// client's subscriptions).
    number: u64,
    /// The protocol revision its client asked for at `initialize` (rmcp
    /// keeps it too, but only within a request it serves).
    revision: std::sync::OnceLock<ProtocolVersion>,
}

impl McpServer {
    /// Serves `host`'s tools on `session`; a request's `_meta` may name
    /// another session of `named`'s store and owner.
    pub fn new(tools: Arc<ToolSet>, session: Session, named: Option<SessionOpener>) -> Self {
        let number = tools.watchers.number();
        Self {
            tools,
            session: OnceCell::new_with(Some(Held::new(session))),
            opener: named,
            owner: None,
            limiter: None,
            log_threshold: LogThreshold::new(),
            number,
            revision: std::sync::OnceLock::new(),
        }
    }

    /// Serves `host`'s tools on a session `opener` creates at the first
    /// request that needs one (or the session a request's `_meta` names),
    /// of `owner` (the opener's user when `None`); each user's calls
    /// counted by `limiter`.
    pub fn lazy(
        tools: Arc<ToolSet>,
        opener: SessionOpener,
        owner: Option<String>,
        limiter: Option<Arc<UserLimiter>>,
    ) -> Self {
        let number = tools.watchers.number();
        Self {
            tools,
            session: OnceCell::new(),
            opener: Some(opener),
            owner,
            limiter,
            log_threshold: LogThreshold::new(),
            number,
            revision: std::sync::OnceLock::new(),
        }
    }

    /// Whether a request with `meta` is of the 2026-07-28 revision or a
    /// later one: the revision `meta` names, else the one the client asked
    /// for at `initialize` (none: an earlier one), as rmcp reads it.
    pub(crate) fn current_revision(&self, meta: &RequestMetaObject) -> bool {
        let named = meta.protocol_version();
        let revision = named.as_ref().or_else(|| self.revision.get());
        revision.is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
    }

    /// The session, once there is one, to release it when serving ends.
    pub fn session(&self) -> Option<Arc<Mutex<Session>>> {
        self.session.get().map(|held| Arc::clone(&held.session))
    }

    /// The session a request of `caller` works on: the one its `_meta`
    /// names (the caller's own, leased for this request), or the server's.
    /// Another user's session is out of reach: a name is looked up among
    /// the caller's sessions only, so one that is not theirs is unknown
    /// (and created as theirs), whether or not another user has one so
    /// named.
    async fn session_for(
        &self,
        meta: &RequestMetaObject,
        caller: Option<&Caller>,
    ) -> Result<Working, String> {
        if let Some(named) = meta.get(SESSION_META_KEY) {
            let Some(id) = named.as_str() else {
                return Err(format!(
                    "_meta {SESSION_META_KEY:?} must be a session id (a string)"
                ));
            };
            let Some(opener) = &self.opener else {
                return Err(format!(
                    "this server works on one session; _meta {SESSION_META_KEY:?} cannot name another"
                ));
            };
            let user = caller.map(|c| c.user.as_str());
            let session = opener
                .open(Some(id.to_owned()), user, &self.tools.current())
                .await
                .map_err(|e| e.to_string())?;
            return Ok(Working::Named(Held::new(session)));
        }
        let opener = self.opener.as_ref();
        self.session
            .get_or_try_init(|| async {
                let opener = opener.ok_or("this server has no session")?;
                let session = opener
                    .open(None, self.owner.as_deref(), &self.tools.current())
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(Held::new(session))
            })
            .await
            .map(|held| Working::Shared(held.clone()))
    }

    /// Asks the client's user about a call of tool `name`, an `approval =
    /// "ask"` tool (MCP elicitation). `Err` is the tool result's text: the
    /// loop's rejection message, and why when the client could not ask.
    async fn approve(
        name: &str,
        arguments: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), String> {
        let can_ask = context
            .peer
            .peer_info()
            .is_some_and(|info| info.capabilities.elicitation.is_some());
        if !can_ask {
            return Err(format!(
                "{REJECTED_MESSAGE} ({name} needs approval, and this client cannot ask its user)"
            ));
        }
        let question = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: approval_question(name, arguments),
            requested_schema: ElicitationSchema::new(std::collections::BTreeMap::new()),
        };
        match context.peer.create_elicitation(question).await {
            Ok(answer) if answer.action == ElicitationAction::Accept => Ok(()),
            Ok(_) => Err(REJECTED_MESSAGE.to_owned()),
            Err(e) => Err(format!(
                "{REJECTED_MESSAGE} (the client could not ask: {e})"
            )),
        }
    }

    /// The tools as MCP lists them to `caller` (those whose scopes its
    /// token grants; all without a token): name, description, the JSON
    /// Schema of the arguments (as `describe` gave it).
    fn tool_list(&self, caller: Option<&Caller>) -> Vec<Tool> {
        let host = self.tools.current();
        host.tools()
            .filter(|spec| may_call(&host, caller, &spec.name))
            .map(|spec| {
                let schema = match &spec.parameters {
                    Value::Object(map) => map.clone(),
                    _ => serde_json::Map::new(),
                };
                Tool::new(spec.name.clone(), spec.description.clone(), schema)
            })
            .collect()
    }

    /// One call, on the session, as a tool result; at most once per id
    /// when the client keyed it (then `begun` is told once its intent is
    /// committed).
    async fn call(
        tools: &Arc<ToolSet>,
        session: &Working,
        call: ToolCall,
        keyed: bool,
        cancel: CancelToken,
        caller: Option<&Caller>,
        start: CallStart<'static>,
    ) -> CallToolResult {
        let mut session = session.handle().lock().await;
        let host = tools.current();
        let by = caller.map(|c| CalledBy {
            user: c.user.clone(),
            client: c.client_id.clone(),
        });
        let started = std::time::Instant::now();
        let result = if keyed {
            session
                .call_once_telling(&host, &call, &cancel, by.as_ref(), start)
                .await
        } else {
            session.call(&host, &call, &cancel, by.as_ref()).await
        };
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let answer = match result {
            Ok(outcome) => {
                // Whoever watches a resource of this session hears of what
                // its read looked at: in a task of its own, so that a client
                // slow to read its stream never holds the session. A call
                // nobody watches pays one look.
                if !outcome.updates.is_empty() && tools.watchers.any() {
                    let written: std::collections::BTreeSet<String> = outcome
                        .updates
                        .iter()
                        .map(|op| op.key().to_owned())
                        .collect();
                    let key = offers::session_key(session.context());
                    let tools = Arc::clone(tools);
                    tokio::spawn(async move { tools.watchers.changed(&key, &written).await });
                }
                tool_result(outcome)
            }
            Err(SessionCallError::Call(failure)) => error_result(failure_text(&failure)),
            Err(e) => error_result(e.to_string()),
        };
        let meta = rmcp::model::JsonObject::from_iter([(DURATION_META_KEY.into(), took.into())]);
        answer.with_meta(Some(rmcp::model::MetaObject(meta)))
    }

    /// What a call of tool `name` needs of its client while it runs
    /// (nothing for a tool the host does not have). One look at the tools.
    fn needs(&self, name: &str) -> Needs {
        let host = self.tools.current();
        let Some(component) = host.component_for(name) else {
            return Needs::default();
        };
        Needs {
            approval: component.approval() == Approval::Ask,
            person: component.grants().ask_user,
            model: component.grants().sampling.is_some(),
        }
    }

    /// Whether a call of tool `name` may need its client while it runs: to
    /// approve it, or to answer its questions. Over HTTP a call that does
    /// not is answered in its request's own task ([`http`]).
    fn needs_client(&self, name: &str) -> bool {
        self.needs(name).any()
    }

    /// A `tools/call` of `caller` whose approval (if any) is given: on the
    /// session `meta` names or the server's, keyed by `meta`'s call key or
    /// else by the request's `id`. A tool the caller's token may not call
    /// is unknown to it, as one that does not exist; past one of the
    /// user's limits nothing runs.
    async fn run_call(
        &self,
        name: &str,
        arguments: String,
        meta: &RequestMetaObject,
        id: &RequestId,
        cancel: CancelToken,
        caller: Option<&Caller>,
    ) -> CallToolResult {
        let work = async {
            if let Some(unknown) = self.unknown_to(caller, name) {
                return Err(unknown);
            }
            let key = call_key(meta)?;
            let _permit = self.permit(caller)?;
            let session = self.session_for(meta, caller).await?;
            let call = ToolCall {
                id: key.clone().unwrap_or_else(|| format!("mcp_{id}")),
                name: name.to_owned(),
                arguments,
                retry: 0,
            };
            let keyed = key.is_some();
            let result = Self::call(
                &self.tools,
                &session,
                call,
                keyed,
                cancel,
                caller,
                CallStart::default(),
            )
            .await;
            session.done().await;
            Ok::<_, String>(result)
        };
        work.await.unwrap_or_else(error_result)
    }

    /// Room for one more call of the caller's (a tool call, or a read, a
    /// prompt or a completion), held while it runs; why not, past one of
    /// the user's limits.
    fn permit(&self, caller: Option<&Caller>) -> Result<Room, String> {
        let limit = match &self.limiter {
            None => None,
            Some(limiter) => {
                let user = self.user(caller).unwrap_or_default();
                Some(limiter.start_call(&user).map_err(|e| e.to_string())?)
            }
        };
        Ok(Room {
            _limit: limit,
            _busy: self.tools.running.start(),
        })
    }

    /// The user whose sessions `caller` works on: its token's, else the
    /// server's owner, else the opener's or the server's session's (`None`:
    /// the anonymous bucket).
    fn user(&self, caller: Option<&Caller>) -> Option<String> {
        caller
            .map(|c| c.user.as_str())
            .or(self.owner.as_deref())
            .or(self.opener.as_ref().and_then(SessionOpener::user))
            .or(self.session.get().and_then(|held| held.user.as_deref()))
            .map(str::to_owned)
    }

    /// Why `caller` may not call tool `name`, as the error of a tool that
    /// does not exist (naming only the tools it may call): its token lacks
    /// a scope the tool needs. `None` when it may, and always without a
    /// token (the host's own error answers a name it does not know).
    fn unknown_to(&self, caller: Option<&Caller>, name: &str) -> Option<String> {
        caller?;
        let host = self.tools.current();
        if may_call(&host, caller, name) {
            return None;
        }
        let available = host
            .tool_names()
            .into_iter()
            .filter(|tool| may_call(&host, caller, tool))
            .collect();
        let unknown = CallError::UnknownTool {
            name: name.to_owned(),
            available,
        };
        Some(unknown.to_string())
    }
}

impl Drop for McpServer {
    /// Its client's subscriptions end with it.
    fn drop(&mut self) {
        self.tools.watchers.forget(self.number, None);
    }
}

/// What a person is asked before a call of an `approval = "ask"` tool.
fn approval_question(name: &str, arguments: &str) -> String {
    format!(
        "Allow the tool {name} to run with {}?",
        crate::text::truncate(arguments, 2000)
    )
}

/// What a call needs of its client while it runs ([`McpServer::needs`]).
#[derive(Debug, Default, Clone, Copy)]
struct Needs {
    /// Approval first (`approval = "ask"`).
    approval: bool,
    /// Answers from its person (`ask = true`).
    person: bool,
    /// Completions from its model (`sample`).
    model: bool,
}

impl Needs {
    /// Whether it needs anything.
    fn any(self) -> bool {
        self.approval || self.person || self.model
    }
}

/// Whether `caller` may see and call tool `name` of `host`: its token
/// grants every scope the tool's policy entry needs (any tool, without a
/// token).
fn may_call(host: &Host, caller: Option<&Caller>, name: &str) -> bool {
    match (caller, host.component_for(name)) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(caller), Some(component)) => caller.has_scopes(component.scopes()),
    }
}

/// The caller a request's token named, as the HTTP layer left it in the
/// request's extensions (rmcp passes the HTTP request's parts on).
fn caller_of(context: &RequestContext<RoleServer>) -> Option<&Caller> {
    context
        .extensions
        .get::<::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Caller>())
}

/// A completed call's outcome as MCP's tool result: an object result as
/// `structuredContent`, a string as its text, anything else as its JSON;
/// then the blocks it showed.
fn tool_result(outcome: crate::tools::CallOutcome) -> CallToolResult {
    let mut answer = match outcome.result {
        Value::Object(_) => CallToolResult::structured(outcome.result),
        // A string is the text itself, not its JSON.
        Value::String(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
        other => CallToolResult::success(vec![ContentBlock::text(other.to_string())]),
    };
    answer
        .content
        .extend(outcome.output.shown.into_iter().map(content_block));
    answer
}

/// A block a call showed, as an MCP content block.
fn content_block(shown: Shown) -> ContentBlock {
    match shown {
        Shown::Text { text } => ContentBlock::text(text),
        Shown::Image { data, mime_type } => ContentBlock::image(data, mime_type),
        Shown::Audio { data, mime_type } => ContentBlock::audio(data, mime_type),
        Shown::ResourceLink {
            uri,
            name,
            description,
            mime_type,
        } => {
            let mut link = Resource::new(uri, name);
            if let Some(description) = description {
                link = link.with_description(description);
            }
            if let Some(mime_type) = mime_type {
                link = link.with_mime_type(mime_type);
            }
            ContentBlock::resource_link(link)
        }
        Shown::Resource {
            uri,
            mime_type,
            text,
            blob,
        } => ContentBlock::resource(resource_contents(uri, mime_type, text, blob)),
    }
}

/// A resource's contents: `blob` (base64) when there is one, else `text`.
fn resource_contents(
    uri: String,
    mime_type: Option<String>,
    text: Option<String>,
    blob: Option<String>,
) -> ResourceContents {
    match (text, blob) {
        (_, Some(blob)) => ResourceContents::BlobResourceContents {
            uri,
            mime_type,
            blob,
            meta: None,
        },
        (text, None) => ResourceContents::TextResourceContents {
            uri,
            mime_type,
            text: text.unwrap_or_default(),
            meta: None,
        },
    }
}

/// A call's arguments as the tool gets them: a JSON object's text.
fn arguments_text(arguments: Option<rmcp::model::JsonObject>) -> String {
    Value::Object(arguments.unwrap_or_default()).to_string()
}

/// How often a call with a progress token reports.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// A session a server works on, with what a request may want of it
/// without waiting for its lock (a call may hold it).
#[derive(Debug, Clone)]
struct Held {
    session: Arc<Mutex<Session>>,
    /// Its id.
    id: String,
    /// Its owner.
    user: Option<String>,
    /// Where it is kept.
    store: Arc<dyn SessionStore>,
}

impl Held {
    fn new(session: Session) -> Self {
        Self {
            id: session.id().to_owned(),
            user: session.context().user_id().map(str::to_owned),
            store: session.store(),
            session: Arc::new(Mutex::new(session)),
        }
    }
}

/// The session one request works on.
enum Working {
    /// The server's own.
    Shared(Held),
    /// One the request named, leased for the request.
    Named(Held),
}

impl Working {
    fn held(&self) -> &Held {
        match self {
            Working::Shared(held) | Working::Named(held) => held,
        }
    }

    fn handle(&self) -> &Arc<Mutex<Session>> {
        &self.held().session
    }

    /// Releases a named session's lease at once.
    async fn done(self) {
        if let Working::Named(held) = self
            && let Err(e) = held.session.lock().await.release().await
        {
            tracing::warn!(error = %e, "cannot release a session");
        }
    }
}

/// A call's place while it runs (a tool call, or a read, a prompt or a
/// completion): in its user's count with `[mcp.limits]`, and among the
/// work a stopping server waits for ([`ToolSet::running`]).
struct Room {
    _limit: Option<limits::Permit>,
    _busy: limits::Busy,
}

/// Who answers a call's questions over MCP: the client's user, through
/// `elicitation/create`, when the client declared it can ask.
fn asker(context: &RequestContext<RoleServer>) -> Asker {
    let can_ask = context
        .peer
        .peer_info()
        .is_some_and(|info| info.capabilities.elicitation.is_some());
    let peer = context.peer.clone();
    Arc::new(move |asked: Asked| {
        let peer = peer.clone();
        Box::pin(async move {
            if !can_ask {
                return Answer::Unavailable {
                    why: NO_ELICITATION.into(),
                };
            }
            let schema: ElicitationSchema = match serde_json::from_value(asked.schema) {
                Ok(schema) => schema,
                Err(e) => {
                    return Answer::Unavailable {
                        why: format!(
                            "the question's schema is not one MCP elicitation carries: {e}"
                        ),
                    };
                }
            };
            let question = ElicitRequestParams::FormElicitationParams {
                meta: None,
                message: asked.message,
                requested_schema: schema,
            };
            match peer.create_elicitation(question).await {
                Ok(answer) => match answer.action {
                    ElicitationAction::Accept => Answer::Accept {
                        content: answer
                            .content
                            .unwrap_or_else(|| Value::Object(Default::default())),
                    },
                    ElicitationAction::Decline => Answer::Decline,
                    _ => Answer::Cancel,
                },
                Err(e) => Answer::Unavailable {
                    why: format!("the client could not ask: {e}"),
                },
            }
        })
    })
}

/// Who answers a call's requests for a completion over MCP: the client's
/// model, through `sampling/createMessage`, when the client declared it
/// can sample.
// Sampling is deprecated by SEP-2577 for later revisions; the 2025-06-18
// and 2025-11-25 revisions this server speaks have it.
#[allow(deprecated)]
fn sampler(context: &RequestContext<RoleServer>) -> Sampler {
    let can_sample = context
        .peer
        .peer_info()
        .is_some_and(|info| info.capabilities.sampling.is_some());
    let peer = context.peer.clone();
    Arc::new(move |request: SampleRequest| {
        let peer = peer.clone();
        Box::pin(async move {
            if !can_sample {
                return SampleReply::Refused {
                    why: NO_SAMPLING.into(),
                };
            }
            match peer.create_message(rounds::sample_params(request)).await {
                Ok(reply) => {
                    let text = reply
                        .message
                        .content
                        .into_vec()
                        .iter()
                        .filter_map(|block| block.as_text().map(|t| t.text.clone()))
                        .collect::<Vec<_>>()
                        .join("\n");
                    SampleReply::Answered {
                        text,
                        model: reply.model,
                        stop_reason: reply.stop_reason,
                    }
                }
                Err(e) => SampleReply::Refused {
                    why: format!("the client's model did not answer: {e}"),
                },
            }
        })
    })
}

/// Cancels `cancel` when the client cancels the request. Never ends; the
/// call's future is raced against it.
async fn watch(
    context: &RequestContext<RoleServer>,
    cancel: CancelToken,
) -> std::convert::Infallible {
    context.ct.cancelled().await;
    cancel.cancel();
    std::future::pending().await
}

/// `mutex`'s guard, even if a thread panicked holding it (what each lock
/// of this module guards stays whole between statements).
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Call `tool`'s progress report after `seconds` of running.
fn progress(token: &ProgressToken, tool: &str, seconds: u32) -> ProgressNotificationParam {
    ProgressNotificationParam::new(token.clone(), f64::from(seconds))
        .with_message(format!("{tool} running ({seconds} s)"))
}

/// Checks a list request's cursor. Every list this server answers is whole
/// on its first page, with no `nextCursor`, so a request that carries a
/// cursor carries one this server never gave: refused (-32602, as MCP's
/// pagination asks of an invalid cursor) rather than answered with the
/// first page again, which a client paging on would take for more items.
fn first_page(request: Option<PaginatedRequestParams>) -> Result<(), ErrorData> {
    match request.and_then(|request| request.cursor) {
        None => Ok(()),
        Some(_) => Err(ErrorData::invalid_params(
            "cursor: not one this server gave (its lists are whole on the first page, \
             with no nextCursor)",
            None,
        )),
    }
}

/// The progress token a call's `_meta` carries, if any: a string of at
/// most [`MAX_PROGRESS_TOKEN`] bytes or an integer (MCP's
/// `ProgressToken`); `null` stands for none. Any other value is refused
/// (-32602, naming it) rather than ignored, which would leave its client
/// waiting for reports that never come.
fn progress_token(meta: &RequestMetaObject) -> Result<Option<ProgressToken>, ErrorData> {
    const FIELD: &str = "progressToken";
    let refused =
        |why: &str| ErrorData::invalid_params(format!("tools/call: _meta.{FIELD} {why}"), None);
    match meta.get(FIELD) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(token)) if token.len() > MAX_PROGRESS_TOKEN => {
            Err(refused(&format!("is over {MAX_PROGRESS_TOKEN} bytes")))
        }
        Some(_) => meta
            .get_progress_token()
            .map(Some)
            .ok_or_else(|| refused("must be a string or an integer")),
    }
}

/// The longest progress token a call may carry. Each of the call's
/// progress notifications repeats it, and a slow client's may wait in
/// memory (`RELAYED` of them a call): a longer one would make the server
/// keep many copies of what the client sent once.
const MAX_PROGRESS_TOKEN: usize = 1024;

/// The call key a request's `_meta` gives ([`CALL_META_KEY`]), checked.
fn call_key(meta: &RequestMetaObject) -> Result<Option<String>, String> {
    let Some(key) = meta.get(CALL_META_KEY) else {
        return Ok(None);
    };
    match key.as_str() {
        Some(key)
            if (1..=128).contains(&key.len())
                && key.bytes().all(|b| b.is_ascii_graphic() || b == b' ') =>
        {
            Ok(Some(key.to_owned()))
        }
        _ => Err(format!(
            "_meta {CALL_META_KEY:?} must be 1 to 128 printable ASCII characters"
        )),
    }
}

fn error_result(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// The error for request `method` with `params` that rmcp read as no
/// method of MCP's: invalid params when `method` is one of them (serde's
/// account of what does not fit, as for that method's params), else
/// method not found. Both quote what the client sent, cut to a few hundred
/// bytes.
// Logging and `resources/subscribe` are deprecated for later revisions;
// the 2025-06-18 and 2025-11-25 revisions this server speaks have them.
#[allow(deprecated)]
fn unreadable(method: &str, params: Option<Value>) -> ErrorData {
    use rmcp::model::*;
    /// Why `request` is not a `T`.
    fn misfit<T: serde::de::DeserializeOwned>(request: Value) -> String {
        match serde_json::from_value::<T>(request) {
            Err(e) => e.to_string(),
            // Read alone, it fits: what rmcp read it among did not.
            Ok(_) => "they are not what the method takes".to_owned(),
        }
    }
    let shown = crate::text::truncate(method, 128);
    let request = serde_json::json!({ "method": method, "params": params });
    let invalid = |why: String| {
        let why = crate::text::truncate(&why, 300);
        ErrorData::invalid_params(format!("{shown}: the params do not fit: {why}"), None)
    };
    macro_rules! known {
        ($($method:ty => $request:ty),* $(,)?) => {
            $(if method == <$method as ConstString>::VALUE {
                return invalid(misfit::<$request>(request));
            })*
        };
    }
    known! {
        CallToolRequestMethod => CallToolRequest,
        ListToolsRequestMethod => ListToolsRequest,
        InitializeResultMethod => InitializeRequest,
        DiscoverRequestMethod => DiscoverRequest,
        PingRequestMethod => PingRequest,
        CompleteRequestMethod => CompleteRequest,
        SetLevelRequestMethod => SetLevelRequest,
        GetPromptRequestMethod => GetPromptRequest,
        ListPromptsRequestMethod => ListPromptsRequest,
        ListResourcesRequestMethod => ListResourcesRequest,
        ListResourceTemplatesRequestMethod => ListResourceTemplatesRequest,
        ReadResourceRequestMethod => ReadResourceRequest,
        SubscribeRequestMethod => SubscribeRequest,
        UnsubscribeRequestMethod => UnsubscribeRequest,
        SubscriptionsListenRequestMethod => SubscriptionsListenRequest,
        GetTaskMethod => GetTaskRequest,
        UpdateTaskMethod => UpdateTaskRequest,
        CancelTaskMethod => CancelTaskRequest,
    }
    ErrorData::new(
        ErrorCode::METHOD_NOT_FOUND,
        format!("no method {shown:?} on this server"),
        None,
    )
}

impl ServerHandler for McpServer {
    // Logging is deprecated by SEP-2577 for later revisions; the 2025-06-18
    // and 2025-11-25 revisions this server speaks have it.
    #[allow(deprecated)]
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_logging()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_resources_list_changed()
            .enable_prompts()
            .enable_prompts_list_changed()
            .enable_completions()
            .enable_tasks()
            .build();
        let mut info = ServerConfig::new(capabilities);
        info.server_info = Implementation::new("airlock", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "Sandboxed WebAssembly tools. Their shared state (deps) persists in this session; \
             read it as the resource airlock://session/deps."
                .into(),
        );
        info
    }

    /// The least level of the tools' log records this session's client
    /// hears from now on (none before it asks).
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.log_threshold.set(request.level);
        Ok(())
    }

    /// A request rmcp could not read as any method it knows: a method of
    /// MCP's whose params do not fit it is refused as invalid params
    /// (-32602), saying what does not fit; any other is not found
    /// (-32601), naming it.
    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, ErrorData> {
        Err(unreadable(&request.method, request.params))
    }

    /// rmcp's answer, the client's revision noted for the results this
    /// server sends past rmcp (Airlock's HTTP answers to `tools/list` and
    /// `tools/call`).
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        let _ = self.revision.set(request.protocol_version.clone());
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.tools.register(context.peer).await;
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        first_page(request)?;
        Ok(ListToolsResult::with_all_items(
            self.tool_list(caller_of(&context)),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let token = progress_token(&context.meta)?;
        // A tool the caller may not call is unknown to it before anything
        // else, its approval question included.
        if let Some(unknown) = self.unknown_to(caller_of(&context), &request.name) {
            return Ok(error_result(unknown).into());
        }
        let arguments = arguments_text(request.arguments.clone());
        let needs = self.needs(&request.name);
        // A call may become a task when its client declares the extension:
        // in the request, for any tool (its questions, its approval first,
        // then wait in the task); at `initialize`, for a tool that needs
        // nothing of its client. A tool that needs approval, of a client
        // that cannot ask its user, is refused as below, saying why.
        let in_request = tasks::declares_tasks(&context.meta);
        if in_request
            || !needs.any()
                && context
                    .peer
                    .peer_info()
                    .is_some_and(|info| info.capabilities.supports_tasks())
        {
            // The client's capabilities are decoded only for a tool that
            // asks (not on every call of a client that declares tasks).
            let asks = if needs.any() {
                let can = context.client_capabilities().unwrap_or_default();
                tasks::Asks {
                    approval: needs.approval.then_some(can.elicitation.is_some()),
                    person: needs.person.then_some(can.elicitation.is_some()),
                    model: needs.model.then_some(can.sampling.is_some()),
                }
            } else {
                tasks::Asks::default()
            };
            if asks.approval != Some(false) {
                return Ok(self
                    .call_as_task(&request.name, arguments, asks, &context)
                    .await);
            }
        }
        // A client of the 2026-07-28 revision takes the call's questions
        // (its approval first) as `input_required` results ([`rounds`]);
        // earlier ones, as requests of the server's mid-call.
        let round = if needs.any()
            && context
                .protocol_version()
                .is_some_and(|version| !version.has_initialize())
        {
            let resumed = Round::resume(
                &request.name,
                &arguments,
                request.request_state.as_deref(),
                request.input_responses.as_ref(),
                &context.client_capabilities().unwrap_or_default(),
                &self.tools.state_key,
            );
            match resumed {
                Ok(round) => Some(Arc::new(round)),
                Err(why) => return Ok(error_result(why).into()),
            }
        } else {
            None
        };
        if needs.approval {
            match &round {
                Some(round) => match round.approval(approval_question(&request.name, &arguments)) {
                    rounds::Approval::Given => {}
                    rounds::Approval::Refused => {
                        return Ok(error_result(REJECTED_MESSAGE.to_owned()).into());
                    }
                    rounds::Approval::Ask(input) => {
                        return Ok(CallToolResponse::InputRequired(input));
                    }
                },
                None => {
                    if let Err(refused) = Self::approve(&request.name, &arguments, &context).await {
                        return Ok(error_result(refused).into());
                    }
                }
            }
        }
        // The client's cancellation stops the tool through its epoch
        // deadline, as Ctrl-C does for `airlock run`. A client that sent a
        // progress token, or set a log level, hears what the call reports
        // ([`relay`]). All of it is watched in this request's own task: no
        // task is spawned and no timer set for a call whose client asked
        // for nothing.
        let (ask, sample) = match &round {
            Some(round) => (
                needs.person.then(|| round.asker()),
                needs.model.then(|| round.sampler()),
            ),
            None => (
                needs.person.then(|| asker(&context)),
                needs.model.then(|| sampler(&context)),
            ),
        };
        let (relay, cancel) = Relay::new(&request.name, token, &self.log_threshold, ask, sample);
        if let Some(round) = &round {
            round.runs_with(&cancel);
        }
        let watch = watch(&context, cancel.clone());
        let call = self.run_call(
            &request.name,
            arguments,
            &context.meta,
            &context.id,
            cancel,
            caller_of(&context),
        );
        let relayed = async {
            let Some(relay) = &relay else {
                return call.await;
            };
            let peer = &context.peer;
            let send = |note| async move {
                if peer.send_notification(note).await.is_err() {
                    tracing::debug!("cannot send a notification about a call");
                }
            };
            relay.run(call, self.tools.seconds.listen(), send).await
        };
        let result = tokio::select! {
            biased;
            result = relayed => result,
            never = watch => match never {},
        };
        if let Some(input) = round.as_ref().and_then(|round| round.input_required()) {
            return Ok(CallToolResponse::InputRequired(input));
        }
        Ok(result.into())
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        let task = self.task(&request.task_id, caller_of(&context)).await?;
        Ok(rmcp::model::GetTaskResult::new(task))
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        McpServer::update_task(
            self,
            &request.task_id,
            &request.input_responses,
            caller_of(&context),
        )
        .await
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        McpServer::cancel_task(self, &request.task_id, caller_of(&context)).await
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        first_page(request)?;
        Ok(ListResourcesResult::with_all_items(
            self.resource_list(&context),
        ))
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        first_page(request)?;
        Ok(ListResourceTemplatesResult::with_all_items(
            self.template_list(&context),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let contents = self.read(&request.uri, &context).await?;
        Ok(ReadResourceResult::new(contents).into())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        McpServer::subscribe(self, &request.uri, &context).await
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        McpServer::unsubscribe(self, &request.uri);
        Ok(())
    }

    /// Every notification this server can send a listener is accepted
    /// (the SDK keeps only those the listener asked for).
    fn accepted_subscription_filter(
        &self,
        requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        Some(requested.clone())
    }

    async fn listen(&self, context: rmcp::service::SubscriptionContext) -> Result<(), ErrorData> {
        McpServer::listen(self, context).await
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        first_page(request)?;
        Ok(ListPromptsResult::with_all_items(
            self.prompt_list(&context),
        ))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let prompt = self
            .prompt(&request.name, request.arguments, &context)
            .await?;
        Ok(prompt.into())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        self.completion(request, &context).await
    }
}
