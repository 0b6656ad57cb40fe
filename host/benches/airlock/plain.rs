//! §12 Plain components: a call of the typed Rust example (a plain
//! component: arguments and result converted by their WIT types) beside
//! the same work through Airlock's world (JSON text both ways), paired.

use std::fmt::Write as _;

use crate::harness::{Bench, Pinned, batch, component};
use airlock::{RunContext, ToolCall};
use serde_json::json;

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(
        out,
        "## 12. Plain components: typed conversion beside JSON text\n"
    )
    .unwrap();
    writeln!(
        out,
        "The same work, echoing a record of every WIT type (24 fields: integers of each width, floats, \
         a char, strings, bytes, lists, options, a tuple, a record, a variant, an enum, flags, results), \
         two ways, each a full `Host::call` in a fresh instance:\n\n\
         - **plain**: the typed example's `echo(value: everything) -> everything` (Rust, no Airlock \
         world): the host checks the arguments against the schema derived from the WIT types, converts \
         them to component values, and converts the returned value back to JSON;\n\
         - **Airlock world**: the context-probe tool's `apply` returning the same value as its result \
         (Rust): the arguments cross as JSON text, the guest parses and re-serializes them \
         (serde_json), the host parses the result.\n"
    )
    .unwrap();
    let host = b
        .host(&[
            component("plain/typed.wasm"),
            component("wasm32-wasip2/release/context_probe.wasm"),
        ])
        .await;
    let value = json!({
        "flag": true, "tiny": -128, "small": 255, "short": -32768, "ushort": 65535,
        "int": -2147483648i64, "uint": 4294967295u64, "long": i64::MIN, "ulong": u64::MAX,
        "single": 0.5, "double": 2.5e-300, "letter": "é", "text": "héllo wörld",
        "bytes": [0, 1, 255], "words": ["a", "bc"], "maybe": "yes", "maybe-maybe": {"some": 3},
        "pair": ["x", 7], "at": {"x": 1, "y": -2}, "shape": {"tag": "rectangle", "val": [2.0, 3.5]},
        "color": "green", "permissions": ["read", "execute"], "outcome": {"tag": "err", "val": "nope"},
        "done": {"tag": "ok"}
    });
    let plain = ToolCall::new("echo", json!({"value": value}).to_string());
    let world = ToolCall::new("apply", json!({"ops": [], "result": value}).to_string());
    let ctx = RunContext::default();
    // Both sides give back the same value.
    let typed = host.call(&mut ctx.clone(), &plain).await.unwrap().result;
    let json = host.call(&mut ctx.clone(), &world).await.unwrap().result;
    assert_eq!(typed, value);
    assert_eq!(json, value);
    let pairs = if b.quick { 5 } else { 45 };
    let pinned = Pinned::here(&[]);
    let measured = b
        .paired(
            "plain (typed) / Airlock world (JSON)",
            pairs,
            async || {
                batch(400, async || {
                    host.call(&mut ctx.clone(), &plain).await.unwrap();
                })
                .await
            },
            async || {
                batch(400, async || {
                    host.call(&mut ctx.clone(), &world).await.unwrap();
                })
                .await
            },
        )
        .await;
    drop(pinned);
    if !b.reporting() {
        return;
    }
    writeln!(
        out,
        "| pair | plain | Airlock world | plain / world | target ≤ 1.1× |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|---|").unwrap();
    writeln!(
        out,
        "{} {} |\n",
        measured.row("echo a record of every type"),
        measured.at_most(1.1)
    )
    .unwrap();
}
