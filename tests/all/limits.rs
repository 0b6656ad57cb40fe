//! Hostile guests against the default limits. Each test checks both sides:
//! the attack ends in its typed error, deps are byte-identical (the attack's
//! `set pwned` op is discarded), and the host serves the next call.

use std::time::{Duration, Instant};

use airlock::context::{ContextRules, RejectReason};
use airlock::sandbox::Stream;
use airlock::{CallError, CompileCache, Host, Limits, LoadError, RunContext, ToolConfig};
use serde_json::json;

use crate::support::{
    assert_host_still_serves, builder, built, cache_dir, call, guest, host_with, hostile_host,
    hostile_limits, idle_pool, prepared, root, snapshot,
};

async fn attack(name: &str) -> CallError {
    attack_on(hostile_host().await, name).await
}

async fn attack_on(host: &airlock::Host, name: &str) -> CallError {
    let mut ctx = RunContext::from_value(json!({"secret_plan": [1, 2, 3]})).unwrap();
    let before = snapshot(&ctx);
    let err = call(host, &mut ctx, name, json!({})).await.unwrap_err();
    assert!(
        !ctx.deps().contains_key("pwned"),
        "{name}: its ops were applied"
    );
    assert_host_still_serves(host, &mut ctx, &before).await;
    err
}

#[tokio::test]
async fn panic_is_a_trap_with_the_panic_message() {
    let err = attack("panic").await;
    let CallError::Trap { message, stderr } = &err else {
        panic!("expected a trap, got {err}");
    };
    assert!(message.contains("unreachable"), "{message}");
    assert!(
        stderr.contains("hostile tool panicked on purpose"),
        "{stderr}"
    );
    assert_eq!(err.kind(), airlock::ErrorKind::Trap);
}

#[tokio::test]
async fn unreachable_is_a_trap() {
    let err = attack("unreachable").await;
    assert!(
        matches!(&err, CallError::Trap { message, .. } if message.contains("unreachable")),
        "{err}"
    );
}

#[tokio::test]
async fn infinite_loop_times_out() {
    let started = Instant::now();
    let err = attack("spin").await;
    assert!(
        matches!(err, CallError::Timeout { limit } if limit == hostile_limits().timeout),
        "{err}"
    );
    // Not a timing assertion on speed: only that the deadline, not some
    // other bound, ended the call.
    assert!(started.elapsed() >= Duration::from_millis(500));
}

/// A guest blocked in a host call runs no wasm, so epoch interruption
/// cannot stop it: the host's own timer must, at the same deadline.
#[tokio::test]
async fn a_guest_asleep_in_the_host_is_stopped_at_its_deadline() {
    let started = Instant::now();
    let err = attack("sleep").await;
    assert!(
        matches!(err, CallError::Timeout { limit } if limit == hostile_limits().timeout),
        "{err}"
    );
    assert!(started.elapsed() >= hostile_limits().timeout);
}

#[tokio::test]
async fn memory_bomb_hits_the_memory_limit() {
    let err = attack("memory_bomb").await;
    assert!(
        matches!(err, CallError::MemoryLimit { limit } if limit == 128 << 20),
        "{err}"
    );
}

#[tokio::test]
async fn unbounded_recursion_is_a_trap() {
    // Rust keeps its stack in linear memory (a shadow stack), so deep
    // recursion runs off the bottom of memory before wasmtime's native
    // stack guard fires: an out-of-bounds trap rather than a stack overflow.
    let err = attack("recurse").await;
    assert!(
        matches!(&err, CallError::Trap { message, .. }
            if message.contains("out of bounds memory access") || message.contains("stack overflow")),
        "{err}"
    );
}

#[tokio::test]
async fn huge_result_is_refused() {
    let err = attack("huge_result").await;
    assert!(
        matches!(err, CallError::ResultTooLarge { limit: 1048576, .. }),
        "{err}"
    );
}

/// Issue 17 item 4: a tool's error message is bounded like its result:
/// an 8 MiB message arrives cut to 16 KiB, saying how long it was.
#[tokio::test]
async fn huge_error_messages_are_cut() {
    let err = attack("huge_error").await;
    let CallError::Failed(message) = &err else {
        panic!("expected a tool failure, got {err}");
    };
    let limit = airlock::tools::MAX_ERROR_MESSAGE_BYTES;
    assert!(message.len() < limit + 100, "{} bytes", message.len());
    assert!(
        message.ends_with(&format!(
            "… (message cut: {} bytes; the limit is {limit})",
            8 << 20
        )),
        "{}",
        &message[message.len() - 80..]
    );
}

