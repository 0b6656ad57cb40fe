//! Context ops: the only way a tool changes deps.
//!
//! Semantics (DESIGN §3), for one op against the value a key holds:
//!
//! | op       | missing or `null` | object     | array    | other    |
//! |----------|-------------------|------------|----------|----------|
//! | `set`    | creates           | replaces   | replaces | replaces |
//! | `merge`  | creates `obj`     | deep merge | rejected | rejected |
//! | `append` | creates `[item]`  | rejected   | pushes   | rejected |
//! | `delete` | no-op / removes   | removes    | removes  | removes  |
//!
//! (`delete` of a missing key is a no-op; of a `null` it removes the key.)

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::access::KeyRules;

/// Bounds on one call's ops. The defaults are what a tool gets unless the
/// operator's policy says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpLimits {
    /// Most ops one call may return. Default 1,000.
    pub max_ops: usize,
    /// Longest key, in UTF-8 bytes. Default 256.
    pub max_key_bytes: usize,
    /// Most bytes of keys plus JSON value text over all of a call's ops.
    /// Default 1 MiB.
    pub max_op_bytes: usize,
    /// Largest deps may grow to, as compact JSON text, checked on the
    /// staged deps before a call's ops are applied. Default 16 MiB. (A call
    /// that shrinks deps is never refused for their size.)
    pub max_deps_bytes: usize,
}

/// Deepest nesting of a value in deps (deps itself not counted), checked on
/// every staged value. Far enough under serde_json's parse limit (128) that
/// whatever a tool puts in deps can always be saved and loaded back, inside
/// a session record included.
pub const MAX_VALUE_DEPTH: usize = 64;

/// Up to this many ops in a call, a touched key's staged value is found by
/// scanning the staged keys; past it, through a map (a scan per op would
/// make a call of many ops quadratic).
const SCANNED_OPS: usize = 8;

impl Default for OpLimits {
    fn default() -> Self {
        Self {
            max_ops: 1_000,
            max_key_bytes: 256,
            max_op_bytes: 1 << 20,
            max_deps_bytes: 16 << 20,
        }
    }
}

/// One change to a top-level key of deps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ContextOp {
    /// Insert or replace.
    Set {
        /// The top-level deps key.
        key: String,
        /// The new value.
        value: Value,
    },
    /// Deep-merge a JSON object into the key.
    Merge {
        /// The top-level deps key.
        key: String,
        /// The object to merge in.
        value: Value,
    },
    /// Push onto a JSON array.
    Append {
        /// The top-level deps key.
        key: String,
        /// The item to push.
        value: Value,
    },
    /// Remove the key, whatever it holds; a missing key is not an error.
    Delete {
        /// The top-level deps key.
        key: String,
    },
}

/// The four kinds of op, for error messages and events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// [`ContextOp::Set`].
    Set,
    /// [`ContextOp::Merge`].
    Merge,
    /// [`ContextOp::Append`].
    Append,
    /// [`ContextOp::Delete`].
    Delete,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::Set => "set",
            OpKind::Merge => "merge",
            OpKind::Append => "append",
            OpKind::Delete => "delete",
        })
    }
}

impl ContextOp {
    /// Which of the four ops this is.
    pub fn kind(&self) -> OpKind {
        match self {
            ContextOp::Set { .. } => OpKind::Set,
            ContextOp::Merge { .. } => OpKind::Merge,
            ContextOp::Append { .. } => OpKind::Append,
            ContextOp::Delete { .. } => OpKind::Delete,
        }
    }

    /// The key it changes.
    pub fn key(&self) -> &str {
        match self {
            ContextOp::Set { key, .. }
            | ContextOp::Merge { key, .. }
            | ContextOp::Append { key, .. }
            | ContextOp::Delete { key } => key,
        }
    }

