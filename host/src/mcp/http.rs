//! The streamable HTTP transport: rmcp's sessions, with the calls that
//! need nothing from their client answered in their request's own task.
//!
//! rmcp serves each MCP session with a worker of its own: a request goes
//! from the connection's task through the session manager's channels to
//! that worker, on to the server's request loop and a task spawned for
//! the handler, and its answer back the same way as an event stream, a
//! thread woken at each hop. [`McpHttpService`] keeps all of rmcp's checks
//! (the Host and Origin headers, Origin always enforced, the protocol
//! version, the session id, the body's size) and its sessions, and answers the common requests itself,
//! once rmcp has checked them, in the connection's task:
//!
//! - `tools/list`, and a `tools/call` whose tool needs nothing from its
//!   client while it runs, are answered with one JSON body (the protocol
//!   lets a server answer so rather than with an event stream);
//! - such a call that reports what its client asked to hear (progress,
//!   log records) holds its first notification 10 ms ([`PROGRESS_GAP`],
//!   the gap within which reports merge anyway; seen when the call's task
//!   next runs, and at most a second): ended by then, it is answered with
//!   one event-stream body, its length known (what it reported, as it
//!   reaches the client at once: its log records in one notification and
//!   its latest progress report, [`relay::at_once`]; then its result);
//!   still running then, it goes on in a task of its own and
//!   answers with an event stream that carries its reports as they come,
//!   then its result;
//! - a call whose client hangs up still runs to its end and commits; it
//!   stops early only when the client cancels it
//!   (`notifications/cancelled`), as over rmcp's path.
//!
//! Everything else (a call that may need its client while it runs: an
//! approval, a question for its user or its model; resources; the
//! session's own stream) goes through rmcp.
//!
//! With [`Access::auth`], every request is admitted by its bearer token
//! first ([`super::auth`]), and an MCP session is its creator's alone:
//! another user naming it is answered as for a session that does not
//! exist. A directly answered call's
//! answer has no event id, so it cannot be resumed with `Last-Event-ID`: a
//! client that lost it retries the call with its key
//! ([`CALL_META_KEY`](super::CALL_META_KEY)) and gets the committed result.
//! Cost of a direct answer beyond the call: a lock of the sessions' map to
//! find the session's server, and the answer's serialization.

use std::cell::RefCell;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, Stream, StreamExt, stream};
use http_body_util::combinators::BoxBody;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientJsonRpcMessage, ClientNotification,
    ClientRequest, GetMeta, JsonRpcNotification, JsonRpcRequest, JsonRpcVersion2_0,
    ListToolsResult, ProgressToken, RequestId, RequestMetaObject, ServerJsonRpcMessage,
    ServerNotification, ServerResult,
};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::auth::{AuthError, Authenticator, Caller, METADATA_PATH};
use super::limits::{Permit, UserLimiter};
use super::relay::{self, PROGRESS_GAP, Relay};
use super::{McpServer, SessionOpener, ToolSet, arguments_text, lock};
use crate::policy::{DEFAULT_MAX_SESSIONS, UserLimits};
use crate::sandbox::CancelToken;

tokio::task_local! {
    /// What rmcp's layers leave for [`McpHttpService::handle`] while they
    /// serve one HTTP request, in the request's own task.
    static IN_REQUEST: RefCell<InRequest>;
}

/// See [`IN_REQUEST`].
#[derive(Default)]
struct InRequest {
    /// The server the session factory made for the `initialize` this
    /// request carries, for [`Sessions::create_session`] to file under its
    /// session's id (rmcp makes both in the request's task).
    made: Option<Weak<McpServer>>,
    /// The request's answer, when it was answered directly and at once:
    /// sent whole, as one JSON body, or (notifications before it) as one
    /// event-stream body, rather than through rmcp's stream.
    answer: Option<Whole>,
    /// Who the request comes from, when its token said.
    caller: Option<Caller>,
    /// The places of the MCP session this request may create, for
    /// [`Sessions::create_session`] to keep with it.
    place: Option<Place>,
}

/// An MCP session's places while it lives: one of the server's
/// [`Access::max_sessions`], and one of its user's `open_sessions` when
/// the policy counts them. Dropped with the session, they are free again.
struct Place {
    _server: tokio::sync::OwnedSemaphorePermit,
    _user: Option<Permit>,
}

/// Who may use an HTTP server, and how much of it.
#[derive(Debug, Clone)]
pub struct Access {
    /// Checks every request's bearer token; `None` asks for none (every
    /// request is the opener's user).
    pub auth: Option<Arc<Authenticator>>,
    /// What one user may use at once.
    pub limits: UserLimits,
    /// The most MCP sessions open at once, all users' together
    /// ([`DEFAULT_MAX_SESSIONS`] by default): an `initialize` past it is
    /// refused (503) until one ends.
    pub max_sessions: usize,
}

impl Default for Access {
    fn default() -> Self {
        Self {
            auth: None,
            limits: UserLimits::default(),
            max_sessions: DEFAULT_MAX_SESSIONS,
        }
    }
}

/// `airlock mcp`'s streamable HTTP service: each MCP session served by
/// its own [`McpServer`] (its Airlock session opened at the first request
/// that needs one), through rmcp, with the direct answers described in
/// the module's documentation.
pub struct McpHttpService {
    service: StreamableHttpService<Arc<McpServer>, Sessions>,
    sessions: Arc<Sessions>,
    tools: Arc<ToolSet>,
    auth: Option<Arc<Authenticator>>,
    /// Counts what each user uses; `None` when the policy sets no limit
    /// (nothing is counted then).
    limiter: Option<Arc<UserLimiter>>,
    /// The places of [`Access::max_sessions`] not taken.
    open: Arc<tokio::sync::Semaphore>,
    max_sessions: usize,
}

impl std::fmt::Debug for McpHttpService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHttpService").finish_non_exhaustive()
    }
}

