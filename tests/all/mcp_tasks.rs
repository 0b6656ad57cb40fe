//! Calls as tasks (the MCP tasks extension): a client that declares it
//! gets a handle for a call that runs long, polls it with `tasks/get`,
//! cancels it with `tasks/cancel`; the task lives in the session's journal,
//! so a server that was SIGKILLed and started again still answers for it.
//! Real `airlock mcp` processes over stdio, rmcp's client of the
//! 2026-07-28 revision.

use std::time::{Duration, Instant};

use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, GetTaskParams,
    GetTaskResult, TaskPayload, TaskStatus, UpdateTaskParams,
};
use rmcp::service::ClientServiceExt;
use rmcp::service::RunningService;
use serde_json::{Value, json};

use crate::support::mcp::{deps, discovering};
use crate::support::stores::{Backend, TestStore};
use crate::support::{airlock_command, guest};

/// A client of the 2026-07-28 revision that declares the tasks extension
/// (or not), and that it can ask its user and its model (or not).
#[derive(Debug, Clone, Copy)]
struct TaskClient {
    tasks: bool,
    answers: bool,
}

impl TaskClient {
    const TASKS: Self = Self {
        tasks: true,
        answers: false,
    };
    /// Declares tasks, elicitation and sampling.
    const ANSWERING: Self = Self {
        tasks: true,
        answers: true,
    };
}

impl rmcp::ClientHandler for TaskClient {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut config = rmcp::model::ClientConfig::default();
        if self.tasks {
            config.capabilities = ClientCapabilities::builder().enable_tasks().build();
        }
        if self.answers {
            config.capabilities.elicitation = Some(Default::default());
            config.capabilities.sampling = Some(Default::default());
        }
        config
    }
}

type Client = RunningService<RoleClient, TaskClient>;

/// `airlock mcp` over stdio with `args`, and a client of it: the client,
/// and the server's pid.
async fn start(client: TaskClient, args: &[&str]) -> (Client, u32) {
    let mut all = vec!["mcp"];
    all.extend_from_slice(args);
    let command = tokio::process::Command::from(airlock_command(&all, &[]));
    let transport = rmcp::transport::TokioChildProcess::new(command).expect("airlock mcp starts");
    let pid = transport.id().expect("the server has a pid");
    let client = client
        .serve_with_lifecycle(transport, discovering())
        .await
        .expect("discover");
    (client, pid)
}

/// A call of `tool` with `args` that must become a task: its id.
async fn task_of(client: &Client, tool: &str, args: Value) -> String {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
    match client.call_tool_once(params).await.unwrap() {
        CallToolResponse::Task(created) => {
            assert_eq!(created.task.status, TaskStatus::Working);
            assert!(created.task.poll_interval_ms.is_some());
            created.task.task_id
        }
        other => panic!("{tool}: not a task: {other:?}"),
    }
}

async fn get(client: &Client, id: &str) -> GetTaskResult {
    client.get_task(GetTaskParams::new(id)).await.unwrap()
}

/// Polls task `id` until it ends (at most a minute).
async fn ended(client: &Client, id: &str) -> GetTaskResult {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let task = get(client, id).await;
        if task.task.status().is_terminal() {
            return task;
        }
        assert!(Instant::now() < deadline, "task {id} never ended: {task:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The result a completed task carries.
fn result_of(task: &GetTaskResult) -> &serde_json::Map<String, Value> {
    match &task.task.payload {
        TaskPayload::Completed { result } => result,
        other => panic!("not completed: {other:?}"),
    }
}

/// A temporary directory with a policy and, beside it, the store's file.
struct Desk {
    _dir: tempfile::TempDir,
    policy: String,
    db: String,
}

impl Desk {
    fn new(policy: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
        let (db, written) = (path("tasks.db"), path("airlock.toml"));
        std::fs::write(&written, policy).unwrap();
        Self {
            _dir: dir,
            policy: written,
            db,
        }
    }

    fn policy(&self) -> &str {
        &self.policy
    }

    fn db(&self) -> &str {
        &self.db
    }

    /// A desk whose policy serves the everything example with `tool` (its
    /// `[[tool]]` lines after `path`), a call a task after ten minutes
    /// unless it asks first.
    fn everything(tool: &str) -> Self {
        Self::new(&format!(
            "[mcp.tasks]\nafter_ms = 600000\npoll_ms = 50\n\n[[tool]]\npath = {:?}\n{tool}",
            guest("everything"),
        ))
    }

    /// `airlock mcp`'s arguments: this desk's policy, session `desk` of
    /// `store`.
    fn args<'a>(&'a self, store: &'a str) -> [&'a str; 6] {
        [
            "--config",
            &self.policy,
            "--store",
            store,
            "--session",
            "desk",
        ]
    }
}

/// How many tasks have mail in the SQLite store `db`.
fn mail_in(db: &str) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("SELECT count(*) FROM task_mail", [], |row| row.get(0))
        .unwrap()
}

