//! Context ops through the real component boundary: the context-probe's
//! `apply` tool returns exactly the ops a test gives it.

use airlock::context::RejectReason;
use airlock::{CallError, CallOutcome, RunContext};
use serde_json::{Value, json};

use crate::support::{call, ctx, host, snapshot};

async fn apply(ctx: &mut RunContext, ops: Value) -> Result<CallOutcome, CallError> {
    call(host().await, ctx, "apply", json!({ "ops": ops })).await
}

/// Runs `ops` against `deps` and returns the deps after, or the rejection.
/// On rejection, also checks deps are byte-identical to before.
async fn run(deps: Value, ops: Value) -> Result<Value, RejectReason> {
    let mut c = ctx(deps);
    let before = snapshot(&c);
    match apply(&mut c, ops).await {
        Ok(_) => Ok(Value::Object(c.deps().clone())),
        Err(CallError::OpRejected(rejected)) => {
            assert_eq!(snapshot(&c), before, "a rejected call changed deps");
            Err(rejected.reason)
        }
        Err(other) => panic!("expected ops applied or rejected, got {other}"),
    }
}

/// What an op leaves under the key (`None`: absent), or the kind of
/// rejection.
type Expected = Result<Option<Value>, &'static str>;

/// Every cell of the DESIGN §3 table: each op against a key that is
/// missing, null, an object, an array, and each other JSON type.
#[tokio::test]
async fn every_cell_of_the_op_table() {
    let states: &[(&str, Option<Value>)] = &[
        ("missing", None),
        ("null", Some(Value::Null)),
        ("object", Some(json!({"a": 1, "n": {"x": 1}}))),
        ("array", Some(json!([1, 2]))),
        ("string", Some(json!("s"))),
        ("number", Some(json!(7))),
        ("bool", Some(json!(true))),
    ];
    // What each op leaves under "k", per state; `Err` = rejected.
    let set = json!({"new": true});
    let merge = json!({"n": {"y": 2}, "b": 3});
    for (state, initial) in states {
        let mut deps = json!({"other": "untouched"});
        if let Some(v) = initial {
            deps["k"] = v.clone();
        }
        let cases: Vec<(&str, Value, Expected)> = vec![
            (
                "set",
                json!([{"op": "set", "key": "k", "value": set}]),
                Ok(Some(set.clone())),
            ),
            (
                "merge",
                json!([{"op": "merge", "key": "k", "value": merge}]),
                match *state {
                    "missing" | "null" => Ok(Some(merge.clone())),
                    "object" => Ok(Some(json!({"a": 1, "n": {"x": 1, "y": 2}, "b": 3}))),
                    _ => Err("type_conflict"),
                },
            ),
            (
                "append",
                json!([{"op": "append", "key": "k", "value": 9}]),
                match *state {
                    "missing" | "null" => Ok(Some(json!([9]))),
                    "array" => Ok(Some(json!([1, 2, 9]))),
                    _ => Err("type_conflict"),
                },
            ),
            (
                "delete",
                json!([{"op": "delete", "key": "k"}]),
                // DESIGN §3: delete removes the key whatever it holds, a
                // `null` too; only a missing key is a no-op.
                Ok(None),
            ),
        ];
        for (op, ops, expected) in cases {
            let got = run(deps.clone(), ops).await;
            let cell = format!("{op} on a {state} key");
            match (expected, got) {
                (Ok(value), Ok(after)) => {
                    assert_eq!(after.get("k"), value.as_ref(), "{cell}");
                    assert_eq!(after["other"], "untouched", "{cell}");
                }
                (Err(kind), Err(reason)) => {
                    assert!(
                        matches!(reason, RejectReason::TypeConflict { .. }),
                        "{cell}: expected {kind}, got {reason}"
                    );
                }
                (expected, got) => panic!("{cell}: expected {expected:?}, got {got:?}"),
            }
        }
    }
}

