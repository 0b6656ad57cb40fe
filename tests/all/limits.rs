//! Hostile guests against the default limits. Each test checks both sides:
//! the attack ends in its typed error, deps are byte-identical (the attack's
//! `set pwned` op is discarded), and the host serves the next call.

use std::time::{Duration, Instant};

use airlock::context::{ContextRules, RejectReason};
use airlock::sandbox::Stream;
use airlock::{CallError, CompileCache, Host, Limits, LoadError, RunContext, ToolConfig};
use serde_json::json;

use crate::support::{
    assert_host_still_serves, cache_dir, call, guest, host_with, hostile_host, hostile_limits,
    root, snapshot,
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
    assert_eq!(err.kind(), "trap");
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
    let mut host = airlock::Host::builder()
        .cache(airlock::CompileCache::in_dir(crate::support::cache_dir()))
        .max_concurrent_calls(4)
        .fuel_metering(true)
        .build()
        .unwrap();
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
