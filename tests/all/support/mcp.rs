//! `airlock mcp` for the tests: a policy to serve, the server over HTTP on
//! a free port, and rmcp's client.

use std::path::Path;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{Peer, RunningService};
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;

use super::{airlock_command, guest};

/// An MCP client session (rmcp's).
pub type Client = RunningService<RoleClient, ()>;

/// Starts `airlock mcp` with `args` over stdio and connects `handler` as
/// its client; also returns the server's pid.
pub async fn connect_with<H: rmcp::ClientHandler>(
    handler: H,
    args: &[&str],
) -> (RunningService<RoleClient, H>, u32) {
    let mut all = vec!["mcp"];
    all.extend_from_slice(args);
    connect_command(handler, airlock_command(&all, &[])).await
}

/// Starts `airlock mcp` with `args` over stdio and connects `handler` as
/// a client of the 2026-07-28 revision (`server/discover`, no
/// `initialize`).
pub async fn connect_2026<H: rmcp::ClientHandler>(
    handler: H,
    args: &[&str],
) -> RunningService<RoleClient, H> {
    use rmcp::service::ClientServiceExt;
    let mut all = vec!["mcp"];
    all.extend_from_slice(args);
    let command = tokio::process::Command::from(airlock_command(&all, &[]));
    let transport = rmcp::transport::TokioChildProcess::new(command).expect("airlock mcp starts");
    handler
        .serve_with_lifecycle(transport, discovering())
        .await
        .expect("discover")
}

/// How a client of the 2026-07-28 revision starts: `server/discover`, no
/// `initialize`.
pub fn discovering() -> rmcp::ClientLifecycleMode {
    rmcp::ClientLifecycleMode::Discover {
        preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
    }
}

/// The session's deps, as the server's deps resource reads them.
pub async fn deps(client: &Peer<RoleClient>) -> Value {
    let read = client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            "airlock://session/deps",
        ))
        .await
        .unwrap();
    let doc = serde_json::to_value(&read.contents).unwrap();
    serde_json::from_str(doc[0]["text"].as_str().unwrap()).unwrap()
}

/// Starts `command` (an `airlock mcp` over stdio) and connects `handler`
/// as its client; also returns the server's pid.
pub async fn connect_command<H: rmcp::ClientHandler>(
    handler: H,
    command: std::process::Command,
) -> (RunningService<RoleClient, H>, u32) {
    let command = tokio::process::Command::from(command);
    let transport = rmcp::transport::TokioChildProcess::new(command).expect("airlock mcp starts");
    let pid = transport.id().expect("the server has a pid");
    (handler.serve(transport).await.expect("initialize"), pid)
}

/// Starts `command` (an `airlock mcp` over stdio) and connects `handler`
/// as its client; the server's notes (its stderr), line by line.
pub async fn connect_noting<H: rmcp::ClientHandler>(
    handler: H,
    command: std::process::Command,
) -> (
    RunningService<RoleClient, H>,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let command = tokio::process::Command::from(command);
    let (transport, stderr) = rmcp::transport::TokioChildProcess::builder(command)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("airlock mcp starts");
    let noted = notes_of(stderr.expect("stderr is piped"));
    (handler.serve(transport).await.expect("initialize"), noted)
}

/// A server's notes (`stderr`, its stderr), line by line as they come.
pub fn notes_of(
    stderr: tokio::process::ChildStderr,
) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (notes, noted) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = notes.send(line);
        }
    });
    noted
}

/// Waits (up to 60 s) for a note containing `needle`; the note.
pub async fn wait_for_note(
    noted: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    needle: &str,
) -> String {
    loop {
        let note = tokio::time::timeout(std::time::Duration::from_secs(60), noted.recv())
            .await
            .unwrap_or_else(|_| panic!("no note containing {needle:?}"))
            .expect("the server is running");
        if note.contains(needle) {
            return note;
        }
    }
}

