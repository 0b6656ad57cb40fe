//! §8 The MCP round trip over stdio and streamable HTTP.

use std::fmt::Write as _;
use std::process::Stdio;
use std::sync::Arc;

use std::time::Duration;

use crate::harness::{
    Bench, airlock_mcp, batch, component, median, quantile, root, serve_http, us,
};
use airlock::context::ContextRules;
use airlock::mcp::DURATION_META_KEY;
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
    let mut minimal_server = tokio::process::Command::from(server("stdio", "minimal.db"));
    minimal_server.args(["--session", "bench"]);
    let mut minimal_stdio = Minimal::stdio(minimal_server).await;
    let stdio =
        ().serve(rmcp::transport::TokioChildProcess::new(stdio_server).unwrap())
            .await
            .unwrap();
    let (mut http_server, url) = serve_http(server("http", "http.db"));
    let http = ()
        .serve(rmcp::transport::StreamableHttpClientTransport::from_uri(
            url.clone(),
        ))
        .await
        .unwrap();
    // rmcp's default HTTP client keeps no idle connection
    // (`pool_max_idle_per_host(0)`): each request opens a TCP connection.
    // The same client given a reqwest client of its own keeps one alive.
    let pooled = ()
        .serve(rmcp::transport::StreamableHttpClientTransport::with_client(
            rmcp_reqwest::Client::new(),
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                url.clone(),
            ),
        ))
        .await
        .unwrap();
    let mut minimal_http = Minimal::http(&url).await;

    // Each MCP call beside the journaled call it makes, batch for batch:
    // the protocol's cost is the difference. Each MCP batch also gives the
    // server's own time for its calls (`_meta`): the protocol's cost
    // against the call itself.
    let pairs = if b.quick { 5 } else { 31 };
    let size = if b.quick { 5 } else { 20 };
    let mut rows = Vec::new();
    for (name, mut client, target) in [
        ("MCP over stdio", Caller::Rmcp(&stdio), 100),
        (
            "MCP over streamable HTTP (loopback)",
            Caller::Rmcp(&http),
            200,
        ),
        (
            "MCP over streamable HTTP (loopback), rmcp's client kept alive",
            Caller::Rmcp(&pooled),
            200,
        ),
        (
            "MCP over stdio, minimal client",
            Caller::Minimal(&mut minimal_stdio),
            100,
        ),
        (
            "MCP over streamable HTTP (loopback), minimal client",
            Caller::Minimal(&mut minimal_http),
            200,
        ),
    ] {
        let (mut own, mut beyond) = (Vec::new(), Vec::new());
        let measured = b
            .paired(
                &format!("{name} / Session::call"),
                pairs,
                async || {
                    let mut server = Duration::ZERO;
                    let per_call = batch(size, async || server += client.call(&params).await).await;
                    let server = server / size as u32;
                    own.push(server.as_secs_f64());
                    beyond.push(per_call.as_secs_f64() - server.as_secs_f64());
                    per_call
                },
                async || {
                    batch(size, async || {
                        session.call(&host, &call, &cancel, None).await.unwrap();
                    })
                    .await
                },
            )
            .await;
        let own = b.collect(&format!("{name}: the server's own call"), own);
        let beyond = b.collect(&format!("{name}: beyond the server's own call"), beyond);
        rows.push((name, measured, own, beyond, target));
    }
    // Where the protocol's time goes: round trips that run no tool and
    // write no journal.
    let stdio_list = median(n, async || {
        stdio.list_tools(None).await.unwrap();
    })
    .await;
    let http_list = median(n, async || {
        http.list_tools(None).await.unwrap();
    })
    .await;
    let pooled_list = median(n, async || {
        pooled.list_tools(None).await.unwrap();
    })
    .await;
    let mut minimal_list = Vec::new();
    for client in [&mut minimal_stdio, &mut minimal_http] {
        minimal_list.push(
            median(n, async || {
                client.request(LIST).await;
            })
            .await,
        );
    }
    let not_found = not_found(&url, n).await;

    session.close().await.unwrap();
    stdio.cancel().await.unwrap();
    http.cancel().await.unwrap();
    pooled.cancel().await.unwrap();
    http_server.kill().unwrap();
    let _ = http_server.wait();
    if !b.reporting() {
        return;
    }

    writeln!(
        out,
        "`tools/call increment` from rmcp's client, and from a minimal client (no SDK, below), to \
         `airlock mcp` (release build), one call at a time. Over HTTP, rmcp's client is measured \
         twice: as it comes, it keeps no idle connection (its reqwest client is built with \
         `pool_max_idle_per_host(0)`), so every request opens a new TCP connection; \
         \"kept alive\" is the same client given a default reqwest client \
         (`StreamableHttpClientTransport::with_client`), which reuses one. \
         Every MCP call is journaled (`Session::call`, SQLite WAL, `synchronous = FULL`); each transport's \
         batches of {size} calls alternate with batches of {size} `Session::call`s in this process \
         ({pairs} pairs), and the protocol's cost is the difference, pair by pair. The server also says \
         how long each call itself took in it (`_meta` `airlock/duration_us`: the journaled call, \
         tool included), and the time a batch took beyond that, call for call, is the protocol's \
         cost over the call itself, the measure the target is checked against: the `Session::call`s \
         in this process run faster than the server's own (docs/performance.md, \"The MCP layer\"), \
         so the first difference charges the protocol with part of the call. `Host::call` (no \
         journal, median of {n}): {}.\n",
        us(direct)
    )
    .unwrap();
    writeln!(
        out,
        "| path | per call | `Session::call` beside it | difference (IQR) | the server's own call | \
         beyond it (IQR) | target | |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|---|---|---|---|").unwrap();
    let micros = |seconds: f64| Duration::from_secs_f64(seconds.max(0.0));
    for (name, measured, own, beyond, target) in rows {
        let (cost, q1, q3) = measured.difference();
        let (over, over_q1, over_q3) = (
            micros(quantile(&beyond, 0.5)),
            micros(quantile(&beyond, 0.25)),
            micros(quantile(&beyond, 0.75)),
        );
        let target = Duration::from_micros(target);
        let verdict = if over_q3 <= target {
            "met"
        } else if over_q1 > target {
            "**not met**"
        } else {
            "not settled"
        };
        writeln!(
            out,
            "| {name} | {} | {} | +{} ({}–{}) | {} | +{} ({}–{}) | ≤ +{} | {verdict} |",
            us(measured.a()),
            us(measured.b()),
            us(cost),
            us(q1),
            us(q3),
            us(micros(quantile(&own, 0.5))),
            us(over),
            us(over_q1),
            us(over_q3),
            us(target)
        )
        .unwrap();
    }
    writeln!(out).unwrap();
    writeln!(
        out,
        "Where the protocol's cost goes: round trips that run no tool and write no journal \
         (median of {n}). The minimal client is no SDK: one JSON-RPC line written and one read \
         over stdio; one HTTP/1.1 POST on a kept-alive connection over HTTP, its SSE response \
         read to the end of the stream, as curl does. What it pays is the server's share.\n"
    )
    .unwrap();
    writeln!(out, "| round trip | time |").unwrap();
    writeln!(out, "|---|---|").unwrap();
    for (what, time) in [
        ("`tools/list`, rmcp's client over stdio", stdio_list),
        ("`tools/list`, minimal client over stdio", minimal_list[0]),
        (
            "`tools/list`, rmcp's client over streamable HTTP",
            http_list,
        ),
        (
            "`tools/list`, rmcp's client kept alive over streamable HTTP",
            pooled_list,
        ),
        (
            "`tools/list`, minimal client over streamable HTTP",
            minimal_list[1],
        ),
        (
            "`GET /other` (404, outside MCP): HTTP on loopback alone",
            not_found,
        ),
    ] {
        writeln!(out, "| {what} | {} |", us(time)).unwrap();
    }
    writeln!(out).unwrap();
}

