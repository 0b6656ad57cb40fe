//! Model providers behind one [`Model`] trait.
//!
//! - [`OpenAiModel`]: OpenAI-compatible chat completions (OpenAI, vLLM,
//!   Ollama, llama.cpp's server, LM Studio).
//! - [`AnthropicModel`]: the Anthropic Messages API.
//! - [`ScriptModel`]: a file of model turns, for offline demos, tests and
//!   replay.
//!
//! Invariant: API keys never appear in logs, events or errors. Error bodies
//! from a provider are shortened and have the key replaced by `[redacted]`.
//! A request (its key and conversation) goes only to the origin of the
//! provider's base URL: a redirect elsewhere is an error, not followed.

mod anthropic;
mod openai;
mod script;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use anthropic::AnthropicModel;
pub use openai::OpenAiModel;
pub use script::ScriptModel;

/// A conversation's message: the journal's type, which providers read
/// and answer in.
pub use crate::journal::Message;
use crate::spec::{SampleRequest, ToolCall, ToolSpec};
use futures::future::BoxFuture;

/// Tokens one model request consumed, as the provider reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    /// Prompt tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Completion tokens.
    #[serde(default)]
    pub output_tokens: u64,
}

impl TokenUsage {
    /// The counts at two JSON pointers of a provider's answer (0 if absent).
    fn at(body: &Value, input: &str, output: &str) -> Self {
        let tokens = |pointer: &str| body.pointer(pointer).and_then(Value::as_u64).unwrap_or(0);
        Self {
            input_tokens: tokens(input),
            output_tokens: tokens(output),
        }
    }
}

/// What the model answered to one request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelReply {
    /// The text, if any.
    pub content: Option<String>,
    /// The tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
    /// What the request cost.
    pub usage: TokenUsage,
}

/// A language model that can call tools.
pub trait Model: Send + Sync + std::fmt::Debug {
    /// `provider:model`, for progress output and events.
    fn name(&self) -> String;

    /// Sends the conversation and the tool specs; returns the reply.
    fn complete<'a>(
        &'a self,
        messages: &'a [Message],
        tools: &'a [ToolSpec],
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>>;

    /// Asks for a completion of `request` with no tools offered, for a
    /// tool that asks the model (the `ask` import's `ask-model`); its
    /// reply at most `request.max_tokens` long where the API takes a bound.
    /// The default sends the request's messages through
    /// [`Model::complete`].
    fn sample<'a>(
        &'a self,
        request: &'a SampleRequest,
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
        let messages = sample_messages(request);
        Box::pin(async move { self.complete(&messages, &[]).await })
    }

    /// Checks, before a run starts, that the model can work with these
    /// tools. Only the script provider, which names tools up front, uses it.
    fn check_tools(&self, available: &[String]) -> Result<(), ModelError> {
        let _ = available;
        Ok(())
    }
}

/// A request for a completion as a conversation: its system
/// instructions, then its messages (`assistant` the model's, any other
/// speaker the person's).
fn sample_messages(request: &SampleRequest) -> Vec<Message> {
    let system = request.system.iter().map(|content| Message::System {
        content: content.clone(),
    });
    let said = request
        .messages
        .iter()
        .map(|(role, text)| match role.as_str() {
            "assistant" => Message::Assistant {
                content: Some(text.clone()),
                tool_calls: Vec::new(),
            },
            _ => Message::User {
                content: text.clone(),
            },
        });
    system.chain(said).collect()
}

/// A model behind an HTTP API. Providers differ only in the request's
/// body and headers and in how an answer reads; the request itself
/// (retries on 429 and 5xx with backoff, bounded and redacted errors) is
/// [`JsonClient::post`], and [`Model`] is implemented once for them all.
trait Provider: Send + Sync + std::fmt::Debug {
    /// The client: the provider, the model and where requests go.
    fn client(&self) -> &JsonClient;

