//! The stateful walkthrough: three tools that share state through the run
//! context, never through their own memory (every call is a fresh instance).
//!
//! - `increment {name}`: adds 1 to `counters[name]`; returns `{counter, value}`
//!   and a `set` of `counters`.
//! - `add_note {text}`: returns `{added, total}` and an `append` to `notes`.
//! - `show_state {}`: returns `{counters, notes}` as read through the view.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "tool-host",
});

use airlock::tool::context::RunContext;
use airlock::tool::types::{ContextOp, Entry, ToolError, ToolOutput, ToolSpec};
use serde_json::{Map, Value, json};

struct Stateful;

impl exports::airlock::tool::tool::Guest for Stateful {
    fn describe() -> Vec<ToolSpec> {
        vec![
            spec(
                "increment",
                "Add 1 to the counter with the given name and return its new value.",
                json!({
                    "type": "object",
                    "properties": {"name": {"type": "string", "description": "Counter name"}},
                    "required": ["name"],
                    "additionalProperties": false
                }),
            ),
            spec(
                "add_note",
                "Append a note to the run's list of notes.",
                json!({
                    "type": "object",
                    "properties": {"text": {"type": "string", "description": "The note"}},
                    "required": ["text"],
                    "additionalProperties": false
                }),
            ),
            spec(
                "show_state",
                "Show all counters and notes.",
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
            ),
        ]
    }

    fn call(ctx: &RunContext, name: String, args: String) -> Result<ToolOutput, ToolError> {
        let args: Value = serde_json::from_str(&args)
            .map_err(|e| ToolError::InvalidArgs(format!("arguments are not JSON: {e}")))?;
        match name.as_str() {
            "increment" => increment(ctx, &args),
            "add_note" => add_note(ctx, &args),
            "show_state" => Ok(output(
                json!({"counters": counters(ctx)?, "notes": notes(ctx)?}),
                vec![],
            )),
            other => Err(ToolError::Failed(format!("no tool named {other:?}"))),
        }
    }
}

fn increment(ctx: &RunContext, args: &Value) -> Result<ToolOutput, ToolError> {
    let name = string_arg(args, "name")?;
    let mut counters = counters(ctx)?;
    let value = match counters.get(name) {
        None => 1,
        Some(v) => {
            v.as_i64().ok_or_else(|| {
                ToolError::Failed(format!("counter {name:?} holds {v}, not an integer"))
            })? + 1
        }
    };
    counters.insert(name.to_owned(), json!(value));
    Ok(output(
        json!({"counter": name, "value": value}),
        vec![ContextOp::Set(entry("counters", &Value::Object(counters)))],
    ))
}

fn add_note(ctx: &RunContext, args: &Value) -> Result<ToolOutput, ToolError> {
    let text = string_arg(args, "text")?;
    let total = notes(ctx)?.len() + 1;
    Ok(output(
        json!({"added": text, "total": total}),
        vec![ContextOp::Append(entry("notes", &json!(text)))],
    ))
}

fn counters(ctx: &RunContext) -> Result<Map<String, Value>, ToolError> {
    match read(ctx, "counters")? {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(map)) => Ok(map),
        Some(other) => Err(ToolError::Failed(format!(
            "deps key \"counters\" holds {other}, not an object"
        ))),
    }
}

fn notes(ctx: &RunContext) -> Result<Vec<Value>, ToolError> {
    match read(ctx, "notes")? {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(ToolError::Failed(format!(
            "deps key \"notes\" holds {other}, not an array"
        ))),
    }
}

fn read(ctx: &RunContext, key: &str) -> Result<Option<Value>, ToolError> {
    ctx.get(key)
        .map(|text| serde_json::from_str(&text))
        .transpose()
        .map_err(|e| ToolError::Failed(format!("deps key {key:?} is not JSON: {e}")))
}

fn string_arg<'a>(args: &'a Value, field: &str) -> Result<&'a str, ToolError> {
    args.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::InvalidArgs(format!("`{field}` must be a string")))
}

fn spec(name: &str, description: &str, parameters: Value) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        parameters: parameters.to_string(),
    }
}

fn entry(key: &str, value: &Value) -> Entry {
    Entry {
        key: key.to_owned(),
        value: value.to_string(),
    }
}

fn output(result: Value, updates: Vec<ContextOp>) -> ToolOutput {
    ToolOutput {
        result: result.to_string(),
        updates,
    }
}

export!(Stateful);
