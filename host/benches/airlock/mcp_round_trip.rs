//! §8 The MCP round trip over stdio and streamable HTTP.

use std::fmt::Write as _;
use std::sync::Arc;

use std::time::Duration;

use crate::harness::{Bench, airlock_mcp, batch, component, median, root, serve_http, us};
use airlock::context::ContextRules;
use airlock::session::SessionStore;
use airlock::{RunContext, Session, SessionOptions, SqliteStore, ToolCall};
use serde_json::json;

pub(crate) async fn run(b: &Bench, out: &mut String) {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    writeln!(out, "## 8. MCP round trip\n").unwrap();
    let dir = tempfile::tempdir_in(root().join("target")).unwrap();
    let stateful = component("wasm32-wasip2/release/stateful.wasm");
    let server =
        |transport: &str, db: &str| airlock_mcp(b, transport, &stateful, dir.path().join(db));
    let arguments = json!({"name": "n"}).as_object().unwrap().clone();
    let params = CallToolRequestParams::new("increment").with_arguments(arguments);
    let n = b.iters(400);

    let host = b.host(std::slice::from_ref(&stateful)).await;
    let mut ctx = RunContext::default();
    let call = ToolCall::new("increment", r#"{"name":"n"}"#);
    let direct = median(n, async || {
        host.call(&mut ctx, &call).await.unwrap();
    })
    .await;
    let store: Arc<dyn SessionStore> =
        Arc::new(SqliteStore::open(dir.path().join("session.db")).unwrap());
    let mut session = Session::open(store, SessionOptions::default(), &ContextRules::default())
        .await
        .unwrap();
    let cancel = airlock::sandbox::CancelToken::new();

    let mut stdio_server = tokio::process::Command::from(server("stdio", "stdio.db"));
    stdio_server.args(["--session", "bench"]);
    let stdio =
        ().serve(rmcp::transport::TokioChildProcess::new(stdio_server).unwrap())
            .await
            .unwrap();
    let (mut http_server, url) = serve_http(server("http", "http.db"));
    let http = ()
        .serve(rmcp::transport::StreamableHttpClientTransport::from_uri(
            url,
        ))
        .await
        .unwrap();

    // Each MCP call beside the journaled call it makes, batch for batch:
    // the protocol's cost is the difference.
    let pairs = if b.quick { 5 } else { 31 };
    let size = if b.quick { 5 } else { 20 };
    let mut rows = Vec::new();
    for (name, client, target) in [
        ("MCP over stdio", &stdio, 100),
        ("MCP over streamable HTTP (loopback)", &http, 200),
    ] {
        let measured = b
            .paired(
                &format!("{name} / Session::call"),
                pairs,
                async || {
                    batch(size, async || {
                        client.call_tool(params.clone()).await.unwrap();
                    })
                    .await
                },
                async || {
                    batch(size, async || {
                        session.call(&host, &call, &cancel).await.unwrap();
                    })
                    .await
                },
            )
            .await;
        rows.push((name, measured, target));
    }
    session.close().await.unwrap();
    stdio.cancel().await.unwrap();
    http.cancel().await.unwrap();
    http_server.kill().unwrap();
    let _ = http_server.wait();
    if !b.reporting() {
        return;
    }

    writeln!(
        out,
        "`tools/call increment` from rmcp's client to `airlock mcp` (release build), one call at a time. \
         Every MCP call is journaled (`Session::call`, SQLite WAL, `synchronous = FULL`); each transport's \
         batches of {size} calls alternate with batches of {size} `Session::call`s in this process \
         ({pairs} pairs), and the protocol's cost is the difference, pair by pair. `Host::call` (no \
         journal, median of {n}): {}.\n",
        us(direct)
    )
    .unwrap();
    writeln!(
        out,
        "| path | per call | `Session::call` beside it | protocol cost (IQR) | target | |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|---|---|").unwrap();
    for (name, measured, target) in rows {
        let (cost, q1, q3) = measured.difference();
        let target = Duration::from_micros(target);
        let verdict = if q3 <= target {
            "met"
        } else if q1 > target {
            "**not met**"
        } else {
            "not settled"
        };
        writeln!(
            out,
            "| {name} | {} | {} | +{} ({}–{}) | ≤ +{} | {verdict} |",
            us(measured.a()),
            us(measured.b()),
            us(cost),
            us(q1),
            us(q3),
            us(target)
        )
        .unwrap();
    }
    writeln!(out).unwrap();
}