impl McpHttpService {
    /// Serves `tools` with `config`; each MCP session's Airlock session is
    /// opened with `opener`. A session ends after `keep_alive` without a
    /// request, a call running or an event stream open ([`KEEP_ALIVE`] is
    /// the usual value). Starts the task that ends idle sessions, which
    /// looks every tenth of `keep_alive`, so it must be called within a
    /// Tokio runtime.
    ///
    /// A request whose `Origin` header is not among `config`'s
    /// `allowed_origins` is refused (403) before anything runs, whatever
    /// `config` says about enforcing it: a browser page of another site
    /// never reaches the tools. A request without the header is served.
    ///
    /// With `access.auth`, every request needs a valid bearer token
    /// (refused with 401 or 403 and a `WWW-Authenticate` challenge
    /// otherwise, before anything runs); an MCP session belongs to the
    /// user whose token created it, and a request of anyone else that
    /// names it is answered as for a session that does not exist.
    pub fn new(
        tools: Arc<ToolSet>,
        opener: SessionOpener,
        config: StreamableHttpServerConfig,
        keep_alive: Duration,
        access: Access,
    ) -> Self {
        let config = config.enforce_origin_validation();
        let sessions = Arc::new(Sessions::new(opener.user().unwrap_or_default().to_owned()));
        let limiter =
            (access.limits != UserLimits::default()).then(|| UserLimiter::new(access.limits));
        let (factory_tools, factory_limiter) = (Arc::clone(&tools), limiter.clone());
        let service = StreamableHttpService::new(
            move || {
                let owner = IN_REQUEST
                    .try_with(|now| now.borrow().caller.as_ref().map(|c| c.user.clone()))
                    .ok()
                    .flatten();
                let server = Arc::new(McpServer::lazy(
                    Arc::clone(&factory_tools),
                    opener.clone(),
                    owner,
                    factory_limiter.clone(),
                ));
                // A server made for a request of the stateless revision
                // (no session) is filed nowhere and served by rmcp alone.
                let _ = IN_REQUEST
                    .try_with(|now| now.borrow_mut().made = Some(Arc::downgrade(&server)));
                Ok(server)
            },
            Arc::clone(&sessions),
            config,
        );
        tokio::spawn(Sessions::expire(Arc::downgrade(&sessions), keep_alive));
        Self {
            service,
            sessions,
            tools,
            auth: access.auth,
            limiter,
            open: Arc::new(tokio::sync::Semaphore::new(access.max_sessions)),
            max_sessions: access.max_sessions,
        }
    }

    /// The places a new MCP session of `user` takes, or why not: the
    /// server holds as many sessions as it may (503), or the user does
    /// (429).
    fn admit(&self, user: &str) -> Result<Place, (hyper::StatusCode, String)> {
        let Ok(server) = Arc::clone(&self.open).try_acquire_owned() else {
            let full = format!(
                "Service Unavailable: this server holds {} MCP sessions, the most it may \
                 ([mcp] max_sessions); try again when one ends (DELETE) or idles out\n",
                self.max_sessions
            );
            return Err((hyper::StatusCode::SERVICE_UNAVAILABLE, full));
        };
        let user = match &self.limiter {
            None => None,
            Some(limiter) => match limiter.open_session(user) {
                Ok(permit) => Some(permit),
                Err(limit) => {
                    return Err((hyper::StatusCode::TOO_MANY_REQUESTS, limit.to_string()));
                }
            },
        };
        Ok(Place {
            _server: server,
            _user: user,
        })
    }

    /// Answers one HTTP request to the MCP endpoint, or, with
    /// authentication on, for the protected resource metadata
    /// ([`METADATA_PATH`], and that path followed by the endpoint's).
    pub async fn handle<B>(
        &self,
        request: hyper::Request<B>,
    ) -> hyper::Response<BoxBody<Bytes, Infallible>>
    where
        B: http_body::Body + Send + 'static,
        B::Error: std::fmt::Display,
    {
        let limit = read_deadline();
        let late = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut request = request.map(|body| Deadline {
            body: Box::pin(body),
            countdown: Countdown::new(limit),
            late: Arc::clone(&late),
        });
        if request.uri().path().starts_with(METADATA_PATH) {
            let Some(auth) = &self.auth else {
                let none =
                    "this server asks for no access token: it has no protected resource metadata\n";
                return text_response(hyper::StatusCode::NOT_FOUND, "text/plain", none, None);
            };
            let scopes = self
                .tools
                .current()
                .components()
                .iter()
                .flat_map(|c| c.scopes().iter().cloned())
                .collect();
            let body = auth.metadata(&scopes).to_string();
            return text_response(hyper::StatusCode::OK, "application/json", body, None);
        }
        let caller = match &self.auth {
            None => None,
            Some(auth) => {
                let header = request.headers().get(hyper::header::AUTHORIZATION);
                match auth.authenticate(header).await {
                    Ok(caller) => Some(caller),
                    Err(refused) => return refusal(auth, &refused),
                }
            }
        };
        let user = caller
            .as_ref()
            .map_or(self.sessions.default_user.as_str(), |c| c.user.as_str());
        let session = request
            .headers()
            .get("mcp-session-id")
            .and_then(|id| id.to_str().ok())
            .map(SessionId::from);
        let mut place = None;
        match &session {
            // Another user's session is one this user does not have.
            Some(id) if !self.sessions.owned_by(id, user) => {
                return text_response(
                    hyper::StatusCode::NOT_FOUND,
                    "text/plain",
                    "Not Found: Session not found",
                    None,
                );
            }
            Some(_) => {}
            // A POST without a session starts one (rmcp refuses anything
            // else that comes without).
            None if request.method() == hyper::Method::POST => match self.admit(user) {
                Ok(admitted) => place = Some(admitted),
                Err((status, why)) => return text_response(status, "text/plain", why, None),
            },
            None => {}
        }
        if let Some(caller) = &caller {
            request.extensions_mut().insert(caller.clone());
        }
        let now = InRequest {
            caller,
            place,
            ..InRequest::default()
        };
        let sessionless_post = session.is_none() && request.method() == hyper::Method::POST;
        let json_post = request.method() == hyper::Method::POST
            && request
                .headers()
                .get(hyper::header::CONTENT_TYPE)
                .and_then(|kind| kind.to_str().ok())
                .is_some_and(|kind| {
                    let kind = kind.trim_start().as_bytes();
                    kind.len() >= 16 && kind[..16].eq_ignore_ascii_case(b"application/json")
                });
        let served = async {
            let response = self.service.handle(request).await;
            match IN_REQUEST.with(|now| now.borrow_mut().answer.take()) {
                None if late.load(std::sync::atomic::Ordering::Relaxed) => {
                    let waited = limit.as_secs_f64();
                    let why = format!(
                        "Request Timeout: the request's body did not arrive within {waited} s\n"
                    );
                    closing(text_response(
                        hyper::StatusCode::REQUEST_TIMEOUT,
                        "text/plain",
                        why,
                        None,
                    ))
                }
                Some(Whole::Json(answer)) => json_response(&answer),
                Some(Whole::Events(messages)) => events_response(&messages),
                None if sessionless_post && response.status() == hyper::StatusCode::BAD_REQUEST => {
                    explain_sessionless(response).await
                }
                None if json_post
                    && response.status() == hyper::StatusCode::UNSUPPORTED_MEDIA_TYPE =>
                {
                    unreadable_body(response).await
                }
                None if response.status() == hyper::StatusCode::PAYLOAD_TOO_LARGE => {
                    closing(response)
                }
                None => response,
            }
        };
        IN_REQUEST.scope(RefCell::new(now), served).await
    }
}

