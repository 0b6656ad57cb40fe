//! §3 Deps size: what a call costs as deps grow.

use std::fmt::Write as _;

use crate::harness::{Bench, component, median, ratio, us, verdict};
use airlock::{RunContext, ToolCall};
use serde_json::json;

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(out, "## 3. Deps size\n").unwrap();
    writeln!(
        out,
        "The context-probe tool reads one small key while deps also hold a large one. The view is lazy: \
         a tool pays for what it reads, not for the size of deps.\n"
    )
    .unwrap();
    writeln!(out, "| deps size | full host path |").unwrap();
    writeln!(out, "|---|---|").unwrap();
    let host = b
        .host(&[component("wasm32-wasip2/release/context_probe.wasm")])
        .await;
    let call = ToolCall::new("read", r#"{"keys":["k"]}"#);
    let mut times = Vec::new();
    for (label, size) in [
        ("1 KB", 1_000usize),
        ("1 MB", 1_000_000),
        ("10 MB", 10_000_000),
    ] {
        let ctx = RunContext::from_value(json!({"k": 1, "filler": "x".repeat(size)})).unwrap();
        let t = median(b.iters(2000), async || {
            let mut c = ctx.clone();
            host.call(&mut c, &call).await.unwrap();
        })
        .await;
        writeln!(out, "| {label} | {} |", us(t)).unwrap();
        times.push(t);
        eprintln!("deps {label}: {}", us(t));
    }
    let spread = ratio(*times.iter().max().unwrap(), *times.iter().min().unwrap()) - 1.0;
    writeln!(
        out,
        "\nTarget: flat within 10%: largest vs smallest {:+.1}% — {}\n",
        spread * 100.0,
        verdict(spread <= 0.10)
    )
    .unwrap();
}
