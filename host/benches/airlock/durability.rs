//! §7 Durability: what a session's journal costs per call and per turn.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{Bench, component, median, root, us};
use airlock::agent::{Agent, AgentOptions};
use airlock::context::ContextRules;
use airlock::journal::Transcript;
use airlock::llm::ScriptModel;
use airlock::session::{Durability, SessionStore};
use airlock::{Host, RunContext, Session, SessionOptions, SqliteStore, ToolCall};
use serde_json::{Value, json};

/// The agent run of `turns` model turns, each calling `increment` once:
/// in memory, or on a session in `store`. Returns the whole run's time.
async fn scripted_turns(
    host: &Arc<Host>,
    script: &Path,
    turns: usize,
    store: Option<Arc<dyn SessionStore>>,
) -> Duration {
    let model = Arc::new(ScriptModel::load(script).unwrap());
    let agent = Agent::new(Arc::clone(host), model).options(AgentOptions {
        max_iterations: turns as u32 + 1,
        ..Default::default()
    });
    match store {
        None => {
            let mut ctx = RunContext::default();
            let mut transcript = Transcript::default();
            let t = Instant::now();
            agent.run(&mut ctx, &mut transcript, "count").await.unwrap();
            t.elapsed()
        }
        Some(store) => {
            let mut session =
                Session::open(store, SessionOptions::default(), &ContextRules::default())
                    .await
                    .unwrap();
            let t = Instant::now();
            agent.run_session(&mut session, "count").await.unwrap();
            let took = t.elapsed();
            session.close().await.unwrap();
            took
        }
    }
}

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(out, "## 7. Durability (sessions)\n").unwrap();
    let host = Arc::new(
        b.host(&[component("wasm32-wasip2/release/stateful.wasm")])
            .await,
    );
    // On the repository's disk (target/), like a data dir on the same machine.
    let dir = tempfile::tempdir_in(root().join("target")).unwrap();
    let stores: Vec<(&str, Option<Arc<dyn SessionStore>>)> = vec![
        ("in memory (`Agent::run`, `Host::call`)", None),
        (
            "SQLite WAL, `sync = \"never\"`: `synchronous = NORMAL` (survives a process crash)",
            Some(Arc::new(
                SqliteStore::open_with(dir.path().join("normal.db"), Durability::Never).unwrap(),
            )),
        ),
        (
            "SQLite WAL, `sync = \"every-call\"`: `synchronous = FULL` (survives a power cut; the default `by-effect` waits so for these calls, which change deps)",
            Some(Arc::new(
                SqliteStore::open_with(dir.path().join("full.db"), Durability::EveryCall).unwrap(),
            )),
        ),
    ];

    // One tool call outside the loop: `Session::call` commits twice (the
    // intent, then the output with its ops).
    let n = b.iters(400);
    let call = ToolCall::new("increment", r#"{"name":"n"}"#);
    let mut per_call = Vec::new();
    for (_, store) in &stores {
        let took = match store {
            None => {
                let mut ctx = RunContext::default();
                median(n, async || {
                    host.call(&mut ctx, &call).await.unwrap();
                })
                .await
            }
            Some(store) => {
                let mut session = Session::open(
                    Arc::clone(store),
                    SessionOptions::default(),
                    &ContextRules::default(),
                )
                .await
                .unwrap();
                let cancel = airlock::sandbox::CancelToken::new();
                let took = median(n, async || {
                    session.call(&host, &call, &cancel, None).await.unwrap();
                })
                .await;
                session.close().await.unwrap();
                took
            }
        };
        per_call.push(took);
    }

    // Agent turns: each commits the model's reply, the call's intent and
    // the call's output (three transactions).
    let turns = if b.quick { 10 } else { 100 };
    let mut script: Vec<Value> = (0..turns)
        .map(|_| json!({"tool_calls": [{"name": "increment", "arguments": {"name": "turns"}}]}))
        .collect();
    script.push(json!({"text": "done"}));
    let script_path = dir.path().join("turns.json");
    std::fs::write(&script_path, json!({ "turns": script }).to_string()).unwrap();
    let runs = if b.quick { 1 } else { 5 };
    let mut per_turn = Vec::new();
    for (_, store) in &stores {
        let mut best = Duration::MAX;
        for _ in 0..runs {
            best = best.min(scripted_turns(&host, &script_path, turns, store.clone()).await);
        }
        per_turn.push(best / turns as u32);
    }

    writeln!(
        out,
        "What a session's journal costs. A tool call outside the loop (`Session::call`, as `airlock call --session` \
         and MCP make it) of this tool, which can reach nothing outside, commits once, after it runs: its intent, \
         output and ops together (a tool that may have effects commits its intent first). An agent turn \
         commits twice: the model's reply with the call it asks for (its intent), then the call's output. Median of {n} calls; best of {runs} \
         runs of {turns} scripted turns. Store files on the repository's disk (`target/`).\n"
    )
    .unwrap();
    writeln!(
        out,
        "| store | per tool call | per agent turn (one call) | call vs in memory |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|").unwrap();
    for (i, (name, _)) in stores.iter().enumerate() {
        writeln!(
            out,
            "| {name} | {} | {} | +{} |",
            us(per_call[i]),
            us(per_turn[i]),
            us(per_call[i].saturating_sub(per_call[0])),
        )
        .unwrap();
    }
    writeln!(out).unwrap();
}