    /// Parses an op as a tool sends it: the value is JSON text.
    ///
    /// Checks only what can be known from the op alone: the value parses and
    /// a `merge` value is an object. Limits and type conflicts are checked
    /// when the ops are applied.
    pub fn from_json_text(
        index: usize,
        kind: OpKind,
        key: String,
        value: Option<&str>,
    ) -> Result<Self, OpRejected> {
        let reject = |key: String, reason| OpRejected {
            index,
            kind,
            key,
            reason,
        };
        let value = match value {
            None => None,
            Some(text) => match serde_json::from_str::<Value>(text) {
                Ok(v) => Some(v),
                Err(e) => return Err(reject(key, RejectReason::InvalidJson(e.to_string()))),
            },
        };
        Ok(match (kind, value) {
            (OpKind::Set, Some(value)) => ContextOp::Set { key, value },
            (OpKind::Merge, Some(value)) => ContextOp::Merge { key, value },
            (OpKind::Append, Some(value)) => ContextOp::Append { key, value },
            (OpKind::Delete, None) => ContextOp::Delete { key },
            (OpKind::Delete, Some(_)) => {
                return Err(reject(key, RejectReason::UnexpectedValue));
            }
            (_, None) => return Err(reject(key, RejectReason::MissingValue)),
        })
    }
}

/// A rejected op, and so a rejected call: no op of the call was applied.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize)]
#[error("op #{index} ({kind} {key:?}) rejected: {reason}")]
pub struct OpRejected {
    /// Position of the op in the call's list, from 0.
    pub index: usize,
    /// Which op.
    pub kind: OpKind,
    /// Its key (shortened if huge).
    pub key: String,
    /// Why it was rejected.
    pub reason: RejectReason,
}

/// Why an op was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize)]
#[serde(tag = "reason", content = "detail", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RejectReason {
    /// The key is the empty string.
    #[error("the key is empty")]
    EmptyKey,
    /// The key is over [`OpLimits::max_key_bytes`].
    #[error("the key is {len} bytes; the limit is {max}")]
    KeyTooLong {
        /// The key's length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The value text does not parse.
    #[error("the value is not valid JSON: {0}")]
    InvalidJson(String),
    /// A `set`, `merge` or `append` without a value.
    #[error("this op needs a value")]
    MissingValue,
    /// A `delete` with a value.
    #[error("a delete op takes no value")]
    UnexpectedValue,
    /// A `merge` whose value is not an object.
    #[error("a merge value must be a JSON object, not {found}")]
    MergeNotObject {
        /// What the value is.
        found: JsonType,
    },
    /// The key holds a type the op cannot work on.
    #[error("the key holds {found}; {kind} needs {needs}")]
    TypeConflict {
        /// The op.
        kind: OpKind,
        /// What the key holds.
        found: JsonType,
        /// What the op needs.
        needs: &'static str,
    },
    /// More ops than [`OpLimits::max_ops`].
    #[error("the call returned {count} ops; the limit is {max}")]
    TooManyOps {
        /// How many the call returned.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// More bytes than [`OpLimits::max_op_bytes`].
    #[error("the call's ops hold {bytes} bytes of keys and values; the limit is {max}")]
    TooManyBytes {
        /// Bytes counted up to this op.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// The key is hidden by the policy.
    #[error("the key is hidden from tools")]
    Hidden,
    /// The key is outside the tool's `context.write` patterns.
    #[error("this tool may not write the key (context.write allows {})", .allowed.join(", "))]
    NotWritable {
        /// The tool's write patterns.
        allowed: Vec<String>,
    },
    /// A `merge` or `append` on a key outside the tool's `context.read`
    /// patterns. Both read the value they change (and a rejection would
    /// reveal its type), so they need read access; `set` and `delete` need
    /// only write access.
    #[error("{kind} reads the key's value, and this tool may not read the key (context.read allows {})", .allowed.join(", "))]
    NotReadable {
        /// The op.
        kind: OpKind,
        /// The tool's read patterns.
        allowed: Vec<String>,
    },
    /// Deps after the call would be larger than [`OpLimits::max_deps_bytes`].
    #[error("deps would grow to {bytes} bytes; the limit is {max}")]
    DepsTooLarge {
        /// The size deps would have.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// The key's value after the call nests deeper than [`MAX_VALUE_DEPTH`].
    #[error("the value after this call nests {depth} levels deep; the limit is {max}")]
    TooDeep {
        /// How deep it nests.
        depth: usize,
        /// The limit.
        max: usize,
    },
    /// The key's value after the call breaks its schema. Names where and
    /// which rule, never the value.
    #[error("the value after this call breaks the key's schema: {0}")]
    SchemaViolation(SchemaViolation),
}

/// Where a value breaks its key's schema: the location in the value and the
/// failing rule's location in the schema. Holds no part of the value, so it
/// can be shown to a tool or a model whatever the value is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SchemaViolation {
    /// JSON Pointer into the value (empty: the value itself).
    pub instance_path: String,
    /// The failing keyword, e.g. `minimum`.
    pub rule: String,
    /// JSON Pointer to the failing keyword in the schema.
    pub schema_path: String,
}

impl SchemaViolation {
    /// The first place where `value` breaks `validator`'s schema, if any.
    /// Cost: one pass that builds no error for a valid value (nearly every
    /// one); jsonschema's error for an invalid one (its message, which
    /// quotes the value, is dropped).
    pub(crate) fn first(validator: &jsonschema::Validator, value: &Value) -> Option<Self> {
        if validator.is_valid(value) {
            return None;
        }
        let e = validator.iter_errors(value).next()?;
        Some(Self::of(&e))
    }

    /// Where `e` says its value breaks the schema, without the value.
    pub(crate) fn of(e: &jsonschema::ValidationError<'_>) -> Self {
        let schema_path = e.schema_path().to_string();
        let rule = schema_path
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        Self {
            instance_path: e.instance_path().to_string(),
            rule,
            schema_path,
        }
    }
}

impl fmt::Display for SchemaViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.instance_path.is_empty() {
            f.write_str("the value")?;
        } else {
            write!(f, "at {}", self.instance_path)?;
        }
        write!(
            f,
            " fails rule {:?} (schema path {})",
            self.rule, self.schema_path
        )
    }
}

