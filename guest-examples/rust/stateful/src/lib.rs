//! The stateful walkthrough: three tools that share state through the run
//! context, never through their own memory (every call is a fresh instance).
//! The same tools exist in Python, JavaScript and C; all four behave
//! identically (see tests/all/conformance.rs):
//!
//! - `increment {name}`: adds 1 to `counters[name]` (missing counts as 0);
//!   returns `{counter, value}` and a `set` of `counters`. Fails if
//!   `counters` is not an object or the counter is not an integer.
//! - `add_note {text}`: returns `{added, total}` and an `append` of `text`
//!   to `notes`; the host rejects the append if `notes` is not an array.
//! - `show_state {}`: returns `{counters, notes}` as read through the view
//!   (`{}` and `[]` when missing).

use airlock_guest::{Context, Output, Spec, Tool, ToolError, Updates, Value, json, str_arg};

struct Stateful;

impl Tool for Stateful {
    fn describe() -> Vec<Spec> {
        vec![
            Spec::new(
                "increment",
                "Add 1 to the counter with the given name and return its new value.",
                json!({
                    "type": "object",
                    "properties": {"name": {"type": "string", "description": "Counter name"}},
                    "required": ["name"],
                    "additionalProperties": false
                }),
            ),
            Spec::new(
                "add_note",
                "Append a note to the run's list of notes.",
                json!({
                    "type": "object",
                    "properties": {"text": {"type": "string", "description": "The note"}},
                    "required": ["text"],
                    "additionalProperties": false
                }),
            ),
            Spec::new(
                "show_state",
                "Show all counters and notes.",
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
            ),
        ]
    }

    fn call(ctx: &Context, name: &str, args: &Value) -> Result<Output, ToolError> {
        match name {
            "increment" => {
                let counter = str_arg(args, "name")?;
                let mut counters = ctx.object("counters")?;
                let current = match counters.get(counter) {
                    None => 0,
                    Some(v) => v.as_i64().ok_or_else(|| {
                        ToolError::Failed(format!(
                            "counter {} is not an integer",
                            Value::from(counter)
                        ))
                    })?,
                };
                let value = current + 1;
                counters.insert(counter.to_owned(), json!(value));
                Ok(Output::new(json!({"counter": counter, "value": value}))
                    .with(Updates::new().set("counters", counters)))
            }
            "add_note" => {
                let text = str_arg(args, "text")?;
                let count = match ctx.get("notes")? {
                    Some(Value::Array(items)) => items.len(),
                    _ => 0,
                };
                Ok(Output::new(json!({"added": text, "total": count + 1}))
                    .with(Updates::new().append("notes", text)))
            }
            "show_state" => {
                let or = |value: Option<Value>, default: Value| match value {
                    None | Some(Value::Null) => default,
                    Some(v) => v,
                };
                Ok(Output::new(json!({
                    "counters": or(ctx.get("counters")?, json!({})),
                    "notes": or(ctx.get("notes")?, json!([])),
                })))
            }
            other => Err(ToolError::Failed(format!("no tool named {other:?}"))),
        }
    }
}

airlock_guest::export_tool!(Stateful);
