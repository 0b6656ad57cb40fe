//! A test fixture that drives the host through the real component boundary.
//!
//! - `apply {ops: [{op, key, value?, raw?}], result?, raw_result?}` returns
//!   exactly the ops it is given. `value` is any JSON and is sent as JSON
//!   text; `raw` is sent verbatim instead (so a test can send text that is
//!   not JSON). `result` (default `{}`) is returned as the result;
//!   `raw_result` is returned verbatim instead.
//! - `read {keys: [..], metadata: [..]}` returns the values it reads through
//!   the view, which keys are missing, every key the view lists, the
//!   requested metadata, and every identity field of the view.
//! - `derive {read: [..], ops: [{op, key, value?, from?}], retry?}` reads
//!   only the `read` keys (with `get`), returns them as its result (`null`
//!   when missing; its retry count too when `retry` is true), and returns
//!   the ops, where an op's `from` names a read key whose value (or `null`)
//!   becomes the op's value: what it writes depends on what it read.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "tool-host",
});

use airlock::tool::context::RunContext;
use airlock::tool::types::{ContextOp, Entry, ToolError, ToolOutput, ToolSpec};
use serde_json::{Map, Value, json};

struct Probe;

impl exports::airlock::tool::tool::Guest for Probe {
    fn describe() -> Vec<ToolSpec> {
        vec![
            ToolSpec {
                name: "apply".into(),
                description: "Return exactly the given context ops and result.".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "ops": {"type": "array", "items": {"type": "object"}},
                        "result": {},
                        "raw_result": {"type": "string"}
                    },
                    "required": ["ops"]
                })
                .to_string(),
            },
            ToolSpec {
                name: "derive".into(),
                description: "Read some keys; return them and ops built from them.".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "read": {"type": "array", "items": {"type": "string"}},
                        "ops": {"type": "array", "items": {"type": "object"}},
                        "retry": {"type": "boolean"}
                    },
                    "required": ["read", "ops"]
                })
                .to_string(),
            },
            ToolSpec {
                name: "read".into(),
                description: "Read keys and every identity field through the view.".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "keys": {"type": "array", "items": {"type": "string"}},
                        "metadata": {"type": "array", "items": {"type": "string"}}
                    }
                })
                .to_string(),
            },
        ]
    }

    fn call(ctx: &RunContext, name: String, args: String) -> Result<ToolOutput, ToolError> {
        let args: Value = serde_json::from_str(&args)
            .map_err(|e| ToolError::InvalidArgs(format!("arguments are not JSON: {e}")))?;
        match name.as_str() {
            "apply" => apply(&args),
            "derive" => derive(ctx, &args),
            "read" => Ok(ToolOutput {
                result: read(ctx, &args)?.to_string(),
                updates: vec![],
            }),
            other => Err(ToolError::Failed(format!("no tool named {other:?}"))),
        }
    }
}

fn apply(args: &Value) -> Result<ToolOutput, ToolError> {
    let ops = args
        .get("ops")
        .and_then(Value::as_array)
        .ok_or_else(|| ToolError::InvalidArgs("`ops` must be an array".into()))?;
    let updates = ops
        .iter()
        .enumerate()
        .map(|(i, op)| to_op(op).map_err(|e| ToolError::InvalidArgs(format!("ops[{i}]: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let result = match (args.get("raw_result"), args.get("result")) {
        (Some(Value::String(raw)), _) => raw.clone(),
        (_, Some(result)) => result.to_string(),
        (_, None) => "{}".into(),
    };
    Ok(ToolOutput { result, updates })
}

fn derive(ctx: &RunContext, args: &Value) -> Result<ToolOutput, ToolError> {
    let mut read = Map::new();
    for key in args["read"].as_array().into_iter().flatten() {
        let key = key
            .as_str()
            .ok_or_else(|| ToolError::InvalidArgs("`read` holds key names".into()))?;
        let value = match ctx.get(key) {
            Some(text) => serde_json::from_str(&text).map_err(|e| {
                ToolError::Failed(format!("the host gave non-JSON for {key:?}: {e}"))
            })?,
            None => Value::Null,
        };
        read.insert(key.to_owned(), value);
    }
    let updates = args["ops"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, op)| {
            let op = match op.get("from").and_then(Value::as_str) {
                Some(from) => {
                    let mut op = op.clone();
                    op["value"] = read.get(from).cloned().unwrap_or(Value::Null);
                    op
                }
                None => op.clone(),
            };
            to_op(&op).map_err(|e| ToolError::InvalidArgs(format!("ops[{i}]: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut result = json!({ "read": read });
    if args["retry"].as_bool() == Some(true) {
        result["retry"] = json!(ctx.retry());
    }
    Ok(ToolOutput {
        result: result.to_string(),
        updates,
    })
}

fn to_op(op: &Value) -> Result<ContextOp, String> {
    let kind = op
        .get("op")
        .and_then(Value::as_str)
        .ok_or("`op` must be a string")?;
    let key = op
        .get("key")
        .and_then(Value::as_str)
        .ok_or("`key` must be a string")?
        .to_owned();
    let value = match (op.get("raw"), op.get("value")) {
        (Some(Value::String(raw)), _) => Some(raw.clone()),
        (_, Some(value)) => Some(value.to_string()),
        (_, None) => None,
    };
    let entry = |value: Option<String>| -> Result<Entry, String> {
        let value = value.ok_or_else(|| format!("`{kind}` needs `value` or `raw`"))?;
        Ok(Entry {
            key: key.clone(),
            value,
        })
    };
    Ok(match kind {
        "set" => ContextOp::Set(entry(value)?),
        "merge" => ContextOp::Merge(entry(value)?),
        "append" => ContextOp::Append(entry(value)?),
        "delete" => ContextOp::Delete(key.clone()),
        other => return Err(format!("unknown op {other:?}")),
    })
}

fn read(ctx: &RunContext, args: &Value) -> Result<Value, ToolError> {
    let names = |field: &str| -> Vec<String> {
        args.get(field)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut values = Map::new();
    let mut missing = Vec::new();
    for key in names("keys") {
        match ctx.get(&key) {
            Some(text) => {
                let value = serde_json::from_str(&text).map_err(|e| {
                    ToolError::Failed(format!("the host gave non-JSON for {key:?}: {e}"))
                })?;
                values.insert(key, value);
            }
            None => missing.push(key),
        }
    }
    let metadata: Map<String, Value> = names("metadata")
        .into_iter()
        .map(|k| {
            let v = ctx.metadata(&k).map_or(Value::Null, Value::String);
            (k, v)
        })
        .collect();
    let usage = ctx.usage();
    Ok(json!({
        "values": values,
        "missing": missing,
        "keys": ctx.keys(),
        "metadata": metadata,
        "run_id": ctx.run_id(),
        "session_id": ctx.session_id(),
        "user_id": ctx.user_id(),
        "tool_call_id": ctx.tool_call_id(),
        "retry": ctx.retry(),
        "iteration": ctx.iteration(),
        "usage": {
            "requests": usage.requests,
            "tool_calls": usage.tool_calls,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
        },
    }))
}

export!(Probe);