fn kill9(pid: u32) {
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
}

/// The error text of a request the server refused.
fn refused<T: std::fmt::Debug>(answer: Result<T, rmcp::ServiceError>) -> String {
    match answer {
        Err(rmcp::ServiceError::McpError(e)) => {
            assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS, "{e:?}");
            e.message.into_owned()
        }
        other => panic!("not refused: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_calls_become_tasks_that_outlive_a_killed_server() {
    // Every call of a client that declares tasks becomes one at once;
    // `spin` runs until it is stopped (its timeout is far away).
    let desk = Desk::new(&format!(
        "[mcp.tasks]\nafter_ms = 0\npoll_ms = 50\n\n[[tool]]\npath = {:?}\n\n\
         [[tool]]\npath = {:?}\nlimits = {{ timeout_ms = 600000 }}\n",
        guest("stateful"),
        guest("hostile"),
    ));
    let (policy, db) = (desk.policy(), desk.db());
    let args = ["--config", policy, "--store", db, "--session", "desk"];
    let (client, pid) = start(TaskClient::TASKS, &args).await;

    // A call that ends: its task completes with the call's result.
    let counted = task_of(&client, "increment", json!({"name": "visits"})).await;
    assert!(counted.starts_with("desk/task-"), "{counted}");
    let task = ended(&client, &counted).await;
    assert_eq!(task.task.status(), TaskStatus::Completed);
    assert_eq!(
        result_of(&task)["structuredContent"],
        json!({"counter": "visits", "value": 1})
    );
    assert_eq!(deps(&client).await, json!({"counters": {"visits": 1}}));

    // A call that runs: working until the server is killed.
    let spinning = task_of(&client, "spin", json!({})).await;
    let task = get(&client, &spinning).await;
    assert_eq!(task.task.status(), TaskStatus::Working);
    assert_eq!(task.task.task.ttl_ms, Some(24 * 60 * 60 * 1000));
    assert_eq!(task.task.task.poll_interval_ms, Some(50));
    // It never waits for input.
    let why = refused(
        client
            .update_task(UpdateTaskParams::new(&spinning, Default::default()))
            .await,
    );
    assert!(why.contains("asks for no input"), "{why}");
    kill9(pid);
    drop(client);
    assert_eq!(mail_in(db), 1, "the killed server's task left its mail");

    // Started again on the same store: the finished task still answers
    // with its result; the one the kill interrupted failed, and none of it
    // was applied.
    let (client, _) = start(TaskClient::TASKS, &args).await;
    let task = get(&client, &counted).await;
    assert_eq!(
        result_of(&task)["structuredContent"],
        json!({"counter": "visits", "value": 1})
    );
    let task = get(&client, &spinning).await;
    assert_eq!(task.task.status(), TaskStatus::Failed, "{task:?}");
    assert_eq!(mail_in(db), 0);
    let TaskPayload::Failed { error } = &task.task.payload else {
        panic!("{task:?}")
    };
    assert!(
        error["message"].as_str().unwrap().contains("interrupted"),
        "{error:?}"
    );
    assert_eq!(deps(&client).await, json!({"counters": {"visits": 1}}));

    // Cancelled: the call stops, its task says so, and a second cancel is
    // refused; the next call is served.
    let spinning = task_of(&client, "spin", json!({})).await;
    client
        .cancel_task(CancelTaskParams::new(&spinning))
        .await
        .unwrap();
    let task = ended(&client, &spinning).await;
    assert_eq!(task.task.status(), TaskStatus::Cancelled, "{task:?}");
    let why = refused(client.cancel_task(CancelTaskParams::new(&spinning)).await);
    assert!(why.contains("already ended"), "{why}");
    let counted = task_of(&client, "increment", json!({"name": "visits"})).await;
    let task = ended(&client, &counted).await;
    assert_eq!(
        result_of(&task)["structuredContent"],
        json!({"counter": "visits", "value": 2})
    );

    // Ids the server never gave, or gave another user, are unknown; one
    // of any length is named cut short.
    for id in ["nonsense", "desk/task-0", "other/task-0"] {
        let why = refused(client.get_task(GetTaskParams::new(id)).await);
        assert!(why.contains("unknown task"), "{id}: {why}");
    }
    let long = format!("desk/{}", "9".repeat(100_000));
    let why = refused(client.get_task(GetTaskParams::new(&long)).await);
    assert!(why.starts_with("unknown task \"desk/999"), "{why}");
    assert!(why.len() < 1000, "{} bytes", why.len());
    client.cancel().await.unwrap();
    let bob = [
        "--config",
        policy,
        "--store",
        db,
        "--session",
        "desk",
        "--user",
        "bob",
    ];
    let (client, _) = start(TaskClient::TASKS, &bob).await;
    let why = refused(client.get_task(GetTaskParams::new(&counted)).await);
    assert!(why.contains("unknown task"), "{why}");
    client.cancel().await.unwrap();

    // A client that does not declare tasks gets results, as before.
    let (client, _) = start(
        TaskClient {
            tasks: false,
            answers: false,
        },
        &args,
    )
    .await;
    let result = client
        .call_tool(
            CallToolRequestParams::new("increment")
                .with_arguments(json!({"name": "visits"}).as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert_eq!(
        result.structured_content,
        Some(json!({"counter": "visits", "value": 3}))
    );
    client.cancel().await.unwrap();
}

/// A client of the 2026-07-28 revision over HTTP (no MCP session: each
/// request stands alone) that declares tasks.
async fn over_http(url: &str) -> Client {
    over_http_as(TaskClient::TASKS, url).await
}

/// [`over_http`] as `client`.
async fn over_http_as(client: TaskClient, url: &str) -> Client {
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_owned());
    client
        .serve_with_lifecycle(transport, discovering())
        .await
        .expect("discover over HTTP")
}

/// A `tools/call` of `tool` with `args` on Airlock session `session`.
async fn call_on(client: &Client, session: &str, tool: &str, args: Value) -> CallToolResponse {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
    let meta = serde_json::Map::from_iter([(
        airlock::mcp::SESSION_META_KEY.to_owned(),
        Value::from(session),
    )]);
    params.meta = Some(meta.into());
    client.call_tool_once(params).await.unwrap()
}

/// Over stateless HTTP every request stands alone, so the task is found
/// through the store: a request that did not start it polls it, and after
/// the server was killed, the next one leases its session as a resume
/// would and finds the call interrupted. A call that ends before the
/// server's wait is answered with its result, task or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_over_stateless_http_are_found_through_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tasks.db");
    let policy = dir.path().join("airlock.toml");
    let write_policy = |after_ms: u64| {
        std::fs::write(
            &policy,
            format!(
                "[mcp.tasks]\nafter_ms = {after_ms}\n\n[[tool]]\npath = {:?}\n\n\
                 [[tool]]\npath = {:?}\nlimits = {{ timeout_ms = 600000 }}\n",
                guest("stateful"),
                guest("hostile"),
            ),
        )
        .unwrap();
    };
    write_policy(0);
    let (policy_path, db) = (policy.to_str().unwrap(), db.to_str().unwrap());
    let mut server = crate::support::mcp::serve_http(policy_path, db);
    let client = over_http(&server.url).await;
    let CallToolResponse::Task(spinning) = call_on(&client, "team", "spin", json!({})).await else {
        panic!("spin is not a task")
    };
    let spinning = spinning.task.task_id;
    assert!(spinning.starts_with("team/task-"), "{spinning}");
    let task = get(&client, &spinning).await;
    assert_eq!(task.task.status(), TaskStatus::Working);
    server.kill();
    drop(client);
    // The task's mail, posted before its handle was given, is left by the
    // killed host; the host that finds the task interrupted removes it.
    assert_eq!(mail_in(db), 1);

    // Calls end long before this server's wait.
    write_policy(600_000);
    let server = crate::support::mcp::serve_http(policy_path, db);
    let client = over_http(&server.url).await;
    let task = get(&client, &spinning).await;
    assert_eq!(task.task.status(), TaskStatus::Failed, "{task:?}");
    assert_eq!(mail_in(db), 0);
    let counted = call_on(&client, "team", "increment", json!({"name": "n"})).await;
    let CallToolResponse::Complete(counted) = counted else {
        panic!("a call that ends is answered with its result: {counted:?}")
    };
    assert_eq!(
        counted.structured_content,
        Some(json!({"counter": "n", "value": 1}))
    );
    client.cancel().await.unwrap();
}

/// A policy serving `http_fetch`, allowed to reach `gate`, each call a
/// task at once.
fn gated_fetch(gate: &crate::support::Gate) -> String {
    format!(
        "[mcp.tasks]\nafter_ms = 0\npoll_ms = 50\n\n[[tool]]\npath = {:?}\n\
         http = [\"http://127.0.0.1:{}\"]\nlimits = {{ timeout_ms = 60000 }}\n",
        guest("http_fetch"),
        gate.served.addr.port()
    )
}

/// `fetch`'s arguments: a request `gate` holds until it opens.
fn held(gate: &crate::support::Gate) -> Value {
    json!({ "url": format!("http://{}/held", gate.served.addr) })
}

/// A stopping HTTP server finishes the calls no request waits for: a
/// task's call, still running when SIGTERM came and no connection open,
/// runs to its end and is committed before the server ends (exit 0), and
/// the next server answers the task `completed` with the call's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_server_finishes_its_tasks_first() {
    let gate = crate::support::Gate::start().await;
    let desk = Desk::new(&gated_fetch(&gate));
    let (policy, db) = (desk.policy(), desk.db());
    let mut server = crate::support::mcp::serve_http(policy, db);
    let client = over_http(&server.url).await;
    let CallToolResponse::Task(fetching) = call_on(&client, "team", "fetch", held(&gate)).await
    else {
        panic!("fetch is not a task")
    };
    let fetching = fetching.task.task_id;
    gate.wait_for(1).await;
    // No request waits for the call now.
    client.cancel().await.unwrap();

    crate::support::signal(server.pid(), libc::SIGTERM);
    let said = crate::support::mcp::wait_for_note(&mut server.notes, "stopping:").await;
    assert!(said.contains("finishing the calls under way"), "{said}");
    assert!(!server.exited(), "it ended with the call running");
    gate.open.send_replace(true);
    let status = server.ended_within(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{status}");

    let server = crate::support::mcp::serve_http(policy, db);
    let client = over_http(&server.url).await;
    let task = get(&client, &fetching).await;
    assert_eq!(task.task.status(), TaskStatus::Completed, "{task:?}");
    assert_eq!(result_of(&task)["structuredContent"]["body"], "through");
    client.cancel().await.unwrap();
}

/// Over stdio, a client that goes away (closes the server's stdin) with a
/// task running leaves it to run to its end: the server ends (exit 0) once
/// it is committed, and the next server answers it `completed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_over_stdio_leaves_its_tasks_to_finish() {
    let gate = crate::support::Gate::start().await;
    let desk = Desk::new(&gated_fetch(&gate));
    let args = desk.args(desk.db());
    // The server's pipes are the test's: closing stdin is all the client
    // does as it goes.
    let mut all = vec!["mcp"];
    all.extend_from_slice(&args);
    let mut child = tokio::process::Command::from(airlock_command(&all, &[]))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
    let mut noted = crate::support::mcp::notes_of(child.stderr.take().unwrap());
    let client = TaskClient::TASKS
        .serve_with_lifecycle((stdout, stdin), discovering())
        .await
        .expect("discover");
    let fetching = task_of(&client, "fetch", held(&gate)).await;
    gate.wait_for(1).await;
    client.cancel().await.unwrap();

    let said = crate::support::mcp::wait_for_note(&mut noted, "went away").await;
    assert!(said.contains("finishing the calls under way"), "{said}");
    assert!(
        child.try_wait().unwrap().is_none(),
        "it ended with the call running"
    );
    gate.open.send_replace(true);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the server ends once its task has")
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status}");

    let (client, _) = start(TaskClient::TASKS, &args).await;
    let task = get(&client, &fetching).await;
    assert_eq!(task.task.status(), TaskStatus::Completed, "{task:?}");
    assert_eq!(result_of(&task)["structuredContent"]["body"], "through");
    client.cancel().await.unwrap();
}