/// Issue 17 item 2: what a guest makes the host hold through WASI is
/// bounded like its memory. Header fields of 64 KiB each, created without
/// end and kept (no HTTP grant is needed to create them), stop at the
/// call's resource limit as `resource_limit`; each fields resource is
/// capped so that the limit's worth of them fits the memory limit.
#[tokio::test]
async fn host_resources_a_guest_creates_are_bounded() {
    // A generous timeout: the bound must be what stops it, on a busy CI
    // machine too.
    let limits = Limits {
        timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let config = ToolConfig {
        limits: limits.clone(),
        ..ToolConfig::default()
    };
    let host = host_with(&[("hostile", config)], ContextRules::default()).await;
    let err = attack_on(&host, "fields_bomb").await;
    assert!(
        matches!(err, CallError::ResourceLimit { limit } if limit == limits.max_host_resources),
        "{err}"
    );
    assert_eq!(err.kind(), airlock::ErrorKind::ResourceLimit);
    assert!(
        limits.max_host_resources * limits.host_resource_bytes() <= limits.max_memory_bytes,
        "the accounted worst case fits the memory limit"
    );
}

#[tokio::test]
async fn stdout_flood_hits_the_output_limit() {
    let err = attack("flood_stdout").await;
    assert!(
        matches!(
            err,
            CallError::OutputLimit {
                stream: Stream::Stdout,
                limit: 1048576
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn log_flood_hits_the_output_limit() {
    let err = attack("flood_log").await;
    assert!(
        matches!(
            err,
            CallError::OutputLimit {
                stream: Stream::Log,
                ..
            }
        ),
        "{err}"
    );
}

/// Empty records cost the host a record each: a flood of them stops at
/// the same bound as text, each charged `LOG_RECORD_COST`, and the host
/// holds no more than that many.
#[tokio::test]
async fn empty_log_flood_is_bounded_per_record() {
    let host = hostile_host().await;
    let mut ctx = RunContext::from_value(json!({"keep": 1})).unwrap();
    let before = snapshot(&ctx);
    let failure = host
        .call(&mut ctx, &airlock::ToolCall::new("flood_empty_log", "{}"))
        .await
        .unwrap_err();
    let limit = hostile_limits().max_output_bytes;
    assert!(
        matches!(
            failure.error,
            CallError::OutputLimit {
                stream: Stream::Log,
                limit: l,
            } if l == limit
        ),
        "{}",
        failure.error
    );
    let kept = failure.output.logs.len();
    assert!(kept > 0, "the records before the bound are kept");
    assert!(
        kept <= limit / airlock::sandbox::LOG_RECORD_COST,
        "{kept} records kept under a {limit}-byte bound"
    );
    assert_host_still_serves(host, &mut ctx, &before).await;
}

#[tokio::test]
async fn a_million_ops_are_refused() {
    // Building and lifting a million ops takes the guest a while; give it
    // the default 5 s so that only the op bound can stop it.
    let host = crate::support::host_with(
        &[("hostile", airlock::ToolConfig::default())],
        airlock::context::ContextRules::default(),
    )
    .await;
    let err = attack_on(&host, "million_ops").await;
    let CallError::OpRejected(rejected) = &err else {
        panic!("expected op_rejected, got {err}");
    };
    assert_eq!(
        rejected.reason,
        RejectReason::TooManyOps {
            count: 1_000_000,
            max: 1000
        }
    );
}

#[tokio::test]
async fn op_bytes_flood_is_refused() {
    let err = attack("op_bytes_flood").await;
    assert!(
        matches!(&err, CallError::OpRejected(r) if matches!(r.reason, RejectReason::TooManyBytes { .. })),
        "{err}"
    );
}

#[tokio::test]
async fn result_that_is_not_json_is_refused() {
    let err = attack("non_json_result").await;
    assert!(matches!(err, CallError::InvalidResult(_)), "{err}");
}

#[tokio::test]
async fn op_value_that_is_not_json_is_refused() {
    let err = attack("non_json_op").await;
    let CallError::OpRejected(rejected) = &err else {
        panic!("expected op_rejected, got {err}");
    };
    assert_eq!((rejected.index, rejected.key.as_str()), (1, "pwned"));
    assert!(
        matches!(rejected.reason, RejectReason::InvalidJson(_)),
        "{err}"
    );
}

#[tokio::test]
async fn spinning_after_partial_output_times_out() {
    let err = attack("spin_after_output").await;
    assert!(matches!(err, CallError::Timeout { .. }), "{err}");
}

#[tokio::test]
async fn fuel_limit_stops_a_loop_deterministically() {
    let host = airlock::Host::builder()
        .cache(airlock::CompileCache::in_dir(crate::support::cache_dir()))
        .max_concurrent_calls(4)
        .fuel_metering(true)
        .build()
        .unwrap();
    fuel_stops_a_spinning_call(host).await;
}

/// On `host` (which meters fuel), the hostile guest's `spin` under a fuel
/// limit ends as `fuel_exhausted`, deps unchanged, the next call served.
pub(crate) async fn fuel_stops_a_spinning_call(mut host: Host) {
    let config = airlock::ToolConfig {
        limits: airlock::Limits {
            fuel: Some(50_000_000),
            ..airlock::Limits::default()
        },
        ..airlock::ToolConfig::default()
    };
    host.load_with(crate::support::guest("hostile"), config)
        .await
        .unwrap();
    host.load(crate::support::guest("stateful")).await.unwrap();
    let mut ctx = RunContext::from_value(json!({"k": 1})).unwrap();
    let before = snapshot(&ctx);
    let err = call(&host, &mut ctx, "spin", json!({})).await.unwrap_err();
    assert!(
        matches!(err, CallError::FuelExhausted { limit: 50_000_000 }),
        "{err}"
    );
    assert_host_still_serves(&host, &mut ctx, &before).await;
}

// Attacks Rust cannot express, written in WAT (guest-examples/hostile/wat):
// a table-growth bomb, an infinite loop in a start function, a huge
// initial memory. Each is contained; the host loads and serves others.

fn wat(name: &str) -> std::path::PathBuf {
    root()
        .join("guest-examples/hostile/wat")
        .join(format!("{name}.wat"))
}

#[tokio::test]
async fn table_bomb_hits_the_table_limit() {
    let mut host = host_with(&[], ContextRules::default()).await;
    host.load(wat("table_bomb")).await.unwrap();
    let mut ctx = RunContext::from_value(json!({"keep": [1, 2]})).unwrap();
    let before = snapshot(&ctx);
    let err = call(&host, &mut ctx, "grow", json!({})).await.unwrap_err();
    assert!(
        matches!(err, CallError::TableLimit { limit: 1_000_000 }),
        "{err}"
    );
    assert_host_still_serves(&host, &mut ctx, &before).await;
}

async fn load_fails(name: &str) -> LoadError {
    let mut host = Host::builder()
        .cache(CompileCache::in_dir(cache_dir()))
        .max_concurrent_calls(4)
        .build()
        .unwrap();
    let config = ToolConfig {
        limits: Limits {
            timeout: Duration::from_millis(500),
            ..Limits::default()
        },
        ..ToolConfig::default()
    };
    let err = host.load_with(wat(name), config).await.unwrap_err();
    assert!(err.to_string().contains(&format!("{name}.wat")), "{err}");
    // The host loads and serves a well-behaved tool afterwards.
    host.load(guest("stateful")).await.unwrap();
    let mut ctx = RunContext::default();
    call(&host, &mut ctx, "increment", json!({"name": "after"}))
        .await
        .unwrap();
    assert_eq!(ctx.deps()["counters"]["after"], 1);
    err
}

#[tokio::test]
async fn a_start_function_that_never_returns_times_out_at_load() {
    let err = load_fails("start_loop").await;
    assert!(
        matches!(&err, LoadError::Describe { source, .. } if matches!(**source, CallError::Timeout { .. })),
        "{err}"
    );
}

#[tokio::test]
async fn a_huge_initial_memory_is_refused_at_load() {
    let err = load_fails("huge_memory").await;
    assert!(
        matches!(&err, LoadError::Describe { source, .. } if matches!(**source, CallError::MemoryLimit { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("128 MiB memory limit"), "{err}");
}

/// Limits that cannot be enforced are refused at load, naming the limit,
/// instead of overflowing (a `Duration::MAX` timeout) or being silently
/// capped (memory over the pool's ceiling); the host goes on serving.
#[tokio::test]
async fn limits_that_cannot_be_enforced_are_refused_at_load() {
    let mut host = host_with(&[], ContextRules::default()).await;
    let cases = [
        (
            Limits {
                timeout: Duration::MAX,
                ..Limits::default()
            },
            "the timeout",
        ),
        (
            Limits {
                timeout: Duration::ZERO,
                ..Limits::default()
            },
            "at least 1 ms",
        ),
        (
            Limits {
                max_memory_bytes: 8 << 30,
                ..Limits::default()
            },
            "over the host's ceiling of 4096 MiB",
        ),
    ];
    for (limits, expected) in cases {
        let config = ToolConfig {
            limits,
            ..ToolConfig::default()
        };
        let err = host.load_with(guest("hostile"), config).await.unwrap_err();
        assert!(
            matches!(&err, LoadError::BadLimits { problem, .. } if problem.contains(expected)),
            "{err}"
        );
        assert!(err.to_string().contains("hostile.wasm"), "{err}");
    }
    let mut ctx = RunContext::default();
    let before = snapshot(&ctx);
    assert_host_still_serves(&host, &mut ctx, &before).await;
}

/// Calls `name` with `args` on a task of its own, cancellable with
/// `cancel`, from deps `{"keep":1}`; the task ends with the call's outcome
/// and the deps after it (as text).
fn spawn_call(
    host: &std::sync::Arc<Host>,
    name: &str,
    args: serde_json::Value,
    cancel: &airlock::sandbox::CancelToken,
) -> tokio::task::JoinHandle<(Result<(), CallError>, String)> {
    let (host, cancel) = (host.clone(), cancel.clone());
    let call = airlock::ToolCall::new(name, args.to_string());
    tokio::spawn(async move {
        let mut ctx = RunContext::from_value(json!({"keep": 1})).unwrap();
        let out = host.call_cancellable(&mut ctx, &call, &cancel).await;
        (out.map(|_| ()).map_err(|f| f.error), snapshot(&ctx))
    })
}

/// A host with the hostile guest under `timeout`, granted a fresh
/// directory as `/signal` (where a guest writes a file to say it runs).
async fn signalling_host(timeout: Duration) -> (tempfile::TempDir, std::sync::Arc<Host>) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ToolConfig::default();
    config.limits.timeout = timeout;
    config.grants.dirs = vec![
        airlock::sandbox::grants::DirGrant::new(
            dir.path(),
            "/signal",
            airlock::sandbox::grants::DirMode::Rw,
        )
        .unwrap(),
    ];
    let host = host_with(&[("hostile", config)], ContextRules::default()).await;
    (dir, std::sync::Arc::new(host))
}

/// Issue 12 item 7: as many spinning calls as the runtime has workers do
/// not stall the others. Each spinner writes a file once it runs (so the
/// test knows both hold a worker), then spins. A benign call spawned on the
/// same runtime then completes while both spinners still run; without the
/// yield at each epoch tick it would wait for a spinner's timeout, and the
/// spinners would be finished by then. The spinners are then cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spinning_calls_do_not_hold_the_runtime_workers() {
    let (dir, host) = signalling_host(Duration::from_secs(30)).await;
    let cancel = airlock::sandbox::CancelToken::new();
    let spinners: Vec<_> = (0..2)
        .map(|i| {
            let args = json!({ "path": format!("/signal/{i}") });
            spawn_call(&host, "write_then_spin", args, &cancel)
        })
        .collect();
    // Blocking wait on this (non-worker) thread: it needs no runtime.
    while !(0..2).all(|i| dir.path().join(i.to_string()).exists()) {
        std::thread::sleep(Duration::from_millis(5));
    }

    let benign = tokio::spawn({
        let host = host.clone();
        async move {
            let mut ctx = RunContext::from_value(json!({"counters": {"a": 1}})).unwrap();
            call(&host, &mut ctx, "increment", json!({"name": "a"}))
                .await
                .map(|o| o.result)
        }
    });
    let result = benign.await.unwrap().unwrap();
    assert_eq!(result, json!({"counter": "a", "value": 2}));
    assert!(
        spinners.iter().all(|s| !s.is_finished()),
        "the benign call had to wait for the spinners to end"
    );

    cancel.cancel();
    for spinner in spinners {
        let (out, deps) = spinner.await.unwrap();
        assert!(matches!(out, Err(CallError::Cancelled)), "{out:?}");
        assert_eq!(deps, r#"{"keep":1}"#);
    }
}

/// Cancelling a call whose guest is blocked in the host (asleep on a
/// clock; its timeout is an hour, so nothing else can end it) ends it as
/// cancelled, deps unchanged, and the host serves the next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_asleep_in_the_host_is_stopped_when_cancelled() {
    let (dir, host) = signalling_host(Duration::from_secs(3600)).await;
    let cancel = airlock::sandbox::CancelToken::new();
    let sleeper = spawn_call(&host, "sleep", json!({"path": "/signal/asleep"}), &cancel);
    // Blocking wait on this (non-worker) thread until the guest is about
    // to sleep.
    while !dir.path().join("asleep").exists() {
        std::thread::sleep(Duration::from_millis(5));
    }
    cancel.cancel();
    let (out, deps) = sleeper.await.unwrap();
    assert!(matches!(out, Err(CallError::Cancelled)), "{out:?}");
    assert_eq!(deps, r#"{"keep":1}"#);
    let mut ctx = RunContext::from_value(json!({"counters": {"a": 1}})).unwrap();
    let before = snapshot(&ctx);
    assert_host_still_serves(&host, &mut ctx, &before).await;
}

/// Issue 12 item 12 (and issue 17 item 4): what `describe` returns is
/// bounded before the host compiles or keeps it: a schema's depth and size,
/// a description's size. Each is refused at load naming the tool and the
/// bound; the host loads and serves other tools afterwards.
#[tokio::test]
async fn oversized_tool_specs_are_refused_at_load() {
    let deep = "{\"not\":".repeat(40) + "{}" + &"}".repeat(40);
    let big_schema = format!(
        "{{\"type\":\"object\",\"description\":\"{}\"}}",
        "x".repeat(70_000)
    );
    let cases = [
        (
            "deep",
            "ok".to_owned(),
            deep,
            "tool \"deep\": parameters are not a usable JSON Schema: the schema nests 41 levels deep; the limit is 32",
        ),
        (
            "big",
            "ok".to_owned(),
            big_schema,
            "tool \"big\": the parameter schema is 70034 bytes; the limit is 65536",
        ),
        (
            "wordy",
            "w".repeat(20_000),
            "{}".to_owned(),
            "tool \"wordy\": the description is 20000 bytes; the limit is 16384",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, description, parameters, expected) in cases {
        let path = dir.path().join(format!("{name}.wat"));
        std::fs::write(
            &path,
            crate::support::describe_wat(name, &description, &parameters),
        )
        .unwrap();
        let mut host = host_with(&[], ContextRules::default()).await;
        let err = host.load(&path).await.unwrap_err();
        assert!(
            matches!(err, LoadError::BadSpec { .. }) && err.to_string().ends_with(expected),
            "{name}: {err}"
        );
        let mut ctx = RunContext::from_value(json!({"keep": 1})).unwrap();
        let before = snapshot(&ctx);
        assert_host_still_serves(&host, &mut ctx, &before).await;
    }
    // The same generator with sane strings loads: the refusals above are
    // the bounds, not the generator.
    let path = dir.path().join("fine.wat");
    std::fs::write(
        &path,
        crate::support::describe_wat("fine", "A fine tool.", "{\"type\":\"object\"}"),
    )
    .unwrap();
    let mut host = host_with(&[], ContextRules::default()).await;
    host.load(&path).await.unwrap();
    assert!(host.tool_names().contains(&"fine".to_owned()));
}

/// Issue 12 item 9: one component cannot take the whole instance pool. The
/// `pool_hog` component (WAT) takes 5 memories per call and spins; on a
/// host with room for 10 calls (20 memories) it may hold half: 2 calls.
/// Of 11 concurrent calls, 2 run, 8 wait their turn (4 per admitted call),
/// and 1 is refused at once as `busy`; another tool is served meanwhile.
/// Cancelling ends the waiting and the running alike, and frees every slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tool_cannot_take_the_whole_instance_pool() {
    use airlock::sandbox::{CancelToken, PoolUsage};
    let mut host = Host::builder()
        .cache(CompileCache::in_dir(cache_dir()))
        .max_concurrent_calls(10)
        .build()
        .unwrap();
    let config = ToolConfig {
        limits: Limits {
            timeout: Duration::from_secs(60),
            ..Limits::default()
        },
        ..ToolConfig::default()
    };
    host.load_with(wat("pool_hog"), config).await.unwrap();
    host.load(guest("stateful")).await.unwrap();
    let host = std::sync::Arc::new(host);
    let cancel = CancelToken::new();
    let hogs: Vec<_> = (0..11)
        .map(|_| spawn_call(&host, "hog", json!({}), &cancel))
        .collect();
    // Wait (on this non-worker thread) until the tool holds its share, its
    // queue is full, and the one call past it has been turned away.
    loop {
        let usage = host.pool_usage();
        let done = hogs.iter().filter(|h| h.is_finished()).count();
        if usage.memories == 10 && usage.waiting == 8 && done == 1 {
            break;
        }
        assert!(usage.memories <= 10, "{usage:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut ctx = RunContext::from_value(json!({"counters": {"a": 1}})).unwrap();
    call(&host, &mut ctx, "increment", json!({"name": "a"}))
        .await
        .unwrap();
    assert_eq!(ctx.deps()["counters"]["a"], 2);

    cancel.cancel();
    let (mut busy, mut cancelled) = (0, 0);
    for hog in hogs {
        let (out, deps) = hog.await.unwrap();
        assert_eq!(deps, r#"{"keep":1}"#);
        match out {
            Err(CallError::Busy(message)) => {
                assert!(message.contains("already waiting"), "{message}");
                busy += 1;
            }
            Err(CallError::Cancelled) => cancelled += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((busy, cancelled), (1, 10));
    // What is still held belongs to instances prepared ahead of demand
    // (the stateful tool's, unless the waiting calls reclaimed it): once
    // none is being made, releasing them frees every slot.
    let idle = idle_pool(&host).await;
    assert_eq!(idle.calls, idle.prepared, "{idle:?}");
    // A hog's store dropped aside holds its slots until it is gone, and
    // an instance being prepared is kept when it is done, either of which
    // `idle_pool`'s reading can miss: released again until nothing is
    // held (within a minute, or the slots leaked).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let usage = loop {
        host.release_prepared();
        let usage = host.pool_usage();
        if (usage.calls, usage.memories, usage.tables, usage.waiting) == (0, 0, 0, 0) {
            break usage;
        }
        assert!(std::time::Instant::now() < deadline, "{usage:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    // The two counts of calls so far depend on timing (a hog's store is
    // dropped aside once its drops are seen to take 20 µs or more, while
    // a core is spare); what is held must be nothing.
    assert_eq!(
        usage,
        PoolUsage {
            prepared_taken: usage.prepared_taken,
            dropped_aside: usage.dropped_aside,
            ..PoolUsage::default()
        }
    );
}

/// Issue 30 item 3: an instance prepared ahead of demand never keeps a
/// call waiting. On a host with room for 2 calls, one slot holds the Python
/// tool's prepared instance and a spinning call holds the other; a third
/// tool's call finds the pool full, reclaims the prepared instance and runs
/// at once (within its 5 s timeout, under the spinner's 60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_instance_gives_its_room_to_a_waiting_call() {
    use airlock::sandbox::CancelToken;
    let mut host = builder().max_concurrent_calls(2).build().unwrap();
    let spinner = ToolConfig {
        limits: Limits {
            timeout: Duration::from_secs(60),
            prepared_instances: 0,
            ..Limits::default()
        },
        ..ToolConfig::default()
    };
    host.load_with(guest("hostile"), spinner).await.unwrap();
    host.load(built("python-stateful")).await.unwrap();
    host.load(guest("context_probe")).await.unwrap();
    let host = std::sync::Arc::new(host);

    let mut ctx = RunContext::default();
    call(&host, &mut ctx, "increment", json!({"name": "a"}))
        .await
        .unwrap();
    prepared(&host, 1).await;
    let cancel = CancelToken::new();
    let spin = spawn_call(&host, "spin", json!({}), &cancel);
    while host.pool_usage().calls < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let usage = host.pool_usage();
    assert_eq!((usage.calls, usage.prepared), (2, 1), "{usage:?}");

    let probe = call(&host, &mut ctx, "read", json!({"keys": []})).await;
    assert!(probe.is_ok(), "{probe:?}");
    // The Python tool's instance was reclaimed: its next call finds none.
    let taken = host.pool_usage().prepared_taken;
    call(&host, &mut ctx, "increment", json!({"name": "a"}))
        .await
        .unwrap();
    assert_eq!(host.pool_usage().prepared_taken, taken);
    assert!(
        !spin.is_finished(),
        "the spinner ended before it was cancelled"
    );
    cancel.cancel();
    let (out, deps) = spin.await.unwrap();
    assert!(matches!(out, Err(CallError::Cancelled)), "{out:?}");
    assert_eq!(deps, r#"{"keep":1}"#);
    assert_eq!(ctx.deps()["counters"]["a"], 2);
}

/// Issue 17 item 3: tables are host memory the guest causes, counted
/// against its memory limit. Four tables of 600,000 funcrefs each stay
/// under the per-table element limit but hold 19.2 MB; under a 16 MiB
/// limit the growth that would pass it is refused and the call ends as
/// `memory_limit`, deps unchanged, the host serving on.
#[tokio::test]
async fn tables_count_against_the_memory_limit() {
    let mut host = host_with(&[], ContextRules::default()).await;
    let config = ToolConfig {
        limits: Limits {
            max_memory_bytes: 16 << 20,
            ..Limits::default()
        },
        ..ToolConfig::default()
    };
    host.load_with(wat("table_hoard"), config).await.unwrap();
    let mut ctx = RunContext::from_value(json!({"keep": [1, 2]})).unwrap();
    let before = snapshot(&ctx);
    let err = call(&host, &mut ctx, "hoard", json!({})).await.unwrap_err();
    assert!(
        matches!(err, CallError::MemoryLimit { limit } if limit == 16 << 20),
        "{err}"
    );
    assert_host_still_serves(&host, &mut ctx, &before).await;
}

/// `airlock inspect ARGS` with `env`, on an empty compile cache of its own.
fn inspect_uncached(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let cache = tempfile::tempdir().unwrap();
    let mut env = env.to_vec();
    let dir = cache.path().to_str().unwrap().to_owned();
    env.push(("AIRLOCK_CACHE_DIR", &dir));
    let mut all = vec!["inspect"];
    all.extend_from_slice(args);
    crate::support::airlock_with_env(&all, &env)
}

/// Issue 17 item 1: compiling is bounded. The `airlock` binary compiles a
/// component it has not cached in a child process under a CPU-time and a
/// memory limit; past either, the load fails naming the component, and the
/// host process itself never ran the compiler. With the default bounds the
/// same component compiles (in the child) and loads.
#[test]
fn compiling_is_bounded_in_cpu_time_and_memory() {
    let stateful = guest("stateful");
    let s = stateful.to_str().unwrap();
    let inspect = |env: &[(&str, &str)]| inspect_uncached(&[s, "--json"], env);
    let refusal = |out: &std::process::Output| {
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            doc["error"]["kind"].as_str().unwrap().to_owned(),
            doc["error"]["message"].as_str().unwrap().to_owned(),
        )
    };
    let (kind, message) = refusal(&inspect(&[("AIRLOCK_COMPILE_CPU_MS", "1")]));
    assert_eq!(kind, "compile_limit");
    assert!(
        message.starts_with(&format!(
            "{s}: compiling used more than 1 ms of CPU time, the limit for it; it was stopped"
        )),
        "{message}"
    );

    let (kind, message) = refusal(&inspect(&[("AIRLOCK_COMPILE_MEMORY_MB", "8")]));
    assert_eq!(kind, "compile_limit");
    assert!(
        message.contains(s) && message.contains("needed more than the 8 MiB of memory"),
        "{message}"
    );

    let out = inspect(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("increment"));
}

/// The compile bound is CPU time, not the clock (issue 60.6): the 18 MB
/// componentize-py example compiles with the default bounds while its
/// compiler gets a core only a quarter of the time (stopped and resumed
/// by the test, as a busy machine's scheduler would leave it waiting: the
/// old wall-clock bound of 23 s refused it so), and one outcome is told
/// once: a compile stopped by its CPU limit after the "compiling" note
/// says no "compiled". A component the compiler refuses is
/// `invalid_component` with the compiler's own words, not a limit. The
/// optimising compiler's bound (no baseline compile first: it is the one
/// that takes long).
#[test]
fn compiling_a_good_component_on_a_busy_machine_is_not_refused() {
    let python = built("python-stateful");
    let p = python.to_str().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let optimised = ("AIRLOCK_BASELINE_FIRST", "off");
    let airlock = crate::support::airlock_command(
        &["inspect", p],
        &[
            ("AIRLOCK_CACHE_DIR", cache.path().to_str().unwrap()),
            optimised,
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // Its compile child runs 30 ms in every 120 while airlock lives; no
    // CPU is taken from the other tests.
    let pid = airlock.id();
    let throttle = std::thread::spawn(move || {
        // Each thread's children: the compiler is started from a blocking
        // thread, not the main one.
        let tasks = format!("/proc/{pid}/task");
        let mut slices = 0u32;
        while let Ok(threads) = std::fs::read_dir(&tasks) {
            let compilers: Vec<u32> = threads
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
                .flat_map(|list| {
                    list.split_whitespace()
                        .filter_map(|c| c.parse().ok())
                        .collect::<Vec<u32>>()
                })
                .collect();
            compilers
                .iter()
                .for_each(|&pid| crate::support::signal(pid, libc::SIGSTOP));
            std::thread::sleep(Duration::from_millis(90));
            compilers
                .iter()
                .for_each(|&pid| crate::support::signal(pid, libc::SIGCONT));
            std::thread::sleep(Duration::from_millis(30));
            slices += u32::from(!compilers.is_empty());
        }
        slices
    });
    let busy = airlock.wait_with_output().unwrap();
    let slices = throttle.join().unwrap();
    assert!(slices > 0, "the compiler was never held back");
    let stopped = inspect_uncached(&[p], &[("AIRLOCK_COMPILE_CPU_MS", "2000"), optimised]);
    let said = String::from_utf8_lossy(&busy.stderr);
    assert!(busy.status.success(), "{said}");
    assert!(String::from_utf8_lossy(&busy.stdout).contains("increment"));

    let said = String::from_utf8_lossy(&stopped.stderr);
    assert_eq!(stopped.status.code(), Some(2), "{said}");
    assert!(
        said.contains("compiling used more than 2000 ms of CPU time"),
        "{said}"
    );
    assert!(!said.contains("compiled "), "two outcomes told: {said}");

    // Invalid: a record used by an exported function without being
    // exported itself. The compiler says so.
    let dir = tempfile::tempdir().unwrap();
    let invalid = dir.path().join("invalid.wasm");
    std::fs::write(
        &invalid,
        wat::parse_str(
            r#"(component
              (core module $m (func (export "f") (param i32 i32)))
              (core instance $i (instantiate $m))
              (type $r (record (field "a" u32) (field "b" u32)))
              (func $f (param "x" $r) (canon lift (core func $i "f")))
              (export "f" (func $f)))"#,
        )
        .unwrap(),
    )
    .unwrap();
    let out = crate::support::airlock_with_env(
        &["inspect", invalid.to_str().unwrap(), "--json"],
        &[(
            "AIRLOCK_CACHE_DIR",
            dir.path().join("cache").to_str().unwrap(),
        )],
    );
    assert_eq!(out.status.code(), Some(2));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["error"]["kind"], "invalid_component", "{doc}");
    let message = doc["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("invalid.wasm") && message.contains("not valid to be used as export"),
        "{message}"
    );
}

/// A component in WAT whose one function has `locals` locals, read after
/// `loops` loops: Cranelift builds a block parameter per local per loop.
fn heavy_component(locals: usize, loops: usize) -> String {
    let mut body = format!("(local {})", "i32 ".repeat(locals));
    body.push_str(&"(loop local.get 0 br_if 0)".repeat(loops));
    for i in 0..locals {
        body.push_str(&format!(" local.get {i} drop"));
    }
    format!(
        "(component
           (core module $m (func (export \"run\") (result i32) {body} i32.const 7))
           (core instance $i (instantiate $m))
           (func (export \"run\") (result u32) (canon lift (core func $i \"run\"))))"
    )
}

/// Issue 32.2: a 22 KB function of 2,000 locals and 2,000 loops takes 2 s
/// and 430 MB to compile (4× that at twice each, under 100 KB); it is
/// refused before it compiles, on every path: the library's default
/// (in-process) compiler and the binary's child alike. Nothing is cached,
/// and the next component loads and runs. A lighter one of the same shape
/// compiles and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_that_asks_the_compiler_for_too_much_is_refused_unbuilt() {
    let dir = tempfile::tempdir().unwrap();
    let heavy = dir.path().join("heavy.wat");
    std::fs::write(&heavy, heavy_component(2000, 2000)).unwrap();
    let light = dir.path().join("light.wat");
    std::fs::write(&light, heavy_component(200, 200)).unwrap();
    let cache = dir.path().join("cache");
    let cached = || -> usize {
        std::fs::read_dir(&cache).map_or(0, |d| {
            d.filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            })
            .count()
        })
    };

    let mut host = Host::builder()
        .cache(CompileCache::in_dir(&cache))
        .build()
        .unwrap();
    let err = host.load(&heavy).await.unwrap_err();
    let LoadError::CompileLimit { path, problem } = &err else {
        panic!("{err}");
    };
    assert_eq!(path, &heavy);
    assert!(
        problem.contains("has 2000 locals and 2000 blocks, loops and ifs"),
        "{problem}"
    );
    assert_eq!(cached(), 0, "a refused component was cached");
    host.load(&light).await.unwrap();
    let mut ctx = RunContext::default();
    let out = call(&host, &mut ctx, "run", json!({})).await.unwrap();
    assert_eq!(out.result, 7);
    assert_eq!(cached(), 1);

    let cache = cache.to_str().unwrap();
    let out = crate::support::airlock_with_env(
        &["call", heavy.to_str().unwrap(), "run"],
        &[("AIRLOCK_CACHE_DIR", cache)],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("2000 locals") && said.contains("it is not compiled"),
        "{said}"
    );
    assert_eq!(cached(), 1, "a refused component was cached");
    let out = crate::support::airlock_with_env(
        &["call", light.to_str().unwrap(), "run"],
        &[("AIRLOCK_CACHE_DIR", cache)],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `progress.report` is bounded: a flood of reports, a report that is not
/// a number, or one with an oversized message fails its call alone (a
/// trap naming the bound), no op applied, and the host serves the next
/// call with deps as they were.
#[tokio::test]
async fn progress_past_its_bounds_fails_the_call_alone() {
    traps_naming(&[
        ("flood_progress", "more than 1000 times"),
        ("progress_nan", "not a number"),
        ("progress_long_message", "over 1024"),
    ])
    .await;
}

/// `show` is checked block by block: bytes that are not what their MIME
/// type says, more than the call's result bytes, more than 32 blocks, or a
/// URI scheme the policy does not allow fail the call alone, no op
/// applied, and the host serves the next call with deps as they were.
#[tokio::test]
async fn what_a_tool_shows_past_its_rules_fails_the_call_alone() {
    traps_naming(&[
        (
            "show_mislabelled",
            "labelled image/jpeg whose bytes are not image/jpeg",
        ),
        ("show_huge", "max_result_bytes"),
        ("show_many", "more than 32 blocks"),
        ("show_file_link", "a file: URI"),
    ])
    .await;
}

/// `ask` is bounded: more than 8 questions, a schema that is not a JSON
/// object, or more requests for a completion than `sample` allows (4 when
/// it allows none: refused requests count), fails the call alone (whether
/// or not anyone could be asked), no op applied, and the next call is
/// served with deps as they were.
#[tokio::test]
async fn questions_past_their_bounds_fail_the_call_alone() {
    traps_naming(&[
        ("ask_flood", "more than 8 questions"),
        ("ask_bad_schema", "not a JSON object"),
        ("sample_flood", "asked the model more than 4 times"),
    ])
    .await;
}

/// Each attack of `cases` fails its call alone ([`attack`]) with a trap
/// whose message says its `said`.
async fn traps_naming(cases: &[(&str, &str)]) {
    for (attack_name, said) in cases {
        let err = attack(attack_name).await;
        let CallError::Trap { message, .. } = &err else {
            panic!("{attack_name}: expected a trap, got {err}");
        };
        assert!(message.contains(said), "{attack_name}: {message}");
    }
}

/// What a component offers beside its tools is bounded like a call's
/// result: a read, a prompt or a completion that breaks a rule (too many
/// contents or messages, too many bytes, a URI scheme the policy does not
/// allow, an image whose bytes are not what its type says, too many or
/// too long completions, a trap, a spin) fails alone with an error naming
/// the rule, deps are unchanged, and the host serves the next call.
#[tokio::test]
async fn resources_prompts_and_completions_that_break_a_rule_fail_alone() {
    use airlock::sandbox::CancelToken;
    use airlock::tools::{Completing, ServeError};
    use std::collections::BTreeMap;
    let host = hostile_host().await;
    let mut ctx = RunContext::from_value(json!({"secret_plan": [1, 2, 3]})).unwrap();
    let before = snapshot(&ctx);
    let cancel = CancelToken::new();
    let read = |name: &str| {
        let uri = format!("https://hostile.example/{name}");
        let (host, ctx, cancel) = (host, ctx.clone(), cancel.clone());
        async move { host.read_resource(&ctx, &uri, &cancel).await.unwrap_err() }
    };
    let refused = |err: ServeError| match err {
        ServeError::Call(CallError::InvalidResult(why)) => why,
        other => panic!("expected a refused result, got {other}"),
    };
    let why = refused(read("flood").await);
    assert!(why.contains("more than 32 blocks"), "{why}");
    let why = refused(read("huge").await);
    assert!(why.contains("max_result_bytes"), "{why}");
    let why = refused(read("file").await);
    assert!(
        why.contains("file: URI") && why.contains("uri_schemes"),
        "{why}"
    );
    let err = read("trap").await;
    assert!(
        matches!(&err, ServeError::Call(CallError::Trap { stderr, .. })
            if stderr.contains("hostile resource panicked on purpose")),
        "{err}"
    );
    let err = read("spin").await;
    assert!(
        matches!(err, ServeError::Call(CallError::Timeout { .. })),
        "{err}"
    );
    let err = read("nothing-here").await;
    assert!(matches!(err, ServeError::UnknownResource { .. }), "{err}");
    assert_host_still_serves(host, &mut ctx, &before).await;

    let none = BTreeMap::new();
    let prompt = |name: &'static str| {
        let (host, ctx, cancel, none) = (host, ctx.clone(), cancel.clone(), none.clone());
        async move {
            host.get_prompt(&ctx, name, &none, &cancel)
                .await
                .unwrap_err()
        }
    };
    let why = refused(prompt("mislabelled_image").await);
    assert!(why.contains("whose bytes are not image/png"), "{why}");
    let why = refused(prompt("flood_messages").await);
    assert!(why.contains("more than 32 blocks"), "{why}");
    let mut unknown = BTreeMap::new();
    unknown.insert("y".to_owned(), "1".to_owned());
    let err = host
        .get_prompt(&ctx, "flood_messages", &unknown, &cancel)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ServeError::BadRequest(m) if m.contains("no argument \"y\"")),
        "{err}"
    );

    let why = refused(
        host.complete(
            &ctx,
            Completing::Prompt("flood_messages"),
            "x",
            "",
            &none,
            &cancel,
        )
        .await
        .unwrap_err(),
    );
    assert!(why.contains("4096 bytes") && why.contains("1024"), "{why}");
    let template = Completing::Template("https://hostile.example/t/{x}");
    let why = refused(
        host.complete(&ctx, template, "x", "", &none, &cancel)
            .await
            .unwrap_err(),
    );
    assert!(
        why.contains("1000 completions") && why.contains("100"),
        "{why}"
    );
    assert_host_still_serves(host, &mut ctx, &before).await;
}

/// An answer is checked against its question before the tool sees it,
/// whoever gave it: one that is not an object, is over 64 KiB, or does
/// not satisfy the question's schema reaches the tool as `unavailable`,
/// saying where and by which rule it does not fit and never what it
/// holds, and is kept (journaled) as such; an answer that fits reaches it
/// as given. Each call is alone: deps unchanged, the next call served.
#[tokio::test]
async fn an_answer_that_does_not_fit_its_question_reaches_the_tool_as_unavailable() {
    use airlock::sandbox::{Asker, CancelToken};
    use airlock::spec::Answer;
    use airlock::tools::ToolCall;
    let mut config = ToolConfig::default();
    config.grants.ask_user = true;
    let host = host_with(&[("everything", config)], ContextRules::default()).await;
    let mut ctx = RunContext::from_value(json!({"secret_plan": [1, 2, 3]})).unwrap();
    let before = snapshot(&ctx);
    // `test_elicitation` asks for `username` and `email`, both strings,
    // both required, and says what it was given.
    let fits = json!({"username": "ann", "email": "ann@example.com"});
    let long = "x".repeat(70 << 10);
    for (content, said) in [
        (fits.clone(), "action=accept".to_owned()),
        (
            json!({"username": 5, "email": "hidden-value@example.com"}),
            r#"at /username fails rule "type""#.to_owned(),
        ),
        (
            json!({"username": "hidden-value"}),
            r#"the value fails rule "required""#.to_owned(),
        ),
        (
            json!("hidden-value"),
            "it is a string, not a JSON object".to_owned(),
        ),
        (
            json!({"username": long, "email": "a@b"}),
            format!(
                "it is {} bytes; the limit is 65536",
                serde_json::to_string(&json!({"username": long, "email": "a@b"}))
                    .unwrap()
                    .len()
            ),
        ),
    ] {
        let given = Answer::Accept {
            content: content.clone(),
        };
        let asker: Asker = std::sync::Arc::new(move |_| {
            let given = given.clone();
            Box::pin(async move { given })
        });
        let cancel = CancelToken::watched(None, Some(asker), None);
        let call = ToolCall::new("test_elicitation", r#"{"message": "Who are you?"}"#);
        let outcome = host
            .call_cancellable(&mut ctx, &call, &cancel)
            .await
            .unwrap();
        // The tool's result quotes what it was told as JSON.
        let told = outcome.result.as_str().unwrap().to_owned();
        assert!(told.contains(&said.replace('"', "\\\"")), "{told}");
        let kept = &outcome.output.asked[0].answer;
        if content == fits {
            assert_eq!(kept, &Answer::Accept { content }, "{told}");
        } else {
            assert!(told.contains("action=unavailable"), "{told}");
            assert!(!told.contains("hidden-value"), "{told}");
            let Answer::Unavailable { why } = kept else {
                panic!("kept {kept:?}");
            };
            assert!(why.contains(&said), "{why}");
        }
        assert_eq!(snapshot(&ctx), before);
    }
    assert_host_still_serves(&host, &mut ctx, &before).await;
}

/// A reply from the model is bounded before the tool sees it, whoever
/// sent it: text longer than a reply of the tokens asked for could be (at
/// least 64 KiB), or a model name over 1 KiB, reaches the tool as refused,
/// saying so, and is kept as such; a reply in bounds reaches it as sent.
/// Each call is alone: deps unchanged, the next call served.
#[tokio::test]
async fn a_reply_longer_than_the_tokens_asked_for_reaches_the_tool_as_refused() {
    use airlock::policy::grants::SampleGrant;
    use airlock::sandbox::{CancelToken, Sampler};
    use airlock::spec::SampleReply;
    use airlock::tools::ToolCall;
    let mut config = ToolConfig::default();
    config.grants.sampling = Some(SampleGrant::DEFAULT);
    let host = host_with(&[("everything", config)], ContextRules::default()).await;
    let mut ctx = RunContext::from_value(json!({"secret_plan": [1, 2, 3]})).unwrap();
    let before = snapshot(&ctx);
    let reply = |text: String, model: String| SampleReply::Answered {
        text,
        model,
        stop_reason: None,
    };
    // The everything example's `test_sampling` asks for 100 tokens.
    for (given, said) in [
        (reply("Hi.".into(), "m".into()), "LLM response: Hi."),
        (
            reply("hidden-value ".repeat(6_000), "m".into()),
            "the reply is 78000 bytes, more than 100 tokens could be (at most 65536)",
        ),
        (
            reply("Hi.".into(), "m".repeat(2_000)),
            "the reply's model or stop reason is over 1024 bytes",
        ),
    ] {
        let sent = given.clone();
        let sampler: Sampler = std::sync::Arc::new(move |_| {
            let sent = sent.clone();
            Box::pin(async move { sent })
        });
        let cancel = CancelToken::watched(None, None, Some(sampler));
        let call = ToolCall::new("test_sampling", r#"{"prompt": "Say hi."}"#);
        let told = match host.call_cancellable(&mut ctx, &call, &cancel).await {
            Ok(outcome) => {
                assert_eq!(outcome.output.sampled[0].reply, given);
                outcome.result.as_str().unwrap().to_owned()
            }
            Err(failure) => {
                let SampleReply::Refused { why } = &failure.output.sampled[0].reply else {
                    panic!("kept {:?}", failure.output.sampled[0].reply);
                };
                assert!(why.contains(said), "{why}");
                failure.error.to_string()
            }
        };
        let head = &told[..told.len().min(300)];
        assert!(told.contains(said), "{head}");
        assert!(!told.contains("hidden-value"), "{head}");
        assert_eq!(snapshot(&ctx), before);
    }
    assert_host_still_serves(&host, &mut ctx, &before).await;
}