/// What the two ways of calling without an MCP session are, for a POST
/// that is neither (rmcp says only "Session ID is required").
const SESSIONLESS: &str = "Bad Request: this request names no MCP session (no Mcp-Session-Id \
header). Either start one with `initialize` (protocol revisions up to 2025-11-25; the \
response's Mcp-Session-Id header names it, send it with every later request), or send \
the 2026-07-28 revision's stateless request: headers MCP-Protocol-Version: 2026-07-28, \
Mcp-Method (and Mcp-Name for tools/call), and in params._meta \
io.modelcontextprotocol/protocolVersion and io.modelcontextprotocol/clientCapabilities \
(airlock/session names the Airlock session). Examples: README, \"Serve over MCP\".\n";

/// `response`, rmcp's refusal of a POST without a session, with
/// [`SESSIONLESS`] in place of its one line; any other 400 as it was.
async fn explain_sessionless(
    response: hyper::Response<BoxBody<Bytes, Infallible>>,
) -> hyper::Response<BoxBody<Bytes, Infallible>> {
    use http_body_util::BodyExt;
    let (parts, body) = response.into_parts();
    let bytes = collected(body).await;
    if bytes.as_ref() == b"Bad Request: Session ID is required" {
        return text_response(parts.status, "text/plain", SESSIONLESS, None);
    }
    hyper::Response::from_parts(parts, http_body_util::Full::new(bytes).boxed())
}

/// All of `body`, one of rmcp's answers (a whole answer, read from memory).
async fn collected(body: BoxBody<Bytes, Infallible>) -> Bytes {
    use http_body_util::BodyExt;
    match body.collect().await {
        Ok(all) => all.to_bytes(),
        Err(never) => match never {},
    }
}

/// `response`, rmcp's refusal (415) of a POST whose body is JSON by its
/// content type but no JSON-RPC message rmcp can read (not JSON, a batch,
/// a request with a null id), answered as JSON-RPC over HTTP is and as
/// stdio answers it: 400, with a parse error (-32700, id null) whose
/// message is rmcp's account, cut to a few hundred bytes. A 415 for a
/// content type that is not JSON stays as it is.
async fn unreadable_body(
    response: hyper::Response<BoxBody<Bytes, Infallible>>,
) -> hyper::Response<BoxBody<Bytes, Infallible>> {
    let bytes = collected(response.into_body()).await;
    let said = crate::text::truncate(String::from_utf8_lossy(&bytes).trim(), 300);
    let error = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": -32700, "message": said },
    });
    text_response(
        hyper::StatusCode::BAD_REQUEST,
        "application/json",
        error.to_string(),
        None,
    )
}

/// The answer to a request whose token was refused: the status and
/// challenge `auth` gives for `refused`, and what was wrong as text.
fn refusal(
    auth: &Authenticator,
    refused: &AuthError,
) -> hyper::Response<BoxBody<Bytes, Infallible>> {
    let (status, challenge) = auth.challenge(refused);
    tracing::debug!(%status, error = %refused, "an MCP request was refused");
    let challenge = hyper::header::HeaderValue::from_str(&challenge).ok();
    text_response(status, "text/plain", format!("{refused}\n"), challenge)
}

/// A response of `status` with `body` of type `kind`, and a
/// `WWW-Authenticate` challenge when given.
fn text_response(
    status: hyper::StatusCode,
    kind: &'static str,
    body: impl Into<Bytes>,
    challenge: Option<hyper::header::HeaderValue>,
) -> hyper::Response<BoxBody<Bytes, Infallible>> {
    use http_body_util::BodyExt;
    let mut response = hyper::Response::new(http_body_util::Full::new(body.into()).boxed());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(kind),
    );
    if let Some(challenge) = challenge {
        headers.insert(hyper::header::WWW_AUTHENTICATE, challenge);
    }
    response
}

/// `answer` as a response of its own: one JSON body, its length known, so
/// that the client reads it in one go (the protocol lets a server answer a
/// request so instead of with an event stream).
fn json_response(answer: &ServerJsonRpcMessage) -> hyper::Response<BoxBody<Bytes, Infallible>> {
    let (status, kind, body) = match serde_json::to_vec(answer) {
        Ok(body) => (hyper::StatusCode::OK, "application/json", body),
        Err(e) => (
            hyper::StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("cannot write the answer: {e}").into_bytes(),
        ),
    };
    text_response(status, kind, body, None)
}