#[tokio::test]
async fn one_invalid_op_leaves_deps_byte_identical() {
    let deps = json!({"list": [1], "text": "hello", "obj": {"a": {"b": [1, 2]}}});
    let ops = json!([
        {"op": "append", "key": "list", "value": 2},
        {"op": "merge", "key": "obj", "value": {"a": {"c": 1}}},
        {"op": "delete", "key": "text"},
        {"op": "set", "key": "fresh", "value": 1},
        {"op": "append", "key": "obj", "value": 3},
    ]);
    let mut c = ctx(deps);
    let before = snapshot(&c);
    let err = apply(&mut c, ops).await.unwrap_err();
    let CallError::OpRejected(rejected) = err else {
        panic!("expected an op rejection, got {err}");
    };
    assert_eq!(rejected.index, 4);
    assert_eq!(rejected.key, "obj");
    assert_eq!(snapshot(&c), before);
    let message = rejected.to_string();
    assert!(
        message.contains("op #4") && message.contains("append") && message.contains("\"obj\""),
        "{message}"
    );
}

#[tokio::test]
async fn order_matters_set_then_append() {
    let set_then_append = json!([
        {"op": "set", "key": "k", "value": [9, 8]},
        {"op": "append", "key": "k", "value": 1},
    ]);
    assert_eq!(
        run(json!({}), set_then_append).await.unwrap()["k"],
        json!([9, 8, 1])
    );
    let append_then_set = json!([
        {"op": "append", "key": "k", "value": 1},
        {"op": "set", "key": "k", "value": [9, 8]},
    ]);
    assert_eq!(
        run(json!({}), append_then_set).await.unwrap()["k"],
        json!([9, 8])
    );
}

#[tokio::test]
async fn append_delete_append() {
    let ops = json!([
        {"op": "append", "key": "k", "value": 1},
        {"op": "append", "key": "k", "value": 2},
        {"op": "delete", "key": "k"},
        {"op": "append", "key": "k", "value": 3},
    ]);
    assert_eq!(run(json!({}), ops).await.unwrap()["k"], json!([3]));
}

#[tokio::test]
async fn deep_merge_recurses_into_objects() {
    let ops = json!([{"op": "merge", "key": "k", "value": {"a": {"c": 2}, "d": 3}}]);
    let after = run(json!({"k": {"a": {"b": 1}}}), ops).await.unwrap();
    assert_eq!(after["k"], json!({"a": {"b": 1, "c": 2}, "d": 3}));
}

#[tokio::test]
async fn merge_replaces_arrays_and_null_sets_null() {
    let ops = json!([{"op": "merge", "key": "k", "value": {"a": {"list": [3], "gone": null}}}]);
    let after = run(
        json!({"k": {"a": {"list": [1, 2], "gone": 5, "kept": 1}}}),
        ops,
    )
    .await
    .unwrap();
    assert_eq!(
        after["k"],
        json!({"a": {"list": [3], "gone": null, "kept": 1}})
    );
    assert!(after["k"]["a"].as_object().unwrap().contains_key("gone"));
}

#[tokio::test]
async fn merge_value_must_be_an_object() {
    for value in [json!([1]), json!("s"), json!(1), Value::Null] {
        let ops = json!([{"op": "merge", "key": "k", "value": value}]);
        let reason = run(json!({}), ops).await.unwrap_err();
        assert!(
            matches!(reason, RejectReason::MergeNotObject { .. }),
            "{value}: {reason}"
        );
    }
}

#[tokio::test]
async fn keys_must_be_non_empty_and_at_most_256_bytes() {
    let empty = json!([{"op": "set", "key": "", "value": 1}]);
    assert_eq!(
        run(json!({}), empty).await.unwrap_err(),
        RejectReason::EmptyKey
    );

    let longest = "k".repeat(256);
    let ok = json!([{"op": "set", "key": longest, "value": 1}]);
    assert_eq!(run(json!({}), ok).await.unwrap()[&longest], 1);

    let too_long = json!([{"op": "set", "key": "é".repeat(129), "value": 1}]);
    assert_eq!(
        run(json!({}), too_long).await.unwrap_err(),
        RejectReason::KeyTooLong { len: 258, max: 256 }
    );
}

#[tokio::test]
async fn values_must_be_json() {
    let ops = json!([
        {"op": "set", "key": "ok", "value": 1},
        {"op": "set", "key": "bad", "raw": "{not json"},
    ]);
    let reason = run(json!({}), ops).await.unwrap_err();
    assert!(matches!(reason, RejectReason::InvalidJson(_)), "{reason}");
}