    /// The headers a request carries (its credentials).
    fn headers(&self) -> Vec<(&'static str, &str)>;

    /// The request for `messages` with `tools` offered.
    fn request_body(&self, messages: &[Message], tools: &[ToolSpec]) -> Value;

    /// The reply an answer holds.
    fn parse_reply(&self, body: &Value) -> Result<ModelReply, ModelError>;

    /// Whether an answer says its reply was cut at the request's output
    /// limit.
    fn cut(&self, body: &Value) -> bool;

    /// The output limit a turn's request has (`None`: the server's own).
    fn limit(&self) -> Option<u32>;
}

impl<P: Provider> Model for P {
    fn name(&self) -> String {
        let client = self.client();
        format!("{}:{}", client.provider, client.model)
    }

    fn complete<'a>(
        &'a self,
        messages: &'a [Message],
        tools: &'a [ToolSpec],
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
        Box::pin(async move {
            let body = self.request_body(messages, tools);
            let client = self.client();
            let answer = client.post(&client.url, &self.headers(), &body).await?;
            let reply = self.parse_reply(&answer)?;
            client.whole(reply, self.cut(&answer), self.limit())
        })
    }

    fn sample<'a>(
        &'a self,
        request: &'a SampleRequest,
    ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
        Box::pin(async move {
            let mut body = self.request_body(&sample_messages(request), &[]);
            // Both APIs bound a reply with `max_tokens`.
            body["max_tokens"] = request.max_tokens.into();
            let client = self.client();
            let answer = client.post(&client.url, &self.headers(), &body).await?;
            self.parse_reply(&answer)
        })
    }
}

/// A model request that failed. Messages never contain an API key.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The provider answered with an error status (after retries).
    #[error("{provider}: HTTP {status}: {body}")]
    Status {
        /// `openai` or `anthropic`.
        provider: &'static str,
        /// The HTTP status.
        status: u16,
        /// The start of the body, key redacted.
        body: String,
    },
    /// The request did not complete (after retries).
    #[error("{provider}: request failed: {message}")]
    Transport {
        /// `openai` or `anthropic`.
        provider: &'static str,
        /// Why, key redacted.
        message: String,
    },
    /// The answer is not what the API defines.
    #[error("{provider}: malformed response: {detail}")]
    Malformed {
        /// `openai` or `anthropic`.
        provider: &'static str,
        /// What is wrong, key redacted.
        detail: String,
    },
    /// The reply was cut at the request's output limit before its tool
    /// calls were whole: none of them is run (their arguments may be cut
    /// too). Nothing of the turn is recorded.
    #[error(
        "{provider}: the model's reply was cut at its output limit (max_tokens {}) \
         before its tool calls were whole; none was run: raise the limit (--max-tokens)",
        limit_text(*.max_tokens)
    )]
    Truncated {
        /// `openai` or `anthropic`.
        provider: &'static str,
        /// The limit the request had (`None`: the server's own).
        max_tokens: Option<u32>,
    },
    /// A script file is unusable or ran out of turns.
    #[error("script {path}: {message}")]
    Script {
        /// The script file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A provider spec or option is invalid.
    #[error("model configuration: {0}")]
    Config(String),
}

/// How often and how patiently to retry HTTP 429 and 5xx answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt. Default 3.
    pub max_retries: u32,
    /// First delay; doubled each retry, and replaced by the server's
    /// `Retry-After` when it gives one (capped at `max_delay`).
    pub base_delay: Duration,
    /// The longest delay between attempts.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 3,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(20),
        }
    }
}

/// Where a provider is and how to reach it.
#[derive(Debug, Clone, Default)]
pub struct ProviderOptions {
    /// The API's base URL (default: the provider's, or its `*_BASE_URL`).
    pub base_url: Option<String>,
    /// The API key (default: the provider's `*_API_KEY` variable).
    pub api_key: Option<String>,
    /// Retries on 429 and 5xx.
    pub retry: RetryPolicy,
    /// Per-request timeout. Default 120 s.
    pub timeout: Option<Duration>,
    /// The most tokens one reply may hold: Anthropic's `max_tokens`
    /// (which it requires: [`DEFAULT_MAX_TOKENS`] when unset), and, when
    /// set, OpenAI's (unset, the server's own limit holds).
    pub max_tokens: Option<u32>,
}