/// `messages` (notifications, then the answer) as a response of its own:
/// one event-stream body, its length known, each message an event without
/// an id (as a JSON answer, it cannot be resumed: a client that lost it
/// retries the call with its key).
fn events_response(
    messages: &[ServerJsonRpcMessage],
) -> hyper::Response<BoxBody<Bytes, Infallible>> {
    let mut body = Vec::with_capacity(EVENTS_BODY);
    for message in messages {
        body.extend_from_slice(b"data: ");
        if let Err(e) = write_message(&mut body, message) {
            let error = format!("cannot write the answer: {e}");
            let status = hyper::StatusCode::INTERNAL_SERVER_ERROR;
            return text_response(status, "text/plain", error, None);
        }
        body.extend_from_slice(b"\n\n");
    }
    let mut response = text_response(hyper::StatusCode::OK, "text/event-stream", body, None);
    response.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-cache"),
    );
    response
}

/// `result` in the shape its client's revision has (`current`: 2026-07-28
/// or later, [`McpServer::current_revision`]), as rmcp shapes the results
/// it sends itself, for one this server sends past rmcp: for an earlier
/// revision, without `resultType: "complete"` and non-object output; from
/// it on, with the caching hints it requires.
fn fit(result: &mut ServerResult, current: bool) {
    if current {
        result.fill_missing_cache_hints();
    } else {
        result.strip_result_type_for_legacy_peer();
        result.strip_non_object_output_for_legacy_peer();
    }
}

/// What an event-stream body is first given room for: a call's merged
/// log records, its latest progress report and a short result, without
/// growing it (each growth copies what was written).
const EVENTS_BODY: usize = 4096;

/// Writes `message` as JSON to `body`. A progress or log notification
/// with no `_meta` (the kind a relay makes) is written straight from its
/// parameters: rmcp writes a notification's parameters through a
/// `serde_json::Value` first, to merge metadata it may carry, which copies
/// all of them (a merged log's whole text). The JSON is the same.
fn write_message(body: &mut Vec<u8>, message: &ServerJsonRpcMessage) -> serde_json::Result<()> {
    /// A notification without metadata, as JSON-RPC writes it.
    #[derive(serde::Serialize)]
    struct Plain<'a, M, P> {
        jsonrpc: JsonRpcVersion2_0,
        method: &'a M,
        params: &'a P,
    }
    fn plain<M: serde::Serialize, P: serde::Serialize>(
        body: &mut Vec<u8>,
        method: &M,
        params: &P,
    ) -> serde_json::Result<()> {
        let jsonrpc = JsonRpcVersion2_0;
        serde_json::to_writer(
            body,
            &Plain {
                jsonrpc,
                method,
                params,
            },
        )
    }
    let ServerJsonRpcMessage::Notification(JsonRpcNotification { notification, .. }) = message
    else {
        return serde_json::to_writer(body, message);
    };
    match notification {
        ServerNotification::ProgressNotification(note)
            if note.extensions.is_empty() && note.params.meta.is_none() =>
        {
            plain(body, &note.method, &note.params)
        }
        #[allow(deprecated)] // logging: see `relay`
        ServerNotification::LoggingMessageNotification(note)
            if note.extensions.is_empty() && note.params.meta.is_none() =>
        {
            plain(body, &note.method, &note.params)
        }
        _ => serde_json::to_writer(body, message),
    }
}

/// How long a connection may take to send a request's headers, or stay
/// idle between requests (the binary's connections), and how long a
/// request's body may take to arrive once its headers have
/// ([`McpHttpService::handle`]): past it the request is answered 408 and
/// its connection closed, so a client that sends its body a byte at a
/// time, or never, holds no connection for good.
pub const READ_DEADLINE: Duration = Duration::from_secs(30);

/// [`READ_DEADLINE`], or, in a build with the `test-hooks` feature, the
/// milliseconds `AIRLOCK_TEST_HEADER_READ_MS` says.
pub fn read_deadline() -> Duration {
    #[cfg(feature = "test-hooks")]
    if let Some(ms) = std::env::var("AIRLOCK_TEST_HEADER_READ_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
    {
        return Duration::from_millis(ms);
    }
    READ_DEADLINE
}

/// A wait bounded by `limit`, counted from the first time it is waited
/// on: no timer is set until then, so what never waits costs nothing.
struct Countdown {
    limit: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Countdown {
    fn new(limit: Duration) -> Self {
        Self { limit, sleep: None }
    }

    /// Whether `limit` has passed since the first wait after the last
    /// [`Countdown::stop`] (the timer set now if none runs); when not, `cx`
    /// is woken once it has.
    fn passed(&mut self, cx: &mut Context<'_>) -> bool {
        let limit = self.limit;
        self.sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)))
            .as_mut()
            .poll(cx)
            .is_ready()
    }

    /// The wait is over: the next one counts from its own start.
    fn stop(&mut self) {
        self.sleep = None;
    }
}

impl std::fmt::Debug for Countdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Countdown")
            .field("limit", &self.limit)
            .field("waiting", &self.sleep.is_some())
            .finish()
    }
}

/// A request's body that ends in an error once its countdown has passed
/// since it was first waited for (its handler read it and it had not
/// come; it is read as soon as its headers are) before its last frame
/// came, saying so in `late` (checked after the request is handled).
/// Cost: a timer only for a body that is waited for; one that is there
/// when read, as most are, sets none.
struct Deadline<B> {
    body: Pin<Box<B>>,
    countdown: Countdown,
    late: Arc<std::sync::atomic::AtomicBool>,
}

/// Why a [`Deadline`] body failed.
#[derive(Debug, thiserror::Error)]
enum BodyError<E> {
    #[error("{0}")]
    Read(E),
    #[error("the request's body did not arrive within {} s", .0.as_secs_f64())]
    Late(Duration),
}

