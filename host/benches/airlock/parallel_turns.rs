//! §10 Parallel turns: a turn of 8 calls, sequential vs parallel.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{Bench, component, root, us};
use airlock::agent::{Agent, AgentOptions};
use airlock::journal::Transcript;
use airlock::llm::ScriptModel;
use airlock::{CompileCache, Host, RunContext, ToolCall};
use serde_json::{Value, json};

/// A loopback HTTP server that answers every request after `delay`; its
/// origin. Serves until the runtime ends.
async fn slow_server(delay: Duration) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_request| async move {
                    tokio::time::sleep(delay).await;
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from_static(b"slow hello")),
                    ))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(wasmtime_wasi_http::io::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

/// The time of an agent run whose one turn makes `calls`, in parallel or
/// sequential mode.
async fn turn_time(host: &Arc<Host>, dir: &Path, calls: &[Value], parallel: bool) -> Duration {
    let script = dir.join(format!("turn-{}-{parallel}.json", calls.len()));
    let turns = json!({"turns": [{"tool_calls": calls}, {"text": "done"}]});
    std::fs::write(&script, turns.to_string()).unwrap();
    let options = AgentOptions {
        turn: airlock::policy::TurnPolicy {
            parallel,
            ..Default::default()
        },
        ..Default::default()
    };
    let model = Arc::new(ScriptModel::load(&script).unwrap());
    let agent = Agent::new(Arc::clone(host), model).options(options);
    let mut ctx = RunContext::default();
    let mut transcript = Transcript::default();
    let t = Instant::now();
    agent.run(&mut ctx, &mut transcript, "go").await.unwrap();
    t.elapsed()
}

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(out, "## 10. Parallel tool calls\n").unwrap();
    let dir = tempfile::tempdir_in(root().join("target")).unwrap();
    let origin = slow_server(Duration::from_millis(100)).await;
    let mut fetch = airlock::ToolConfig::default();
    fetch.grants.http = airlock::sandbox::grants::HttpGrant::new(vec![
        airlock::sandbox::grants::HostPattern::parse(&origin).unwrap(),
    ]);
    fetch.idempotent = true;
    let mut host = Host::builder()
        .cache(CompileCache::in_dir(&b.cache))
        .build()
        .unwrap();
    host.load_with(component("wasm32-wasip2/release/http_fetch.wasm"), fetch)
        .await
        .unwrap();
    host.load(component("python-stateful.wasm")).await.unwrap();
    let host = Arc::new(host);

    let fetches = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| json!({"name": "fetch", "arguments": {"url": format!("{origin}/{i}")}}))
            .collect()
    };
    let pairs = if b.quick { 3 } else { 9 };
    let turn = |calls: Vec<Value>, parallel: bool| {
        let (host, dir) = (&host, dir.path());
        async move || turn_time(host, dir, &calls, parallel).await
    };
    let sequential_over_parallel = |name: &str| format!("sequential / parallel: {name}");
    const HTTP: &str = "HTTP fetches (100 ms each)";
    const INDEPENDENT: &str = "Python `show_state` (independent)";
    const DEPENDENT: &str = "Python `increment` of one counter (all dependent)";
    const DIRECT: &str = "Python `show_state` from 8 tasks, `Host::call` (no loop)";
    // The target: a parallel turn of 8 fetches against a turn of one.
    let http_one = b
        .paired(
            "parallel 8 fetches / one fetch",
            pairs,
            turn(fetches(8), true),
            turn(fetches(1), false),
        )
        .await;
    let http = b
        .paired(
            &sequential_over_parallel(HTTP),
            pairs,
            turn(fetches(8), false),
            turn(fetches(8), true),
        )
        .await;

    let same = |name: &str, args: Value| -> Vec<Value> {
        (0..8)
            .map(|_| json!({"name": name, "arguments": args.clone()}))
            .collect()
    };
    let pairs = if b.quick { 3 } else { 21 };
    let reads = same("show_state", json!({}));
    let writes = same("increment", json!({"name": "n"}));
    let independent = b
        .paired(
            &sequential_over_parallel(INDEPENDENT),
            pairs,
            turn(reads.clone(), false),
            turn(reads.clone(), true),
        )
        .await;
    let dependent = b
        .paired(
            &sequential_over_parallel(DEPENDENT),
            pairs,
            turn(writes.clone(), false),
            turn(writes.clone(), true),
        )
        .await;
    // The ceiling outside the loop: 8 `show_state` calls from 8 tasks at
    // once, straight through `Host::call`, against 8 in sequence.
    let eight = |together: bool| {
        let host = Arc::clone(&host);
        async move || {
            let t = Instant::now();
            if together {
                let mut set = tokio::task::JoinSet::new();
                for _ in 0..8 {
                    let host = Arc::clone(&host);
                    set.spawn(async move {
                        let mut ctx = RunContext::default();
                        host.call(&mut ctx, &ToolCall::new("show_state", "{}"))
                            .await
                            .unwrap();
                    });
                }
                while let Some(done) = set.join_next().await {
                    done.unwrap();
                }
            } else {
                let mut ctx = RunContext::default();
                for _ in 0..8 {
                    host.call(&mut ctx, &ToolCall::new("show_state", "{}"))
                        .await
                        .unwrap();
                }
            }
            t.elapsed()
        }
    };
    let direct = b
        .paired(
            &sequential_over_parallel(DIRECT),
            pairs,
            eight(false),
            eight(true),
        )
        .await;

    writeln!(
        out,
        "One model turn of 8 calls through the agent loop (a script model), the calls one after \
         another (`--sequential`) or at once with the results of running them in order (the \
         default; at most 8 at once), paired turn for turn ({pairs} pairs; 9 for HTTP). HTTP: \
         the Rust `http-fetch` tool, marked `idempotent`, against a loopback server that answers \
         after 100 ms. Python: componentize-py components on {} cores; `show_state` calls only \
         read, so none re-runs; 8 `increment`s of one counter each read what the one before \
         wrote, so every speculative run after the first is discarded and the call runs again: \
         the worst case.\n",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    )
    .unwrap();
    writeln!(
        out,
        "| 8 calls | sequential | parallel | speedup (paired) |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|").unwrap();
    for (name, measured) in [
        (HTTP, &http),
        (INDEPENDENT, &independent),
        (DEPENDENT, &dependent),
        (DIRECT, &direct),
    ] {
        writeln!(out, "{}", measured.row(name)).unwrap();
    }
    writeln!(
        out,
        "\nTargets:\n\n\
         - the parallel turn of 8 fetches ({}) within 1.5× of a turn of one ({}): {} — {}\n\
         - 8 independent Python calls in one turn at least 1.6× as fast in parallel as in sequence on 2 cores: {} — {}\n\n\
         The Python rows are bound by the host, not the turn: 8 Python calls from 8 tasks \
         straight through `Host::call` are {} as fast as 8 in sequence, which is what two cores give \
         fresh Python instances (the Rust tool: §5); what parallel mode adds on top is the re-run of \
         dependent calls.\n",
        us(http_one.a()),
        us(http_one.b()),
        http_one.cell(),
        http_one.at_most(1.5),
        independent.cell(),
        independent.at_least(1.6),
        direct.cell(),
    )
    .unwrap();
}
