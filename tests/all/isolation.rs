//! Nothing survives a call: every call runs in a fresh instance.

use airlock::RunContext;
use serde_json::json;

use crate::support::{call, host};

#[tokio::test]
async fn every_call_is_a_fresh_instance() {
    // Counters live in deps, not in guest memory: two contexts never see
    // each other's counts, however calls interleave.
    let host = host().await;
    let mut a = RunContext::default();
    let mut b = RunContext::default();
    for _ in 0..2 {
        call(host, &mut a, "increment", json!({"name": "n"}))
            .await
            .unwrap();
    }
    let first_b = call(host, &mut b, "increment", json!({"name": "n"}))
        .await
        .unwrap();
    assert_eq!(first_b.result["value"], 1);
    assert_eq!(a.deps()["counters"]["n"], 2);
}