/// What §8 times `tools/call increment` from: rmcp's client, or the
/// minimal one.
enum Caller<'a> {
    Rmcp(&'a rmcp::service::RunningService<rmcp::RoleClient, ()>),
    Minimal(&'a mut Minimal),
}

impl Caller<'_> {
    /// Makes the call; how long it took in the server, as its result says.
    async fn call(&mut self, params: &rmcp::model::CallToolRequestParams) -> Duration {
        let micros = match self {
            Caller::Rmcp(client) => {
                let result = client.call_tool(params.clone()).await.unwrap();
                result.meta.unwrap().0[DURATION_META_KEY].as_u64().unwrap()
            }
            Caller::Minimal(client) => {
                let response = client.request(CALL).await;
                let key = format!("\"{DURATION_META_KEY}\":");
                let at = response.find(&key).unwrap() + key.len();
                let digits = &response[at..];
                let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap();
                digits[..end].parse().unwrap()
            }
        };
        Duration::from_micros(micros)
    }
}

/// An MCP client with no SDK: one JSON-RPC line written and one read over
/// stdio; one HTTP/1.1 POST on a kept-alive connection over HTTP, its SSE
/// response read to the end of the stream (as curl does). What the server
/// costs, apart from any client library's own work.
pub(crate) enum Minimal {
    Stdio {
        _child: Box<tokio::process::Child>,
        input: tokio::process::ChildStdin,
        output: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    },
    Http {
        client: reqwest::Client,
        url: String,
        session: String,
    },
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
const LIST: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
const CALL: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"increment","arguments":{"name":"n"}}}"#;

