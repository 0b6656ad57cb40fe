//! Shared set-up: the guest components are built once per test run (a no-op
//! when `make guests` already built them), and hosts are shared between
//! tests so each component compiles once per process.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub mod loopback;
pub mod mcp;
pub mod model_server;
pub mod oauth;
pub mod pty;
pub mod registry;
pub mod stores;
pub mod tls;

use airlock::context::ContextRules;
use airlock::{
    CallError, CallOutcome, CompileCache, Host, Limits, RunContext, ToolCall, ToolConfig,
};
use serde_json::Value;
use tokio::sync::OnceCell;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the host crate lives one level below the repository root")
        .to_path_buf()
}

/// The guest target dir. Separate from the host's so that building guests
/// from inside `cargo test` never waits on the outer cargo's lock.
pub fn guest_dir() -> PathBuf {
    root().join("target/guests/wasm32-wasip2/release")
}

/// The compile cache shared by all tests (and kept between runs).
pub fn cache_dir() -> PathBuf {
    root().join("target/test-cache")
}

/// Path of a guest component from `guest-examples/`, building all of them
/// the first time it is asked for. Fails loudly if the build fails.
pub fn guest(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let root = root();
        let output = Command::new(cargo)
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip2",
                "--manifest-path",
            ])
            .arg(root.join("guest-examples/Cargo.toml"))
            .arg("--target-dir")
            .arg(root.join("target/guests"))
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    });
    if let Err(e) = built {
        panic!(
            "building guest-examples failed (is the wasm32-wasip2 target installed? `make setup`):\n{e}"
        );
    }
    let path = guest_dir().join(format!("{name}.wasm"));
    assert!(path.is_file(), "{} was not built", path.display());
    path
}

/// A component `make guests` builds with another language's toolchain
/// (`target/guests/NAME.wasm`: `python-stateful`, `js-typed`, ...).
pub fn built(name: &str) -> PathBuf {
    let path = root().join(format!("target/guests/{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run `make guests`",
        path.display()
    );
    path
}

/// A host builder with the tests' shared compile cache and room for 16
/// calls at once.
pub fn builder() -> airlock::HostBuilder {
    Host::builder()
        .cache(CompileCache::in_dir(cache_dir()))
        .max_concurrent_calls(16)
}

/// The demo's prompt (the Makefile's `DEMO_PROMPT`).
pub const PROMPT: &str = "Count how many vowels are in the word 'elephant', incrementing a counter named 'vowels' for each one. Also add a note listing the vowels you found. Then show the final state.";

/// The tools of [`host`], sorted by name.
pub const HOST_TOOLS: [&str; 6] = [
    "add_note",
    "apply",
    "derive",
    "increment",
    "read",
    "show_state",
];

/// A host with the well-behaved guests loaded (stateful, context-probe),
/// default limits.
pub async fn host() -> &'static Arc<Host> {
    static HOST: OnceCell<Arc<Host>> = OnceCell::const_new();
    HOST.get_or_init(|| async {
        let mut host = builder().build().expect("host builds");
        for name in ["stateful", "context_probe"] {
            host.load(guest(name)).await.expect("guest loads");
        }
        Arc::new(host)
    })
    .await
}

/// The tool messages among `messages`: (call id, content, is error).
pub fn tool_messages(messages: &[airlock::llm::Message]) -> Vec<(String, String, bool)> {
    messages
        .iter()
        .filter_map(|m| match m {
            airlock::llm::Message::Tool {
                call_id,
                content,
                is_error,
                ..
            } => Some((call_id.clone(), content.clone(), *is_error)),
            _ => None,
        })
        .collect()
}

/// Limits for hostile guests: default, but a short timeout so that the
/// looping attacks end quickly.
pub fn hostile_limits() -> Limits {
    Limits {
        timeout: Duration::from_millis(500),
        ..Limits::default()
    }
}

