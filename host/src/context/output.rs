//! From a tool's raw output to checked ops: the one entry point through
//! which anything a guest returns becomes ops ([`parse_output`]).
//!
//! Every op, the guest's own and those of the legacy `__update_context__`
//! form alike, is counted against the same [`OpLimits`] before any value
//! is parsed, so a flood is refused before the host spends time on it.

use serde_json::Value;

use super::ops::{ContextOp, OpKind, OpLimits, OpRejected, RejectReason, truncate_key};

/// The result key of the legacy update form (DESIGN §3): a JSON result
/// object carrying `__update_context__: {k: v, ...}` becomes `set` ops, and
/// the key is removed from what the model sees.
pub const LEGACY_UPDATE_KEY: &str = "__update_context__";

/// One op as a guest sends it, before anything of it is parsed: which op,
/// the key, the value as JSON text. Implemented by the guest interface's
/// own op type, so an op is parsed once, from what the guest returned
/// into the [`ContextOp`] the engine applies.
pub trait WireOp {
    /// Which op.
    fn kind(&self) -> OpKind;
    /// The deps key.
    fn key(&self) -> &str;
    /// The length of the value's JSON text (0 for `delete`).
    fn value_len(&self) -> usize;
    /// The key and the value's JSON text (`None` for `delete`).
    fn into_parts(self) -> (String, Option<String>);
}

/// A tool's result and the ops to apply, both checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedOutput {
    /// What the model sees (the legacy key removed).
    pub result: Value,
    /// The ops, in order: the guest's, then the legacy form's.
    pub ops: Vec<ContextOp>,
}

/// Why a tool's output was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// The result is not JSON, or its legacy update is not an object.
    #[error("invalid result: {0}")]
    InvalidResult(String),
    /// An op is over a bound or malformed.
    #[error(transparent)]
    OpRejected(#[from] OpRejected),
}

/// Parses a tool's result text and ops under `limits`: the op count and
/// total bytes (keys plus value text, legacy ops included) first, then each
/// value. Applies nothing; key rules, type conflicts and schemas are
/// checked when the ops are applied.
///
/// Costs one JSON parse of the result and of each value.
pub fn parse_output<O: WireOp>(
    result: &str,
    ops: Vec<O>,
    limits: &OpLimits,
) -> Result<ParsedOutput, OutputError> {
    let mut result: Value = serde_json::from_str(result)
        .map_err(|e| OutputError::InvalidResult(format!("the result is not valid JSON: {e}")))?;
    let legacy = match &mut result {
        Value::Object(map) => match map.shift_remove(LEGACY_UPDATE_KEY) {
            None => None,
            Some(Value::Object(entries)) => Some(entries),
            Some(_) => {
                return Err(OutputError::InvalidResult(format!(
                    "`{LEGACY_UPDATE_KEY}` must be a JSON object of key → value"
                )));
            }
        },
        _ => None,
    };
    let legacy: Vec<(String, Value, usize)> = legacy
        .into_iter()
        .flatten()
        .map(|(key, value)| {
            let bytes = value.to_string().len();
            (key, value, bytes)
        })
        .collect();

    let sizes = ops
        .iter()
        .map(|op| (op.kind(), op.key(), op.value_len()))
        .chain(
            legacy
                .iter()
                .map(|(key, _, bytes)| (OpKind::Set, key.as_str(), *bytes)),
        );
    check_bounds(sizes, ops.len() + legacy.len(), limits)?;

    let mut parsed = Vec::with_capacity(ops.len() + legacy.len());
    for (index, op) in ops.into_iter().enumerate() {
        let kind = op.kind();
        let (key, value) = op.into_parts();
        parsed.push(ContextOp::from_json_text(
            index,
            kind,
            key,
            value.as_deref(),
        )?);
    }
    parsed.extend(
        legacy
            .into_iter()
            .map(|(key, value, _)| ContextOp::Set { key, value }),
    );
    Ok(ParsedOutput {
        result,
        ops: parsed,
    })
}

/// Checks the call-wide bounds: op count and total bytes (`value_bytes` is
/// the length of an op's value as JSON text, 0 for `delete`). Keys are
/// checked once, when the ops are applied.
fn check_bounds<'a>(
    ops: impl Iterator<Item = (OpKind, &'a str, usize)>,
    count: usize,
    limits: &OpLimits,
) -> Result<(), OpRejected> {
    let mut bytes = 0usize;
    for (index, (kind, key, value_bytes)) in ops.enumerate() {
        let reject = |reason| OpRejected {
            index,
            kind,
            key: truncate_key(key),
            reason,
        };
        if index >= limits.max_ops {
            return Err(reject(RejectReason::TooManyOps {
                count,
                max: limits.max_ops,
            }));
        }
        bytes = bytes.saturating_add(key.len()).saturating_add(value_bytes);
        if bytes > limits.max_op_bytes {
            return Err(reject(RejectReason::TooManyBytes {
                bytes,
                max: limits.max_op_bytes,
            }));
        }
    }
    Ok(())
}
