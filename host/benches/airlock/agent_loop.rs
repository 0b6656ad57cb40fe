//! §6 The agent loop: a scripted run's cost over its tool calls.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{Bench, component, us};
use airlock::RunContext;
use airlock::agent::{Agent, AgentOptions};
use airlock::journal::{Item, Transcript};
use airlock::llm::ScriptModel;
use serde_json::{Value, json};

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(out, "## 6. Agent loop overhead\n").unwrap();
    let turns = if b.quick { 10 } else { 100 };
    let mut script: Vec<Value> = (0..turns)
        .map(|_| json!({"tool_calls": [{"name": "increment", "arguments": {"name": "turns"}}]}))
        .collect();
    script.push(json!({"text": "done"}));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("turns.json");
    std::fs::write(&path, json!({ "turns": script }).to_string()).unwrap();
    let host = Arc::new(
        b.host(&[component("wasm32-wasip2/release/stateful.wasm")])
            .await,
    );
    let mut best: Option<(Duration, Duration)> = None;
    for _ in 0..if b.quick { 1 } else { 5 } {
        let model = ScriptModel::load(&path).unwrap();
        let mut ctx = RunContext::default();
        let mut transcript = Transcript::default();
        let t = Instant::now();
        Agent::new(Arc::clone(&host), Arc::new(model))
            .options(AgentOptions {
                max_iterations: turns as u32 + 1,
                ..Default::default()
            })
            .run(&mut ctx, &mut transcript, "count")
            .await
            .unwrap();
        let total = t.elapsed();
        assert_eq!(ctx.deps()["counters"]["turns"], turns);
        let in_tools: Duration = transcript
            .items
            .iter()
            .filter_map(|e| match &e.item {
                Item::FunctionCallOutput { duration_us, .. } => {
                    Some(Duration::from_micros(*duration_us))
                }
                _ => None,
            })
            .sum();
        if best.is_none_or(|(b, _)| total < b) {
            best = Some((total, in_tools));
        }
    }
    let (total, in_tools) = best.unwrap();
    let outside = total.saturating_sub(in_tools);
    writeln!(
        out,
        "A scripted run of {turns} model turns, each calling `increment` once (the script model answers \
         instantly, so nothing here is model time). Best of {} runs.\n",
        if b.quick { 1 } else { 5 }
    )
    .unwrap();
    writeln!(out, "| | total | per turn |").unwrap();
    writeln!(out, "|---|---|---|").unwrap();
    writeln!(
        out,
        "| whole run | {} | {} |",
        us(total),
        us(total / turns as u32)
    )
    .unwrap();
    writeln!(
        out,
        "| in tool calls (sandboxed) | {} | {} |",
        us(in_tools),
        us(in_tools / turns as u32)
    )
    .unwrap();
    writeln!(
        out,
        "| loop outside the model and tools (messages, events, dispatch) | {} | {} |\n",
        us(outside),
        us(outside / turns as u32)
    )
    .unwrap();
}