impl<B: http_body::Body> http_body::Body for Deadline<B> {
    type Data = B::Data;
    type Error = BodyError<B::Error>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = self.body.as_mut().poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(BodyError::Read)));
        }
        if !self.countdown.passed(cx) {
            return Poll::Pending;
        }
        self.late.store(true, std::sync::atomic::Ordering::Relaxed);
        Poll::Ready(Some(Err(BodyError::Late(self.countdown.limit))))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A connection (`io`) whose writes fail once one has waited `limit` for
/// its client to read: a client that stops reading its answer (or its
/// event stream) loses its connection, and the server what it held for
/// it, rather than holding both for good. Each write that goes through
/// starts the wait anew; a timer is set only while a write waits. Reads
/// pass through. `airlock mcp --transport http` serves each connection
/// through one, with [`read_deadline`].
#[derive(Debug)]
pub struct WriteDeadline<S> {
    io: S,
    countdown: Countdown,
}

impl<S> WriteDeadline<S> {
    /// `io`, its writes bounded by `limit`.
    pub fn new(io: S, limit: Duration) -> Self {
        Self {
            io,
            countdown: Countdown::new(limit),
        }
    }

    /// What a write that `went` gives: its outcome once it is ready (the
    /// wait over), an error once it has waited `limit`.
    fn waited<T>(
        &mut self,
        cx: &mut Context<'_>,
        went: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if went.is_ready() {
            self.countdown.stop();
            return went;
        }
        if !self.countdown.passed(cx) {
            return Poll::Pending;
        }
        Poll::Ready(Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the client read nothing for {} s while its answer waited",
                self.countdown.limit.as_secs_f64()
            ),
        )))
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let went = Pin::new(&mut self.io).poll_write(cx, buf);
        self.waited(cx, went)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let went = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.waited(cx, went)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let went = Pin::new(&mut self.io).poll_flush(cx);
        self.waited(cx, went)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let went = Pin::new(&mut self.io).poll_shutdown(cx);
        self.waited(cx, went)
    }
}

/// How long a session lives without a request, unless told otherwise
/// (rmcp's own default; `airlock mcp --idle-timeout`): it ends then, and
/// its Airlock session's lease with it. A call running, or an event stream
/// the client holds open (its standalone GET stream, a resumed stream, a
/// request rmcp answers with a stream), keeps it alive.
pub const KEEP_ALIVE: Duration = Duration::from_secs(300);

/// rmcp's in-memory sessions (their own idle timer off: a directly
/// answered request never reaches rmcp's worker), and what Airlock keeps
/// of each.
struct Sessions {
    local: LocalSessionManager,
    known: Arc<Mutex<HashMap<SessionId, Known>>>,
    /// The owner of a session no token's user created.
    default_user: String,
}

/// What [`Sessions`] keeps of one session.
struct Known {
    /// Its server, held weakly: rmcp's worker owns it, and the Airlock
    /// session's lease ends when rmcp drops it (DELETE, or the session's
    /// end). A direct call holds it for as long as it runs. `None` if
    /// rmcp made it elsewhere than in the request that created the session
    /// (then rmcp alone serves the session).
    server: Option<Weak<McpServer>>,
    /// When its last request came.
    last: Instant,
    /// Its directly answered calls running, to cancel when their client
    /// says so.
    running: HashMap<RequestId, CancelToken>,
    /// Its event streams open now ([`Sessions::held_open`]).
    streams: usize,
    /// The user whose request created it: only their requests reach it.
    owner: String,
    /// Its places among the server's sessions and its owner's.
    _place: Option<Place>,
}

impl Known {
    /// A session whose last request came at `last`, nothing running.
    fn new(server: Option<Weak<McpServer>>, last: Instant) -> Self {
        Self {
            server,
            last,
            running: HashMap::new(),
            streams: 0,
            owner: String::new(),
            _place: None,
        }
    }
}

impl Sessions {
    fn new(default_user: String) -> Self {
        let mut local = LocalSessionManager::default();
        local.session_config.keep_alive = None;
        Self {
            local,
            known: Arc::default(),
            default_user,
        }
    }

    /// Whether session `id` is `user`'s, or unknown here (for rmcp to
    /// answer as it does an unknown session).
    fn owned_by(&self, id: &SessionId, user: &str) -> bool {
        lock(&self.known).get(id).is_none_or(|k| k.owner == user)
    }

    /// Notes a request to session `id`; its server, if it has one.
    fn touch(&self, id: &SessionId) -> Option<Arc<McpServer>> {
        let mut known = lock(&self.known);
        let known = known.get_mut(id)?;
        known.last = Instant::now();
        known.server.as_ref().and_then(Weak::upgrade)
    }

    /// The sessions without a request for `keep_alive` before `now`, no
    /// call running and no event stream open, forgotten here (for rmcp to
    /// close).
    fn idle(&self, now: Instant, keep_alive: Duration) -> Vec<SessionId> {
        let mut known = lock(&self.known);
        let idle: Vec<SessionId> = known
            .iter()
            .filter(|(id, k)| {
                if now.saturating_duration_since(k.last) < keep_alive {
                    return false;
                }
                let kept = !k.running.is_empty() || k.streams > 0;
                if kept {
                    tracing::debug!(
                        session = %id,
                        calls = k.running.len(),
                        streams = k.streams,
                        "an MCP session past its idle timeout is kept: a call runs or a stream is open"
                    );
                }
                !kept
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &idle {
            known.remove(id);
        }
        idle
    }

    /// `stream`, to the client of session `id`, counted as open (so the
    /// session is not idle) until it is dropped; its idle time counts from
    /// then.
    fn held_open<S: Stream + Send + Sync + 'static>(
        &self,
        id: &SessionId,
        stream: S,
    ) -> impl Stream<Item = S::Item> + Send + Sync + 'static {
        let open = OpenStream::new(&self.known, id);
        stream.map(move |item| {
            let _counted = &open;
            item
        })
    }

