//! Parallel tool calls with sequential results (DESIGN §3): the calls of a
//! model turn run concurrently and commit as if one after another, in the
//! model's order. Real components, the real agent loop, a script model.

use std::path::Path;
use std::sync::Arc;

use airlock::agent::{Agent, AgentOptions};
use airlock::context::ContextRules;
use airlock::journal::{Event, Transcript};
use airlock::llm::ScriptModel;
use airlock::policy::TurnPolicy;
use airlock::sandbox::grants::{HostPattern, HttpGrant};
use airlock::{Host, RunContext, ToolConfig};
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use sha2::Digest as _;

use crate::support::loopback::Loopback;
use crate::support::{host, host_with};

/// What the model was told, call by call.
fn tool_messages(transcript: &Transcript) -> Vec<(String, String, bool)> {
    crate::support::tool_messages(&transcript.messages)
}

fn parallel(max_parallel: usize) -> AgentOptions {
    AgentOptions {
        turn: TurnPolicy {
            parallel: true,
            max_parallel,
            ..TurnPolicy::default()
        },
        ..AgentOptions::default()
    }
}

fn sequential() -> AgentOptions {
    AgentOptions {
        turn: TurnPolicy {
            parallel: false,
            ..TurnPolicy::default()
        },
        ..AgentOptions::default()
    }
}

/// Runs a script of `turns` (then "done") on `deps`, in session `turns`;
/// the context and the transcript at the end.
async fn run(
    host: &Arc<Host>,
    dir: &Path,
    turns: &[Value],
    deps: &Map<String, Value>,
    options: AgentOptions,
) -> (RunContext, Transcript) {
    let mut script = turns.to_vec();
    script.push(json!({"text": "done"}));
    // Named by its content: both modes play the same file (the model's
    // name, in the events, is the script's path).
    let text = json!({ "turns": script }).to_string();
    let digest = sha2::Sha256::digest(text.as_bytes());
    let path = dir.join(format!("{}.json", hex::encode(&digest[..8])));
    std::fs::write(&path, text).unwrap();
    let model = Arc::new(ScriptModel::load(&path).unwrap());
    let mut ctx = RunContext::new(deps.clone()).with_session_id("turns");
    let mut transcript = Transcript::default();
    let outcome = Agent::new(Arc::clone(host), model)
        .options(options)
        .run(&mut ctx, &mut transcript, "go")
        .await;
    outcome.unwrap();
    (ctx, transcript)
}

/// A run's messages and events, less what differs between two runs by
/// nature: the run id (which the `read` tool also shows), the clock, and
/// how long calls took.
fn comparable(ctx: &RunContext, transcript: &Transcript) -> (String, Vec<Value>) {
    let unrun = |text: String| text.replace(ctx.run_id(), "RUN");
    let messages = unrun(serde_json::to_string(&transcript.messages).unwrap());
    let events = transcript
        .items
        .iter()
        .map(|event: &Event| {
            let mut value: Value =
                serde_json::from_str(&unrun(serde_json::to_string(event).unwrap())).unwrap();
            let map = value.as_object_mut().unwrap();
            for field in ["at_ms", "duration_us"] {
                map.remove(field);
            }
            value
        })
        .collect();
    (messages, events)
}

