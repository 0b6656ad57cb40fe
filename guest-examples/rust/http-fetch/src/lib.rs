//! `fetch {url, prefix_bytes?}`: GET a URL through `wasi:http` and return
//! `{status, bytes, body}`, where `body` is the first `prefix_bytes`
//! (default 1024) of the response as text.
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
use wasip2::http::outgoing_handler;
use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasip2::io::streams::StreamError;

struct HttpFetch;

impl exports::airlock::tool::tool::Guest for HttpFetch {
    fn describe() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "fetch".into(),
            description: "GET a URL and return its status and the start of its body.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "url": {"type": "string", "description": "http:// or https:// URL"},
                    "prefix_bytes": {"type": "integer", "minimum": 0}
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
        let (status, body) = get(url).map_err(|e| ToolError::Failed(format!("GET {url}: {e}")))?;
        let shown = String::from_utf8_lossy(&body[..body.len().min(prefix)]).into_owned();
        Ok(ToolOutput {
            result: json!({"status": status, "bytes": body.len(), "body": shown}).to_string(),
            updates: vec![],
        })
    }
}

fn get(url: &str) -> Result<(u16, Vec<u8>), String> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (Scheme::Https, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (Scheme::Http, rest)
    } else {
        return Err("the URL must start with http:// or https://".into());
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };

    let request = OutgoingRequest::new(Fields::new());
    let invalid = |what: &str| format!("invalid {what}");
    request
        .set_method(&Method::Get)
        .map_err(|()| invalid("method"))?;
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| invalid("scheme"))?;
    request
        .set_authority(Some(authority))
        .map_err(|()| invalid("authority"))?;
    request
        .set_path_with_query(Some(path))
        .map_err(|()| invalid("path"))?;
    let body = request
        .body()
        .map_err(|()| "the request body was already taken".to_string())?;
    let pending = outgoing_handler::handle(request, None).map_err(|code| format!("{code:?}"))?;
    OutgoingBody::finish(body, None).map_err(|code| format!("{code:?}"))?;

    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(format!("{code:?}")),
        Some(Err(())) => return Err("the response was already taken".into()),
        None => return Err("no response".into()),
    };
    let status = response.status();
    let incoming = response
        .consume()
        .map_err(|()| "the body was already taken".to_string())?;
    let mut bytes = Vec::new();
    {
        let stream = incoming
            .stream()
            .map_err(|()| "the body stream was already taken".to_string())?;
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(e)) => return Err(e.to_debug_string()),
            }
        }
    }
    Ok((status, bytes))
}

export!(HttpFetch);
