//! A first use on baseline code (issue "Performance IV", 66.2): a large
//! component the cache lacks is compiled by Winch, served at once, and
//! its optimised code is compiled into the cache in the background for
//! the next load. Baseline code keeps every bound optimised code has.

use std::path::Path;
use std::time::{Duration, Instant};

use airlock::sandbox::CacheOutcome;
use airlock::{CallError, CompileCache, Host, RunContext};
use serde_json::json;

use crate::support::{assert_host_still_serves, built, call, guest, hostile_limits, snapshot};

/// A host on the cache in `cache` that compiles every component it lacks
/// on the baseline compiler first (from 0 bytes: the Rust examples are
/// small), under `limits`, metering fuel if `fuel`.
fn baseline_host(cache: &Path, limits: airlock::Limits, fuel: bool) -> Host {
    Host::builder()
        .cache(CompileCache::in_dir(cache))
        .max_concurrent_calls(8)
        .baseline_first(Some(0))
        .fuel_metering(fuel)
        .limits(limits)
        .build()
        .unwrap()
}

/// Waits until the cache in `cache` holds `entries` compiled components
/// and no filler is at work in it (a condition, not a time: the deadline
/// only turns a filler that never ends into a failure).
fn wait_for_fills(cache: &Path, entries: usize) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let names: Vec<String> = std::fs::read_dir(cache)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let compiled = names.iter().filter(|n| n.ends_with(".cwasm")).count();
        let filling = names.iter().any(|n| n.ends_with(".lock"));
        if compiled >= entries && !filling {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the cache was never filled: {names:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The library's path: the first load runs on baseline code (the same
/// results), fills the cache behind it, and the next host loads the
/// optimised code from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_use_runs_on_baseline_code_and_the_next_on_optimised_code() {
    let cache = tempfile::tempdir().unwrap();
    let increments = |host: Host| async move {
        let mut ctx = RunContext::default();
        for _ in 0..3 {
            call(&host, &mut ctx, "increment", json!({"name": "a"}))
                .await
                .unwrap();
        }
        serde_json::to_value(ctx.deps()).unwrap()
    };
    let mut first = baseline_host(cache.path(), airlock::Limits::default(), false);
    let loaded = first.load(guest("stateful")).await.unwrap();
    assert_eq!(loaded.cache_outcome(), CacheOutcome::Baseline);
    let deps = increments(first).await;
    assert_eq!(deps, json!({"counters": {"a": 3}}));

    wait_for_fills(cache.path(), 1);
    let mut next = baseline_host(cache.path(), airlock::Limits::default(), false);
    let loaded = next.load(guest("stateful")).await.unwrap();
    assert_eq!(loaded.cache_outcome(), CacheOutcome::Hit);
    assert_eq!(increments(next).await, deps, "the same on optimised code");

    // Without baseline_first, the same host compiles what it lacks and
    // waits for it.
    let other = tempfile::tempdir().unwrap();
    let mut waits = Host::builder()
        .cache(CompileCache::in_dir(other.path()))
        .max_concurrent_calls(4)
        .build()
        .unwrap();
    let loaded = waits.load(guest("stateful")).await.unwrap();
    assert_eq!(loaded.cache_outcome(), CacheOutcome::Compiled);
}

/// Hostile guests on baseline code meet the same bounds as on optimised
/// code (epoch deadline, memory, stack, output, result, fuel), each
/// failing alone: deps unchanged and the next call served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_guests_on_baseline_code_meet_every_bound() {
    let cache = tempfile::tempdir().unwrap();
    // Baseline code is slower, and this machine may be busy with other
    // tests: the memory bomb must meet the memory limit, not the timeout.
    let limits = airlock::Limits {
        timeout: std::time::Duration::from_secs(3),
        ..hostile_limits()
    };
    let mut host = baseline_host(cache.path(), limits, false);
    for name in ["hostile", "stateful"] {
        let loaded = host.load(guest(name)).await.unwrap();
        assert_eq!(loaded.cache_outcome(), CacheOutcome::Baseline, "{name}");
    }
    type Expected = fn(&CallError) -> bool;
    let expect: [(&str, Expected); 7] = [
        ("spin", |e| matches!(e, CallError::Timeout { .. })),
        ("panic", |e| matches!(e, CallError::Trap { .. })),
        (
            "memory_bomb",
            |e| matches!(e, CallError::MemoryLimit { limit } if *limit == 128 << 20),
        ),
        ("recurse", |e| {
            matches!(e, CallError::Trap { message, .. }
                if message.contains("out of bounds memory access") || message.contains("stack overflow"))
        }),
        ("flood_stdout", |e| {
            matches!(e, CallError::OutputLimit { .. })
        }),
        ("huge_result", |e| {
            matches!(e, CallError::ResultTooLarge { .. })
        }),
        ("op_bytes_flood", |e| matches!(e, CallError::OpRejected(_))),
    ];
    for (attack, expected) in expect {
        let mut ctx = RunContext::from_value(json!({"secret_plan": [1, 2, 3]})).unwrap();
        let before = snapshot(&ctx);
        let err = call(&host, &mut ctx, attack, json!({})).await.unwrap_err();
        assert!(expected(&err), "{attack}: {err}");
        assert!(!ctx.deps().contains_key("pwned"), "{attack}: ops applied");
        assert_host_still_serves(&host, &mut ctx, &before).await;
    }

    // Fuel is counted by baseline code too.
    let fueled = tempfile::tempdir().unwrap();
    let host = baseline_host(fueled.path(), airlock::Limits::default(), true);
    crate::limits::fuel_stops_a_spinning_call(host).await;
}

