//! The Anthropic Messages API with tools (`tool_use` / `tool_result`
//! blocks). `base_url` is the API root (`https://api.anthropic.com`).

use serde_json::{Value, json};

use super::{
    DEFAULT_MAX_TOKENS, JsonClient, Message, ModelError, ModelReply, Provider, ProviderOptions,
    TokenUsage, join_url,
};
use crate::journal::tool_text;
use crate::spec::{Shown, ToolCall, ToolSpec};

const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
const API_VERSION: &str = "2023-06-01";

/// The Anthropic Messages API.
#[derive(Debug)]
pub struct AnthropicModel {
    api_key: String,
    http: JsonClient,
}

impl AnthropicModel {
    /// A client for `model`; the key comes from `options` or
    /// `ANTHROPIC_API_KEY`.
    pub fn new(model: &str, options: ProviderOptions) -> Result<Self, ModelError> {
        let api_key = options
            .api_key
            .clone()
            .ok_or_else(|| ModelError::Config("anthropic: set ANTHROPIC_API_KEY".into()))?;
        let base = options
            .base_url
            .clone()
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_owned());
        Ok(Self {
            api_key,
            http: JsonClient::new(
                "anthropic",
                model,
                join_url(&base, "/v1/messages"),
                &options,
            )?,
        })
    }
}

impl Provider for AnthropicModel {
    fn client(&self) -> &JsonClient {
        &self.http
    }

    fn headers(&self) -> Vec<(&'static str, &str)> {
        vec![
            ("x-api-key", self.api_key.as_str()),
            ("anthropic-version", API_VERSION),
        ]
    }

    fn request_body(&self, messages: &[Message], tools: &[ToolSpec]) -> Value {
        let mut system = Vec::new();
        let mut out: Vec<Value> = Vec::new();
        for message in messages {
            match message {
                Message::System { content } => system.push(content.as_str()),
                Message::User { content } => out.push(json!({"role": "user", "content": content})),
                Message::Assistant {
                    content,
                    tool_calls,
                } => {
                    let mut blocks = Vec::new();
                    if let Some(text) = content.as_deref().filter(|t| !t.is_empty()) {
                        blocks.push(json!({"type": "text", "text": text}));
                    }
                    for call in tool_calls {
                        // `input` must be an object; arguments the model sent
                        // that were not JSON are passed back as a string field.
                        let input = serde_json::from_str::<Value>(&call.arguments)
                            .ok()
                            .filter(Value::is_object)
                            .unwrap_or_else(|| json!({"_raw_arguments": call.arguments}));
                        blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
                    }
                    out.push(json!({"role": "assistant", "content": blocks}));
                }
                Message::Tool {
                    call_id,
                    content,
                    is_error,
                    shown,
                    ..
                } => {
                    // A tool result carries images beside its text; what
                    // else the call showed is named in the text.
                    let image = |block: &Shown| matches!(block, Shown::Image { .. });
                    let text = tool_text(content, shown, image);
                    let content = if shown.iter().any(image) {
                        let mut parts = vec![json!({"type": "text", "text": text})];
                        parts.extend(shown.iter().filter_map(|block| match block {
                            Shown::Image { data, mime_type } => Some(json!({
                                "type": "image",
                                "source": {"type": "base64", "media_type": mime_type, "data": data}
                            })),
                            _ => None,
                        }));
                        Value::Array(parts)
                    } else {
                        Value::String(text)
                    };
                    let block = json!({"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error});
                    // Results of one turn's calls go together in one user message.
                    match out.last_mut() {
                        Some(last) if last["role"] == "user" && last["content"].is_array() => {
                            if let Some(blocks) = last["content"].as_array_mut() {
                                blocks.push(block);
                            }
                        }
                        _ => out.push(json!({"role": "user", "content": [block]})),
                    }
                }
            }
        }
        let mut body =
            json!({"model": self.http.model, "max_tokens": self.max_tokens(), "messages": out});
        if !system.is_empty() {
            body["system"] = json!(system.join("\n\n"));
        }
        if !tools.is_empty() {
            body["tools"] = tools
                .iter()
                .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
                .collect();
        }
        body
    }

    fn parse_reply(&self, body: &Value) -> Result<ModelReply, ModelError> {
        let blocks = body
            .get("content")
            .and_then(Value::as_array)
            .ok_or_else(|| self.http.malformed("no content array"))?;
        let mut text = Vec::new();
        let mut tool_calls = Vec::new();
        for (i, block) in blocks.iter().enumerate() {
            match block.get("type").and_then(Value::as_str) {
                Some("text") => {
                    text.push(block.get("text").and_then(Value::as_str).ok_or_else(|| {
                        self.http
                            .malformed(format!("content[{i}] text block has no text"))
                    })?)
                }
                Some("tool_use") => {
                    let get = |f: &str| {
                        block.get(f).ok_or_else(|| {
                            self.http
                                .malformed(format!("content[{i}] tool_use has no {f}"))
                        })
                    };
                    tool_calls.push(ToolCall {
                        id: get("id")?.as_str().unwrap_or_default().to_owned(),
                        name: get("name")?
                            .as_str()
                            .ok_or_else(|| {
                                self.http
                                    .malformed(format!("content[{i}].name is not a string"))
                            })?
                            .to_owned(),
                        arguments: get("input")?.to_string(),
                        retry: 0,
                    });
                }
                // Thinking and other blocks carry nothing the loop uses.
                Some(_) => {}
                None => return Err(self.http.malformed(format!("content[{i}] has no type"))),
            }
        }

        Ok(ModelReply {
            content: if text.is_empty() {
                None
            } else {
                Some(text.join(""))
            },
            tool_calls,
            usage: TokenUsage::at(body, "/usage/input_tokens", "/usage/output_tokens"),
        })
    }

    fn cut(&self, body: &Value) -> bool {
        body.get("stop_reason").and_then(Value::as_str) == Some("max_tokens")
    }

    fn limit(&self) -> Option<u32> {
        Some(self.max_tokens())
    }
}

impl AnthropicModel {
    /// The `max_tokens` every request carries (Anthropic requires one).
    fn max_tokens(&self) -> u32 {
        self.http.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)
    }
}
