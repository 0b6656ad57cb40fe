//! The stateful walkthrough tools, end to end.

use airlock::{CallError, ContextOp, RunContext};
use serde_json::json;

use crate::support::{call, host, snapshot};

#[tokio::test]
async fn three_increments_leave_three() {
    let host = host().await;
    let mut ctx = RunContext::default();
    for expected in 1..=3 {
        let outcome = call(host, &mut ctx, "increment", json!({"name": "vowels"}))
            .await
            .unwrap();
        assert_eq!(
            outcome.result,
            json!({"counter": "vowels", "value": expected})
        );
        assert_eq!(
            outcome.updates,
            vec![ContextOp::Set {
                key: "counters".into(),
                value: json!({"vowels": expected}),
            }]
        );
    }
    assert_eq!(ctx.deps()["counters"], json!({"vowels": 3}));
}

#[tokio::test]
async fn the_walkthrough_ends_with_three_vowels_and_a_note() {
    let host = host().await;
    let mut ctx = RunContext::default();
    for _ in 0..3 {
        call(host, &mut ctx, "increment", json!({"name": "vowels"}))
            .await
            .unwrap();
    }
    let note = call(
        host,
        &mut ctx,
        "add_note",
        json!({"text": "vowels: e, e, a"}),
    )
    .await
    .unwrap();
    assert_eq!(note.result, json!({"added": "vowels: e, e, a", "total": 1}));
    assert_eq!(
        note.updates,
        vec![ContextOp::Append {
            key: "notes".into(),
            value: json!("vowels: e, e, a"),
        }]
    );
    let state = call(host, &mut ctx, "show_state", json!({})).await.unwrap();
    let expected = json!({"counters": {"vowels": 3}, "notes": ["vowels: e, e, a"]});
    assert_eq!(state.result, expected);
    assert_eq!(serde_json::Value::Object(ctx.deps().clone()), expected);
}

#[tokio::test]
async fn arguments_outside_the_schema_are_refused_and_change_nothing() {
    let host = host().await;
    let mut ctx = RunContext::from_value(json!({"counters": {"a": 1}})).unwrap();
    let before = snapshot(&ctx);
    let err = call(host, &mut ctx, "increment", json!({"name": 5}))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::BadArguments(m) if m.contains("/name")),
        "{err}"
    );
    assert_eq!(snapshot(&ctx), before);
}

#[tokio::test]
async fn host_rejects_an_append_onto_a_string() {
    // `add_note` just appends to `notes`; the host refuses to append onto
    // a string and applies nothing.
    let host = host().await;
    let mut ctx = RunContext::from_value(json!({"notes": "not a list"})).unwrap();
    let before = snapshot(&ctx);
    let err = call(host, &mut ctx, "add_note", json!({"text": "x"}))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::OpRejected(r) if r.key == "notes" && r.index == 0),
        "{err}"
    );
    assert_eq!(snapshot(&ctx), before);
}