    /// Ends the sessions idle for `keep_alive`, looking every tenth of it
    /// (at most every millisecond), while `sessions` is served.
    async fn expire(sessions: Weak<Sessions>, keep_alive: Duration) {
        let mut every = tokio::time::interval((keep_alive / 10).max(Duration::from_millis(1)));
        loop {
            every.tick().await;
            let Some(sessions) = sessions.upgrade() else {
                return;
            };
            for id in sessions.idle(Instant::now(), keep_alive) {
                tracing::debug!(session = %id, "an idle MCP session ends");
                if let Err(e) = sessions.local.close_session(&id).await {
                    tracing::debug!(session = %id, error = %e, "cannot close an idle MCP session");
                }
            }
        }
    }

    /// The answer to `request` from `server` when it needs nothing from
    /// the client while it runs; else the request, for rmcp.
    async fn answer(
        &self,
        id: &SessionId,
        server: Arc<McpServer>,
        request: JsonRpcRequest<ClientRequest>,
    ) -> Result<Answer, JsonRpcRequest<ClientRequest>> {
        let meta = request.request.get_meta();
        let caller = IN_REQUEST
            .try_with(|now| now.borrow().caller.clone())
            .ok()
            .flatten();
        match &request.request {
            // A list request with a cursor goes through rmcp, to be
            // refused there (`first_page`).
            ClientRequest::ListToolsRequest(list)
                if list.params.as_ref().is_none_or(|p| p.cursor.is_none()) =>
            {
                let tools = ListToolsResult::with_all_items(server.tool_list(caller.as_ref()));
                let mut result = ServerResult::ListToolsResult(tools);
                fit(&mut result, server.current_revision(meta));
                Ok(Answer::Now(Box::new(ServerJsonRpcMessage::response(
                    result, request.id,
                ))))
            }
            // A call that may become a task goes through rmcp
            // ([`super::tasks`]), and so does one whose progress token is
            // malformed, to be refused there.
            ClientRequest::CallToolRequest(call)
                if !server.needs_client(&call.params.name)
                    && !super::tasks::declares_tasks(meta) =>
            {
                let Ok(token) = super::progress_token(meta) else {
                    return Err(request);
                };
                let asked = (&call.params, meta, token);
                Ok(self.call(id, server, asked, &request.id, caller).await)
            }
            _ => Err(request),
        }
    }

    /// Runs call `request` of session `id` (its params, its `_meta` and
    /// the progress token read from that, once) in this request's task,
    /// answered with one JSON body. One that reports something its client
    /// asked to hear (progress, with a progress token; log records, at the
    /// session's level) and ends within [`PROGRESS_GAP`] of its first
    /// notification is answered with one event-stream body; one that runs
    /// on goes on in a task of its own and answers with an event stream:
    /// what it reports ([`Relay`]), then its result.
    async fn call(
        &self,
        id: &SessionId,
        server: Arc<McpServer>,
        (params, meta, token): (
            &CallToolRequestParams,
            &RequestMetaObject,
            Option<ProgressToken>,
        ),
        request: &RequestId,
        caller: Option<Caller>,
    ) -> Answer {
        let tool = params.name.to_string();
        // A tool that may ask its person or the model never comes here
        // (see `answer`).
        let (relay, cancel) = Relay::new(&tool, token, &server.log_threshold, None, None);
        let running = self.running(id, request, &cancel);
        let current = server.current_revision(meta);
        // The call's seconds, counted for its relay.
        let relay = relay.map(|relay| (relay, server.tools.seconds.listen()));
        let work = {
            let (name, arguments) = (tool.clone(), arguments_text(params.arguments.clone()));
            let (meta, request) = (meta.clone(), request.clone());
            async move {
                let _running = running;
                server
                    .run_call(&name, arguments, &meta, &request, cancel, caller.as_ref())
                    .await
            }
        };
        let request = request.clone();
        let mut work = RunsToEnd(Some(Box::pin(work)));
        let answer = move |result| {
            let mut result = ServerResult::from(CallToolResponse::from(result));
            fit(&mut result, current);
            Box::new(ServerJsonRpcMessage::response(result, request.clone()))
        };
        let Some((relay, mut seconds)) = relay else {
            return Answer::Now(answer(work.await));
        };
        // What the call reports is held for PROGRESS_GAP after its first
        // notification, as seen the first time this task runs after it (the
        // call reports again, its wasm yields, a read it waits for is done),
        // and at most until its first second (the server's clock's first
        // tick a second after it began): a call that ends by then is
        // answered whole, its notifications and result in one body; one
        // that runs on streams them. No timer is set for the call: one
        // earlier than any the runtime has wakes the worker parked on its
        // timer driver, which costs a short call more than its notes.
        let mut held: Vec<ServerNotification> = Vec::new();
        let mut since: Option<std::time::Instant> = None;
        let first = loop {
            let past_gap = std::future::poll_fn(|_| {
                if since.is_some_and(|at| at.elapsed() >= PROGRESS_GAP) {
                    std::task::Poll::Ready(())
                } else {
                    std::task::Poll::Pending
                }
            });
            tokio::select! {
                biased;
                result = relay.polling(&mut work) => {
                    held.extend(relay.rest());
                    if held.is_empty() {
                        return Answer::Now(answer(result));
                    }
                    let mut messages: Vec<ServerJsonRpcMessage> = relay::at_once(held)
                        .into_iter()
                        .map(ServerJsonRpcMessage::notification)
                        .collect();
                    messages.push(*answer(result));
                    return Answer::Ended(messages);
                }
                notes = relay.ready() => {
                    held.extend(notes);
                    since.get_or_insert_with(std::time::Instant::now);
                }
                () = past_gap => break held,
                ran = seconds.next() => {
                    held.extend(relay.tick(ran));
                    break held;
                }
            }
        };
        let (mut sender, receiver) = futures::channel::mpsc::channel(RELAYED);
        tokio::spawn(async move {
            for note in first {
                let _ = sender.try_send(event(note));
            }
            // A client that reads slower than the call reports misses
            // reports; the call goes on, never waiting on its client.
            let relayed = |note| {
                let _ = sender.try_send(event(note));
                std::future::ready(())
            };
            let result = relay.run(work, seconds, relayed).await;
            // A client gone has nothing to be told.
            let _ = sender
                .send(ServerSseMessage::from_message(*answer(result)))
                .await;
        });
        Answer::Later(receiver)
    }