/// A client that counts `notifications/tools/list_changed`.
#[derive(Clone, Default)]
pub struct Watching {
    changes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl rmcp::ClientHandler for Watching {
    async fn on_tool_list_changed(&self, _context: rmcp::service::NotificationContext<RoleClient>) {
        self.changes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Watching {
    /// How many tools/list_changed it has seen.
    pub fn changes(&self) -> usize {
        self.changes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Waits (up to 60 s) for `watching` to have seen `n` tools/list_changed.
pub async fn wait_for_changes(watching: &Watching, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while watching.changes() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "no tools/list_changed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// [`connect_with`] a client that handles nothing.
pub async fn connect(args: &[&str]) -> (Client, u32) {
    connect_with((), args).await
}

/// A policy with the stateful tool, the hostile one (a short timeout, but
/// `spin_long` calls are cancelled long before theirs) and an approval tool.
pub fn policy(dir: &Path) -> String {
    policy_spinning(dir, 500)
}

/// [`policy`], with `spin` stopped after `timeout_ms`.
pub fn policy_spinning(dir: &Path, timeout_ms: u64) -> String {
    let path = dir.join("airlock.toml");
    std::fs::write(
        &path,
        format!(
            "[[tool]]\npath = {:?}\n\n[[tool]]\npath = {:?}\nlimits = {{ timeout_ms = {timeout_ms} }}\n\n\
             [[tool]]\npath = {:?}\napproval = \"ask\"\n",
            guest("stateful"),
            guest("hostile"),
            guest("context_probe"),
        ),
    )
    .unwrap();
    path.to_str().unwrap().to_owned()
}

/// A `tools/call` whose `_meta` is `meta`.
pub async fn call_with(
    client: &Peer<RoleClient>,
    meta: serde_json::Map<String, Value>,
    name: &str,
    args: Value,
) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    let mut params = CallToolRequestParams::new(name.to_owned()).with_arguments(args);
    if !meta.is_empty() {
        params.meta = Some(meta.into());
    }
    client
        .call_tool(params)
        .await
        .expect("a tools/call is answered, never a protocol error")
}

/// `airlock mcp --transport http` on a free port: where it listens. It is
/// killed (and reaped) when dropped, so a failing test leaves no server
/// behind.
#[derive(Debug)]
pub struct HttpServer {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    /// What it writes to stderr after the line saying where it listens
    /// ([`wait_for_note`]).
    pub notes: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl HttpServer {
    /// Whether it has ended (and is reaped).
    pub fn exited(&mut self) -> bool {
        self.ended().is_some()
    }

    /// How it ended, once it has (and is reaped).
    fn ended(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// How it ended, waiting for that at most `within` (a failure past it).
    pub fn ended_within(&mut self, within: std::time::Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.ended() {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the server did not end within {within:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// `127.0.0.1:PORT`: where to open a connection of one's own.
    pub fn address(&self) -> String {
        self.url
            .trim_start_matches("http://")
            .trim_end_matches("/mcp")
            .to_owned()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it (SIGKILL) and waits for it to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `airlock mcp --transport http` on a free port, its sessions in `store`
/// (a file or a URL).
pub fn serve_http(config: &str, store: &str) -> HttpServer {
    serve_http_with(&["--config", config, "--store", store])
}

pub async fn http_client(url: &str) -> Client {
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_owned());
    ().serve(transport).await.expect("initialize over HTTP")
}

/// `airlock mcp --transport http` on a free port with `args`.
pub fn serve_http_with(args: &[&str]) -> HttpServer {
    serve_http_env(args, &[])
}

/// [`serve_http_with`] with `env` set for the server.
pub fn serve_http_env(args: &[&str], env: &[(&str, &str)]) -> HttpServer {
    serve_http_at("127.0.0.1:0", args, env)
}

/// `airlock mcp --transport http --listen ADDR` with `args`, and `env`
/// set for the server.
pub fn serve_http_at(listen: &str, args: &[&str], env: &[(&str, &str)]) -> HttpServer {
    serve_http_command(http_command(listen, args, env))
}

/// The command [`serve_http_at`] starts, not yet started.
pub fn http_command(listen: &str, args: &[&str], env: &[(&str, &str)]) -> std::process::Command {
    let mut all = vec!["mcp", "--transport", "http", "--listen", listen];
    all.extend_from_slice(args);
    airlock_command(&all, env)
}

/// `command` (an `airlock mcp --transport http`), started, once it says
/// where it listens.
pub fn serve_http_command(mut command: std::process::Command) -> HttpServer {
    use std::io::BufRead;
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = std::io::BufReader::new(stderr).lines();
    // The first note that names a URL says where it listens (a debug log
    // may come before it).
    let mut before = Vec::new();
    let url = loop {
        let line = lines
            .next()
            .unwrap_or_else(|| {
                panic!("the server ended before saying where it listens: {before:?}")
            })
            .unwrap();
        if let Some(url) = line
            .split_whitespace()
            .find(|w| w.starts_with("http://") || w.starts_with("https://"))
        {
            break url.to_owned();
        }
        before.push(line);
    };
    let (notes, noted) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = notes.send(line);
        }
    });
    HttpServer {
        child,
        url,
        notes: noted,
    }
}

/// An MCP client over HTTP with no SDK: each message one POST (reqwest),
/// in one MCP session of the 2025-06-18 revision.
#[derive(Debug, Clone)]
pub struct RawHttp {
    pub http: reqwest::Client,
    pub url: String,
    /// The MCP session's id, once initialized.
    pub session: Option<String>,
    /// The access token sent as `Authorization: Bearer`, if any.
    pub bearer: Option<String>,
}

impl RawHttp {
    /// A client of the server at `url`, not yet initialized.
    pub fn new(url: &str) -> Self {
        // Plain HTTP on loopback; reqwest still wants a TLS provider named.
        Self::trusting(url, rustls::RootCertStore::empty())
    }

    /// A client of the server at `url` (HTTPS) whose certificate chains
    /// to one of `roots`.
    pub fn trusting(url: &str, roots: rustls::RootCertStore) -> Self {
        Self {
            http: super::tls::reqwest_client(roots),
            url: url.to_owned(),
            session: None,
            bearer: None,
        }
    }

    /// This client, sending `token` with every request from now on.
    pub fn with_token(mut self, token: &str) -> Self {
        self.bearer = Some(token.to_owned());
        self
    }

    /// A client of the server at `url`, with an MCP session initialized.
    pub async fn initialized(url: &str) -> Self {
        Self::new(url).initialize().await
    }

    /// Initializes an MCP session (initialize, then initialized).
    pub async fn initialize(mut self) -> Self {
        let answer = self
            .post(
                serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"}}}),
            )
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "initialize");
        let id = answer.headers()["mcp-session-id"].to_str().unwrap();
        self.session = Some(id.to_owned());
        drop(answer);
        let initialized =
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.post(initialized).await.unwrap();
        self
    }

    /// Ends the session (DELETE), with this client's token if it has one.
    pub async fn end(&self) -> reqwest::Response {
        let mut request = self
            .http
            .delete(&self.url)
            .header("mcp-session-id", self.session.clone().unwrap_or_default())
            .header("mcp-protocol-version", "2025-06-18");
        if let Some(token) = &self.bearer {
            request = request.bearer_auth(token);
        }
        request.send().await.unwrap()
    }

    /// POSTs `message`, in the session once there is one.
    pub fn post(
        &self,
        message: Value,
    ) -> impl std::future::Future<Output = reqwest::Result<reqwest::Response>> + use<> {
        let mut request = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18");
        if let Some(id) = &self.session {
            request = request.header("mcp-session-id", id);
        }
        if let Some(token) = &self.bearer {
            request = request.bearer_auth(token);
        }
        request.body(message.to_string()).send()
    }
}

/// The JSON-RPC messages of an event-stream body, in order.
pub fn events(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim)
        .filter(|data| !data.is_empty())
        .map(|data| serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}")))
        .collect()
}
