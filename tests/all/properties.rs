//! Property tests of the ops engine (proptest): for random deps and random
//! op lists, `RunContext::apply` never panics, applies all of a call's ops
//! or none, and ends exactly where a straightforward sequential reference
//! model ends.

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
        ops in prop::collection::vec(op(), 0..8),
        max_ops in prop_oneof![1 => 1usize..8, 6 => Just(8usize)],
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