/// Asserts that parallel mode ended exactly where sequential mode did.
async fn assert_same_as_sequential(
    host: &Arc<Host>,
    dir: &Path,
    turns: &[Value],
    deps: &Map<String, Value>,
    max_parallel: usize,
) {
    let (seq_ctx, seq) = run(host, dir, turns, deps, sequential()).await;
    let (par_ctx, par) = run(host, dir, turns, deps, parallel(max_parallel)).await;
    assert_eq!(
        serde_json::to_string(par_ctx.deps()).unwrap(),
        serde_json::to_string(seq_ctx.deps()).unwrap(),
        "deps"
    );
    let (par_messages, par_events) = comparable(&par_ctx, &par);
    let (seq_messages, seq_events) = comparable(&seq_ctx, &seq);
    assert_eq!(par_messages, seq_messages, "results");
    assert_eq!(par_events, seq_events, "events");
    assert_eq!(par_ctx.usage, seq_ctx.usage);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_increments_in_one_turn_leave_three() {
    let dir = tempfile::tempdir().unwrap();
    let increment = json!({"name": "increment", "arguments": {"name": "c"}});
    let turns = [json!({"tool_calls": [increment, increment, increment]})];
    let (ctx, transcript) = run(host().await, dir.path(), &turns, &Map::new(), parallel(8)).await;
    assert_eq!(ctx.deps()["counters"], json!({"c": 3}));
    let values: Vec<Value> = tool_messages(&transcript)
        .iter()
        .map(|(_, content, _)| serde_json::from_str::<Value>(content).unwrap()["value"].clone())
        .collect();
    assert_eq!(values, [json!(1), json!(2), json!(3)]);
    assert_same_as_sequential(host().await, dir.path(), &turns, &Map::new(), 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_calls_run_once_and_dependent_ones_see_earlier_writes() {
    let dir = tempfile::tempdir().unwrap();
    // b is copied from a after a is set in the same turn; c is untouched.
    let turns = [json!({"tool_calls": [
        {"id": "w", "name": "derive", "arguments": {"read": [], "ops": [{"op": "set", "key": "a", "value": 7}]}},
        {"id": "copy", "name": "derive", "arguments": {"read": ["a"], "ops": [{"op": "set", "key": "b", "from": "a"}]}},
        {"id": "other", "name": "derive", "arguments": {"read": ["c"], "ops": [{"op": "append", "key": "log", "value": 1}]}},
        {"id": "retry", "name": "derive", "arguments": {"read": [], "ops": [{"op": "bogus", "key": "x"}]}},
        {"id": "sees", "name": "derive", "arguments": {"read": [], "ops": [], "retry": true}}
    ]})];
    let deps = json!({"a": 1, "c": "kept"}).as_object().unwrap().clone();
    let (ctx, transcript) = run(host().await, dir.path(), &turns, &deps, parallel(8)).await;
    assert_eq!(
        Value::Object(ctx.deps().clone()),
        json!({"a": 7, "c": "kept", "b": 7, "log": [1]})
    );
    let told = tool_messages(&transcript);
    assert_eq!(told[1].1, r#"{"read":{"a":7}}"#);
    assert_eq!(told[2].1, r#"{"read":{"c":"kept"}}"#);
    assert!(told[3].2, "the bogus op fails the call");
    assert_eq!(
        told[4].1, r#"{"read":{},"retry":1}"#,
        "it sees the failure before it"
    );
    assert_same_as_sequential(host().await, dir.path(), &turns, &deps, 8).await;
}

/// Keys from a small alphabet, so calls collide.
fn key() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["a", "b", "c", "d"])
}

fn small_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-3i64..4).prop_map(|n| json!(n)),
        Just(json!({"x": 1})),
        Just(json!([1])),
        Just(Value::Null),
    ]
}

/// One op of `derive`: a set, merge, append or delete, its value given or
/// copied from a key the call read.
fn derive_op() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["set", "merge", "append", "delete"]),
        key(),
        prop_oneof![small_value().prop_map(Some), Just(None)],
        key(),
    )
        .prop_map(|(op, key, value, from)| match (op, value) {
            ("delete", _) => json!({"op": "delete", "key": key}),
            (op, Some(value)) => json!({"op": op, "key": key, "value": value}),
            (op, None) => json!({"op": op, "key": key, "from": from}),
        })
}

/// A call: `derive` (random reads and ops; sometimes a bad op, which fails
/// it and bumps the retry count later calls see), `increment`, or `read`
/// of the whole view.
fn call() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => (
            prop::collection::vec(key(), 0..3),
            prop::collection::vec(derive_op(), 0..3),
            any::<bool>(),
            prop::bool::weighted(0.1),
        )
            .prop_map(|(read, mut ops, retry, bad)| {
                if bad {
                    ops.push(json!({"op": "bogus", "key": "a"}));
                }
                json!({"name": "derive", "arguments": {"read": read, "ops": ops, "retry": retry}})
            }),
        2 => key().prop_map(|k| json!({"name": "increment", "arguments": {"name": k}})),
        1 => Just(json!({"name": "read", "arguments": {"keys": ["a"]}})),
    ]
}

fn turns() -> impl Strategy<Value = Vec<Value>> {
    prop::collection::vec(
        prop::collection::vec(call(), 1..7).prop_map(|calls| {
            let calls: Vec<Value> = calls
                .into_iter()
                .enumerate()
                .map(|(i, mut call)| {
                    call["id"] = json!(format!("c{i}"));
                    call
                })
                .collect();
            json!({"tool_calls": calls})
        }),
        1..3,
    )
}