    /// Files call `request` of session `id` as running until the guard is
    /// dropped.
    fn running(&self, id: &SessionId, request: &RequestId, cancel: &CancelToken) -> Running {
        if let Some(known) = lock(&self.known).get_mut(id) {
            known.running.insert(request.clone(), cancel.clone());
        }
        Running {
            known: Arc::clone(&self.known),
            id: id.clone(),
            request: request.clone(),
        }
    }
}

/// How many notifications of a call may wait for a slow client before the
/// next are dropped.
const RELAYED: usize = 64;

/// `note` as an event of a call's stream.
fn event(note: ServerNotification) -> ServerSseMessage {
    ServerSseMessage::from_message(ServerJsonRpcMessage::notification(note))
}

/// A directly answered request's answer.
enum Answer {
    /// Ready.
    Now(Box<ServerJsonRpcMessage>),
    /// A call that ended: what it reported, then its answer, all ready.
    Ended(Vec<ServerJsonRpcMessage>),
    /// A long call's progress reports, then its answer.
    Later(futures::channel::mpsc::Receiver<ServerSseMessage>),
}

/// `response`, sent before its request's body was read to its end (a body
/// over the bound), marked `Connection: close`: the connection cannot
/// carry another request after a body left half read, and a client told
/// so opens a new one for its next request rather than send it down one
/// the server is closing.
fn closing<B>(mut response: hyper::Response<B>) -> hyper::Response<B> {
    response.headers_mut().insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    response
}

/// A directly answered call's entry in [`Known::running`], removed as the
/// call ends (and the session's idle time counted from then).
struct Running {
    known: Arc<Mutex<HashMap<SessionId, Known>>>,
    id: SessionId,
    request: RequestId,
}

impl Drop for Running {
    fn drop(&mut self) {
        ended(&self.known, &self.id, |known| {
            known.running.remove(&self.request);
        });
    }
}

/// Something that kept session `id` busy has ended: `end` takes it out of
/// the session's entry, whose idle time counts from now.
fn ended(known: &Mutex<HashMap<SessionId, Known>>, id: &SessionId, end: impl FnOnce(&mut Known)) {
    if let Some(known) = lock(known).get_mut(id) {
        end(known);
        known.last = Instant::now();
    }
}

/// An event stream's count in [`Known::streams`], taken back as the
/// stream is dropped (the client gone or the stream ended), and the
/// session's idle time counted from then.
struct OpenStream {
    known: Arc<Mutex<HashMap<SessionId, Known>>>,
    id: SessionId,
}

impl OpenStream {
    fn new(known: &Arc<Mutex<HashMap<SessionId, Known>>>, id: &SessionId) -> Self {
        if let Some(session) = lock(known).get_mut(id) {
            session.streams += 1;
        }
        Self {
            known: Arc::clone(known),
            id: id.clone(),
        }
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        ended(&self.known, &self.id, |known| {
            known.streams = known.streams.saturating_sub(1);
        });
    }
}

/// An answer sent whole by [`McpHttpService::handle`].
enum Whole {
    /// One JSON body.
    Json(Box<ServerJsonRpcMessage>),
    /// One event-stream body: notifications, then the answer.
    Events(Vec<ServerJsonRpcMessage>),
}

/// Leaves `answer` for [`McpHttpService::handle`] to send whole; outside
/// it (no request in flight), its messages, for rmcp's stream.
fn whole(answer: Whole) -> Vec<ServerSseMessage> {
    let mut answer = Some(answer);
    let _ = IN_REQUEST.try_with(|now| now.borrow_mut().answer = answer.take());
    match answer {
        None => Vec::new(),
        Some(Whole::Json(message)) => vec![ServerSseMessage::from_message(*message)],
        Some(Whole::Events(messages)) => messages
            .into_iter()
            .map(ServerSseMessage::from_message)
            .collect(),
    }
}

/// A call's work, run to its end even when the request's task drops it
/// (its client hung up): the rest is spawned. A journaled call stopped
/// between its steps would leave the session's state behind its journal.
struct RunsToEnd<F: Future + Send + 'static>(Option<Pin<Box<F>>>);

impl<F: Future + Send + 'static> Future for RunsToEnd<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(work) = self.0.as_mut() else {
            return Poll::Pending;
        };
        let done = work.as_mut().poll(cx);
        if done.is_ready() {
            self.0 = None;
        }
        done
    }
}

impl<F: Future + Send + 'static> Drop for RunsToEnd<F> {
    fn drop(&mut self) {
        if let Some(rest) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                rest.await;
            });
        }
    }
}