/// The JSON type of a value, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JsonType {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool,
    /// A number.
    Number,
    /// A string.
    String,
    /// An array.
    Array,
    /// An object.
    Object,
}

impl JsonType {
    /// The type of `value`.
    pub fn of(value: &Value) -> Self {
        match value {
            Value::Null => JsonType::Null,
            Value::Bool(_) => JsonType::Bool,
            Value::Number(_) => JsonType::Number,
            Value::String(_) => JsonType::String,
            Value::Array(_) => JsonType::Array,
            Value::Object(_) => JsonType::Object,
        }
    }
}

impl fmt::Display for JsonType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JsonType::Null => "null",
            JsonType::Bool => "a boolean",
            JsonType::Number => "a number",
            JsonType::String => "a string",
            JsonType::Array => "an array",
            JsonType::Object => "an object",
        })
    }
}

fn check_key(key: &str, limits: &OpLimits) -> Result<(), RejectReason> {
    if key.is_empty() {
        return Err(RejectReason::EmptyKey);
    }
    if key.len() > limits.max_key_bytes {
        return Err(RejectReason::KeyTooLong {
            len: key.len(),
            max: limits.max_key_bytes,
        });
    }
    Ok(())
}

/// Keys in errors are shown whole unless a hostile tool made them huge.
pub(crate) fn truncate_key(key: &str) -> String {
    crate::text::truncate(key, 64)
}

/// What one entry adds to deps' JSON text: `"key":value` and a comma.
fn entry_len(key: &str, value: Option<&Value>) -> usize {
    value.map_or(0, |v| {
        crate::json::len(&key)
            .saturating_add(crate::json::len(v))
            .saturating_add(2)
    })
}

