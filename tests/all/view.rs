//! The read-only context view, read through a real component.

use airlock::{RunContext, ToolCall, Usage};
use serde_json::{Value, json};

use crate::support::{host, snapshot};

#[tokio::test]
async fn view_returns_exactly_what_the_host_holds() {
    let deps = json!({
        "text": "héllo \"quoted\" \n line",
        "big": 12345678901234567u64,
        "float": 0.1,
        "nested": {"list": [1, {"a": null}], "empty": {}},
        "null": null,
    });
    let mut ctx = RunContext::from_value(deps.clone())
        .unwrap()
        .with_session_id("sess-fixed")
        .with_user_id("user-7")
        .with_metadata("tenant", "acme");
    ctx.iteration = 4;
    ctx.usage = Usage {
        requests: 4,
        tool_calls: 9,
        input_tokens: 1_000,
        output_tokens: 2_000,
    };
    let before = snapshot(&ctx);

    let mut call = ToolCall::new(
        "read",
        json!({"keys": ["text", "big", "float", "nested", "null", "absent"], "metadata": ["tenant", "nope"]})
            .to_string(),
    );
    call.retry = 2;
    let outcome = host().await.call(&mut ctx, &call).await.unwrap();
    let seen = &outcome.result;

    assert_eq!(seen["values"], deps);
    assert_eq!(seen["missing"], json!(["absent"]));
    assert_eq!(
        seen["keys"],
        json!(["text", "big", "float", "nested", "null"])
    );
    assert_eq!(seen["metadata"], json!({"tenant": "acme", "nope": null}));
    assert_eq!(seen["run_id"], ctx.run_id());
    assert_eq!(seen["session_id"], "sess-fixed");
    assert_eq!(seen["user_id"], "user-7");
    assert_eq!(seen["tool_call_id"], call.id.as_str());
    assert_eq!(seen["retry"], 2);
    assert_eq!(seen["iteration"], 4);
    // The call counts itself, outside the agent loop too.
    assert_eq!(
        seen["usage"],
        json!({"requests": 4, "tool_calls": 10, "input_tokens": 1000, "output_tokens": 2000})
    );
    assert_eq!(ctx.usage.tool_calls, 10);
    assert!(outcome.updates.is_empty());
    assert_eq!(snapshot(&ctx), before, "reading changes nothing");
}

#[tokio::test]
async fn anonymous_run_has_no_user_and_fresh_ids() {
    let mut a = RunContext::default();
    let mut b = RunContext::default();
    let read = ToolCall::new("read", "{}");
    let seen_a = host().await.call(&mut a, &read).await.unwrap().result;
    let seen_b = host().await.call(&mut b, &read).await.unwrap().result;
    assert_eq!(seen_a["user_id"], Value::Null);
    assert_ne!(seen_a["run_id"], seen_b["run_id"]);
    assert_ne!(seen_a["session_id"], seen_b["session_id"]);
    assert_eq!(seen_a["keys"], json!([]));
}

#[tokio::test]
async fn the_next_call_sees_a_calls_ops() {
    // A call's ops are applied when it ends; the next call's view holds
    // them.
    let host = host().await;
    let mut ctx = RunContext::default();
    let write = ToolCall::new(
        "apply",
        json!({"ops": [{"op": "set", "key": "k", "value": 1}]}).to_string(),
    );
    host.call(&mut ctx, &write).await.unwrap();
    let read = ToolCall::new("read", json!({"keys": ["k"]}).to_string());
    let seen = host.call(&mut ctx, &read).await.unwrap().result;
    assert_eq!(seen["values"], json!({"k": 1}));
}