/// A host with the hostile guest and the stateful guest loaded, under
/// [`hostile_limits`].
pub async fn hostile_host() -> &'static Arc<Host> {
    static HOST: OnceCell<Arc<Host>> = OnceCell::const_new();
    HOST.get_or_init(|| async {
        let mut host = builder()
            .limits(hostile_limits())
            .build()
            .expect("host builds");
        for name in ["hostile", "stateful"] {
            host.load(guest(name)).await.expect("guest loads");
        }
        Arc::new(host)
    })
    .await
}

/// A fresh host with `guests` loaded, each under its own config, plus the
/// stateful guest (default config) so [`assert_host_still_serves`] works.
pub async fn host_with(guests: &[(&str, ToolConfig)], rules: ContextRules) -> Host {
    let mut host = builder().context_rules(rules).build().expect("host builds");
    for (name, config) in guests {
        host.load_with(guest(name), config.clone())
            .await
            .expect("guest loads");
    }
    host.load(guest("stateful")).await.expect("stateful loads");
    host
}

/// Calls `name` with `args` on `host`.
pub async fn call(
    host: &Host,
    ctx: &mut RunContext,
    name: &str,
    args: Value,
) -> Result<CallOutcome, CallError> {
    host.call(ctx, &ToolCall::new(name, args.to_string()))
        .await
        .map_err(|f| f.error)
}