fn deps() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec((key(), small_value()), 0..4).prop_map(|entries| {
        entries
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect()
    })
}

/// Random turns of calls over the context-probe tool (random reads and
/// ops), the stateful tool and the full view: parallel mode ends with
/// byte-identical deps, results and events (less run ids, clocks and
/// durations) to sequential mode.
#[test]
fn parallel_turns_equal_sequential_turns() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let host = runtime.block_on(host());
    let dir = tempfile::tempdir().unwrap();
    let config = ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(turns in turns(), deps in deps(), max_parallel in 2usize..9)| {
        runtime.block_on(assert_same_as_sequential(host, dir.path(), &turns, &deps, max_parallel));
    });
}

/// A fetcher granted the loopback server, idempotent or not; the stateful
/// and context-probe tools beside it.
async fn fetch_host(server: &Loopback, idempotent: bool) -> Arc<Host> {
    let mut fetch = ToolConfig::default();
    fetch.grants.http = HttpGrant::new(vec![HostPattern::parse(&server.url("")).unwrap()]);
    fetch.idempotent = idempotent;
    let mut host = host_with(&[("http_fetch", fetch)], ContextRules::default()).await;
    host.load(crate::support::guest("context_probe"))
        .await
        .unwrap();
    Arc::new(host)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effectful_tools_never_run_twice() {
    let dir = tempfile::tempdir().unwrap();
    for idempotent in [false, true] {
        let server = Loopback::start().await;
        let host = fetch_host(&server, idempotent).await;
        let fetch = |n: u32| json!({"name": "fetch", "arguments": {"url": server.url(&format!("/hello?{n}"))}});
        // Writes between the fetches: every later speculative call that read
        // a written key runs again; the fetches must not.
        let turns = [json!({"tool_calls": [
            fetch(1),
            {"name": "derive", "arguments": {"read": ["a"], "ops": [{"op": "set", "key": "a", "value": 1}]}},
            fetch(2),
            {"name": "increment", "arguments": {"name": "a"}},
            {"name": "read", "arguments": {"keys": ["a"]}},
            fetch(3)
        ]})];
        let (ctx, transcript) = run(&host, dir.path(), &turns, &Map::new(), parallel(8)).await;
        let paths: Vec<String> = server.requests().iter().map(|r| r.path.clone()).collect();
        assert_eq!(paths.len(), 3, "idempotent = {idempotent}: {paths:?}");
        assert_eq!(ctx.deps()["a"], 1);
        let told = tool_messages(&transcript);
        assert!(told.iter().all(|(_, _, error)| !error), "{told:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_calls_of_a_turn_run_at_once() {
    use bytes::Bytes;
    use http_body_util::Full;
    // Answers only once three requests wait together (or, failing that,
    // after 20 s, "alone"): a turn of three fetches gets "together" only
    // if its calls run at once.
    let barrier = Arc::new(tokio::sync::Barrier::new(3));
    let served = crate::support::serve(move |_request| {
        let barrier = Arc::clone(&barrier);
        async move {
            let met = tokio::time::timeout(std::time::Duration::from_secs(20), barrier.wait())
                .await
                .is_ok();
            let body = if met { "together" } else { "alone" };
            Ok(hyper::Response::new(Full::new(Bytes::from(body))))
        }
    })
    .await;
    let origin = format!("http://{}", served.addr);
    let mut fetch = ToolConfig::default();
    fetch.grants.http = HttpGrant::new(vec![HostPattern::parse(&origin).unwrap()]);
    fetch.idempotent = true;
    let host = Arc::new(host_with(&[("http_fetch", fetch)], ContextRules::default()).await);
    let calls: Vec<Value> = (0..3)
        .map(|i| json!({"name": "fetch", "arguments": {"url": format!("{origin}/{i}")}}))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let turns = [json!({ "tool_calls": calls })];
    let (_, transcript) = run(&host, dir.path(), &turns, &Map::new(), parallel(8)).await;
    let told = tool_messages(&transcript);
    assert_eq!(told.len(), 3);
    for (id, content, error) in told {
        assert!(!error && content.contains("together"), "{id}: {content}");
    }
}

/// A turn of many calls starts each only once the turn is within
/// `max_parallel` of it: while its first call waits, the calls behind it
/// do not all run and hold their results (a model that asks for thousands
/// of calls in one turn cannot make the host hold thousands of results).
/// Once the first call ends, the rest run and every call is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_runs_at_most_max_parallel_calls_ahead_of_the_one_it_is_at() {
    use bytes::Bytes;
    use http_body_util::Full;
    let arrived = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (release, released) = tokio::sync::watch::channel(false);
    let served = {
        let arrived = Arc::clone(&arrived);
        crate::support::serve(move |request: hyper::Request<hyper::body::Incoming>| {
            let first = request.uri().path() == "/0";
            arrived.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut released = released.clone();
            async move {
                if first {
                    let _ = released.wait_for(|r| *r).await;
                }
                Ok(hyper::Response::new(Full::new(Bytes::from("ok"))))
            }
        })
        .await
    };
    let origin = format!("http://{}", served.addr);
    let mut fetch = ToolConfig::default();
    fetch.grants.http = HttpGrant::new(vec![HostPattern::parse(&origin).unwrap()]);
    fetch.idempotent = true;
    let host = Arc::new(host_with(&[("http_fetch", fetch)], ContextRules::default()).await);
    let calls: Vec<Value> = (0..40)
        .map(|i| json!({"name": "fetch", "arguments": {"url": format!("{origin}/{i}")}}))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let turns = [json!({ "tool_calls": calls })];
    let watcher = {
        let arrived = Arc::clone(&arrived);
        tokio::spawn(async move {
            // Four at once, or a failing count after 30 s (not a hang).
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
            while arrived.load(std::sync::atomic::Ordering::SeqCst) < 4
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            // Time for calls past the window to arrive, were they started:
            // a shorter wait only makes this check weaker, never wrong.
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let seen = arrived.load(std::sync::atomic::Ordering::SeqCst);
            release.send_replace(true);
            seen
        })
    };
    let (_, transcript) = run(&host, dir.path(), &turns, &Map::new(), parallel(4)).await;
    let seen = watcher.await.unwrap();
    assert_eq!(seen, 4, "calls started while the first waited");
    let told = tool_messages(&transcript);
    assert_eq!(told.len(), 40);
    assert!(
        told.iter()
            .all(|(_, content, error)| !error && content.contains("ok")),
        "{told:?}"
    );
    assert_eq!(
        arrived.load(std::sync::atomic::Ordering::SeqCst),
        40,
        "each call ran once"
    );
}

/// A turn runs at most `max_calls` of its calls, in parallel mode or not:
/// each call past them is answered "not run" (an error the model sees,
/// saying why and what to do), none of them ran, and the run goes on.
/// The policy file sets the bound, and refuses 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_runs_at_most_max_calls_and_tells_the_model_of_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let increment =
        |i: usize| json!({"id": format!("c{i}"), "name": "increment", "arguments": {"name": "n"}});
    let turns = [
        json!({"tool_calls": (0..5).map(increment).collect::<Vec<_>>()}),
        json!({"tool_calls": [increment(9)]}),
    ];
    for parallel in [true, false] {
        let options = AgentOptions {
            turn: TurnPolicy {
                parallel,
                max_calls: 3,
                ..TurnPolicy::default()
            },
            ..AgentOptions::default()
        };
        let (ctx, transcript) = run(host().await, dir.path(), &turns, &Map::new(), options).await;
        assert_eq!(
            ctx.deps()["counters"]["n"],
            4,
            "3 of the first turn, 1 of the next"
        );
        let told = tool_messages(&transcript);
        assert_eq!(told.len(), 6, "every call is answered: {told:?}");
        for (id, content, error) in &told[3..5] {
            assert!(*error, "{id}: {content}");
            assert_eq!(
                content,
                "Tool call was not run: this turn asked for 5 tool calls, and a turn runs at \
                 most 3 (the policy's [turn] max_calls). Ask for it again in a later turn."
            );
        }
        assert!(told[5].1.contains(r#""value":4"#), "{told:?}");
    }

    let policy = dir.path().join("turn.toml");
    std::fs::write(&policy, "[turn]\nmax_calls = 2\n").unwrap();
    let loaded = airlock::policy::Policy::load(&policy).unwrap();
    assert_eq!(loaded.turn.max_calls, 2);
    std::fs::write(&policy, "[turn]\nmax_calls = 0\n").unwrap();
    let refused = airlock::policy::Policy::load(&policy)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("[turn] max_calls must be at least 1"),
        "{refused}"
    );
}