/// Task `id` once it waits on a question: the questions, by key.
async fn waiting(client: &Client, id: &str) -> rmcp::model::InputRequests {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let task = get(client, id).await;
        if let TaskPayload::InputRequired { input_requests } = task.task.payload {
            assert_eq!(task.task.task.status, TaskStatus::InputRequired);
            return input_requests;
        }
        assert!(
            !task.task.status().is_terminal() && Instant::now() < deadline,
            "task {id} never asked: {task:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The method and params of a waiting question, as JSON.
fn question(requests: &rmcp::model::InputRequests, key: &str) -> Value {
    assert_eq!(requests.len(), 1, "{requests:?}");
    serde_json::to_value(&requests[key]).unwrap()
}

/// Answers `greet` task `id`'s first question (whom to greet) with Ada,
/// through `client`: once it waits, an update naming a key that does not
/// wait is refused and answers nothing; then the name is taken. The
/// question the task asks next (for a greeting), once it does.
async fn name_ada(client: &Client, id: &str) -> Value {
    let person = question(&waiting(client, id).await, "person-1");
    assert_eq!(person["method"], "elicitation/create", "{person}");
    assert_eq!(person["params"]["message"], "Whom shall I greet?");
    let wrong = [("model-1".to_owned(), json!({"action": "accept"}))].into();
    let why = refused(client.update_task(UpdateTaskParams::new(id, wrong)).await);
    assert!(why.contains("no question \"model-1\" is waiting"), "{why}");
    // A key of any length is named cut short.
    let long = format!("model-{}", "9".repeat(100_000));
    let wrong = [(long, json!({"action": "accept"}))].into();
    let why = refused(client.update_task(UpdateTaskParams::new(id, wrong)).await);
    assert!(why.contains("no question \"model-999"), "{why}");
    assert!(why.len() < 1000, "{} bytes", why.len());
    assert_eq!(question(&waiting(client, id).await, "person-1"), person);
    let name = [(
        "person-1".to_owned(),
        json!({"action": "accept", "content": {"name": "Ada"}}),
    )]
    .into();
    client
        .update_task(UpdateTaskParams::new(id, name))
        .await
        .unwrap();
    let model = question(&waiting(client, id).await, "model-1");
    let asked = model["params"]["messages"][0]["content"]["text"].as_str();
    assert!(asked.unwrap_or_default().contains("Ada"), "{model}");
    model
}

/// Answers `greet` task `id`'s request for a greeting, once it has Ada's
/// name ([`name_ada`]), through `client`: the task once it ends, and the
/// greeting it is to make.
async fn greet_ada(client: &Client, id: &str) -> (GetTaskResult, Value) {
    let reply = [(
        "model-1".to_owned(),
        json!({"role": "assistant", "content": {"type": "text", "text": "Hello, Ada!"},
               "model": "scripted"}),
    )]
    .into();
    client
        .update_task(UpdateTaskParams::new(id, reply))
        .await
        .unwrap();
    let task = ended(client, id).await;
    (task, json!({"name": "Ada", "greeting": "Hello, Ada!"}))
}

/// A tool that asks becomes a task at its first question, whatever the
/// server's wait: the task is `input_required` with the question until
/// `tasks/update` answers it, then the next; the answers reach the tool,
/// and its result and ops are the task's. An update that names no waiting
/// question is refused and answers nothing; a task cancelled while it
/// waits ends `cancelled` with deps unchanged, and the next call is
/// served. A client that cannot ask its user gets the tool's own answer
/// to that. The wait counts against the tool's time limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waits_for_its_clients_answers() {
    let desk = Desk::everything(
        "ask = true\nsample = { max_tokens = 50 }\nlimits = { timeout_ms = 60000 }\n",
    );
    let db = desk.db();
    let (client, _) = start(TaskClient::ANSWERING, &desk.args(db)).await;

    let greeting = task_of(&client, "greet", json!({})).await;
    let model = name_ada(&client, &greeting).await;
    assert_eq!(model["method"], "sampling/createMessage", "{model}");
    let (task, entry) = greet_ada(&client, &greeting).await;
    assert_eq!(result_of(&task)["structuredContent"], entry);
    assert_eq!(deps(&client).await, json!({"greetings": [entry]}));
    let why = refused(
        client
            .update_task(UpdateTaskParams::new(&greeting, Default::default()))
            .await,
    );
    assert!(why.contains("asks for no input"), "{why}");

    // Cancelled while it waits: nothing of it is applied.
    cancelled_while_waiting(&client, "greet", json!({})).await;
    assert_eq!(deps(&client).await, json!({"greetings": [entry]}));
    client.cancel().await.unwrap();

    // A client that declares no elicitation: the tool hears it cannot
    // ask, and says so.
    let (client, _) = start(TaskClient::TASKS, &desk.args(db)).await;
    let params = CallToolRequestParams::new("test_elicitation")
        .with_arguments(json!({"message": "Go on?"}).as_object().unwrap().clone());
    let result = match client.call_tool_once(params).await.unwrap() {
        CallToolResponse::Complete(result) => result,
        other => panic!("a call that asks nobody ends within the wait: {other:?}"),
    };
    let said = serde_json::to_string(&result.content).unwrap();
    assert!(said.contains("declared no elicitation"), "{said}");
    assert_eq!(deps(&client).await, json!({"greetings": [entry]}));
    client.cancel().await.unwrap();

    // The wait counts against the tool's time limit: past it, the task
    // ends with the timeout's error, nothing waits, nothing is applied.
    let hurried = Desk::everything("ask = true\nlimits = { timeout_ms = 2000 }\n");
    let (client, _) = start(TaskClient::ANSWERING, &hurried.args(db)).await;
    // (Only its question makes it a task before the server's wait.)
    let late = task_of(&client, "greet", json!({})).await;
    let task = ended(&client, &late).await;
    let result = result_of(&task);
    assert_eq!(result["isError"], true, "{result:?}");
    let said = result["content"].to_string();
    assert!(said.contains("ran past its 2 s timeout"), "{said}");
    assert_eq!(deps(&client).await, json!({"greetings": [entry]}));
    client.cancel().await.unwrap();
}

/// A call of `tool` with `args` as a task, cancelled once it waits for
/// its client: it ends `cancelled`.
async fn cancelled_while_waiting(client: &Client, tool: &str, args: Value) {
    let stopped = task_of(client, tool, args).await;
    waiting(client, &stopped).await;
    client
        .cancel_task(CancelTaskParams::new(&stopped))
        .await
        .unwrap();
    let task = ended(client, &stopped).await;
    assert_eq!(task.task.status(), TaskStatus::Cancelled, "{task:?}");
}

/// Task `id`'s approval (its question `person-1`) answered `action`; the
/// task once it has ended.
async fn approval_answered(client: &Client, id: &str, action: &str) -> GetTaskResult {
    let answer = [("person-1".to_owned(), json!({"action": action}))].into();
    client
        .update_task(UpdateTaskParams::new(id, answer))
        .await
        .unwrap();
    ended(client, id).await
}

/// A tool that needs approval (`approval = "ask"`) called as a task: the
/// task waits `input_required` on its approval (`person-1`, naming the
/// tool and its arguments), and nothing runs before it; accepted, the
/// call runs and its op applies; declined, the task ends with the
/// rejection and nothing is applied, and `tasks/get` still says so once
/// the task is no longer running (from the journal). A task cancelled
/// while it waits for its approval ends cancelled. The next call is
/// served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_asks_for_its_approval_first() {
    let desk = Desk::everything("approval = \"ask\"\n");
    let db = desk.db();
    let (client, _) = start(TaskClient::ANSWERING, &desk.args(db)).await;

    let approved = task_of(&client, "set_watched", json!({"text": "one"})).await;
    let approval = question(&waiting(&client, &approved).await, "person-1");
    assert_eq!(approval["method"], "elicitation/create", "{approval}");
    let message = approval["params"]["message"].as_str().unwrap();
    assert!(
        message.contains("set_watched") && message.contains("one"),
        "{message}"
    );
    let task = approval_answered(&client, &approved, "accept").await;
    assert_eq!(result_of(&task)["isError"], false, "{task:?}");
    assert_eq!(deps(&client).await, json!({"watched": "one"}));

    let declined = task_of(&client, "set_watched", json!({"text": "two"})).await;
    waiting(&client, &declined).await;
    let task = approval_answered(&client, &declined, "decline").await;
    let result = result_of(&task);
    assert_eq!(result["isError"], true, "{result:?}");
    assert!(
        result["content"].to_string().contains("rejected"),
        "{result:?}"
    );
    assert_eq!(deps(&client).await, json!({"watched": "one"}));
    // Once it no longer runs here, the journal answers for it.
    assert_eq!(get(&client, &declined).await.task, task.task);

    cancelled_while_waiting(&client, "set_watched", json!({"text": "three"})).await;
    assert_eq!(deps(&client).await, json!({"watched": "one"}));

    let next = task_of(&client, "set_watched", json!({"text": "four"})).await;
    waiting(&client, &next).await;
    approval_answered(&client, &next, "accept").await;
    assert_eq!(deps(&client).await, json!({"watched": "four"}));
    client.cancel().await.unwrap();

    // An approval unanswered within the tool's time limit is refused.
    let hurried = Desk::everything("approval = \"ask\"\nlimits = { timeout_ms = 1000 }\n");
    let (client, _) = start(TaskClient::ANSWERING, &hurried.args(db)).await;
    let unanswered = task_of(&client, "set_watched", json!({"text": "five"})).await;
    let task = ended(&client, &unanswered).await;
    assert_eq!(result_of(&task)["isError"], true, "{task:?}");
    assert_eq!(deps(&client).await, json!({"watched": "four"}));
    client.cancel().await.unwrap();
}