/// Waits until `host` has `n` instances prepared ahead of demand (polling
/// its pool; no sleep has to be long enough). Panics after 60 s.
pub async fn prepared(host: &Host, n: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while host.pool_usage().prepared < n {
        assert!(
            std::time::Instant::now() < deadline,
            "no {n} instances prepared within 60 s: {:?}",
            host.pool_usage()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The pool's usage once no call runs or waits, no instance is being
/// prepared and no store is being dropped aside (polled; panics after
/// 60 s).
pub async fn idle_pool(host: &Host) -> airlock::sandbox::PoolUsage {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let usage = host.pool_usage();
        if usage.calls == usage.prepared && usage.waiting == 0 {
            return usage;
        }
        assert!(std::time::Instant::now() < deadline, "{usage:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A context whose deps are `deps` (a JSON object).
pub fn ctx(deps: Value) -> RunContext {
    RunContext::from_value(deps).expect("test deps are an object")
}

/// Deps as bytes, to check they are byte-identical.
pub fn snapshot(ctx: &RunContext) -> String {
    serde_json::to_string(ctx.deps()).expect("deps serialize")
}

/// Asserts that a hostile call left deps byte-identical and that the host
/// still serves a well-behaved call (and applies its ops).
pub async fn assert_host_still_serves(host: &Host, ctx: &mut RunContext, before: &str) {
    assert_eq!(snapshot(ctx), before, "a failed call changed deps");
    let mut probe = ctx.clone();
    let outcome = call(
        host,
        &mut probe,
        "increment",
        serde_json::json!({"name": "after"}),
    )
    .await
    .expect("the host serves the next call");
    assert_eq!(outcome.result["value"], 1);
    assert_eq!(probe.deps()["counters"]["after"], 1);
}

/// The data directory the `airlock` binary gets in tests (its session
/// store), emptied once per test process. Tests that look into a store
/// pass their own `--store` or `AIRLOCK_DATA_DIR`.
pub fn data_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = root().join("target/test-data");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create target/test-data");
        dir
    })
    .clone()
}

/// The `airlock` binary with `args`, the tests' compile cache and data
/// directory, no tracing, no colour settings, and none of the API keys or
/// secrets the tests use (they pass them in `env`).
pub fn airlock_command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_airlock"));
    cmd.args(args)
        .env("AIRLOCK_CACHE_DIR", cache_dir())
        .env("AIRLOCK_DATA_DIR", data_dir())
        .env_remove("AIRLOCK_STORE_SYNC")
        .env_remove("AIRLOCK_LEASE_TTL_MS")
        .env_remove("RUST_LOG")
        .env_remove("CLICOLOR_FORCE")
        .env_remove("NO_COLOR")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("GITHUB_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs [`airlock_command`] to its end.
pub fn airlock_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    airlock_command(args, env)
        .output()
        .expect("the airlock binary runs")
}

/// [`airlock_with_env`] with no extra environment.
/// Makes a named pipe (FIFO) at `path`.
pub fn named_pipe(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

pub fn airlock(args: &[&str]) -> Output {
    airlock_with_env(args, &[])
}

/// A server task on 127.0.0.1, stopped when dropped.
pub struct Served {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves HTTP/1.1 on a free port of 127.0.0.1 with `handler` until the
/// returned guard is dropped.
pub async fn serve<F, Fut>(handler: F) -> Served
where
    F: Fn(hyper::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<hyper::Response<http_body_util::Full<bytes::Bytes>>, Infallible>>
        + Send
        + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(handler);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(wasmtime_wasi_http::io::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Served { addr, task }
}

/// A component in WAT whose `describe` returns one tool with exactly these
/// strings (the `table_bomb` component's shape, generated).
pub fn describe_wat(name: &str, description: &str, parameters: &str) -> String {
    let hex = |s: &str| s.bytes().map(|b| format!("\\{b:02x}")).collect::<String>();
    let le = |n: usize| {
        u32::try_from(n)
            .unwrap()
            .to_le_bytes()
            .iter()
            .map(|b| format!("\\{b:02x}"))
            .collect::<String>()
    };
    let (name_at, description_at) = (1024, 4096);
    let parameters_at = description_at + description.len();
    let end = parameters_at + parameters.len();
    let pages = end / 65536 + 2;
    format!(
        r#"(component
  (core module $m
    (memory (export "memory") {pages})
    (global $next (mut i32) (i32.const {end}))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $ptr i32)
      (local.set $ptr (i32.and
        (i32.add (global.get $next) (i32.sub (local.get 2) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get 2))))
      (global.set $next (i32.add (local.get $ptr) (local.get 3)))
      (local.get $ptr))
    (data (i32.const {name_at}) "{name}")
    (data (i32.const {description_at}) "{description}")
    (data (i32.const {parameters_at}) "{parameters}")
    (data (i32.const 128) "{record}")
    (data (i32.const 256) "\80\00\00\00\01\00\00\00")
    (func (export "describe") (result i32) (i32.const 256))
    (func (export "call") (param i32 i32 i32 i32 i32) (result i32) unreachable))
  (core instance $i (instantiate $m))
  (type $tool-spec (record (field "name" string) (field "description" string) (field "parameters" string)))
  (type $entry (record (field "key" string) (field "value" string)))
  (type $context-op (variant (case "set" $entry) (case "merge" $entry) (case "append" $entry) (case "delete" string)))
  (type $tool-output (record (field "result" string) (field "updates" (list $context-op))))
  (type $tool-error (variant (case "invalid-args" string) (case "failed" string) (case "retry" string)))
  (import "airlock:tool/context@0.1.0" (instance $context (export "run-context" (type (sub resource)))))
  (alias export $context "run-context" (type $run-context))
  (func $describe (result (list $tool-spec))
    (canon lift (core func $i "describe") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (func $call (param "ctx" (borrow $run-context)) (param "name" string) (param "args" string)
    (result (result $tool-output (error $tool-error)))
    (canon lift (core func $i "call") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (instance $tool
    (export "tool-spec" (type $tool-spec)) (export "entry" (type $entry))
    (export "context-op" (type $context-op)) (export "tool-output" (type $tool-output))
    (export "tool-error" (type $tool-error))
    (export "describe" (func $describe)) (export "call" (func $call)))
  (export "airlock:tool/tool@0.1.0" (instance $tool)))
"#,
        name = hex(name),
        description = hex(description),
        parameters = hex(parameters),
        record = [
            le(name_at),
            le(name.len()),
            le(description_at),
            le(description.len()),
            le(parameters_at),
            le(parameters.len()),
        ]
        .concat(),
    )
}

/// What a run of the binary cost: its exit code, output, CPU time (user
/// and system, its children's included) and peak resident memory.
#[derive(Debug)]
pub struct Measured {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub cpu: std::time::Duration,
    pub max_rss_bytes: u64,
}

/// [`airlock_command`] run by `wrapper`: the binary and its arguments
/// after the wrapper's own, with the environment the tests give it.
pub fn airlock_through(mut wrapper: Command, args: &[&str], env: &[(&str, &str)]) -> Command {
    let airlock = airlock_command(args, env);
    wrapper.arg(airlock.get_program()).args(airlock.get_args());
    for (key, value) in airlock.get_envs() {
        match value {
            Some(value) => wrapper.env(key, value),
            None => wrapper.env_remove(key),
        };
    }
    wrapper
}

/// Runs [`airlock_command`] to its end and reads its resource use from the
/// kernel (`wait4`): CPU seconds and peak memory, which do not depend on
/// how busy the machine is. A small Python process forks it and reads its
/// usage: a child forked from the test process would count the test
/// process's own peak memory as its own (the kernel keeps the high-water
/// mark of the memory a child was forked with).
pub fn airlock_measured(args: &[&str], env: &[(&str, &str)]) -> Measured {
    const WAIT: &str = r#"
import json, os, sys
out, err, report = sys.argv[1:4]
argv = sys.argv[4:]
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    os.execv(argv[0], argv)
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as f:
    json.dump({"code": os.waitstatus_to_exitcode(status),
               "cpu": usage.ru_utime + usage.ru_stime,
               "max_rss_kb": usage.ru_maxrss}, f)
"#;
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let (out, err, report) = (file("stdout"), file("stderr"), file("report"));
    let mut python = Command::new("python3");
    python.args(["-c", WAIT, &out, &err, &report]);
    let status = airlock_through(python, args, env)
        .status()
        .expect("python3 runs");
    assert!(status.success(), "the measuring wrapper failed: {status}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    Measured {
        code: report["code"]
            .as_i64()
            .and_then(|c| i32::try_from(c).ok())
            .filter(|c| *c >= 0),
        stdout: std::fs::read_to_string(&out).unwrap(),
        stderr: std::fs::read_to_string(&err).unwrap(),
        cpu: std::time::Duration::from_secs_f64(report["cpu"].as_f64().unwrap_or(f64::MAX)),
        max_rss_bytes: report["max_rss_kb"].as_u64().unwrap_or(u64::MAX) * 1024,
    }
}

/// A gate for calls of the fetch tool: each request to `/held` waits until
/// the test opens the gate; the test waits until as many as it expects
/// have arrived.
pub struct Gate {
    pub served: Served,
    arrived: std::sync::Arc<tokio::sync::Semaphore>,
    /// Sent `true`, it lets every request through, held or to come.
    pub open: tokio::sync::watch::Sender<bool>,
}

impl Gate {
    pub async fn start() -> Self {
        let arrived = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
        let (open, opened) = tokio::sync::watch::channel(false);
        let counted = std::sync::Arc::clone(&arrived);
        let served = serve(move |_request| {
            let (counted, mut opened) = (std::sync::Arc::clone(&counted), opened.clone());
            async move {
                counted.add_permits(1);
                let _ = opened.wait_for(|open| *open).await;
                Ok(hyper::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from_static(b"through"),
                )))
            }
        })
        .await;
        Self {
            served,
            arrived,
            open,
        }
    }

    /// Waits until `count` requests have arrived.
    pub async fn wait_for(&self, count: u32) {
        let _ = self.arrived.acquire_many(count).await.unwrap();
    }
}

/// Sends `signal` to the process `pid` (one the test started); one that is
/// gone already is no error.
#[allow(unsafe_code)]
pub fn signal(pid: u32, signal: i32) {
    let Ok(pid) = i32::try_from(pid) else {
        return;
    };
    // SAFETY: kill has no memory effects; a pid that is gone is ESRCH.
    unsafe { libc::kill(pid, signal) };
}
