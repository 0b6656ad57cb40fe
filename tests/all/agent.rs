//! The agent loop against model servers on 127.0.0.1 that speak the OpenAI
//! and Anthropic wire formats (real reqwest, real JSON), with real tools.

use std::time::Duration;

use std::sync::Arc;

use airlock::Approval;
use airlock::ErrorKind;
use airlock::agent::{Agent, AgentOptions, Decision, REJECTED_MESSAGE, RunError};
use airlock::journal::{CallStatus, Item, Outcome, Transcript};
use airlock::llm::{AnthropicModel, Message, ModelError};
use airlock::sandbox::CancelToken;
use airlock::{Host, Limits, RunContext, ToolConfig};
use serde_json::{Value, json};

use crate::support::model_server::{
    KEY, ModelServer, anthropic_reply, openai, openai_reply, provider_options as options,
};
use crate::support::{HOST_TOOLS, cache_dir, guest, host};

fn tool_messages(body: &Value) -> Vec<&Value> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_run_calls_tools_over_turns_and_applies_their_ops() {
    let server = ModelServer::start().await;
    let inc = r#"{"name":"vowels"}"#;
    server
        .push_json(openai_reply(
            Some("e, e, a: three vowels."),
            &[
                ("call_a", "increment", inc),
                ("call_b", "increment", inc),
                ("call_c", "increment", inc),
            ],
            100,
            20,
        ))
        .push_json(openai_reply(
            None,
            &[("call_d", "add_note", r#"{"text":"e, e, a"}"#)],
            150,
            10,
        ))
        .push_json(openai_reply(Some("There are 3 vowels."), &[], 200, 8));
    let model = openai(&server);
    let host = host().await;
    let mut ctx = RunContext::default();
    let mut transcript = Transcript::default();
    let outcome = Agent::new(Arc::clone(host), Arc::new(model))
        .run(&mut ctx, &mut transcript, "Count the vowels in elephant.")
        .await
        .unwrap();

    assert_eq!(outcome.answer, "There are 3 vowels.");
    assert_eq!(outcome.iterations, 3);
    assert_eq!(ctx.deps()["counters"], json!({"vowels": 3}));
    assert_eq!(ctx.deps()["notes"], json!(["e, e, a"]));
    assert_eq!(
        (
            outcome.usage.requests,
            outcome.usage.tool_calls,
            outcome.usage.input_tokens,
            outcome.usage.output_tokens
        ),
        (3, 4, 450, 38)
    );

    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(seen[0].body["model"], "gpt-test");
    let tools: Vec<&str> = seen[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, HOST_TOOLS);
    assert_eq!(seen[0].body["tools"][0]["type"], "function");
    // The second request carries the assistant's calls and one tool message
    // per call, in order, each seeing the deps the previous one left.
    let results = tool_messages(&seen[1].body);
    let ids: Vec<&str> = results
        .iter()
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["call_a", "call_b", "call_c"]);
    let values: Vec<Value> = results
        .iter()
        .map(|m| {
            serde_json::from_str::<Value>(m["content"].as_str().unwrap()).unwrap()["value"].clone()
        })
        .collect();
    assert_eq!(values, [json!(1), json!(2), json!(3)]);
    let assistant = &seen[1].body["messages"][1];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["tool_calls"][2]["function"]["arguments"], inc);

    // The item log: user message, model text, 4 calls with outputs, 4 context updates, final answer.
    let kinds: Vec<&str> = transcript
        .items
        .iter()
        .map(|e| match &e.item {
            Item::Message { .. } => "message",
            Item::FunctionCall { .. } => "function_call",
            Item::FunctionCallOutput { .. } => "function_call_output",
            Item::ContextUpdate { .. } => "context_update",
            Item::Error { .. } => "error",
            Item::RunStarted { .. } => "run_started",
            Item::RunEnded { .. } => "run_ended",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "function_call_output")
            .count(),
        4
    );
    assert_eq!(kinds.iter().filter(|k| **k == "context_update").count(), 4);
    assert_eq!(kinds.first(), Some(&"run_started"));
    assert_eq!(kinds[1], "message");
    assert_eq!(kinds[kinds.len() - 2], "message");
    assert_eq!(kinds.last(), Some(&"run_ended"));
    assert!(transcript.items.iter().all(|e| e.run_id == ctx.run_id()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_run_groups_tool_results() {
    let server = ModelServer::start().await;
    server
        .push_json(anthropic_reply(
            Some("Counting."),
            &[
                ("toolu_1", "increment", json!({"name": "vowels"})),
                ("toolu_2", "increment", json!({"name": "vowels"})),
            ],
            90,
            30,
        ))
        .push_json(anthropic_reply(Some("Two so far."), &[], 120, 5));
    let model = AnthropicModel::new("claude-test", options(server.anthropic_base())).unwrap();
    let mut ctx = RunContext::default();
    let mut transcript = Transcript::default();
    let outcome = Agent::new(Arc::clone(host().await), Arc::new(model))
        .options(AgentOptions {
            system_prompt: Some("You count things.".into()),
            ..AgentOptions::default()
        })
        .run(&mut ctx, &mut transcript, "Count.")
        .await
        .unwrap();
    assert_eq!(outcome.answer, "Two so far.");
    assert_eq!(ctx.deps()["counters"]["vowels"], 2);
    assert_eq!(
        (outcome.usage.input_tokens, outcome.usage.output_tokens),
        (210, 35)
    );

    let seen = server.seen();
    assert_eq!(seen[0].path, "/v1/messages");
    assert_eq!(seen[0].header("x-api-key"), Some(KEY));
    assert_eq!(seen[0].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(seen[0].body["system"], "You count things.");
    assert!(seen[0].body["max_tokens"].as_u64().unwrap() > 0);
    assert_eq!(seen[0].body["tools"][0]["input_schema"]["type"], "object");
    let messages = seen[1].body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert_eq!(messages[1]["content"][1]["type"], "tool_use");
    assert_eq!(
        messages[1]["content"][1]["input"],
        json!({"name": "vowels"})
    );
    let results = messages[2]["content"].as_array().unwrap();
    assert_eq!(messages[2]["role"], "user");
    assert_eq!(results.len(), 2, "both results in one user message");
    assert_eq!(results[0]["type"], "tool_result");
    assert_eq!(results[0]["tool_use_id"], "toolu_1");
    assert_eq!(results[1]["tool_use_id"], "toolu_2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_iterations_ends_the_run_and_keeps_the_state() {
    let server = ModelServer::start().await;
    for i in 0..5 {
        server.push_json(openai_reply(
            None,
            &[(&format!("c{i}"), "increment", r#"{"name":"loops"}"#)],
            10,
            1,
        ));
    }
    let model = openai(&server);
    let mut ctx = RunContext::default();
    let mut transcript = Transcript::default();
    let err = Agent::new(Arc::clone(host().await), Arc::new(model))
        .options(AgentOptions {
            max_iterations: 3,
            ..AgentOptions::default()
        })
        .run(&mut ctx, &mut transcript, "Loop forever.")
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::MaxIterations { limit: 3 }), "{err}");
    assert_eq!(
        server.seen().len(),
        3,
        "exactly max_iterations model requests"
    );
    assert_eq!(ctx.deps()["counters"]["loops"], 3, "the work done is kept");
    assert_eq!(ctx.usage.requests, 3);
    // The log ends with the error, then the run's end.
    let [.., error, end] = &transcript.items[..] else {
        panic!("too few items")
    };
    assert!(
        matches!(
            &error.item,
            Item::Error {
                kind: ErrorKind::MaxIterations,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        matches!(
            &end.item,
            Item::RunEnded {
                outcome: Outcome::Failed(ErrorKind::MaxIterations),
                iterations: 3
            }
        ),
        "{end:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried_then_succeed() {
    let server = ModelServer::start().await;
    server
        .push(500, r#"{"error":{"message":"overloaded"}}"#)
        .push(429, r#"{"error":{"message":"slow down"}}"#)
        .push_json(openai_reply(Some("fine now"), &[], 5, 2));
    let model = openai(&server);
    let mut ctx = RunContext::default();
    let outcome = Agent::new(Arc::clone(host().await), Arc::new(model))
        .run(&mut ctx, &mut Transcript::default(), "hi")
        .await
        .unwrap();
    assert_eq!(outcome.answer, "fine now");
    assert_eq!(server.seen().len(), 3);
    assert_eq!(ctx.usage.requests, 1, "retries are one model request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_bounded() {
    let server = ModelServer::start().await;
    for _ in 0..10 {
        server.push(503, "busy");
    }
    let model = openai(&server);
    let err = Agent::new(Arc::clone(host().await), Arc::new(model))
        .run(&mut RunContext::default(), &mut Transcript::default(), "hi")
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            RunError::Model(ModelError::Status { status: 503, .. })
        ),
        "{err}"
    );
    assert_eq!(server.seen().len(), 4, "one attempt and three retries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_responses_are_clear_errors_without_the_key() {
    let server = ModelServer::start().await;
    server
        .push(200, "this is not json")
        .push_json(json!({"choices": []}))
        .push(
            401,
            format!(r#"{{"error":{{"message":"Incorrect API key provided: {KEY}"}}}}"#),
        );
    let model: Arc<dyn airlock::llm::Model> = Arc::new(openai(&server));
    let mut messages = Vec::new();
    for _ in 0..3 {
        let err = Agent::new(Arc::clone(host().await), Arc::clone(&model))
            .run(&mut RunContext::default(), &mut Transcript::default(), "hi")
            .await
            .unwrap_err();
        messages.push(err.to_string());
    }
    assert!(
        messages[0].starts_with("openai: malformed response: not JSON"),
        "{}",
        messages[0]
    );
    assert!(
        messages[1].contains("openai: malformed response: no choices[0].message"),
        "{}",
        messages[1]
    );
    assert!(
        messages[2].starts_with("openai: HTTP 401"),
        "{}",
        messages[2]
    );
    for m in &messages {
        assert!(!m.contains(KEY), "the API key leaked: {m}");
    }
    assert!(messages[2].contains("[redacted]"), "{}", messages[2]);

    // An answer larger than any model's turn (33 MiB, well-formed) is
    // refused, not held; the next run is served.
    let huge = format!(
        r#"{{"choices": [{{"message": {{"role": "assistant", "content": "{}"}}}}]}}"#,
        "x".repeat(33 << 20)
    );
    server
        .push(200, huge)
        .push_json(openai_reply(Some("fine"), &[], 1, 1));
    let err = Agent::new(Arc::clone(host().await), Arc::clone(&model))
        .run(&mut RunContext::default(), &mut Transcript::default(), "hi")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("openai: malformed response: the answer is over 32 MiB (HTTP 200 OK)"),
        "{}",
        &err[..err.len().min(300)]
    );
    let mut transcript = Transcript::default();
    Agent::new(Arc::clone(host().await), Arc::clone(&model))
        .run(&mut RunContext::default(), &mut transcript, "hi")
        .await
        .unwrap();
}

/// A provider's redirect to another origin would carry the API key
/// (Anthropic's `x-api-key`, which an HTTP client does not drop on its
/// own) and the conversation there: it is refused, naming only the
/// origin. A redirect within the provider's origin is followed, a bounded
/// number of times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_another_origin_is_refused_and_carries_nothing_there() {
    let server = ModelServer::start().await;
    let elsewhere = ModelServer::start().await;
    elsewhere.push_json(anthropic_reply(Some("stolen"), &[], 1, 1));
    let model: Arc<dyn airlock::llm::Model> =
        Arc::new(AnthropicModel::new("claude-test", options(server.anthropic_base())).unwrap());
    let mut ctx = RunContext::default();
    ctx.deps_mut().insert("plan".into(), json!("unchanged"));
    let before = ctx.deps().clone();

    let away = format!(
        "http://{}/v1/messages?token=the-servers-own",
        elsewhere.addr
    );
    for status in [307, 308, 302] {
        server.push_redirect(status, &away);
        let err = Agent::new(Arc::clone(host().await), Arc::clone(&model))
            .run(&mut ctx, &mut Transcript::default(), "a secret plan")
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!(
                "redirected the request to http://{}, another origin",
                elsewhere.addr
            )),
            "HTTP {status}: {err}"
        );
        assert!(!err.contains("the-servers-own"), "{err}");
        assert!(!err.contains(KEY), "{err}");
    }
    assert!(
        elsewhere.seen().is_empty(),
        "another origin got a request: {:?}",
        elsewhere.seen()
    );
    assert_eq!(ctx.deps(), &before);

    // Within the origin: followed, the key and the conversation with it.
    server
        .push_redirect(308, "/v1/messages/moved")
        .push_json(anthropic_reply(Some("fine"), &[], 1, 1));
    let outcome = Agent::new(Arc::clone(host().await), Arc::clone(&model))
        .run(&mut ctx, &mut Transcript::default(), "a secret plan")
        .await
        .unwrap();
    assert_eq!(outcome.answer, "fine");
    let seen = server.seen();
    let moved = seen.last().unwrap();
    assert_eq!(moved.path, "/v1/messages/moved");
    assert_eq!(moved.header("x-api-key"), Some(KEY));
    assert_eq!(moved.body["messages"][0]["content"], "a secret plan");

    // A loop within the origin ends.
    for _ in 0..6 {
        server.push_redirect(307, "/v1/messages");
    }
    let err = Agent::new(Arc::clone(host().await), Arc::clone(&model))
        .run(&mut ctx, &mut Transcript::default(), "a secret plan")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("more than 5 redirects"), "{err}");
    assert_eq!(ctx.deps(), &before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_calls_are_reported_to_the_model_and_the_run_goes_on() {
    let server = ModelServer::start().await;
    // A name and an argument as long as a model may make them.
    let long_name = "x".repeat(100_000);
    let long_argument = json!({"name": ["y".repeat(100_000)]}).to_string();
    server
        .push_json(openai_reply(
            None,
            &[
                ("c1", "no_such_tool", "{}"),
                ("c2", "increment", "{not json"),
                ("c3", "increment", r#"{"name": 7}"#),
                ("c4", "read", r#"{"keys": 5}"#),
                ("c5", "read", "{}"),
                ("c6", &long_name, "{}"),
                ("c7", "increment", &long_argument),
            ],
            10,
            10,
        ))
        .push_json(openai_reply(Some("done"), &[], 10, 1));
    let model = openai(&server);
    let mut ctx = RunContext::default();
    let mut transcript = Transcript::default();
    let outcome = Agent::new(Arc::clone(host().await), Arc::new(model))
        .run(&mut ctx, &mut transcript, "try things")
        .await
        .unwrap();
    assert_eq!(outcome.answer, "done");
    let seen = server.seen();
    let results = tool_messages(&seen[1].body);
    let text: Vec<&str> = results
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert!(
        text[0].contains("unknown_tool") && text[0].contains("available: add_note"),
        "{}",
        text[0]
    );
    assert!(
        text[1].contains("invalid_args") && text[1].contains("not valid JSON"),
        "{}",
        text[1]
    );
    assert!(
        text[2].contains("invalid_args") && text[2].contains("schema") && text[2].contains("/name"),
        "{}",
        text[2]
    );
    assert!(text[3].contains("invalid_args"), "{}", text[3]);
    // `read` failed once in this run, so its next call sees retry = 1.
    let read: Value = serde_json::from_str(text[4]).unwrap();
    assert_eq!(read["retry"], 1);
    assert_eq!(read["tool_call_id"], "c5");
    assert_eq!(read["iteration"], 1);
    // What the model named is said back to it cut short, and its long
    // argument not at all.
    assert!(
        text[5].contains("unknown tool \"xxx") && text[5].contains("…\"; available: add_note"),
        "{}",
        text[5]
    );
    assert!(
        text[6].contains(r#"at /name fails rule "type""#),
        "{}",
        text[6]
    );
    for said in &text[5..] {
        assert!(said.len() < 1000, "{} bytes", said.len());
    }
    assert!(ctx.deps().is_empty(), "no failed call changed deps");
    let failed = transcript
        .items
        .iter()
        .filter(|e| {
            matches!(
                &e.item,
                Item::FunctionCallOutput {
                    status: CallStatus::Failed,
                    ..
                }
            )
        })
        .count();
    assert_eq!(failed, 6);
}

async fn approval_host() -> Host {
    let mut host = Host::builder()
        .cache(airlock::CompileCache::in_dir(cache_dir()))
        .max_concurrent_calls(4)
        .build()
        .unwrap();
    let config = ToolConfig {
        approval: Approval::Ask,
        ..ToolConfig::default()
    };
    host.load_with(guest("stateful"), config).await.unwrap();
    host
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_can_reject_and_edit() {
    let server = ModelServer::start().await;
    server
        .push_json(openai_reply(
            None,
            &[
                ("c1", "increment", r#"{"name":"rejected"}"#),
                ("c2", "increment", r#"{"name":"typo"}"#),
                ("c3", "show_state", "{}"),
            ],
            1,
            1,
        ))
        .push_json(openai_reply(Some("ok"), &[], 1, 1));
    let model = openai(&server);
    let host = Arc::new(approval_host().await);
    let approver = |call: &airlock::ToolCall| match call.id.as_str() {
        "c1" => Decision::Reject,
        "c2" => Decision::Edit(r#"{"name":"fixed"}"#.into()),
        _ => Decision::Approve,
    };
    let mut ctx = RunContext::default();
    let mut transcript = Transcript::default();
    Agent::new(Arc::clone(&host), Arc::new(model))
        .approver(Arc::new(approver))
        .run(&mut ctx, &mut transcript, "go")
        .await
        .unwrap();
    assert_eq!(
        ctx.deps()["counters"],
        json!({"fixed": 1}),
        "rejected call did not run; edited one ran as edited"
    );
    let results = tool_messages(&server.seen()[1].body)
        .into_iter()
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect::<Vec<_>>();
    assert_eq!(results[0], REJECTED_MESSAGE);
    assert_eq!(
        serde_json::from_str::<Value>(&results[1]).unwrap()["counter"],
        "fixed"
    );
    assert!(transcript.items.iter().any(|e| matches!(&e.item, Item::FunctionCallOutput { status: CallStatus::Rejected, call_id, .. } if call_id == "c1")));

    // Without an approval handler, "ask" tools are rejected.
    let server = ModelServer::start().await;
    server
        .push_json(openai_reply(
            None,
            &[("c1", "increment", r#"{"name":"x"}"#)],
            1,
            1,
        ))
        .push_json(openai_reply(Some("ok"), &[], 1, 1));
    let model = openai(&server);
    let mut ctx = RunContext::default();
    Agent::new(Arc::clone(&host), Arc::new(model))
        .run(&mut ctx, &mut Transcript::default(), "go")
        .await
        .unwrap();
    assert!(ctx.deps().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_stops_the_tool_in_flight() {
    let server = ModelServer::start().await;
    server.push_json(openai_reply(
        None,
        &[
            ("c1", "increment", r#"{"name":"before"}"#),
            ("c2", "spin", "{}"),
        ],
        1,
        1,
    ));
    let model = openai(&server);
    let mut host = Host::builder()
        .cache(airlock::CompileCache::in_dir(cache_dir()))
        .max_concurrent_calls(4)
        .build()
        .unwrap();
    let long = ToolConfig {
        limits: Limits {
            timeout: Duration::from_secs(60),
            ..Limits::default()
        },
        ..ToolConfig::default()
    };
    host.load_with(guest("hostile"), long).await.unwrap();
    host.load(guest("stateful")).await.unwrap();

    // Cancel once the call before the spinning one has ended (its output
    // item): the spinning call runs by then (it started with the turn, or
    // starts next).
    let cancel = CancelToken::new();
    let trigger = cancel.clone();
    let (sender, mut events) = tokio::sync::mpsc::unbounded_channel::<airlock::journal::Event>();
    let watcher = tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            if matches!(&event.item, Item::FunctionCallOutput { call_id, .. } if call_id == "c1") {
                trigger.cancel();
            }
        }
    });
    let mut ctx = RunContext::default();
    let mut transcript = Transcript::default();
    let host = Arc::new(host);
    let err = Agent::new(Arc::clone(&host), Arc::new(model))
        .cancel_token(cancel)
        .events(sender)
        .run(&mut ctx, &mut transcript, "spin")
        .await
        .unwrap_err();
    watcher.await.unwrap();
    assert!(matches!(err, RunError::Cancelled), "{err}");
    // The call before it kept its ops; the spinning one was recorded as
    // cancelled (not timed out: its limit is 60 s).
    assert_eq!(ctx.deps()["counters"], json!({"before": 1}));
    assert!(transcript.items.iter().any(|e| matches!(&e.item,
        Item::FunctionCallOutput { status: CallStatus::Cancelled, error_kind: Some(kind), .. }
            if *kind == airlock::ErrorKind::Cancelled)));
    assert_eq!(
        ctx.deps()["counters"],
        json!({"before": 1}),
        "work before the cancel is kept"
    );
    assert!(!ctx.deps().contains_key("pwned"));
    assert!(transcript.items.iter().any(|e| matches!(&e.item, Item::FunctionCallOutput { status: CallStatus::Cancelled, call_id, .. } if call_id == "c2")));
    let [.., error, end] = &transcript.items[..] else {
        panic!("too few items")
    };
    assert!(matches!(
        &error.item,
        Item::Error {
            kind: ErrorKind::Cancelled,
            ..
        }
    ));
    assert!(matches!(
        &end.item,
        Item::RunEnded {
            outcome: Outcome::Failed(ErrorKind::Cancelled),
            ..
        }
    ));
    // The host serves the next call after a cancelled one.
    host.call(
        &mut ctx,
        &airlock::ToolCall::new("increment", r#"{"name":"after"}"#),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_update_context_through_the_loop() {
    let server = ModelServer::start().await;
    let args = json!({"ops": [], "result": {"saved": true, "__update_context__": {"user": "ada", "lang": "en"}}}).to_string();
    server
        .push_json(openai_reply(None, &[("c1", "apply", &args)], 1, 1))
        .push_json(openai_reply(Some("saved"), &[], 1, 1));
    let model = openai(&server);
    let mut ctx = RunContext::default();
    let mut transcript = Transcript::default();
    Agent::new(Arc::clone(host().await), Arc::new(model))
        .run(&mut ctx, &mut transcript, "save")
        .await
        .unwrap();
    assert_eq!(ctx.deps()["user"], "ada");
    assert_eq!(ctx.deps()["lang"], "en");
    let told = tool_messages(&server.seen()[1].body)[0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        serde_json::from_str::<Value>(&told).unwrap(),
        json!({"saved": true})
    );
    assert!(
        transcript
            .items
            .iter()
            .any(|e| matches!(&e.item, Item::ContextUpdate { ops, .. } if ops.len() == 2))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transcript_continues_a_conversation() {
    let server = ModelServer::start().await;
    server
        .push_json(openai_reply(Some("first answer"), &[], 1, 1))
        .push_json(openai_reply(Some("second answer"), &[], 1, 1));
    let model = openai(&server);
    let mut ctx = RunContext::default();
    let mut transcript = Transcript::default();
    let agent = Agent::new(Arc::clone(host().await), Arc::new(model));
    let first = agent.run(&mut ctx, &mut transcript, "one").await.unwrap();
    let second = agent.run(&mut ctx, &mut transcript, "two").await.unwrap();
    // Each run has its own id; the session carries on.
    assert_ne!(first.run_id, second.run_id);
    assert_eq!(first.session_id, second.session_id);
    let run_ids: Vec<&str> = transcript.items.iter().map(|e| e.run_id.as_str()).collect();
    assert!(run_ids.contains(&first.run_id.as_str()) && run_ids.contains(&second.run_id.as_str()));
    let sent = &server.seen()[1].body["messages"];
    assert_eq!(sent.as_array().unwrap().len(), 3);
    assert_eq!(sent[0]["content"], "one");
    assert_eq!(sent[1]["content"], "first answer");
    assert_eq!(sent[2]["content"], "two");
    assert!(matches!(&transcript.messages[2], Message::User { content } if content == "two"));
}

/// What a tool showed reaches the model as its provider's API carries
/// it: Anthropic's tool result takes the image itself, beside the text;
/// OpenAI's tool message is text, and names the image instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_provider_gets_the_picture_its_api_carries() {
    let mut host = crate::support::builder().build().unwrap();
    host.load(guest("everything")).await.unwrap();
    let host = Arc::new(host);
    let sketch = json!({"steps": 1});

    let server = ModelServer::start().await;
    server
        .push_json(anthropic_reply(
            None,
            &[("toolu_1", "sketch", sketch.clone())],
            10,
            5,
        ))
        .push_json(anthropic_reply(Some("A checkerboard."), &[], 20, 5));
    let model = AnthropicModel::new("claude-test", options(server.anthropic_base())).unwrap();
    let mut transcript = Transcript::default();
    Agent::new(Arc::clone(&host), Arc::new(model))
        .run(&mut RunContext::default(), &mut transcript, "Draw.")
        .await
        .unwrap();
    let seen = server.seen();
    let result = &seen[1].body["messages"][2]["content"][0];
    assert_eq!(result["type"], "tool_result", "{result}");
    let parts = result["content"].as_array().unwrap();
    assert_eq!(parts[0]["type"], "text");
    assert!(
        !parts[0]["text"].as_str().unwrap().contains("also showed"),
        "{result}"
    );
    assert_eq!(parts[1]["type"], "image");
    assert_eq!(parts[1]["source"]["media_type"], "image/png");
    assert!(
        parts[1]["source"]["data"]
            .as_str()
            .unwrap()
            .starts_with("iVBORw0KGgo"),
        "{result}"
    );
    // The transcript keeps the result and what was shown apart.
    let Some(Message::Tool { content, shown, .. }) = transcript
        .messages
        .iter()
        .find(|m| matches!(m, Message::Tool { .. }))
    else {
        panic!("no tool message");
    };
    assert!(content.starts_with(r#"{"bytes":86"#), "{content}");
    assert_eq!(shown.len(), 1);

    let server = ModelServer::start().await;
    server
        .push_json(openai_reply(
            None,
            &[("call_1", "sketch", &sketch.to_string())],
            10,
            5,
        ))
        .push_json(openai_reply(Some("A checkerboard."), &[], 20, 5));
    Agent::new(Arc::clone(&host), Arc::new(openai(&server)))
        .run(
            &mut RunContext::default(),
            &mut Transcript::default(),
            "Draw.",
        )
        .await
        .unwrap();
    let seen = server.seen();
    let told = tool_messages(&seen[1].body);
    let text = told[0]["content"].as_str().unwrap();
    assert!(
        text.ends_with(
            "\n[the tool also showed its user an image (image/png, 86 bytes), not included here]"
        ),
        "{text}"
    );
}

/// A reply the provider cut at its output limit (`max_tokens`) before its
/// tool calls were whole fails the run, naming the limit: none of its
/// calls runs (one may be cut short), deps are unchanged, and nothing of
/// the turn is recorded. A text cut so is kept as far as it goes. The
/// limit is what the options say: Anthropic's `max_tokens` (4096 unset),
/// and OpenAI's only when set. (An OpenAI refusal, with no content, is the
/// answer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_at_its_output_limit_runs_none_of_its_calls() {
    let server = ModelServer::start().await;
    let mut cut = openai_reply(None, &[("c1", "increment", r#"{"name":"a"#)], 5, 50);
    cut["choices"][0]["finish_reason"] = json!("length");
    let mut cut_text = openai_reply(Some("The answer is"), &[], 5, 50);
    cut_text["choices"][0]["finish_reason"] = json!("length");
    server.push_json(cut).push_json(cut_text);
    let limited = airlock::llm::ProviderOptions {
        max_tokens: Some(50),
        ..options(server.openai_base())
    };
    let model = airlock::llm::OpenAiModel::new("gpt-test", limited).unwrap();
    let agent = Agent::new(Arc::clone(host().await), Arc::new(model));
    let mut ctx = RunContext::from_value(json!({"kept": 1})).unwrap();
    let mut transcript = Transcript::default();
    let error = agent
        .run(&mut ctx, &mut transcript, "go")
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "openai: the model's reply was cut at its output limit (max_tokens 50) before \
         its tool calls were whole; none was run: raise the limit (--max-tokens)",
    );
    assert_eq!(ctx.deps(), json!({"kept": 1}).as_object().unwrap());
    assert!(
        !transcript
            .items
            .iter()
            .any(|e| matches!(e.item, Item::FunctionCall { .. })),
        "no call of the cut turn was recorded"
    );
    assert_eq!(server.seen()[0].body["max_tokens"], 50);
    // The next run is served; a text cut short is its answer.
    let outcome = agent
        .run(&mut ctx, &mut Transcript::default(), "again")
        .await
        .unwrap();
    assert_eq!(outcome.answer, "The answer is");
    // A refusal (OpenAI's `refusal`, no content) is the answer too.
    let mut refused = openai_reply(None, &[], 5, 5);
    refused["choices"][0]["message"]["refusal"] = json!("I can't help with that.");
    server.push_json(refused);
    let outcome = agent
        .run(&mut ctx, &mut Transcript::default(), "refuse")
        .await
        .unwrap();
    assert_eq!(outcome.answer, "I can't help with that.");

    // Unset: OpenAI's request has none; Anthropic's has 4096, and names
    // it when a reply is cut.
    let server = ModelServer::start().await;
    server.push_json(openai_reply(Some("ok"), &[], 1, 1));
    let mut cut = anthropic_reply(None, &[("toolu_1", "increment", json!({}))], 5, 4096);
    cut["stop_reason"] = json!("max_tokens");
    server.push_json(cut);
    let openai = airlock::llm::OpenAiModel::new("gpt-test", options(server.openai_base())).unwrap();
    Agent::new(Arc::clone(host().await), Arc::new(openai))
        .run(&mut RunContext::default(), &mut Transcript::default(), "go")
        .await
        .unwrap();
    assert!(server.seen()[0].body.get("max_tokens").is_none());
    let anthropic = AnthropicModel::new("claude-test", options(server.anthropic_base())).unwrap();
    let error = Agent::new(Arc::clone(host().await), Arc::new(anthropic))
        .run(&mut RunContext::default(), &mut Transcript::default(), "go")
        .await
        .unwrap_err();
    assert!(error.to_string().contains("(max_tokens 4096)"), "{error}");
    assert_eq!(server.seen()[1].body["max_tokens"], 4096);
}
