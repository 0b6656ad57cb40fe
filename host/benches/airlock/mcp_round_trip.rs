//! §8 The MCP round trip over stdio and streamable HTTP.

use std::fmt::Write as _;
use std::process::Command;
use std::sync::Arc;

use crate::harness::{Bench, component, median, root, serve_http, us};
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
    let exe = env!("CARGO_BIN_EXE_airlock");
    let server = |transport: &str, db: &str| {
        let mut command = Command::new(exe);
        command
            .args([
                "mcp",
                "--transport",
                transport,
                "--listen",
                "127.0.0.1:0",
                "--tool",
            ])
            .arg(&stateful)
            .arg("--store")
            .arg(dir.path().join(db))
            .env("AIRLOCK_CACHE_DIR", &b.cache)
            .env_remove("RUST_LOG");
        command
    };
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
    let journaled = median(n, async || {
        session.call(&host, &call, &cancel).await.unwrap();
    })
    .await;
    session.close().await.unwrap();

    let mut stdio_server = tokio::process::Command::from(server("stdio", "stdio.db"));
    stdio_server.args(["--session", "bench"]);
    let client =
        ().serve(rmcp::transport::TokioChildProcess::new(stdio_server).unwrap())
            .await
            .unwrap();
    let stdio = median(n, async || {
        client.call_tool(params.clone()).await.unwrap();
    })
    .await;
    client.cancel().await.unwrap();

    let (mut http_server, url) = serve_http(server("http", "http.db"));
    let client = ()
        .serve(rmcp::transport::StreamableHttpClientTransport::from_uri(
            url,
        ))
        .await
        .unwrap();
    let http = median(n, async || {
        client.call_tool(params.clone()).await.unwrap();
    })
    .await;
    client.cancel().await.unwrap();
    http_server.kill().unwrap();
    let _ = http_server.wait();

    writeln!(
        out,
        "`tools/call increment` from rmcp's client to `airlock mcp` (release build), one call at a time, \
         median of {n}. Every MCP call is journaled (`Session::call`, SQLite WAL, `synchronous = FULL`); \
         the protocol's own cost is the round trip less the journaled call.\n"
    )
    .unwrap();
    writeln!(out, "| path | per call | protocol cost |").unwrap();
    writeln!(out, "|---|---|---|").unwrap();
    writeln!(out, "| `Host::call` (in memory) | {} | |", us(direct)).unwrap();
    writeln!(out, "| `Session::call` (journaled) | {} | |", us(journaled)).unwrap();
    for (name, took) in [
        ("MCP over stdio", stdio),
        ("MCP over streamable HTTP (loopback)", http),
    ] {
        writeln!(
            out,
            "| {name} | {} | +{} |",
            us(took),
            us(took.saturating_sub(journaled))
        )
        .unwrap();
    }
    writeln!(out).unwrap();
}
