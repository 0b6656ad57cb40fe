//! The Rust `increment` tool's work (guest-examples/rust/stateful) as an
//! Extism plugin. Extism has no context view, so the input carries what the
//! view would give: `{"counters": <the counters key as JSON, or null>,
//! "args": {"name": "..."}}`. The output is what the tool returns: `{"result":
//! {"counter", "value"}, "ops": [{"op": "set", "key": "counters", "value"}]}`.

use extism_pdk::{FnResult, plugin_fn};
use serde_json::{Map, Value, json};

#[plugin_fn]
pub fn increment(input: String) -> FnResult<String> {
    let input: Value = serde_json::from_str(&input)?;
    let name = input["args"]["name"]
        .as_str()
        .ok_or_else(|| extism_pdk::Error::msg("args.name must be a string"))?
        .to_owned();
    let mut counters = match &input["counters"] {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    let value = counters.get(&name).and_then(Value::as_i64).unwrap_or(0) + 1;
    counters.insert(name.clone(), json!(value));
    Ok(json!({
        "result": {"counter": name, "value": value},
        "ops": [{"op": "set", "key": "counters", "value": counters}],
    })
    .to_string())
}