/// The binary's path, as a new user meets it: `airlock call` of the
/// Python example on an empty cache is answered from baseline code, its
/// optimised code is compiled by a child that outlives the command, and
/// the next command loads that from the cache. `AIRLOCK_BASELINE_FIRST`
/// moves the size bound (`off`: never).
#[test]
fn a_first_use_of_an_interpreter_does_not_wait_for_its_optimised_code() {
    let python = built("python-stateful");
    let cache = tempfile::tempdir().unwrap();
    let call = |wasm: &Path, env: &[(&str, &str)]| {
        let mut all = vec![
            ("AIRLOCK_CACHE_DIR", cache.path().to_str().unwrap()),
            ("RUST_LOG", "airlock::tools::load=debug"),
        ];
        all.extend_from_slice(env);
        let out = crate::support::airlock_with_env(
            &[
                "call",
                wasm.to_str().unwrap(),
                "increment",
                r#"{"name":"a"}"#,
            ],
            &all,
        );
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{said}");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            stdout.contains(r#"result: {"counter":"a","value":1}"#),
            "{stdout}"
        );
        said
    };
    let said = call(&python, &[]);
    assert!(said.contains("cache=Baseline"), "{said}");
    wait_for_fills(cache.path(), 1);
    let said = call(&python, &[]);
    assert!(said.contains("cache=Hit"), "{said}");

    // Under the bound (the Rust example is small): compiled and waited for.
    let rust = guest("stateful");
    let said = call(&rust, &[]);
    assert!(said.contains("cache=Compiled"), "{said}");
    let other = tempfile::tempdir().unwrap();
    let dir = other.path().to_str().unwrap();
    let said = call(
        &rust,
        &[("AIRLOCK_CACHE_DIR", dir), ("AIRLOCK_BASELINE_FIRST", "0")],
    );
    assert!(said.contains("cache=Baseline"), "{said}");
    wait_for_fills(other.path(), 1);
    let fresh = tempfile::tempdir().unwrap();
    let dir = fresh.path().to_str().unwrap();
    let said = call(
        &rust,
        &[
            ("AIRLOCK_CACHE_DIR", dir),
            ("AIRLOCK_BASELINE_FIRST", "off"),
        ],
    );
    assert!(said.contains("cache=Compiled"), "{said}");
}
