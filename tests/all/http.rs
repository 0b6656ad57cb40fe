//! The HTTP grant and secrets, through the real `http-fetch` tool and a real
//! HTTP server on 127.0.0.1.

use std::time::Duration;

use airlock::context::ContextRules;
use airlock::sandbox::grants::{HostPattern, HttpGrant, SecretConfig, SecretGrant};
use airlock::{CallError, Host, Limits, RunContext, ToolConfig};
use serde_json::json;

use crate::support::loopback::Loopback;
use crate::support::{assert_host_still_serves, call, host_with, snapshot};

const SECRET: &str = "s3cr3t-token-never-in-the-guest";

fn config(allow: &[&str], secrets: Vec<SecretGrant>) -> ToolConfig {
    let mut config = ToolConfig::default();
    config.grants.http = HttpGrant::new(
        allow
            .iter()
            .map(|p| HostPattern::parse(p).unwrap())
            .collect(),
    );
    config.grants.secrets = secrets;
    config
}

/// The test secret, bound to `origin` (cleartext allowed: the test
/// servers are on loopback).
fn secret_for(origin: &str) -> SecretGrant {
    let mut config = SecretConfig::new("TEST_TOKEN", vec![origin.into()]);
    config.cleartext_loopback = true;
    SecretGrant::with_value(config, SECRET).unwrap()
}

/// One `fetch` with `args` by a fetcher allowed to reach `server`, with the
/// test secret bound to it.
async fn fetch_with_secret(server: &Loopback, args: serde_json::Value) -> airlock::CallOutcome {
    let origin = server.url("");
    let host = fetch_host(config(&[&origin], vec![secret_for(&origin)])).await;
    let mut ctx = RunContext::default();
    call(&host, &mut ctx, "fetch", args).await.unwrap()
}

async fn fetch_host(config: ToolConfig) -> Host {
    host_with(&[("http_fetch", config)], ContextRules::default()).await
}