/// Two hosts of one store: a task runs on the first, and a client of the
/// second sees its questions, answers them and cancels it there, through
/// the task's mail in the store; the first host's call gets each answer,
/// and the task ends as it would answered where it runs. An update that
/// names no waiting question is refused on the second host too. Once
/// tasks end, no mail is left in the store.
async fn a_task_is_seen_answered_and_cancelled_from_another_host(backend: Backend) {
    let db = TestStore::new(backend, "mail").await;
    let desk = Desk::everything(
        "ask = true\nsample = { max_tokens = 50 }\nlimits = { timeout_ms = 60000 }\n",
    );
    let runs = crate::support::mcp::serve_http(desk.policy(), &db.spec);
    let other = crate::support::mcp::serve_http(desk.policy(), &db.spec);
    let (here, there) = (
        over_http_as(TaskClient::ANSWERING, &runs.url).await,
        over_http_as(TaskClient::ANSWERING, &other.url).await,
    );
    let CallToolResponse::Task(greeting) = call_on(&here, "team", "greet", json!({})).await else {
        panic!("greet is not a task")
    };
    let greeting = greeting.task.task_id;
    let model = name_ada(&there, &greeting).await;
    // The host that runs it shows the same question.
    assert_eq!(question(&waiting(&here, &greeting).await, "model-1"), model);
    let (task, entry) = greet_ada(&there, &greeting).await;
    assert_eq!(result_of(&task)["structuredContent"], entry);
    assert_eq!(ended(&here, &greeting).await.task, task.task);

    // Cancelled from the other host while it waits: it ends cancelled,
    // nothing of it applied.
    let CallToolResponse::Task(stopped) = call_on(&here, "team", "greet", json!({})).await else {
        panic!("greet is not a task")
    };
    let stopped = stopped.task.task_id;
    waiting(&there, &stopped).await;
    there
        .cancel_task(CancelTaskParams::new(&stopped))
        .await
        .unwrap();
    assert_eq!(
        ended(&there, &stopped).await.task.status(),
        TaskStatus::Cancelled
    );
    let shown =
        crate::support::airlock(&["sessions", "show", "team", "--json", "--store", &db.spec]);
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown["deps"], json!({"greetings": [entry]}));
    assert_eq!(db.scalar("SELECT count(*) FROM {p}task_mail").await, 0);
    here.cancel().await.unwrap();
    there.cancel().await.unwrap();
}

crate::on_both_stores!(a_task_is_seen_answered_and_cancelled_from_another_host);