/// Applies `ops` in order to `deps`, whose JSON text is `deps_bytes` long,
/// all or nothing; returns the new length.
///
/// Each touched key is staged as a copy of its current value (none when
/// its first op is a set or a delete, which replace it); untouched keys are
/// never copied, so the cost is that of the values the ops touch, not of
/// deps. `deps` is modified only after every op has succeeded.
pub(crate) fn apply(
    deps: &mut Map<String, Value>,
    deps_bytes: usize,
    ops: &[ContextOp],
    limits: &OpLimits,
    rules: &KeyRules,
) -> Result<usize, OpRejected> {
    if ops.len() > limits.max_ops {
        let index = limits.max_ops;
        return Err(OpRejected {
            index,
            kind: ops[index].kind(),
            key: truncate_key(ops[index].key()),
            reason: RejectReason::TooManyOps {
                count: ops.len(),
                max: limits.max_ops,
            },
        });
    }
    // Touched keys in first-touch order, so new keys land in deps in the
    // order the ops created them.
    // Each entry: key, staged value, index of the last op that touched it.
    let mut staged: Vec<(&str, Option<Value>, usize)> = Vec::with_capacity(ops.len());
    // A key's slot in `staged`: looked up in a map when there are many
    // ops, found by a scan when there are few (no map built).
    let mut slot_of: BTreeMap<&str, usize> = BTreeMap::new();
    let scan = ops.len() <= SCANNED_OPS;
    for (index, op) in ops.iter().enumerate() {
        let key = op.key();
        let reject = |reason| OpRejected {
            index,
            kind: op.kind(),
            key: truncate_key(key),
            reason,
        };
        check_key(key, limits).map_err(reject)?;
        if rules.context.is_hidden(key) {
            return Err(reject(RejectReason::Hidden));
        }
        if !rules.access.write.matches(key) {
            return Err(reject(RejectReason::NotWritable {
                allowed: rules.access.write.patterns().to_vec(),
            }));
        }
        if matches!(op, ContextOp::Merge { .. } | ContextOp::Append { .. })
            && !rules.access.read.matches(key)
        {
            return Err(reject(RejectReason::NotReadable {
                kind: op.kind(),
                allowed: rules.access.read.patterns().to_vec(),
            }));
        }
        let stage = |staged: &mut Vec<_>| {
            // A set or a delete replaces whatever the key held: only a
            // merge or an append needs a copy of it.
            let current = match op {
                ContextOp::Set { .. } | ContextOp::Delete { .. } => None,
                ContextOp::Merge { .. } | ContextOp::Append { .. } => deps.get(key).cloned(),
            };
            staged.push((key, current, index));
            staged.len() - 1
        };
        let slot = if scan {
            match staged.iter().position(|(touched, ..)| *touched == key) {
                Some(slot) => slot,
                None => stage(&mut staged),
            }
        } else {
            *slot_of.entry(key).or_insert_with(|| stage(&mut staged))
        };
        apply_one(&mut staged[slot].1, op).map_err(reject)?;
        staged[slot].2 = index;
    }
    let mut new_bytes = deps_bytes;
    for (key, value, index) in &staged {
        let reject = |reason| OpRejected {
            index: *index,
            kind: ops[*index].kind(),
            key: truncate_key(key),
            reason,
        };
        new_bytes = new_bytes
            .saturating_sub(entry_len(key, deps.get(*key)))
            .saturating_add(entry_len(key, value.as_ref()));
        let Some(value) = value else { continue };
        if crate::json::deeper_than(value, MAX_VALUE_DEPTH) {
            return Err(reject(RejectReason::TooDeep {
                depth: crate::json::depth(value),
                max: MAX_VALUE_DEPTH,
            }));
        }
        if let Err(violation) = rules.context.check(key, value) {
            return Err(reject(RejectReason::SchemaViolation(violation)));
        }
    }
    if new_bytes > limits.max_deps_bytes && new_bytes > deps_bytes {
        let index = ops.len() - 1;
        return Err(OpRejected {
            index,
            kind: ops[index].kind(),
            key: truncate_key(ops[index].key()),
            reason: RejectReason::DepsTooLarge {
                bytes: new_bytes,
                max: limits.max_deps_bytes,
            },
        });
    }
    for (key, value, _) in staged {
        match value {
            // An existing key keeps its position (and its `String`); a
            // new one is appended.
            Some(value) => match deps.get_mut(key) {
                Some(held) => *held = value,
                None => {
                    deps.insert(key.to_owned(), value);
                }
            },
            // `shift_remove` keeps the order of the remaining keys.
            None => {
                deps.shift_remove(key);
            }
        }
    }
    Ok(new_bytes)
}

