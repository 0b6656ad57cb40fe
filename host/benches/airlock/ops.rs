//! §4 Op application: applying ops of several sizes.

use std::fmt::Write as _;

use crate::harness::{Bench, component, median, us};
use airlock::{ContextOp, OpLimits, RunContext, ToolCall};
use serde_json::{Value, json};

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(out, "## 4. Op application\n").unwrap();
    writeln!(
        out,
        "`RunContext::apply` on 1,000 ops at a time (staged per key, committed all or none), and a \
         1,000-op update returned by a real tool through the component boundary.\n"
    )
    .unwrap();
    writeln!(out, "| workload | time per 1,000 ops | ops per second |").unwrap();
    writeln!(out, "|---|---|---|").unwrap();
    let user = |i: usize| json!({"id": i, "name": format!("user {i}"), "tags": ["a", "b"], "score": 0.5, "address": {"city": "Lyon", "zip": "69001"}});
    let workloads: Vec<(&str, Vec<ContextOp>)> = vec![
        (
            "set 1,000 keys to objects",
            (0..1000)
                .map(|i| ContextOp::Set {
                    key: format!("user_{i}"),
                    value: user(i),
                })
                .collect(),
        ),
        (
            "merge 1,000 objects into one key",
            (0..1000)
                .map(|i| ContextOp::Merge {
                    key: "profile".into(),
                    value: json!({"visits": i, "last": {"page": format!("/p/{i}")}}),
                })
                .collect(),
        ),
        (
            "append 1,000 items to one array",
            (0..1000)
                .map(|i| ContextOp::Append {
                    key: "log".into(),
                    value: user(i),
                })
                .collect(),
        ),
    ];
    for (label, list) in &workloads {
        let t = median(b.iters(200), async || {
            let mut ctx = RunContext::default();
            ctx.apply(list, &OpLimits::default()).unwrap();
        })
        .await;
        writeln!(
            out,
            "| {label} | {} | {:.0} |",
            us(t),
            1000.0 / t.as_secs_f64()
        )
        .unwrap();
    }
    let host = b
        .host(&[component("wasm32-wasip2/release/context_probe.wasm")])
        .await;
    let ops: Vec<Value> = (0..1000)
        .map(|i| json!({"op": "set", "key": format!("k{i}"), "value": user(i)}))
        .collect();
    let call = ToolCall::new("apply", json!({ "ops": ops }).to_string());
    let t = median(b.iters(100), async || {
        let mut ctx = RunContext::default();
        host.call(&mut ctx, &call).await.unwrap();
    })
    .await;
    writeln!(
        out,
        "| a tool returning 1,000 `set` ops (whole call: arguments in, ops parsed, validated, applied) | {} | {:.0} |\n",
        us(t),
        1000.0 / t.as_secs_f64()
    )
    .unwrap();
}
