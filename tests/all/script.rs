//! The script provider, and `airlock run` end to end with it (offline).

use std::sync::Arc;

use std::path::Path;

use airlock::RunContext;
use airlock::agent::{Agent, RunError};
use airlock::journal::Transcript;
use airlock::llm::{ModelError, ScriptModel};
use serde_json::{Value, json};

use crate::support::host;

fn script(dir: &Path, body: Value) -> std::path::PathBuf {
    let path = dir.join("script.json");
    std::fs::write(&path, body.to_string()).unwrap();
    path
}

#[tokio::test]
async fn script_drives_the_real_loop() {
    let dir = tempfile::tempdir().unwrap();
    let path = script(
        dir.path(),
        json!({"turns": [
            {"tool_calls": [
                {"name": "increment", "arguments": {"name": "a"}},
                {"id": "raw", "name": "increment", "arguments": "{\"name\": \"b\"}"}
            ], "usage": {"input_tokens": 7, "output_tokens": 3}},
            {"text": "done"}
        ]}),
    );
    let model = ScriptModel::load(&path).unwrap();
    let mut ctx = RunContext::default();
    let mut transcript = Transcript::default();
    let outcome = Agent::new(Arc::clone(host().await), Arc::new(model))
        .run(&mut ctx, &mut transcript, "go")
        .await
        .unwrap();
    assert_eq!(outcome.answer, "done");
    assert_eq!(ctx.deps()["counters"], json!({"a": 1, "b": 1}));
    assert_eq!((ctx.usage.input_tokens, ctx.usage.output_tokens), (7, 3));
    let ids: Vec<String> = transcript
        .items
        .iter()
        .filter_map(|e| match &e.item {
            airlock::journal::Item::FunctionCall { call, .. } => Some(call.id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, ["call_1_1", "raw"]);
}

#[tokio::test]
async fn running_out_of_turns_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = script(
        dir.path(),
        json!({"turns": [{"tool_calls": [{"name": "show_state"}]}]}),
    );
    let model = ScriptModel::load(&path).unwrap();
    let err = Agent::new(Arc::clone(host().await), Arc::new(model))
        .run(&mut RunContext::default(), &mut Transcript::default(), "go")
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, RunError::Model(ModelError::Script { .. })),
        "{message}"
    );
    assert!(
        message.contains("script.json") && message.contains("ran out of turns"),
        "{message}"
    );
}

#[tokio::test]
async fn a_tool_the_host_has_not_loaded_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = script(
        dir.path(),
        json!({"turns": [{"text": "hi"}, {"tool_calls": [{"name": "launch_missiles"}]}]}),
    );
    let model = ScriptModel::load(&path).unwrap();
    let mut ctx = RunContext::default();
    let err = Agent::new(Arc::clone(host().await), Arc::new(model))
        .run(&mut ctx, &mut Transcript::default(), "go")
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("turn 2") && message.contains("\"launch_missiles\" is not loaded"),
        "{message}"
    );
    assert_eq!(ctx.usage.requests, 0, "nothing ran");
}

#[test]
fn invalid_scripts_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    for body in [
        "{",
        r#"{"turns": [{"txt": "typo"}]}"#,
        r#"{"turns": [{"tool_calls": [{"name": "x", "arguments": 5}]}]}"#,
    ] {
        std::fs::write(&path, body).unwrap();
        let err = ScriptModel::load(&path).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("script {}", path.display())),
            "{err}"
        );
    }
    let err = ScriptModel::load(dir.path().join("missing.json"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("missing.json") && err.contains("cannot read"),
        "{err}"
    );
}

/// A call that fails after writing output keeps that output in the event
/// log: it is often what explains the failure.
#[tokio::test]
async fn a_failed_calls_output_reaches_the_event_log() {
    use airlock::journal::{CallStatus, Item};

    let dir = tempfile::tempdir().unwrap();
    let path = script(
        dir.path(),
        json!({"turns": [
            {"tool_calls": [
                {"id": "c1", "name": "spin_after_output", "arguments": {}},
                {"id": "c2", "name": "increment", "arguments": {"name": "after"}}
            ]},
            {"text": "done"}
        ]}),
    );
    let model = ScriptModel::load(&path).unwrap();
    let mut ctx = RunContext::default();
    let mut transcript = Transcript::default();
    Agent::new(
        Arc::clone(crate::support::hostile_host().await),
        Arc::new(model),
    )
    .run(&mut ctx, &mut transcript, "go")
    .await
    .unwrap();
    let failed = transcript
        .items
        .iter()
        .find_map(|e| match &e.item {
            Item::FunctionCallOutput {
                call_id,
                status,
                error_kind,
                guest,
                ..
            } if call_id == "c1" => Some((*status, *error_kind, guest.clone())),
            _ => None,
        })
        .expect("the failed call has an output event");
    assert_eq!(failed.0, CallStatus::Failed);
    assert_eq!(failed.1, Some(airlock::ErrorKind::Timeout));
    assert_eq!(failed.2.stdout, "partial output before the loop\n");
    // The JSON form of the event carries it too.
    let output = transcript
        .items
        .iter()
        .find(|e| matches!(&e.item, Item::FunctionCallOutput { call_id, .. } if call_id == "c1"))
        .unwrap();
    let line = serde_json::to_value(output).unwrap();
    assert_eq!(line["stdout"], "partial output before the loop\n", "{line}");
    // The run went on: the next call ran.
    assert_eq!(ctx.deps()["counters"], json!({"after": 1}));
}

/// Issue 12 item 11: what a run keeps is bounded. Calls whose outputs
/// together pass `max_transcript_bytes` end the run with a clear error
/// before the next call or model request; the calls already made are kept,
/// and the transcript stays near the bound.
#[tokio::test]
async fn a_run_keeps_a_bounded_transcript() {
    let dir = tempfile::tempdir().unwrap();
    // The turn's five intents (committed with it) fit in the bound; the
    // calls' outputs and ops pass it.
    let call = json!({"name": "add_note", "arguments": {"text": "n".repeat(600)}});
    let path = script(
        dir.path(),
        json!({"turns": [
            {"tool_calls": [call.clone(), call.clone(), call.clone(), call.clone(), call]},
            {"text": "never reached"}
        ]}),
    );
    let model = ScriptModel::load(&path).unwrap();
    let mut ctx = RunContext::default();
    let mut transcript = Transcript::default();
    let limit = 5_000;
    let err = Agent::new(Arc::clone(host().await), Arc::new(model))
        .options(airlock::agent::AgentOptions {
            max_transcript_bytes: limit,
            ..Default::default()
        })
        .run(&mut ctx, &mut transcript, "go")
        .await
        .unwrap_err();
    assert!(
        matches!(err, RunError::TranscriptTooLarge { limit: 5_000 }),
        "{err}"
    );
    assert_eq!(err.kind(), airlock::ErrorKind::TranscriptTooLarge);
    let notes = ctx.deps()["notes"].as_array().unwrap().len();
    assert!((1..5).contains(&notes), "{notes} notes kept");
    let kept = serde_json::to_string(&transcript.items).unwrap().len();
    assert!(kept < 2 * limit + 10_000, "{kept} bytes kept");
}