/// A fetch that must be refused: the tool fails with exactly the
/// `wasi:http` error code the host gave it (the guest reports it as
/// `GET <url>: <code>`), deps unchanged, and the host serving the next call.
async fn refused(host: &Host, url: &str, code: &str) {
    let mut ctx = RunContext::from_value(json!({"keep": true})).unwrap();
    let before = snapshot(&ctx);
    let err = call(host, &mut ctx, "fetch", json!({ "url": url }))
        .await
        .unwrap_err();
    let expected = format!("GET {url}: {code}");
    assert!(
        matches!(&err, CallError::Failed(m) if *m == expected),
        "{url}: expected {expected:?}, got {err}"
    );
    assert_host_still_serves(host, &mut ctx, &before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_host_is_fetched_with_the_secret_the_tool_never_sees() {
    let server = Loopback::start().await;
    let out = fetch_with_secret(&server, json!({ "url": server.url("/hello") })).await;
    assert_eq!(
        out.result,
        json!({"status": 200, "bytes": 19, "body": "hello from loopback"})
    );

    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/hello");
    assert!(
        seen[0]
            .headers
            .contains(&("authorization".into(), format!("Bearer {SECRET}"))),
        "the server gets the secret: {:?}",
        seen[0].headers
    );
    let everything = format!("{out:?}");
    assert!(
        !everything.contains(SECRET),
        "the tool's output holds the secret"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_grant_no_network() {
    let server = Loopback::start().await;
    let host = fetch_host(ToolConfig::default()).await;
    refused(&host, &server.url("/hello"), "ErrorCode::HttpRequestDenied").await;
    assert!(server.requests().is_empty(), "nothing reached the server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_off_the_allowlist_are_refused() {
    let server = Loopback::start().await;
    let other_port = format!("http://127.0.0.1:{}", server.port().wrapping_add(1).max(1));
    let host = fetch_host(config(&[&other_port, "https://api.example.com"], vec![])).await;
    refused(&host, &server.url("/hello"), "ErrorCode::HttpRequestDenied").await;
    refused(
        &host,
        "http://api.example.com/",
        "ErrorCode::HttpRequestDenied",
    )
    .await;
    refused(
        &host,
        "https://evil.example.com/",
        "ErrorCode::HttpRequestDenied",
    )
    .await;
    assert!(server.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowlisted_name_that_resolves_to_loopback_is_refused() {
    // `127.1` is a host *name* to the allowlist (not the literal address
    // 127.0.0.1), and the resolver maps it to 127.0.0.1. The operator
    // allowed the name, not the loopback address, so it is refused after
    // resolution.
    let server = Loopback::start().await;
    let name = format!("http://127.1:{}", server.port());
    let host = fetch_host(config(&[&name], vec![])).await;
    refused(
        &host,
        &format!("{name}/hello"),
        "ErrorCode::DestinationIpProhibited",
    )
    .await;
    assert!(server.requests().is_empty(), "nothing reached the server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localhost_named_explicitly_is_allowed() {
    let server = Loopback::start().await;
    let url = format!("http://localhost:{}", server.port());
    let host = fetch_host(config(&[&url], vec![])).await;
    let mut ctx = RunContext::default();
    let out = call(
        &host,
        &mut ctx,
        "fetch",
        json!({ "url": format!("{url}/hello") }),
    )
    .await
    .unwrap();
    assert_eq!(out.result["status"], 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_go_only_to_their_hosts() {
    // The echo server is allowed under two names; the secret is bound to
    // one. Through the other, the echo shows every header the server got:
    // no secret.
    let server = Loopback::start().await;
    let by_ip = format!("http://127.0.0.1:{}", server.port());
    let by_name = format!("http://localhost:{}", server.port());
    let host = fetch_host(config(&[&by_ip, &by_name], vec![secret_for(&by_ip)])).await;
    let mut ctx = RunContext::default();
    let out = call(
        &host,
        &mut ctx,
        "fetch",
        json!({ "url": format!("{by_name}/echo") }),
    )
    .await
    .unwrap();
    let echoed = out.result["body"].as_str().unwrap();
    assert!(echoed.contains("host: localhost:"), "{echoed}");
    assert!(!echoed.contains(SECRET), "{echoed}");
    assert!(
        !echoed.to_ascii_lowercase().contains("authorization"),
        "{echoed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_env_deps_or_logs() {
    let server = Loopback::start().await;
    let mut cfg = config(&[&server.url("")], vec![secret_for(&server.url(""))]);
    cfg.grants.env = vec![airlock::sandbox::grants::EnvGrant::new("HOME").unwrap()];
    let host = host_with(&[("hostile", cfg)], ContextRules::default()).await;
    let mut ctx = RunContext::from_value(json!({"note": "deps hold no secret"})).unwrap();
    for tool in ["dump_env", "dump_deps"] {
        let out = call(&host, &mut ctx, tool, json!({})).await.unwrap();
        let text = format!("{out:?}");
        assert!(!text.contains(SECRET), "{tool}: {text}");
    }
    let debug = format!("{:?}", host.components());
    assert!(!debug.contains(SECRET), "Debug output redacts secrets");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_bodies_are_capped() {
    let server = Loopback::start().await;
    let mut cfg = config(&[&server.url("")], vec![]);
    cfg.grants.http.max_response_bytes = 64 * 1024;
    let host = fetch_host(cfg).await;
    refused(
        &host,
        &server.url("/big"),
        "HTTP response body size exceeds limit",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_server_cannot_outlast_the_call_deadline() {
    let server = Loopback::start().await;
    let mut cfg = config(&[&server.url("")], vec![]);
    cfg.limits = Limits {
        timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let host = fetch_host(cfg).await;
    let mut ctx = RunContext::from_value(json!({"keep": true})).unwrap();
    let before = snapshot(&ctx);
    let err = call(
        &host,
        &mut ctx,
        "fetch",
        json!({ "url": server.url("/slow") }),
    )
    .await
    .unwrap_err();
    // Either the host's timer ends the call, or the guest sees its request
    // time out first (the request timeout is capped by the call deadline).
    match &err {
        CallError::Timeout { .. } => {}
        CallError::Failed(m) if m.contains("Timeout") => {}
        other => panic!("expected a timeout, got {other}"),
    }
    assert_host_still_serves(&host, &mut ctx, &before).await;
}

#[test]
fn secret_debug_is_redacted() {
    let secret = secret_for("api.example.com");
    assert!(!format!("{secret:?}").contains(SECRET));
    assert!(secret.appears_in(&format!("Bearer {SECRET}")));
    let err = SecretGrant::with_value(SecretConfig::new("X", vec!["h".into()]), "bad\nvalue")
        .unwrap_err();
    assert!(!err.to_string().contains("bad"), "{err}");
}

/// Issue 12 item 3: a secret is bound to origins (scheme, host and port),
/// not to a host name. Two servers on the same host, both allowed: only
/// the bound origin's server gets the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_go_only_to_their_origin_not_to_other_ports() {
    let bound = Loopback::start().await;
    let other = Loopback::start().await;
    let host = fetch_host(config(
        &[&bound.url(""), &other.url("")],
        vec![secret_for(&bound.url(""))],
    ))
    .await;
    let mut ctx = RunContext::default();
    for server in [&other, &bound] {
        call(
            &host,
            &mut ctx,
            "fetch",
            json!({ "url": server.url("/hello") }),
        )
        .await
        .unwrap();
    }
    let got_secret = |server: &Loopback| {
        server.requests()[0]
            .headers
            .iter()
            .any(|(name, _)| name == "authorization")
    };
    assert!(got_secret(&bound), "the bound origin gets the secret");
    assert!(
        !got_secret(&other),
        "another port of the same host does not"
    );
}

/// A secret is never bound to a cleartext origin unless the entry says so,
/// and then only on this machine; a bare host name means https on 443.
#[test]
fn cleartext_secret_origins_are_refused() {
    let build = |origin: &str, cleartext_loopback: bool| {
        let mut config = SecretConfig::new("TOKEN", vec![origin.into()]);
        config.cleartext_loopback = cleartext_loopback;
        SecretGrant::from_env(config).map(|s| s.origins()[0].as_str().to_owned())
    };
    let err = build("http://api.example.com", false)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(
            "secret \"TOKEN\": origin \"http://api.example.com\" would send the secret in cleartext"
        ),
        "{err}"
    );
    let err = build("http://api.example.com", true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("only localhost and loopback addresses"),
        "{err}"
    );
    assert_eq!(
        build("http://127.0.0.1:8080", true).unwrap(),
        "http://127.0.0.1:8080"
    );
    assert_eq!(
        build("http://localhost:8080", true).unwrap(),
        "http://localhost:8080"
    );
    assert!(build("http://localhost:8080", false).is_err());
    assert_eq!(
        build("api.example.com", false).unwrap(),
        "https://api.example.com"
    );
    assert!(build("api.example.com/path", false).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_sockets_are_never_granted() {
    // Even with HTTP granted to the server, a raw TCP connection to it is
    // refused: `wasi:sockets` has no grant.
    let server = Loopback::start().await;
    let host = host_with(
        &[("hostile", config(&[&server.url("")], vec![]))],
        ContextRules::default(),
    )
    .await;
    let mut ctx = RunContext::from_value(json!({"keep": true})).unwrap();
    let before = snapshot(&ctx);
    let addr = server.addr.to_string();
    let err = call(&host, &mut ctx, "tcp_connect", json!({ "addr": addr }))
        .await
        .unwrap_err();
    let prefix = format!("connect {addr}: ");
    assert!(
        matches!(&err, CallError::Failed(m) if m.starts_with(&prefix)),
        "{err}"
    );
    assert_host_still_serves(&host, &mut ctx, &before).await;
    assert!(server.requests().is_empty(), "nothing reached the server");
}

/// Issue 12 item 4: one call cannot open connections without bound. With
/// room for 3 connections and 5 requests per call, a call that starts 8
/// requests to a server that never answers in time holds 3; the 4th and
/// 5th are refused for the connection limit and the 6th to 8th for the
/// request limit, all with `connection-limit-reached`. The next call gets
/// a fresh budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_holds_a_bounded_number_of_connections() {
    let server = Loopback::start().await;
    let mut cfg = config(&[&server.url("")], vec![]);
    cfg.grants.http.max_connections = 3;
    cfg.grants.http.max_requests = 5;
    let host = host_with(&[("hostile", cfg)], ContextRules::default()).await;
    let mut ctx = RunContext::from_value(json!({"keep": true})).unwrap();
    let before = snapshot(&ctx);
    // Starts `count` GETs of `url`; how the last `wait_last` ended.
    async fn open(
        host: &Host,
        ctx: &mut RunContext,
        url: String,
        count: u32,
        wait_last: u32,
    ) -> serde_json::Value {
        let args = json!({"url": url, "count": count, "wait_last": wait_last});
        call(host, ctx, "open_connections", args)
            .await
            .unwrap()
            .result
    }
    assert_eq!(
        open(&host, &mut ctx, server.url("/slow"), 8, 5).await,
        json!({"outcomes": {"ErrorCode::ConnectionLimitReached": 5}})
    );
    assert!(server.requests().len() <= 3, "{:?}", server.requests());
    assert_eq!(
        open(&host, &mut ctx, server.url("/hello"), 1, 1).await,
        json!({"outcomes": {"status 200": 1}})
    );
    assert_host_still_serves(&host, &mut ctx, &before).await;
}

/// Issue 12 item 8: DNS lookups that never answer do not outlive their
/// call. The binary runs in a mount namespace whose `/etc/resolv.conf`
/// names a server on loopback that reads nothing (so every `getaddrinfo`
/// hangs for its 30 s resolver timeout). A call with a wildcard grant
/// starts 8 lookups: the call is contained at its 1 s deadline (the tool
/// sees `DNS-timeout`, or the call times out), and the process exits
/// without joining the hung lookup threads.
///
/// Needs a mount namespace (`unshare -m`, root); where there is none (a
/// developer's unprivileged machine) it says so and checks nothing. CI
/// runs as root.
#[test]
fn dns_lookups_that_never_answer_do_not_outlive_the_call() {
    use std::process::Command;
    let namespaces = Command::new("unshare")
        .args(["-m", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !namespaces {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("skipped: `unshare -m` is not permitted here (needs root)");
        }
        return;
    }
    let silent = std::net::UdpSocket::bind("127.53.53.53:53").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 127.53.53.53\noptions timeout:30 attempts:1\n",
    )
    .unwrap();
    let hostile = crate::support::guest("hostile");
    let policy = dir.path().join("airlock.toml");
    std::fs::write(
        &policy,
        format!(
            "[[tool]]\npath = {:?}\nhttp = [\"http://*.example:8080\"]\nlimits = {{ timeout_ms = 1000 }}\n",
            hostile.display()
        ),
    )
    .unwrap();
    let args = json!({"url": "http://never.example:8080/", "count": 8, "wait_last": 8}).to_string();
    let started = std::time::Instant::now();
    let out = Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            r#"mount --bind "$0" /etc/resolv.conf && exec "$@""#,
        ])
        .arg(&resolv)
        .arg(env!("CARGO_BIN_EXE_airlock"))
        .args(["call"])
        .arg(&hostile)
        .args(["open_connections", &args, "--json", "--config"])
        .arg(&policy)
        .env("AIRLOCK_CACHE_DIR", crate::support::cache_dir())
        .output()
        .unwrap();
    let took = started.elapsed();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let contained = doc["result"] == json!({"outcomes": {"ErrorCode::DnsTimeout": 8}})
        || doc["error"]["kind"] == "timeout";
    assert!(contained, "{doc}");
    assert!(
        took < std::time::Duration::from_secs(25),
        "the process waited {took:?} for lookups that never answer"
    );
    // The lookups did reach the silent server (the test is not vacuous).
    silent.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    assert!(silent.recv_from(&mut buf).is_ok(), "no DNS query arrived");
}

/// Issue 17 item 6: a server that echoes the request's headers hands the
/// injected secret back; the host redacts it from the response before the
/// tool can read it (split across chunks too: unit
/// `sender::tests::secrets_are_redacted_across_chunk_boundaries`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoed_secret_is_redacted_before_the_tool_sees_it() {
    let server = Loopback::start().await;
    let args = json!({ "url": server.url("/echo"), "prefix_bytes": 4096 });
    let out = fetch_with_secret(&server, args).await;
    let body = out.result["body"].as_str().unwrap();
    assert!(body.contains("authorization: [redacted]\n"), "{body}");
    assert!(!body.contains(SECRET), "{body}");
    assert!(
        server.requests()[0]
            .headers
            .contains(&("authorization".into(), format!("Bearer {SECRET}"))),
        "the server did get the secret"
    );
}

/// A policy that names `localhost` does not allow `127.0.0.1` (nor the
/// reverse), and the refusal says so where the operator reads it: the
/// `airlock call` error names the host, what the allowlist names, and what
/// to list (issue 31.10); the same text reaches the model with the failure.
/// Nothing reaches the server, and the allowed form works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loopback_name_and_its_address_are_different_hosts_and_the_refusal_says_so() {
    use crate::support::{airlock, guest};
    let server = Loopback::start().await;
    let port = server.port();
    let dir = tempfile::tempdir().unwrap();
    let fetcher = guest("http_fetch");
    for (listed, asked) in [("localhost", "127.0.0.1"), ("127.0.0.1", "localhost")] {
        let policy = dir.path().join(format!("{listed}.toml"));
        std::fs::write(
            &policy,
            format!("[[tool]]\npath = {fetcher:?}\nhttp = [\"http://{listed}:{port}\"]\n"),
        )
        .unwrap();
        let fetch = |host: &str| {
            let args = json!({"url": format!("http://{host}:{port}/x")}).to_string();
            airlock(&[
                "call",
                fetcher.to_str().unwrap(),
                "fetch",
                &args,
                "--config",
                policy.to_str().unwrap(),
            ])
        };
        let sent = server.requests().len();
        let out = fetch(asked);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{said}");
        let expected = format!(
            "host {asked} is not in the allowlist; the allowlist names {listed} (a pattern \
             matches the host as the URL writes it) — list the address itself"
        );
        assert!(said.contains(&expected), "{said}");
        assert_eq!(server.requests().len(), sent, "a refused request was sent");
        let out = fetch(listed);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // In the library: the refusal is in the failure's output and in what
    // the model is told.
    let host = fetch_host(config(&[&format!("http://localhost:{port}")], vec![])).await;
    let mut ctx = RunContext::default();
    let call = airlock::ToolCall::new(
        "fetch",
        json!({"url": format!("http://127.0.0.1:{port}/x")}).to_string(),
    );
    let failure = host.call(&mut ctx, &call).await.unwrap_err();
    assert_eq!(failure.output.refusals.len(), 1, "{:?}", failure.output);
    let told = airlock::tools::failure_text(&failure);
    assert!(told.contains("the allowlist names localhost"), "{told}");
}
