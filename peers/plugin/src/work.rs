//! The increment tool's work on JSON text, shared by the Extism plugin
//! (`lib.rs`) and the harness's native and subprocess baselines, so that
//! every peer does exactly the same work.
//!
//! Extism has no context view, so the input carries what the view would
//! give: `{"counters": <the counters key as JSON, or null>, "args":
//! {"name": "..."}}`. The output is what the tool returns: `{"result":
//! {"counter", "value"}, "ops": [{"op": "set", "key": "counters", "value"}]}`.

use serde_json::{Map, Value, json};

/// One increment: the input's JSON text in, the output's out.
pub fn increment(input: &str) -> Result<String, String> {
    let input: Value = serde_json::from_str(input).map_err(|e| e.to_string())?;
    let name = input["args"]["name"]
        .as_str()
        .ok_or("args.name must be a string")?
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
