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
    let RejectReason::SchemaViolation(violation) = &reason else {
        panic!("expected a schema violation, got {reason}");
    };
    assert_eq!(violation.instance_path, "/b");
    assert_eq!(violation.rule, "minimum");
    assert_eq!(violation.schema_path, "/additionalProperties/minimum");
    assert_eq!(
        reason.to_string(),
        "the value after this call breaks the key's schema: at /b fails rule \"minimum\" \
         (schema path /additionalProperties/minimum)"
    );
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

/// Issue 12 item 2: a tool that may write but not read a key learns
/// nothing of its value from a rejection. `merge` and `append` read the
/// value, so they are refused on it (without naming its type); a schema
/// violation names where and which rule, never the value.
#[tokio::test]
async fn rejections_reveal_nothing_the_tool_cannot_read() {
    let mut schemas = BTreeMap::new();
    schemas.insert(
        "profile".to_owned(),
        json!({"type": "object", "required": ["name"], "properties": {"age": {"type": "integer"}}}),
    );
    let rules = ContextRules::new(KeyPatterns::none(), schemas).unwrap();
    let config = ToolConfig {
        access: KeyAccess {
            read: KeyPatterns::new(&["public"]).unwrap(),
            write: KeyPatterns::new(&["public", "profile", "log"]).unwrap(),
        },
        ..ToolConfig::default()
    };
    let host = host_with(&[("context_probe", config)], rules).await;
    let secret = json!({"name": "Ada", "ssn": "078-05-1120", "age": 36});

    for (ops, expected) in [
        (
            json!([{"op": "merge", "key": "profile", "value": {"age": "old"}}]),
            "op #0 (merge \"profile\") rejected: merge reads the key's value, and this tool may \
             not read the key (context.read allows public)",
        ),
        (
            json!([{"op": "append", "key": "log", "value": 1}]),
            "op #0 (append \"log\") rejected: append reads the key's value, and this tool may \
             not read the key (context.read allows public)",
        ),
        (
            json!([{"op": "set", "key": "profile", "value": {"age": "old"}}]),
            "op #0 (set \"profile\") rejected: the value after this call breaks the key's schema: \
             the value fails rule \"required\" (schema path /required)",
        ),
    ] {
        let mut ctx =
            RunContext::from_value(json!({"public": 1, "profile": secret, "log": "text"})).unwrap();
        let before = snapshot(&ctx);
        let err = call(&host, &mut ctx, "apply", json!({ "ops": ops }))
            .await
            .unwrap_err();
        let shown = err.to_string();
        assert!(shown.ends_with(expected), "{shown}");
        for leak in ["078-05", "Ada", "36", "a string", "an object"] {
            assert!(!shown.contains(leak), "{leak} in {shown}");
        }
        assert_host_still_serves(&host, &mut ctx, &before).await;
    }

    // What the tool may do: replace or delete the key outright.
    let mut ctx = RunContext::from_value(json!({"public": 1, "profile": secret})).unwrap();
    call(
        &host,
        &mut ctx,
        "apply",
        json!({"ops": [{"op": "set", "key": "profile", "value": {"name": "B"}}]}),
    )
    .await
    .unwrap();
    assert_eq!(ctx.deps()["profile"], json!({"name": "B"}));
}

/// With `read` and no `write`, a tool may change only what it may read.
#[test]
fn write_defaults_to_read() {
    let dir = tempfile::tempdir().unwrap();
    let tool = crate::support::guest("stateful");
    let text = format!(
        "[[tool]]\npath = {:?}\ncontext = {{ read = [\"public\", \"notes\"] }}\n",
        tool.display()
    );
    let policy =
        airlock::Policy::parse(&text, &dir.path().join("airlock.toml"), dir.path()).unwrap();
    let write = &policy.tools[0].config.access.write;
    assert!(write.matches("public") && write.matches("notes"));
    assert!(!write.matches("profile"));
    assert_eq!(write.patterns(), ["public", "notes"]);
}

#[test]
fn bad_rules_are_refused() {
    assert!(KeyPatterns::new(&["[unclosed"]).is_err());
    let mut schemas = BTreeMap::new();
    schemas.insert("k".to_owned(), json!({"type": 12}));
    let err = ContextRules::new(KeyPatterns::none(), schemas).unwrap_err();
    assert!(err.to_string().contains("\"k\""), "{err}");
}
