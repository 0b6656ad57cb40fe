//! The script provider, and `airlock run` end to end with it (offline).

use std::path::Path;

use airlock::RunContext;
use airlock::agent::{Agent, RunError, Transcript};
use airlock::llm::{ModelError, ScriptModel};
use serde_json::{Value, json};

use crate::support::{airlock, guest, host, root};

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
    let outcome = Agent::new(host().await, &model)
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
            airlock::agent::Item::FunctionCall { call_id, .. } => Some(call_id.clone()),
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
    let err = Agent::new(host().await, &model)
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
    let err = Agent::new(host().await, &model)
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

const PROMPT: &str = "Count how many vowels are in the word 'elephant', incrementing a counter named 'vowels' for each one. Also add a note listing the vowels you found. Then show the final state.";

#[test]
fn airlock_run_with_the_demo_script() {
    let stateful = guest("stateful");
    let demo = root().join("guest-examples/scripts/vowels.json");
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let out = airlock(&[
        "run",
        "--tool",
        stateful.to_str().unwrap(),
        "--script",
        demo.to_str().unwrap(),
        "--events",
        events.to_str().unwrap(),
        "--json",
        PROMPT,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], true);
    assert!(doc["answer"].as_str().unwrap().contains("3 vowels"));
    assert_eq!(
        doc["deps"],
        json!({"counters": {"vowels": 3}, "notes": ["Vowels in 'elephant': e, e, a"]})
    );
    assert_eq!(
        doc["usage"],
        json!({"requests": 4, "tool_calls": 5, "input_tokens": 2163, "output_tokens": 124})
    );
    assert_eq!(doc["iterations"], 4);
    assert!(doc["session_id"].as_str().unwrap().starts_with("sess_"));
    assert!(doc["run_id"].as_str().unwrap().starts_with("run_"));

    let lines: Vec<Value> = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let types: Vec<&str> = lines.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.iter().filter(|t| **t == "function_call").count(), 5);
    assert_eq!(types.iter().filter(|t| **t == "context_update").count(), 4);
    assert_eq!(types[0], "message");
    assert!(lines.iter().all(|e| e["run_id"] == doc["run_id"]));
    assert_eq!(lines[0]["id"], "item_1");
}

#[test]
fn airlock_run_text_output_shows_progress() {
    let stateful = guest("stateful");
    let demo = root().join("guest-examples/scripts/vowels.json");
    let out = airlock(&[
        "run",
        "--tool",
        stateful.to_str().unwrap(),
        "--script",
        demo.to_str().unwrap(),
        PROMPT,
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("[turn 1] call increment {\"name\":\"vowels\"}"),
        "{text}"
    );
    assert!(text.contains("ops: set counters"), "{text}");
    assert!(
        text.contains("deps:   {\"counters\":{\"vowels\":3}"),
        "{text}"
    );
    assert!(text.contains("usage:  4 requests, 5 tool calls"), "{text}");
}

#[test]
fn airlock_run_input_errors() {
    let stateful = guest("stateful");
    let s = stateful.to_str().unwrap();
    let out = airlock(&["run", "--tool", s, "hello"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no model"));

    let out = airlock(&["run", "--script", "x.json", "hello"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no tools"));

    let out = airlock(&["run", "--tool", s, "--model", "nonsense", "hello"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PROVIDER:MODEL"));

    let out = airlock(&[
        "run",
        "--tool",
        s,
        "--script",
        "/no/such/script.json",
        "hello",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/script.json"));
}
