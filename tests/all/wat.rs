//! Attacks Rust cannot express, written in WAT (guest-examples/hostile/wat):
//! a table-growth bomb, an infinite loop in a start function, a huge
//! initial memory. Each is contained; the host loads and serves others.

use std::time::Duration;

use airlock::context::ContextRules;
use airlock::{CallError, CompileCache, Host, Limits, LoadError, RunContext, ToolConfig};
use serde_json::json;

use crate::support::{assert_host_still_serves, cache_dir, call, guest, host_with, root, snapshot};

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
