//! OpenAI-compatible chat completions with tools: OpenAI, vLLM, Ollama,
//! llama.cpp's server, LM Studio. `base_url` includes the version path
//! (`https://api.openai.com/v1`, `http://localhost:11434/v1`).

use serde_json::{Value, json};

use super::{
    JsonClient, Message, ModelError, ModelReply, Provider, ProviderOptions, TokenUsage, join_url,
};
use crate::journal::tool_text;
use crate::spec::{ToolCall, ToolSpec};

const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// OpenAI-compatible chat completions.
#[derive(Debug)]
pub struct OpenAiModel {
    /// `Bearer <key>`, or none for local servers that need no key.
    authorization: Option<String>,
    http: JsonClient,
}

impl OpenAiModel {
    /// A client for `model`; the key comes from `options` or
    /// `OPENAI_API_KEY`. OpenAI's own API needs one, and its absence is an
    /// error here, before any request; a server at another base URL (a
    /// local one) may need none.
    pub fn new(model: &str, options: ProviderOptions) -> Result<Self, ModelError> {
        if options.api_key.is_none() && options.base_url.is_none() {
            return Err(ModelError::Config(
                "openai: set OPENAI_API_KEY (or OPENAI_BASE_URL for a server that needs no key)"
                    .into(),
            ));
        }
        let base = options
            .base_url
            .clone()
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_owned());
        Ok(Self {
            authorization: options.api_key.as_ref().map(|key| format!("Bearer {key}")),
            http: JsonClient::new(
                "openai",
                model,
                join_url(&base, "/chat/completions"),
                &options,
            )?,
        })
    }
}

impl Provider for OpenAiModel {
    fn client(&self) -> &JsonClient {
        &self.http
    }

    fn headers(&self) -> Vec<(&'static str, &str)> {
        self.authorization
            .as_deref()
            .map(|auth| ("authorization", auth))
            .into_iter()
            .collect()
    }

    fn request_body(&self, messages: &[Message], tools: &[ToolSpec]) -> Value {
        let messages: Vec<Value> = messages
            .iter()
            .map(|message| match message {
                Message::System { content } => json!({"role": "system", "content": content}),
                Message::User { content } => json!({"role": "user", "content": content}),
                Message::Assistant { content, tool_calls } => {
                    let mut m = json!({"role": "assistant", "content": content});
                    if !tool_calls.is_empty() {
                        m["tool_calls"] = tool_calls
                            .iter()
                            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                            .collect();
                    }
                    m
                }
                Message::Tool {
                    call_id,
                    content,
                    shown,
                    ..
                } => {
                    // A tool message carries text only: what the call
                    // showed is named in it.
                    let content = tool_text(content, shown, |_| false);
                    json!({"role": "tool", "tool_call_id": call_id, "content": content})
                }
            })
            .collect();
        let mut body = json!({"model": self.http.model, "messages": messages});
        if let Some(max_tokens) = self.http.max_tokens {
            body["max_tokens"] = max_tokens.into();
        }
        if !tools.is_empty() {
            body["tools"] = tools
                .iter()
                .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
                .collect();
        }
        body
    }

    fn parse_reply(&self, body: &Value) -> Result<ModelReply, ModelError> {
        let message = body
            .pointer("/choices/0/message")
            .ok_or_else(|| self.http.malformed("no choices[0].message"))?;
        let content = match message.get("content") {
            // A refusal comes as `refusal`, with no content: it is the
            // model's answer.
            None | Some(Value::Null) => message
                .get("refusal")
                .and_then(Value::as_str)
                .map(str::to_owned),
            Some(Value::String(text)) => Some(text.clone()),
            Some(other) => {
                return Err(self
                    .http
                    .malformed(format!("message.content is {other}, not a string")));
            }
        };
        let mut tool_calls = Vec::new();
        if let Some(calls) = message.get("tool_calls").filter(|c| !c.is_null()) {
            let calls = calls
                .as_array()
                .ok_or_else(|| self.http.malformed("message.tool_calls is not an array"))?;
            for (i, call) in calls.iter().enumerate() {
                let field = |name: &str| {
                    call.pointer(name).ok_or_else(|| {
                        self.http
                            .malformed(format!("tool_calls[{i}] has no {name}"))
                    })
                };
                let name = field("/function/name")?.as_str().ok_or_else(|| {
                    self.http
                        .malformed(format!("tool_calls[{i}].function.name is not a string"))
                })?;
                // OpenAI sends arguments as JSON text; some servers send an object.
                let arguments = match field("/function/arguments")? {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                let id = call
                    .get("id")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("call_{i}"), str::to_owned);
                tool_calls.push(ToolCall {
                    id,
                    name: name.to_owned(),
                    arguments,
                    retry: 0,
                });
            }
        }
        Ok(ModelReply {
            content,
            tool_calls,
            usage: TokenUsage::at(body, "/usage/prompt_tokens", "/usage/completion_tokens"),
        })
    }

    fn cut(&self, body: &Value) -> bool {
        body.pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
            == Some("length")
    }

    fn limit(&self) -> Option<u32> {
        self.http.max_tokens
    }
}
