//! A model provider on 127.0.0.1 for agent-loop tests: a real HTTP server
//! that answers each request with the next queued response (status and JSON
//! body, written as the OpenAI or Anthropic API sends them) and records
//! every request (path, headers, JSON body).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use serde_json::{Value, json};

#[derive(Debug, Clone)]
pub struct SeenRequest {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl SeenRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct State {
    /// Status, body and the `Location` header, if any.
    queue: VecDeque<(u16, String, Option<String>)>,
    seen: Vec<SeenRequest>,
}

pub struct ModelServer {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    _served: super::Served,
}

impl ModelServer {
    pub async fn start() -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        let served = super::serve(move |req| answer(req, Arc::clone(&shared))).await;
        Self {
            addr: served.addr,
            state,
            _served: served,
        }
    }

    /// The base URL as an OpenAI-compatible client expects it.
    pub fn openai_base(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The base URL as the Anthropic client expects it.
    pub fn anthropic_base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn push(&self, status: u16, body: impl Into<String>) -> &Self {
        self.state
            .lock()
            .expect("not poisoned")
            .queue
            .push_back((status, body.into(), None));
        self
    }

    /// Queues a redirect (`status`, 3xx) to `location`.
    pub fn push_redirect(&self, status: u16, location: &str) -> &Self {
        self.state.lock().expect("not poisoned").queue.push_back((
            status,
            String::new(),
            Some(location.to_owned()),
        ));
        self
    }

    pub fn push_json(&self, body: Value) -> &Self {
        self.push(200, body.to_string())
    }

    pub fn seen(&self) -> Vec<SeenRequest> {
        self.state.lock().expect("not poisoned").seen.clone()
    }
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    state: Arc<Mutex<State>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let (status, text, location) = {
        let mut state = state.lock().expect("not poisoned");
        state.seen.push(SeenRequest {
            path,
            headers,
            body,
        });
        state.queue.pop_front().unwrap_or((
            500,
            r#"{"error":"the test queued no more responses"}"#.into(),
            None,
        ))
    };
    let mut response = Response::builder()
        .status(status)
        .header("content-type", "application/json");
    if let Some(location) = location {
        response = response.header("location", location);
    }
    Ok(response
        .body(Full::new(Bytes::from(text)))
        .unwrap_or_default())
}

/// An OpenAI chat completion answering with `content` and `tool_calls`
/// (`(id, name, arguments-as-JSON-text)`), as the API sends it.
pub fn openai_reply(
    content: Option<&str>,
    tool_calls: &[(&str, &str, &str)],
    prompt_tokens: u64,
    completion_tokens: u64,
) -> Value {
    let calls: Vec<Value> = tool_calls
        .iter()
        .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
        .collect();
    let mut message = json!({"role": "assistant", "content": content, "refusal": null});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_763_700_000,
        "model": "gpt-test",
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": if tool_calls.is_empty() { "stop" } else { "tool_calls" }
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens
        },
        "system_fingerprint": "fp_test"
    })
}

/// An Anthropic Messages response with a text block (if any) and
/// `tool_use` blocks (`(id, name, input)`), as the API sends it.
pub fn anthropic_reply(
    text: Option<&str>,
    tool_uses: &[(&str, &str, Value)],
    input_tokens: u64,
    output_tokens: u64,
) -> Value {
    let mut content: Vec<Value> = text
        .map(|t| json!({"type": "text", "text": t}))
        .into_iter()
        .collect();
    content.extend(tool_uses.iter().map(
        |(id, name, input)| json!({"type": "tool_use", "id": id, "name": name, "input": input}),
    ));
    json!({
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": content,
        "stop_reason": if tool_uses.is_empty() { "end_turn" } else { "tool_use" },
        "stop_sequence": null,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}
    })
}

/// The API key the test models send; it must never show up in output.
pub const KEY: &str = "sk-test-key-never-logged";

/// Provider options for a model server at `server_base`: the test key,
/// quick retries, a short timeout.
pub fn provider_options(server_base: String) -> airlock::llm::ProviderOptions {
    airlock::llm::ProviderOptions {
        base_url: Some(server_base),
        api_key: Some(KEY.into()),
        retry: airlock::llm::RetryPolicy {
            max_retries: 3,
            base_delay: std::time::Duration::from_millis(10),
            max_delay: std::time::Duration::from_millis(50),
        },
        timeout: Some(std::time::Duration::from_secs(10)),
        max_tokens: None,
    }
}

/// An OpenAI-compatible model on `server`.
pub fn openai(server: &ModelServer) -> airlock::llm::OpenAiModel {
    airlock::llm::OpenAiModel::new("gpt-test", provider_options(server.openai_base()))
        .expect("the test model builds")
}