/// Anthropic's `max_tokens` when [`ProviderOptions::max_tokens`] is unset.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// An output limit as a message says it (`unset`: the server's own).
fn limit_text(limit: Option<u32>) -> String {
    limit.map_or_else(|| "unset".to_owned(), |n| n.to_string())
}

/// Builds the model named `provider:model` (`openai:gpt-4o-mini`,
/// `anthropic:claude-sonnet-4-5`). Missing options come from the
/// environment: `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`,
/// `ANTHROPIC_API_KEY`.
pub fn from_spec(spec: &str, options: ProviderOptions) -> Result<Box<dyn Model>, ModelError> {
    let (provider, model) = spec
        .split_once(':')
        .filter(|(p, m)| !p.is_empty() && !m.is_empty())
        .ok_or_else(|| {
            ModelError::Config(format!(
                "{spec:?}: expected PROVIDER:MODEL, such as openai:gpt-4o-mini"
            ))
        })?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    match provider {
        "openai" => {
            let options = ProviderOptions {
                base_url: options.base_url.or_else(|| env("OPENAI_BASE_URL")),
                api_key: options.api_key.or_else(|| env("OPENAI_API_KEY")),
                ..options
            };
            Ok(Box::new(OpenAiModel::new(model, options)?))
        }
        "anthropic" => {
            let options = ProviderOptions {
                base_url: options.base_url.or_else(|| env("ANTHROPIC_BASE_URL")),
                api_key: options.api_key.or_else(|| env("ANTHROPIC_API_KEY")),
                ..options
            };
            Ok(Box::new(AnthropicModel::new(model, options)?))
        }
        other => Err(ModelError::Config(format!(
            "unknown provider {other:?}; use openai, anthropic, or --script FILE"
        ))),
    }
}

/// The most bytes of one answer from a provider: a model's turn is far
/// smaller; a server that sends more is refused rather than held.
const MAX_ANSWER_BYTES: u64 = 32 << 20;

/// How many redirects one request to a provider follows.
const MAX_REDIRECTS: usize = 5;

/// The redirect policy of a provider's client: a redirect is followed
/// only within the origin (scheme, host and port) the request was sent
/// to, at most [`MAX_REDIRECTS`] of them. A request carries the API key
/// in its headers (`x-api-key` is not one that an HTTP client drops on
/// its own) and the conversation in its body, so a redirect to another
/// origin, or from `https` to `http`, ends the request with an error that
/// names the origin only: the rest of its URL is the server's to keep.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let from = attempt.previous().first().map(reqwest::Url::origin);
        let to = attempt.url().origin();
        if from.as_ref().is_some_and(|from| *from != to) {
            let to = to.ascii_serialization();
            return attempt.error(format!(
                "the server redirected the request to {to}, another origin; a provider's \
                 redirects are followed only within its own, since a request carries the \
                 API key and the conversation: set the base URL to the server that answers"
            ));
        }
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
        }
        attempt.follow()
    })
}

/// A JSON-over-HTTP client for one provider, with retries and redaction.
#[derive(Debug)]
struct JsonClient {
    provider: &'static str,
    /// The model, as the provider names it.
    model: String,
    /// Where requests go.
    url: String,
    client: reqwest::Client,
    /// Replaced by `[redacted]` in anything we report.
    api_key: Option<String>,
    /// [`ProviderOptions::max_tokens`].
    max_tokens: Option<u32>,
    retry: RetryPolicy,
}

