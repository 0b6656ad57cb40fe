//! §18 Rich results and what a call reports, over MCP HTTP: a call that
//! shows a 100 KiB image beside the same call returning 100 KiB of JSON
//! text; a call that reports 100 times, told to its client as it runs,
//! beside the same call told nothing.

use std::fmt::Write as _;

use crate::harness::{Bench, airlock_mcp, batch, component, root, serve_http};
use crate::mcp_round_trip::Minimal;

const IMAGE: &str = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"large_image","arguments":{"kib":100}}}"#;
const TEXT: &str = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"large_text","arguments":{"kib":100}}}"#;
const TOLD: &str = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"chatty","arguments":{"n":100},"_meta":{"progressToken":"p"}}}"#;
const QUIET: &str = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"chatty","arguments":{"n":100}}}"#;
const SET_LEVEL: &str =
    r#"{"jsonrpc":"2.0","id":5,"method":"logging/setLevel","params":{"level":"debug"}}"#;

pub(crate) async fn run(b: &Bench, out: &mut String) {
    // A told call differs from an untold one by a few percent, less than
    // this machine's noise from one batch to the next: the two alternate
    // call by call, 80 of each to a pair (with 20, the pairs' ratios
    // spread wider than the 5% the target allows).
    let per_pair = if b.quick { 2 } else { 80 };
    writeln!(
        out,
        "## 18. Rich results and notifications over MCP HTTP\n\n\
         `guest-examples/rust/everything` served by `airlock mcp --transport http` (release \
         build), called by the minimal client of §8, one call at a time, each journaled. A call \
         that shows a 100 KiB image (an image content block, base64, also journaled) is paired \
         with the same tool returning 100 KiB of JSON text; a call that reports progress 100 \
         times and logs 100 records, from a session that set a log level and with a \
         `progressToken` (so its client hears them as they happen, on an event stream), is paired \
         with the same call from a session that asked for neither (one JSON body), the two \
         alternating call by call (a pair is {per_pair} of each, each side's time its calls' \
         median).\n"
    )
    .unwrap();
    let dir = tempfile::tempdir_in(root().join("target")).unwrap();
    let everything = component("wasm32-wasip2/release/everything.wasm");
    let (mut server, url) = serve_http(airlock_mcp(
        b,
        "http",
        &everything,
        dir.path().join("rich.db"),
    ));
    let (mut images, mut texts) = (Minimal::http(&url).await, Minimal::http(&url).await);
    let (mut told, mut quiet) = (Minimal::http(&url).await, Minimal::http(&url).await);
    told.request(SET_LEVEL).await;
    let image = images.request(IMAGE).await;
    assert!(image.contains(r#""type":"image""#), "{}", &image[..200]);
    let heard = told.request(TOLD).await;
    let progress = heard.matches("notifications/progress").count();
    let messages = heard.matches("notifications/message").count();
    let per_batch = if b.quick { 2 } else { 5 };
    let media = b
        .paired(
            "image vs text, 100 KiB, MCP HTTP",
            31,
            async || {
                batch(per_batch, async || {
                    images.request(IMAGE).await;
                })
                .await
            },
            async || {
                batch(per_batch, async || {
                    texts.request(TEXT).await;
                })
                .await
            },
        )
        .await;
    let reports = b
        .interleaved(
            "100 reports told vs not, MCP HTTP",
            31,
            per_pair,
            async || {
                told.request(TOLD).await;
            },
            async || {
                quiet.request(QUIET).await;
            },
        )
        .await;
    writeln!(
        out,
        "| call | this | beside it | ratio | target | |\n|---|---|---|---|---|---|\n\
         {} | — | |\n{} | ≤ 1.05× | {} |\n",
        media
            .row("a 100 KiB image, beside 100 KiB of JSON text")
            .trim_end_matches(" |"),
        reports
            .row("100 progress reports and 100 log records, told, beside untold")
            .trim_end_matches(" |"),
        reports.at_most(1.05)
    )
    .unwrap();
    writeln!(
        out,
        "A told call's client heard {progress} progress and {messages} log notifications: reports \
         closer than 10 ms apart are merged (the last progress report always sent; merged log \
         records one per line in one notification, none lost). A call that ends within 10 ms of \
         its first notification is answered with one event-stream body: its log records in one \
         notification, its latest progress report, then its result. \
         What the told call pays beyond the untold one is the merging, done where the tool \
         reports (a lock, and a copy of each log record's text; the clock is read only when a \
         notification goes out or the relay looks for what waits), and a larger answer; it \
         sets no timer of its own (its seconds are counted by one timer of the server's) and \
         wakes no other thread.\n"
    )
    .unwrap();
    let _ = server.kill();
    let _ = server.wait();
}