impl SessionManager for Sessions {
    type Error = <LocalSessionManager as SessionManager>::Error;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (server, owner, place) = IN_REQUEST
            .try_with(|now| {
                let mut now = now.borrow_mut();
                let owner = now.caller.as_ref().map(|c| c.user.clone());
                (now.made.take(), owner, now.place.take())
            })
            .unwrap_or_default();
        let (id, transport) = self.local.create_session().await?;
        let mut known = Known::new(server, Instant::now());
        known.owner = owner.unwrap_or_else(|| self.default_user.clone());
        known._place = place;
        lock(&self.known).insert(id.clone(), known);
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.local.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.local.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        lock(&self.known).remove(id);
        self.local.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let message = match (message, self.touch(id)) {
            (ClientJsonRpcMessage::Request(request), Some(server)) => {
                match self.answer(id, server, request).await {
                    Ok(Answer::Now(answer)) => {
                        // Within `handle`, the answer goes out as JSON and
                        // rmcp's event stream is left empty.
                        let answers = whole(Whole::Json(answer));
                        return Ok(stream::iter(answers).left_stream().left_stream());
                    }
                    Ok(Answer::Ended(messages)) => {
                        // Within `handle`, one event-stream body.
                        let answers = whole(Whole::Events(messages));
                        return Ok(stream::iter(answers).left_stream().left_stream());
                    }
                    Ok(Answer::Later(answers)) => return Ok(answers.right_stream().left_stream()),
                    Err(request) => ClientJsonRpcMessage::Request(request),
                }
            }
            (message, _) => message,
        };
        let stream = self.local.create_stream(id, message).await?;
        Ok(self.held_open(id, stream).right_stream())
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.touch(id);
        if let ClientJsonRpcMessage::Notification(notification) = &message
            && let ClientNotification::CancelledNotification(cancelled) = &notification.notification
            && let Some(request) = &cancelled.params.request_id
            && let Some(known) = lock(&self.known).get(id)
            && let Some(call) = known.running.get(request)
        {
            call.cancel();
        }
        self.local.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        let stream = self.local.create_standalone_stream(id).await?;
        Ok(self.held_open(id, stream))
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        let stream = self.local.resume(id, last_event_id).await?;
        Ok(self.held_open(id, stream))
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.local.restore_session(id).await
    }

    fn event_store(
        &self,
    ) -> Option<Arc<dyn rmcp::transport::streamable_http_server::session::EventStore>> {
        self.local.event_store()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(deprecated)] // logging: see `relay`
    fn notifications_written_straight_are_the_json_rmcp_writes() {
        use rmcp::model::{
            LoggingLevel, LoggingMessageNotificationParam, Notification, NotificationMetaObject,
            NumberOrString, ProgressNotificationParam, ProgressToken,
        };
        let token = ProgressToken(NumberOrString::String("p".into()));
        let mut meta = NotificationMetaObject::default();
        meta.insert("k".into(), serde_json::json!(1));
        let mut with_meta = ProgressNotificationParam::new(token.clone(), 2.0);
        with_meta.meta = Some(meta);
        let notes = [
            ServerNotification::ProgressNotification(Notification::new(
                ProgressNotificationParam::new(token.clone(), 3.5)
                    .with_total(4.0)
                    .with_message("step \"3\"\n"),
            )),
            ServerNotification::ProgressNotification(Notification::new(
                ProgressNotificationParam::new(ProgressToken(NumberOrString::Number(7)), 1.0),
            )),
            ServerNotification::ProgressNotification(Notification::new(with_meta)),
            ServerNotification::LoggingMessageNotification(Notification::new(
                LoggingMessageNotificationParam::new(LoggingLevel::Warning, "a\nb".into())
                    .with_logger("chatty"),
            )),
            ServerNotification::LoggingMessageNotification(Notification::new(
                LoggingMessageNotificationParam::new(
                    LoggingLevel::Info,
                    serde_json::json!({"x": [1]}),
                ),
            )),
        ];
        for note in notes {
            let message = ServerJsonRpcMessage::notification(note);
            let mut body = Vec::new();
            write_message(&mut body, &message).unwrap();
            let written: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(written, serde_json::to_value(&message).unwrap());
            assert_eq!(written["jsonrpc"], "2.0", "{written}");
        }
    }

    #[test]
    fn a_session_idle_past_keep_alive_ends_unless_a_call_runs() {
        let sessions = Sessions::new(String::new());
        let start = Instant::now();
        let known = |last: Instant, running: bool| {
            let mut known = Known::new(None, last);
            if running {
                known
                    .running
                    .insert(RequestId::Number(1), CancelToken::new());
            }
            known
        };
        {
            let mut all = lock(&sessions.known);
            all.insert("idle".into(), known(start, false));
            all.insert("calling".into(), known(start, true));
            all.insert(
                "recent".into(),
                known(start + Duration::from_secs(60), false),
            );
        }
        let later = start + KEEP_ALIVE;
        assert_eq!(sessions.idle(later, KEEP_ALIVE), [SessionId::from("idle")]);
        let mut left: Vec<SessionId> = lock(&sessions.known).keys().cloned().collect();
        left.sort();
        assert_eq!(left, [SessionId::from("calling"), "recent".into()]);
        assert!(sessions.idle(later, KEEP_ALIVE).is_empty());
    }

    /// A client holding its event stream open (a GET to listen for the
    /// server's messages) is not idle, however long since its last
    /// request; once the stream is gone, its idle time counts from then.
    #[tokio::test]
    async fn a_session_with_an_open_stream_is_not_idle() {
        let sessions = Sessions::new(String::new());
        let start = Instant::now();
        let id = SessionId::from("listening");
        lock(&sessions.known).insert(id.clone(), Known::new(None, start));
        let mut stream = Box::pin(sessions.held_open(&id, stream::iter([1, 2])));
        assert_eq!(stream.next().await, Some(1));
        let later = start + KEEP_ALIVE * 2;
        assert!(sessions.idle(later, KEEP_ALIVE).is_empty());
        drop(stream);
        let closed = lock(&sessions.known)[&id].last;
        assert!(closed >= start);
        assert!(sessions.idle(closed, KEEP_ALIVE).is_empty());
        assert_eq!(sessions.idle(closed + KEEP_ALIVE, KEEP_ALIVE), [id]);
    }

    /// However short the keep-alive a caller gives, the task that ends
    /// idle sessions runs (and ends when the sessions are gone) instead of
    /// panicking on a zero period.
    #[tokio::test]
    async fn the_idle_check_runs_with_any_keep_alive() {
        for keep_alive in [Duration::ZERO, Duration::from_nanos(1), KEEP_ALIVE] {
            let sessions = Arc::new(Sessions::new(String::new()));
            let expiring = tokio::spawn(Sessions::expire(Arc::downgrade(&sessions), keep_alive));
            drop(sessions);
            expiring.await.expect("the idle check does not panic");
        }
    }
}