impl Minimal {
    /// Starts `command` (`airlock mcp --transport stdio`) and initializes.
    pub(crate) async fn stdio(mut command: tokio::process::Command) -> Self {
        use tokio::io::AsyncBufReadExt;
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        let output = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut client = Minimal::Stdio {
            _child: Box::new(child),
            input,
            output,
        };
        client.request(INITIALIZE).await;
        client.notify(INITIALIZED).await;
        client
    }

    /// Initializes an MCP session at `url`.
    pub(crate) async fn http(url: &str) -> Self {
        // reqwest is built without a TLS provider (Airlock installs ring's).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut client = Minimal::Http {
            client: reqwest::Client::new(),
            url: url.to_owned(),
            session: String::new(),
        };
        let Minimal::Http {
            client: http,
            url,
            session,
        } = &mut client
        else {
            unreachable!()
        };
        let init = post(http, url, None, INITIALIZE).send().await.unwrap();
        *session = init.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_owned();
        init.bytes().await.unwrap();
        client.notify(INITIALIZED).await;
        client
    }

    /// Sends `message` (a request) and returns the response.
    pub(crate) async fn request(&mut self, message: &str) -> String {
        use tokio::io::AsyncWriteExt;
        let response = match self {
            Minimal::Stdio { input, output, .. } => {
                input
                    .write_all(format!("{message}\n").as_bytes())
                    .await
                    .unwrap();
                output.next_line().await.unwrap().unwrap()
            }
            Minimal::Http {
                client,
                url,
                session,
            } => post(client, url, Some(session), message)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        };
        assert!(response.contains(r#""result""#), "{response}");
        response
    }

    /// Sends `message` (a notification).
    async fn notify(&mut self, message: &str) {
        use tokio::io::AsyncWriteExt;
        match self {
            Minimal::Stdio { input, .. } => input
                .write_all(format!("{message}\n").as_bytes())
                .await
                .unwrap(),
            Minimal::Http {
                client,
                url,
                session,
            } => {
                post(client, url, Some(session), message)
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap();
            }
        }
    }
}

fn post(
    client: &reqwest::Client,
    url: &str,
    session: Option<&str>,
    body: &str,
) -> reqwest::RequestBuilder {
    let request = client
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2025-06-18")
        .body(body.to_owned());
    match session {
        Some(id) => request.header("mcp-session-id", id),
        None => request,
    }
}

/// A request outside MCP (404): HTTP on loopback alone, median of `n`.
async fn not_found(url: &str, n: usize) -> Duration {
    let client = reqwest::Client::new();
    let other = url.replace("/mcp", "/other");
    median(n, async || {
        let response = client.get(&other).send().await.unwrap();
        assert_eq!(response.status(), 404);
        response.bytes().await.unwrap();
    })
    .await
}