#[tokio::test]
async fn op_count_and_bytes_are_bounded() {
    let many: Vec<Value> = (0..1001)
        .map(|i| json!({"op": "set", "key": format!("k{i}"), "value": i}))
        .collect();
    let reason = run(json!({}), Value::Array(many)).await.unwrap_err();
    assert_eq!(
        reason,
        RejectReason::TooManyOps {
            count: 1001,
            max: 1000
        }
    );

    let exactly: Vec<Value> = (0..1000)
        .map(|i| json!({"op": "set", "key": format!("k{i}"), "value": i}))
        .collect();
    assert_eq!(
        run(json!({}), Value::Array(exactly))
            .await
            .unwrap()
            .as_object()
            .unwrap()
            .len(),
        1000
    );

    let big = "x".repeat(600 * 1024);
    let ops = json!([
        {"op": "set", "key": "a", "value": big},
        {"op": "set", "key": "b", "value": big},
    ]);
    let reason = run(json!({}), ops).await.unwrap_err();
    assert!(
        matches!(reason, RejectReason::TooManyBytes { max: 1048576, .. }),
        "{reason}"
    );
}

#[tokio::test]
async fn legacy_update_context_becomes_set_ops() {
    let mut c = ctx(json!({"keep": 1}));
    let args = json!({
        "ops": [{"op": "append", "key": "log", "value": "x"}],
        "result": {"answer": 42, "__update_context__": {"user": {"name": "Ada"}, "keep": 2}},
    });
    let outcome = call(host().await, &mut c, "apply", args).await.unwrap();
    assert_eq!(
        outcome.result,
        json!({"answer": 42}),
        "the legacy key is hidden from the model"
    );
    assert_eq!(
        Value::Object(c.deps().clone()),
        json!({"keep": 2, "log": ["x"], "user": {"name": "Ada"}})
    );

    let mut c = ctx(json!({"keep": 1}));
    let before = snapshot(&c);
    let bad = json!({"ops": [], "result": {"__update_context__": [1]}});
    let err = call(host().await, &mut c, "apply", bad).await.unwrap_err();
    assert!(matches!(err, CallError::InvalidResult(_)), "{err}");
    assert_eq!(snapshot(&c), before);
}

#[tokio::test]
async fn result_must_be_json() {
    let mut c = ctx(json!({"keep": 1}));
    let before = snapshot(&c);
    let args = json!({"ops": [{"op": "set", "key": "k", "value": 1}], "raw_result": "not json"});
    let err = call(host().await, &mut c, "apply", args).await.unwrap_err();
    assert!(matches!(err, CallError::InvalidResult(_)), "{err}");
    assert_eq!(snapshot(&c), before);
}

#[tokio::test]
async fn legacy_updates_count_against_max_op_bytes() {
    let limits = airlock::Limits {
        ops: airlock::OpLimits {
            max_op_bytes: 1_000,
            ..airlock::OpLimits::default()
        },
        ..airlock::Limits::default()
    };
    let config = airlock::ToolConfig {
        limits,
        ..airlock::ToolConfig::default()
    };
    let host = crate::support::host_with(
        &[("context_probe", config)],
        airlock::context::ContextRules::default(),
    )
    .await;
    let mut c = ctx(json!({"keep": 1}));
    let before = snapshot(&c);
    // 600 bytes of guest ops plus 600 of legacy updates: each alone fits,
    // together they are over the bound.
    let args = json!({
        "ops": [{"op": "set", "key": "a", "value": "x".repeat(600)}],
        "result": {"__update_context__": {"b": "y".repeat(600)}},
    });
    let err = call(&host, &mut c, "apply", args).await.unwrap_err();
    let CallError::OpRejected(rejected) = &err else {
        panic!("expected op_rejected, got {err}");
    };
    assert_eq!(rejected.index, 1, "the legacy op is the one over");
    assert_eq!(rejected.key, "b");
    assert!(
        matches!(
            rejected.reason,
            RejectReason::TooManyBytes { max: 1_000, .. }
        ),
        "{err}"
    );
    assert_eq!(snapshot(&c), before);

    // Legacy updates alone are bounded too.
    let args = json!({"ops": [], "result": {"__update_context__": {"b": "y".repeat(2_000)}}});
    let err = call(&host, &mut c, "apply", args).await.unwrap_err();
    assert!(
        matches!(&err, CallError::OpRejected(r) if matches!(r.reason, RejectReason::TooManyBytes { .. })),
        "{err}"
    );
    assert_eq!(snapshot(&c), before);

    // And the host serves the next call.
    let ok = json!({"ops": [], "result": {"__update_context__": {"b": 2}}});
    call(&host, &mut c, "apply", ok).await.unwrap();
    assert_eq!(c.deps()["b"], 2);
}