/// Applies one op to the value a key holds (`None`: the key is missing).
fn apply_one(slot: &mut Option<Value>, op: &ContextOp) -> Result<(), RejectReason> {
    let conflict = |found: &Value, needs| RejectReason::TypeConflict {
        kind: op.kind(),
        found: JsonType::of(found),
        needs,
    };
    match op {
        ContextOp::Set { value, .. } => *slot = Some(value.clone()),
        ContextOp::Merge { value, .. } => {
            let Value::Object(patch) = value else {
                return Err(RejectReason::MergeNotObject {
                    found: JsonType::of(value),
                });
            };
            match slot {
                None | Some(Value::Null) => *slot = Some(value.clone()),
                Some(Value::Object(target)) => deep_merge(target, patch),
                Some(other) => return Err(conflict(other, "an object, null or a missing key")),
            }
        }
        ContextOp::Append { value, .. } => match slot {
            None | Some(Value::Null) => *slot = Some(Value::Array(vec![value.clone()])),
            Some(Value::Array(items)) => items.push(value.clone()),
            Some(other) => return Err(conflict(other, "an array, null or a missing key")),
        },
        // DESIGN §3: deleting removes the key whatever it holds, `null`
        // included; a missing key is a no-op.
        ContextOp::Delete { .. } => *slot = None,
    }
    Ok(())
}

/// Object into object recurses; anywhere else the patch's value wins
/// (arrays are replaced, a `null` leaf sets `null`).
fn deep_merge(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (key, value) in patch {
        match (target.get_mut(key), value) {
            (Some(Value::Object(inner)), Value::Object(patch_inner)) => {
                deep_merge(inner, patch_inner)
            }
            _ => {
                target.insert(key.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deps(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn failed_op_leaves_deps_untouched() {
        let mut d = deps(json!({"a": [1], "s": "x"}));
        let before = d.clone();
        let ops = vec![
            ContextOp::Append {
                key: "a".into(),
                value: json!(2),
            },
            ContextOp::Append {
                key: "s".into(),
                value: json!(3),
            },
        ];
        let err = apply(&mut d, 0, &ops, &OpLimits::default(), &KeyRules::default()).unwrap_err();
        assert_eq!(err.index, 1);
        assert_eq!(err.key, "s");
        assert_eq!(d, before);
    }

    #[test]
    fn key_order_is_stable() {
        let mut d = deps(json!({"a": 1, "b": 2, "c": 3}));
        let ops = vec![
            ContextOp::Set {
                key: "z".into(),
                value: json!(0),
            },
            ContextOp::Delete { key: "b".into() },
            ContextOp::Set {
                key: "a".into(),
                value: json!(9),
            },
            ContextOp::Append {
                key: "m".into(),
                value: json!(1),
            },
        ];
        apply(&mut d, 0, &ops, &OpLimits::default(), &KeyRules::default()).unwrap();
        let keys: Vec<&str> = d.keys().map(String::as_str).collect();
        assert_eq!(keys, ["a", "c", "z", "m"]);
        assert_eq!(d["a"], 9);
    }

    #[test]
    fn huge_keys_are_truncated_in_errors() {
        let key = "k".repeat(10_000);
        let err = apply(
            &mut Map::new(),
            0,
            &[ContextOp::Delete { key }],
            &OpLimits::default(),
            &KeyRules::default(),
        )
        .unwrap_err();
        assert!(err.key.len() < 100, "{}", err.key);
        assert!(matches!(
            err.reason,
            RejectReason::KeyTooLong {
                len: 10_000,
                max: 256
            }
        ));
    }
}
