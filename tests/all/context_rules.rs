//! Context permissions: per-tool read/write globs, hidden keys, per-key
//! JSON Schemas. A violation rejects the whole call, naming key and rule.

use std::collections::BTreeMap;

use airlock::context::{ContextRules, KeyAccess, KeyPatterns, RejectReason};
use airlock::{CallError, Host, RunContext, ToolConfig};
use serde_json::{Value, json};

use crate::support::{assert_host_still_serves, call, host_with, snapshot};

fn deps() -> RunContext {
    RunContext::from_value(json!({
        "api_token": "tok-123-hidden",
        "internal_db": {"password": "hunter2"},
        "counters": {"a": 1},
        "notes": ["n1"],
        "public": "visible",
    }))
    .unwrap()
}

async fn host(read: &[&str], write: &[&str]) -> Host {
    let hidden = KeyPatterns::new(&["api_token", "internal_*"]).unwrap();
    let mut schemas = BTreeMap::new();
    schemas.insert(
        "counters".to_owned(),
        json!({"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}),
    );
    let rules = ContextRules::new(hidden, schemas).unwrap();
    let config = ToolConfig {
        access: KeyAccess {
            read: KeyPatterns::new(read).unwrap(),
            write: KeyPatterns::new(write).unwrap(),
        },
        ..ToolConfig::default()
    };
    host_with(
        &[("hostile", config.clone()), ("context_probe", config)],
        rules,
    )
    .await
}

async fn rejected(host: &Host, ops: Value) -> RejectReason {
    let mut ctx = deps();
    let before = snapshot(&ctx);
    let err = call(host, &mut ctx, "apply", json!({ "ops": ops }))
        .await
        .unwrap_err();
    let CallError::OpRejected(rejected) = err else {
        panic!("expected an op rejection, got {err}");
    };
    assert_host_still_serves(host, &mut ctx, &before).await;
    rejected.reason
}

#[tokio::test]
async fn hidden_keys_are_invisible() {
    let host = host(&["*"], &["*"]).await;
    let mut ctx = deps();
    let all = call(&host, &mut ctx, "dump_deps", json!({})).await.unwrap();
    let keys: Vec<&String> = all.result.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["counters", "notes", "public"]);
    for key in ["api_token", "internal_db"] {
        let out = call(&host, &mut ctx, "read_key", json!({ "key": key }))
            .await
            .unwrap();
        assert_eq!(out.result["value"], Value::Null, "{key}");
    }
    let text = serde_json::to_string(&all.result).unwrap();
    assert!(
        !text.contains("tok-123") && !text.contains("hunter2"),
        "{text}"
    );
}

#[tokio::test]
async fn hidden_keys_cannot_be_written() {
    let host = host(&["*"], &["*"]).await;
    let reason = rejected(
        &host,
        json!([{"op": "set", "key": "api_token", "value": "mine"}]),
    )
    .await;
    assert_eq!(reason, RejectReason::Hidden);
    let reason = rejected(&host, json!([{"op": "delete", "key": "internal_db"}])).await;
    assert_eq!(reason, RejectReason::Hidden);
}

#[tokio::test]
async fn read_globs_limit_what_a_tool_sees() {
    let host = host(&["notes", "pub*"], &["*"]).await;
    let mut ctx = deps();
    let all = call(&host, &mut ctx, "dump_deps", json!({})).await.unwrap();
    let keys: Vec<&String> = all.result.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["notes", "public"]);
}

#[tokio::test]
async fn writes_outside_context_write_are_rejected() {
    let host = host(&["*"], &["notes", "scratch_*"]).await;
    let reason = rejected(
        &host,
        json!([
            {"op": "append", "key": "notes", "value": "ok"},
            {"op": "set", "key": "scratch_1", "value": 1},
            {"op": "set", "key": "public", "value": "defaced"},
        ]),
    )
    .await;
    assert_eq!(
        reason,
        RejectReason::NotWritable {
            allowed: vec!["notes".into(), "scratch_*".into()]
        }
    );
    assert!(
        reason
            .to_string()
            .contains("context.write allows notes, scratch_*"),
        "{reason}"
    );

    let mut ctx = deps();
    call(
        &host,
        &mut ctx,
        "apply",
        json!({"ops": [{"op": "append", "key": "notes", "value": "ok"}]}),
    )
    .await
    .unwrap();
    assert_eq!(ctx.deps()["notes"], json!(["n1", "ok"]));
}

#[tokio::test]
async fn values_must_satisfy_the_key_schema_after_the_ops() {
    let host = host(&["*"], &["*"]).await;
    let reason = rejected(
        &host,
        json!([{"op": "merge", "key": "counters", "value": {"b": -1}}]),
    )
    .await;
    let RejectReason::SchemaViolation(message) = &reason else {
        panic!("expected a schema violation, got {reason}");
    };
    assert!(message.contains("/b"), "{message}");
    let reason = rejected(
        &host,
        json!([{"op": "set", "key": "counters", "value": "many"}]),
    )
    .await;
    assert!(
        matches!(reason, RejectReason::SchemaViolation(_)),
        "{reason}"
    );

    // An intermediate value may break the schema; only the end state counts.
    let mut ctx = deps();
    call(
        &host,
        &mut ctx,
        "apply",
        json!({"ops": [
            {"op": "set", "key": "counters", "value": "temporarily a string"},
            {"op": "set", "key": "counters", "value": {"a": 2}},
        ]}),
    )
    .await
    .unwrap();
    assert_eq!(ctx.deps()["counters"], json!({"a": 2}));
}

#[test]
fn bad_rules_are_refused() {
    assert!(KeyPatterns::new(&["[unclosed"]).is_err());
    let mut schemas = BTreeMap::new();
    schemas.insert("k".to_owned(), json!({"type": 12}));
    let err = ContextRules::new(KeyPatterns::none(), schemas).unwrap_err();
    assert!(err.to_string().contains("\"k\""), "{err}");
}