impl JsonClient {
    /// A client of `provider`'s `model` at `url`.
    fn new(
        provider: &'static str,
        model: &str,
        url: String,
        options: &ProviderOptions,
    ) -> Result<Self, ModelError> {
        let reachable = reqwest::Url::parse(&url)
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some());
        if !reachable {
            return Err(ModelError::Config(format!(
                "{provider}: the base URL is not an http:// or https:// URL with a host \
                 (--base-url, or {}_BASE_URL): requests would go to {:?}",
                provider.to_ascii_uppercase(),
                without_credentials(&url)
            )));
        }
        let tls = crate::tls::client_config().map_err(ModelError::Config)?;
        let client = reqwest::Client::builder()
            .use_preconfigured_tls((*tls).clone())
            .redirect(same_origin_redirects())
            .timeout(options.timeout.unwrap_or(Duration::from_secs(120)))
            .build()
            .map_err(|e| {
                ModelError::Config(format!("{provider}: cannot build an HTTP client: {e}"))
            })?;
        Ok(Self {
            provider,
            model: model.to_owned(),
            url,
            client,
            api_key: options.api_key.clone(),
            max_tokens: options.max_tokens,
            retry: options.retry,
        })
    }

    /// `reply`, which the provider says it `cut` at the request's output
    /// limit (`limit` tokens; `None`: the server's own): refused when it
    /// has tool calls (one may be cut short, and a turn's calls run as a
    /// whole or not at all); a text is kept as far as it goes, with a
    /// warning.
    fn whole(
        &self,
        reply: ModelReply,
        cut: bool,
        limit: Option<u32>,
    ) -> Result<ModelReply, ModelError> {
        if !cut {
            return Ok(reply);
        }
        if !reply.tool_calls.is_empty() {
            return Err(ModelError::Truncated {
                provider: self.provider,
                max_tokens: limit,
            });
        }
        tracing::warn!(
            provider = self.provider,
            max_tokens = %limit_text(limit),
            "the model's reply was cut at its output limit (raise it with --max-tokens)"
        );
        Ok(reply)
    }

    fn redact(&self, text: &str) -> String {
        match &self.api_key {
            Some(key) if !key.is_empty() => text.replace(key.as_str(), "[redacted]"),
            _ => text.to_owned(),
        }
    }

    /// POSTs `body` and returns the JSON answer. Retries 429 and 5xx with
    /// backoff; any other non-2xx is an error carrying (the start of) the
    /// provider's message.
    async fn post(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> Result<Value, ModelError> {
        let mut attempt = 0;
        loop {
            let mut request = self.client.post(url).json(body);
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            let response = match request.send().await {
                Ok(response) => response,
                Err(e) => {
                    return Err(ModelError::Transport {
                        provider: self.provider,
                        message: self.redact(&crate::text::error_chain(&e)),
                    });
                }
            };
            let status = response.status();
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let body = crate::tls::read_bounded(response, MAX_ANSWER_BYTES)
                .await
                .map_err(|e| ModelError::Transport {
                    provider: self.provider,
                    message: self.redact(&crate::text::error_chain(&e)),
                })?
                .ok_or_else(|| {
                    self.malformed(format!(
                        "the answer is over {} MiB (HTTP {status})",
                        MAX_ANSWER_BYTES >> 20
                    ))
                })?;
            let text = String::from_utf8_lossy(&body);
            let retryable = status.as_u16() == 429 || status.is_server_error();
            if retryable && attempt < self.retry.max_retries {
                let backoff = self.retry.base_delay.saturating_mul(1 << attempt.min(16));
                let delay = retry_after.unwrap_or(backoff).min(self.retry.max_delay);
                tracing::warn!(
                    provider = self.provider,
                    status = status.as_u16(),
                    ?delay,
                    "retrying model request"
                );
                tokio::time::sleep(delay).await;
                attempt += 1;
                continue;
            }
            if !status.is_success() {
                return Err(ModelError::Status {
                    provider: self.provider,
                    status: status.as_u16(),
                    body: self.redact(&crate::text::truncate(&text, 500)),
                });
            }
            return serde_json::from_str(&text).map_err(|e| ModelError::Malformed {
                provider: self.provider,
                detail: format!(
                    "not JSON ({e}): {}",
                    self.redact(&crate::text::truncate(&text, 200))
                ),
            });
        }
    }

    fn malformed(&self, detail: impl Into<String>) -> ModelError {
        ModelError::Malformed {
            provider: self.provider,
            detail: self.redact(&detail.into()),
        }
    }
}

/// `url` as a message may show it: anything before an `@` (a user name
/// and password) left out.
fn without_credentials(url: &str) -> String {
    match url.rsplit_once('@') {
        Some((_, rest)) => format!("…@{rest}"),
        None => url.to_owned(),
    }
}

/// `base` without a trailing slash, joined with `path`.
fn join_url(base: &str, path: &str) -> String {
    format!("{}{path}", base.trim_end_matches('/'))
}