/// `depth` levels of arrays around 0.
fn nested(depth: usize) -> Value {
    (0..depth).fold(json!(0), |inner, _| json!([inner]))
}

/// Issue 17 item 5: deps take only values Airlock can always load back.
/// At the depth limit a value is accepted, saved with `--save-deps` and
/// loaded again with `--deps`; one level deeper (by `set`, or by `append`
/// wrapping a value at the limit) is refused and deps are unchanged.
#[tokio::test]
async fn deps_hold_only_values_that_load_back() {
    let max = airlock::context::MAX_VALUE_DEPTH;
    let deps = run(
        json!({}),
        json!([{"op": "set", "key": "deep", "value": nested(max)}]),
    )
    .await
    .unwrap();
    // One level too deep, by `set`, or by `append` wrapping a value at the
    // limit in an array.
    for ops in [
        json!([{"op": "set", "key": "deep", "value": nested(max + 1)}]),
        json!([{"op": "append", "key": "deep", "value": nested(max)}]),
    ] {
        let err = run(json!({}), ops).await.unwrap_err();
        assert_eq!(
            err,
            RejectReason::TooDeep {
                depth: max + 1,
                max
            }
        );
    }

    // The round trip through the binary, at the limit.
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("deps.json");
    let probe = crate::support::guest("context_probe");
    let probe = probe.to_str().unwrap();
    let ops = json!({"ops": [{"op": "set", "key": "deep", "value": nested(max)}]}).to_string();
    let out = crate::support::airlock(&[
        "call",
        probe,
        "apply",
        &ops,
        "--save-deps",
        saved.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = crate::support::airlock(&[
        "call",
        probe,
        "apply",
        r#"{"ops":[]}"#,
        "--deps",
        saved.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["deps"], deps);
}

/// Issue 12 item 11: deps cannot grow without bound across calls. Each
/// call stays under the per-call op bytes; the call that would take deps
/// past `max_deps_bytes` is refused whole, and a call that shrinks deps
/// still works.
#[tokio::test]
async fn deps_growth_is_bounded_across_calls() {
    let mut config = airlock::ToolConfig::default();
    config.limits.ops.max_deps_bytes = 10_000;
    let host = crate::support::host_with(
        &[("context_probe", config)],
        airlock::context::ContextRules::default(),
    )
    .await;
    let mut c = ctx(json!({}));
    let chunk = "x".repeat(3_000);
    for i in 0..3 {
        call(
            &host,
            &mut c,
            "apply",
            json!({"ops": [{"op": "set", "key": format!("k{i}"), "value": chunk}]}),
        )
        .await
        .unwrap();
    }
    let before = snapshot(&c);
    let err = call(
        &host,
        &mut c,
        "apply",
        json!({"ops": [{"op": "set", "key": "k3", "value": chunk}]}),
    )
    .await
    .unwrap_err();
    let CallError::OpRejected(rejected) = err else {
        panic!("expected a rejection, got {err}");
    };
    assert!(
        matches!(rejected.reason, RejectReason::DepsTooLarge { max: 10_000, bytes } if bytes > 12_000),
        "{rejected}"
    );
    assert_eq!(snapshot(&c), before);
    call(&host, &mut c, "apply", json!({"ops": [{"op": "delete", "key": "k0"}, {"op": "set", "key": "k1", "value": "small"}]}))
        .await
        .unwrap();
    assert_eq!(c.deps().len(), 2);
}

/// Property tests of the ops engine (proptest): for random deps and random
/// op lists, `RunContext::apply` never panics, applies all of a call's ops
/// or none, and ends exactly where a straightforward sequential reference
/// model ends.
mod against_a_reference_model {
    use airlock::context::RejectReason;
    use airlock::{ContextOp, OpLimits, RunContext};
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    /// Keys from a small alphabet so that ops collide, plus the two invalid
    /// shapes (empty, over the limit).
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            30 => prop::sample::select(vec!["a", "b", "c", "d"]).prop_map(str::to_owned),
            1 => Just(String::new()),
            1 => Just("k".repeat(300)),
        ]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-5i64..5).prop_map(|n| json!(n)),
            "[a-c]{0,3}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::vec((prop::sample::select(vec!["x", "y", "z"]), inner), 0..3)
                    .prop_map(|entries| {
                        Value::Object(
                            entries
                                .into_iter()
                                .map(|(k, v)| (k.to_owned(), v))
                                .collect(),
                        )
                    }),
            ]
        })
    }

    /// A top-level value: `null` often, since the table treats it apart.
    fn slot_value() -> impl Strategy<Value = Value> {
        prop_oneof![1 => Just(Value::Null), 3 => json_value()]
    }

    /// Mostly objects, sometimes not (a rejected merge).
    fn merge_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            6 => prop::collection::vec((prop::sample::select(vec!["x", "y", "z"]), json_value()), 0..3)
                .prop_map(|entries| {
                    Value::Object(entries.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                }),
            1 => json_value(),
        ]
    }

    fn op() -> impl Strategy<Value = ContextOp> {
        prop_oneof![
            (key(), slot_value()).prop_map(|(key, value)| ContextOp::Set { key, value }),
            (key(), merge_value()).prop_map(|(key, value)| ContextOp::Merge { key, value }),
            (key(), json_value()).prop_map(|(key, value)| ContextOp::Append { key, value }),
            key().prop_map(|key| ContextOp::Delete { key }),
        ]
    }

    fn deps() -> impl Strategy<Value = Map<String, Value>> {
        prop::collection::vec(
            (prop::sample::select(vec!["a", "b", "c", "d"]), slot_value()),
            0..4,
        )
        .prop_map(|entries| {
            entries
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect()
        })
    }

    /// The reference: the ops one after another on a copy, per the DESIGN §3
    /// table; `None` if any op is rejected.
    fn reference(
        deps: &Map<String, Value>,
        ops: &[ContextOp],
        limits: &OpLimits,
    ) -> Option<Map<String, Value>> {
        if ops.len() > limits.max_ops {
            return None;
        }
        let mut d = deps.clone();
        for op in ops {
            let key = op.key();
            if key.is_empty() || key.len() > limits.max_key_bytes {
                return None;
            }
            match op {
                ContextOp::Set { value, .. } => {
                    d.insert(key.to_owned(), value.clone());
                }
                ContextOp::Merge { value, .. } => {
                    let Value::Object(patch) = value else {
                        return None;
                    };
                    match d.get_mut(key) {
                        None | Some(Value::Null) => {
                            d.insert(key.to_owned(), value.clone());
                        }
                        Some(Value::Object(target)) => merge(target, patch),
                        Some(_) => return None,
                    }
                }
                ContextOp::Append { value, .. } => match d.get_mut(key) {
                    None | Some(Value::Null) => {
                        d.insert(key.to_owned(), Value::Array(vec![value.clone()]));
                    }
                    Some(Value::Array(items)) => items.push(value.clone()),
                    Some(_) => return None,
                },
                ContextOp::Delete { .. } => {
                    d.shift_remove(key);
                }
            }
        }
        Some(d)
    }

    fn merge(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
        for (k, v) in patch {
            if let (Some(Value::Object(inner)), Value::Object(p)) = (target.get_mut(k), v) {
                merge(inner, p);
            } else {
                target.insert(k.clone(), v.clone());
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn ops_are_all_or_nothing_and_match_the_reference(
            start in deps(),
            // Up to 8 ops the engine finds a key's staged value by a scan,
            // past 8 through a map: both are drawn.
            ops in prop::collection::vec(op(), 0..14),
            max_ops in prop_oneof![1 => 1usize..14, 6 => Just(14usize)],
        ) {
            let limits = OpLimits { max_ops, ..OpLimits::default() };
            let mut ctx = RunContext::new(start.clone());
            let applied = ctx.apply(&ops, &limits);
            let expected = reference(&start, &ops, &limits);
            match (applied, expected) {
                (Ok(()), Some(expected)) => {
                    // Same entries (order aside: a set keeps an existing key's place).
                    prop_assert_eq!(ctx.deps(), &expected);
                }
                (Err(rejected), None) => {
                    prop_assert_eq!(ctx.deps(), &start, "a rejected call changed deps");
                    prop_assert!(rejected.index < ops.len().max(1));
                    if !matches!(rejected.reason, RejectReason::TooManyOps { .. }) {
                        prop_assert!(rejected.key.len() <= 64 + '…'.len_utf8());
                    }
                }
                (got, expected) => {
                    prop_assert!(false, "engine {:?}, reference {:?}", got, expected);
                }
            }
        }
    }
}
