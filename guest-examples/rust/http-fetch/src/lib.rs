//! `fetch {url, prefix_bytes?, body?}`: GET a URL through `wasi:http` (or
//! POST `body` to it) and return `{status, bytes, body}`, where `body` is
//! the first `prefix_bytes` (default 1024) of the response as text.
//!
//! The tool can reach only what the operator's policy grants:
//!
//! ```toml
//! [[tool]]
//! path = "http_fetch.wasm"
//! http = ["https://api.example.com"]
//! secrets = [{ env = "EXAMPLE_TOKEN", origins = ["https://api.example.com"] }]
//! ```
//!
//! A refused request comes back as a `failed` error naming the WASI HTTP
//! error code (`HttpRequestDenied`, `DestinationIpProhibited`, ...).

wit_bindgen::generate!({
    path: "../../../wit",
    world: "tool-host",
});

use airlock::tool::context::RunContext;
use airlock::tool::types::{ToolError, ToolOutput, ToolSpec};
use serde_json::{Value, json};
use wasi_get::send;

struct HttpFetch;

impl exports::airlock::tool::tool::Guest for HttpFetch {
    fn describe() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "fetch".into(),
            description: "GET a URL (or POST `body` to it) and return its status and the start \
                          of its body."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "url": {"type": "string", "description": "http:// or https:// URL"},
                    "prefix_bytes": {"type": "integer", "minimum": 0},
                    "body": {"type": "string", "description": "POST this text instead of a GET"}
                },
                "required": ["url"]
            })
            .to_string(),
        }]
    }

    fn call(_ctx: &RunContext, _name: String, args: String) -> Result<ToolOutput, ToolError> {
        let args: Value =
            serde_json::from_str(&args).map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
        let url = args
            .get("url")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolError::InvalidArgs("`url` must be a string".into()))?;
        let prefix = args
            .get("prefix_bytes")
            .and_then(Value::as_u64)
            .unwrap_or(1024) as usize;
        let sent = args.get("body").and_then(Value::as_str);
        let method = if sent.is_some() { "POST" } else { "GET" };
        let (status, body) = send(url, sent.map(str::as_bytes))
            .map_err(|e| ToolError::Failed(format!("{method} {url}: {e}")))?;
        let shown = String::from_utf8_lossy(&body[..body.len().min(prefix)]).into_owned();
        Ok(ToolOutput {
            result: json!({"status": status, "bytes": body.len(), "body": shown}).to_string(),
            updates: vec![],
        })
    }
}

export!(HttpFetch);
