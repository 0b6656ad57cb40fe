//! HTTP MCP as an OAuth 2.1 resource server, against a real authorization
//! server (authlib, `tests/oauth/server.py`) and the MCP Python SDK's own
//! OAuth client: who may call, which tools they see, whose sessions they
//! reach, how much they may run, and what the journal says of them.

use std::path::Path;

use serde_json::{Value, json};

use crate::support::mcp::RawHttp;
use crate::support::oauth::{AuthServer, client, python, serve_authenticated};
use crate::support::{Gate, airlock, guest, root};

/// The policy of these tests: the stateful tools for `tools`, the probe's
/// for `probe`, `extra` after them, and `[mcp.auth]` for `audience`.
fn policy(auth: &AuthServer, extra: &str) -> impl Fn(&str) -> String {
    let tools = format!(
        "[[tool]]\npath = {:?}\nscopes = [\"tools\"]\n\n[[tool]]\npath = {:?}\nscopes = [\"probe\"]\n\n{extra}\n",
        guest("stateful"),
        guest("context_probe"),
    );
    let auth = |audience: &str| auth.auth_section(audience);
    move |audience| format!("{tools}{}", auth(audience))
}

/// A `tools/call` of `tool` with `arguments` and `meta`.
fn call(id: u64, tool: &str, arguments: Value, meta: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": arguments, "_meta": meta}})
}

/// The JSON-RPC message a response carries: its body, or the last event
/// of its stream.
async fn message(response: reqwest::Response) -> Value {
    let text = response.text().await.unwrap();
    if text.trim_start().starts_with('{') {
        return serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    }
    crate::support::mcp::events(&text)
        .pop()
        .unwrap_or_else(|| panic!("no message in {text:?}"))
}

/// The structured result of a successful call, or the text of a failed
/// one as `Err`.
async fn outcome(response: reqwest::Response) -> Result<Value, String> {
    let status = response.status();
    assert_eq!(status, 200, "a served call answers 200");
    let message = message(response).await;
    let result = &message["result"];
    if result["isError"] == true {
        return Err(result["content"][0]["text"].as_str().unwrap_or("").into());
    }
    Ok(result["structuredContent"].clone())
}

fn sessions_of(user: &str, store: &Path) -> String {
    let out = airlock(&[
        "sessions",
        "list",
        "--user",
        user,
        "--store",
        store.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The MCP Python SDK finds the authorization server from the server's 401
/// (protected resource metadata, then the server's own metadata), gets a
/// token for this resource by client credentials, and calls tools: with a
/// JWT (ann) and with an opaque token the server introspects (bob). Each
/// sees the tools its scopes allow, a tool it may not call is unknown to
/// it, and the journal says who made each call and with which client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_discovers_the_authorization_server_and_calls_tools() {
    let auth = AuthServer::start();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("sessions.db");
    let (_server, url) =
        serve_authenticated(dir.path(), store.to_str().unwrap(), policy(&auth, ""));
    let sdk = |client_id: &str, tool: &str, arguments: &str| {
        let c = client(client_id);
        let out = std::process::Command::new(python())
            .arg(root().join("tests/oauth/client.py"))
            .args([&url, c.id, c.secret, &auth.issuer, tool, arguments])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let answer: Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("{e}: {stdout} {}", String::from_utf8_lossy(&out.stderr)));
        assert!(answer.get("error").is_none(), "{client_id}: {answer}");
        answer
    };

    let ann = sdk("ann-laptop", "increment", r#"{"name":"visits"}"#);
    assert_eq!(
        ann["tools"],
        json!([
            "add_note",
            "apply",
            "derive",
            "increment",
            "read",
            "show_state"
        ])
    );
    assert_eq!(ann["result"]["structured_content"]["value"], 1, "{ann}");

    let bob = sdk("bob-ci", "read", "{}");
    assert_eq!(bob["tools"], json!(["add_note", "increment", "show_state"]));
    let refused = &bob["result"];
    assert_eq!(refused["is_error"], true, "{bob}");
    let text = refused["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("unknown tool \"read\""), "{text}");
    assert!(
        !text.contains("derive"),
        "the probe's tools are not named: {text}"
    );
    let bob = sdk("bob-ci", "increment", r#"{"name":"visits"}"#);
    assert_eq!(bob["result"]["structured_content"]["value"], 1, "{bob}");

    // Who did what: the user and the client, never the token.
    for (user, client_id) in [("ann", "ann-laptop"), ("bob", "bob-ci")] {
        let listed = sessions_of(user, &store);
        let id = listed
            .split_whitespace()
            .find(|w| w.starts_with("sess_"))
            .unwrap_or_else(|| panic!("{user} has a session: {listed}"));
        let shown = airlock(&[
            "sessions",
            "show",
            id,
            "--user",
            user,
            "--store",
            store.to_str().unwrap(),
        ]);
        let shown = String::from_utf8_lossy(&shown.stdout);
        let by = format!("call increment {{\"name\":\"visits\"}} (by {user} with {client_id})");
        assert!(shown.contains(&by), "{shown}");
        assert!(!shown.contains("eyJ"), "no token is journaled: {shown}");
    }
    assert!(sessions_of("eve", &store).contains("no sessions"));
}

/// Every kind of bad token is refused with its status and challenge, and
/// none runs a tool: the session's first served call counts 1. A key the
/// issuer rotated away stops working as soon as a token names the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_refused_with_their_status_and_run_nothing() {
    use base64::Engine;
    let auth = AuthServer::start();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("sessions.db");
    let (server, audience) =
        serve_authenticated(dir.path(), store.to_str().unwrap(), policy(&auth, ""));
    let ann = client("ann-laptop");
    let good = auth.token(ann, &audience).await;
    let session = RawHttp::new(&server.url)
        .with_token(&good)
        .initialize()
        .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = |changes: Value| {
        let mut claims = json!({"iss": auth.issuer, "aud": audience, "sub": "ann",
            "client_id": "ann-laptop", "scope": "tools", "exp": now + 600, "iat": now});
        for (k, v) in changes.as_object().unwrap() {
            claims[k] = v.clone();
        }
        claims
    };
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let kid = {
        let header = good.split('.').next().unwrap();
        let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(header)
            .unwrap();
        serde_json::from_slice::<Value>(&header).unwrap()["kid"].clone()
    };
    let payload = b64(claims(json!({})).to_string().as_bytes());
    let unsigned = format!(
        "{}.{payload}.",
        b64(json!({"alg": "none", "typ": "JWT"}).to_string().as_bytes())
    );
    let hmac = {
        let pem = auth.public_pem().await;
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = kid.as_str().map(str::to_owned);
        let key = jsonwebtoken::EncodingKey::from_secret(pem.as_bytes());
        jsonwebtoken::encode(&header, &claims(json!({})), &key).unwrap()
    };
    let forged = {
        let (signed, signature) = good.rsplit_once('.').unwrap();
        let mut bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(signature)
            .unwrap();
        bytes[10] ^= 1;
        format!("{signed}.{}", b64(&bytes))
    };
    let revoked = {
        let bob = client("bob-ci");
        let token = auth.token(bob, &audience).await;
        let working = RawHttp::new(&server.url)
            .with_token(&token)
            .initialize()
            .await;
        drop(working);
        auth.revoke(&token, bob).await;
        token
    };
    let cases: Vec<(&str, Option<String>, u16, &str)> = vec![
        ("no token", None, 401, ""),
        (
            "expired",
            Some(auth.sign(claims(json!({"exp": now - 3600}))).await),
            401,
            "expired",
        ),
        (
            "another audience",
            Some(
                auth.sign(claims(json!({"aud": "https://other.example/mcp"})))
                    .await,
            ),
            401,
            "another audience",
        ),
        (
            "another issuer",
            Some(
                auth.sign(claims(json!({"iss": "https://evil.example"})))
                    .await,
            ),
            401,
            "another issuer",
        ),
        ("a bad signature", Some(forged), 401, "signature"),
        ("alg none", Some(unsigned), 401, "header"),
        ("HMAC with the public key", Some(hmac), 401, "HS256"),
        (
            "no scope",
            Some(auth.token(client("eve-app"), &audience).await),
            403,
            "insufficient_scope",
        ),
        ("revoked", Some(revoked), 401, "not active"),
        ("garbage", Some("not.a.token".into()), 401, "invalid_token"),
    ];
    let increment = call(2, "increment", json!({"name": "n"}), json!({}));
    for (what, token, status, said) in cases {
        let mut client = session.clone();
        client.bearer = token;
        let answer = client.post(increment.clone()).await.unwrap();
        assert_eq!(answer.status(), status, "{what}");
        let challenge = answer.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .to_owned();
        let metadata = format!(
            "resource_metadata=\"{}\"",
            audience.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
        );
        assert!(challenge.starts_with("Bearer "), "{what}: {challenge}");
        assert!(challenge.contains(&metadata), "{what}: {challenge}");
        assert!(challenge.contains(said), "{what}: {challenge}");
        if status == 403 {
            assert!(challenge.contains("scope=\"tools\""), "{what}: {challenge}");
        }
        let body = answer.text().await.unwrap();
        assert!(!body.contains("value"), "{what}: {body}");
    }
    // None ran: the first call served on the session counts 1.
    let first = outcome(session.post(increment.clone()).await.unwrap()).await;
    assert_eq!(first.unwrap()["value"], 1);

    // The issuer rotates its key: a token with the new key works at
    // once, and the old key's tokens stop.
    auth.rotate().await;
    let fresh = auth.token(ann, &audience).await;
    let mut rotated = session.clone();
    rotated.bearer = Some(fresh);
    let second = outcome(rotated.post(increment.clone()).await.unwrap()).await;
    assert_eq!(second.unwrap()["value"], 2);
    let stale = session.post(increment.clone()).await.unwrap();
    assert_eq!(stale.status(), 401);
    let challenge = stale.headers()["www-authenticate"].to_str().unwrap();
    assert!(challenge.contains("names no key"), "{challenge}");
    let third = outcome(rotated.post(increment).await.unwrap()).await;
    assert_eq!(third.unwrap()["value"], 3, "the session is as it was");
}

/// ann and bob on one server: bob reaches none of ann's sessions, by MCP
/// session id (any method) or by naming her Airlock session in `_meta`
/// (he gets a session of his own so named, as if hers did not exist, and
/// takes no lease of hers); ann's session goes on as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_users_cannot_reach_each_others_sessions() {
    let auth = AuthServer::start();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("sessions.db");
    let (server, audience) =
        serve_authenticated(dir.path(), store.to_str().unwrap(), policy(&auth, ""));
    let ann_token = auth.token(client("ann-laptop"), &audience).await;
    let bob_token = auth.token(client("bob-ci"), &audience).await;
    let ann = RawHttp::new(&server.url)
        .with_token(&ann_token)
        .initialize()
        .await;
    let increment = |id: u64, meta: Value| call(id, "increment", json!({"name": "n"}), meta);
    let first = outcome(ann.post(increment(2, json!({}))).await.unwrap()).await;
    assert_eq!(first.unwrap()["value"], 1);
    let listed = sessions_of("ann", &store);
    let ann_session = listed
        .split_whitespace()
        .find(|w| w.starts_with("sess_"))
        .unwrap()
        .to_owned();

    // By MCP session id: bob's token on ann's session is answered as an
    // unknown session is, for a call, a read, her stream and her DELETE.
    let mut as_bob = ann.clone();
    as_bob.bearer = Some(bob_token.clone());
    let unknown = {
        let mut nobody = as_bob.clone();
        nobody.session = Some("no-such-session".into());
        let answer = nobody.post(increment(3, json!({}))).await.unwrap();
        (answer.status(), answer.text().await.unwrap())
    };
    assert_eq!(unknown.0, 404);
    let read = json!({"jsonrpc": "2.0", "id": 4, "method": "resources/read",
                      "params": {"uri": "airlock://session/deps"}});
    for message in [increment(3, json!({})), read.clone()] {
        let answer = as_bob.post(message.clone()).await.unwrap();
        let seen = (answer.status(), answer.text().await.unwrap());
        assert_eq!(seen, unknown, "{message}");
    }
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let answer = as_bob
            .http
            .request(method.clone(), &server.url)
            .bearer_auth(&bob_token)
            .header("mcp-session-id", ann.session.clone().unwrap())
            .header("mcp-protocol-version", "2025-06-18")
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 404, "{method}");
    }

    // By name: bob's own MCP session naming ann's Airlock session works
    // on a session of his own (ann's lease, held by her MCP session, does
    // not stand in his way), and shows him nothing of hers.
    let bob = RawHttp::new(&server.url)
        .with_token(&bob_token)
        .initialize()
        .await;
    let named = json!({"airlock/session": ann_session});
    let his = outcome(bob.post(increment(5, named.clone())).await.unwrap()).await;
    assert_eq!(his.unwrap()["value"], 1, "bob counts in his own session");
    let mut read_named = read.clone();
    read_named["params"]["_meta"] = named.clone();
    let deps = message(bob.post(read_named).await.unwrap()).await;
    let text = deps["result"]["contents"][0]["text"].as_str().unwrap();
    let deps: Value = serde_json::from_str(text).unwrap();
    assert_eq!(deps["counters"]["n"], 1, "his deps, not hers: {deps}");
    assert!(sessions_of("bob", &store).contains(&ann_session));

    // ann's session is as she left it: her next call counts 2.
    let next = outcome(ann.post(increment(6, json!({}))).await.unwrap()).await;
    assert_eq!(next.unwrap()["value"], 2);
    let out = airlock(&[
        "sessions",
        "show",
        &ann_session,
        "--user",
        "ann",
        "--store",
        store.to_str().unwrap(),
    ]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(!shown.contains("by bob"), "{shown}");
}

/// Per-user limits under load: while ann holds her two concurrent calls,
/// her flood is refused with a message naming the limit and bob's calls
/// run; her open sessions and calls per minute are bounded too; no
/// committed call is lost, and nothing refused left a trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_limits_hold_under_a_flood() {
    let auth = AuthServer::start();
    let gate = Gate::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("sessions.db");
    let extra = format!(
        "[[tool]]\npath = {:?}\nscopes = [\"tools\"]\nhttp = [\"http://127.0.0.1:{}\"]\n\n\
         [mcp.limits]\nconcurrent_calls = 2\ncalls_per_minute = 40\nopen_sessions = 3\n",
        guest("http_fetch"),
        gate.served.addr.port()
    );
    let (server, audience) =
        serve_authenticated(dir.path(), store.to_str().unwrap(), policy(&auth, &extra));
    let ann_token = auth.token(client("ann-laptop"), &audience).await;
    let bob_token = auth.token(client("bob-ci"), &audience).await;
    let ann = RawHttp::new(&server.url)
        .with_token(&ann_token)
        .initialize()
        .await;
    let bob = RawHttp::new(&server.url)
        .with_token(&bob_token)
        .initialize()
        .await;
    let held = format!("http://{}/held", gate.served.addr);
    let fetch = |id: u64, session: &str| {
        call(
            id,
            "fetch",
            json!({"url": held}),
            json!({"airlock/session": session}),
        )
    };
    // ann's two calls, on sessions of their own, wait at the gate.
    let running: Vec<_> = (0..2)
        .map(|i| {
            let (ann, message) = (ann.clone(), fetch(10 + i, &format!("held-{i}")));
            tokio::spawn(async move { outcome(ann.post(message).await.unwrap()).await })
        })
        .collect();
    gate.wait_for(2).await;
    // Her flood meanwhile: every call refused, each saying why.
    let flood: Vec<_> = (0..20)
        .map(|i| {
            let message = call(
                100 + i,
                "increment",
                json!({"name": "n"}),
                json!({"airlock/session": format!("flood-{i}")}),
            );
            let ann = ann.clone();
            tokio::spawn(async move { outcome(ann.post(message).await.unwrap()).await })
        })
        .collect();
    for refused in flood {
        let text = refused.await.unwrap().unwrap_err();
        assert!(text.contains("concurrent_calls"), "{text}");
    }
    // bob is not held back by her: his calls run while hers wait.
    for i in 0..5 {
        let message = call(200 + i, "increment", json!({"name": "n"}), json!({}));
        let counted = outcome(bob.post(message).await.unwrap()).await;
        assert_eq!(counted.unwrap()["value"], i + 1);
    }
    gate.open.send_replace(true);
    for call in running {
        let fetched = call.await.unwrap().unwrap();
        assert_eq!(fetched["body"], "through", "{fetched}");
    }

    // Open sessions: she holds one; two more, then the fourth is refused
    // until one ends.
    let second = RawHttp::new(&server.url)
        .with_token(&ann_token)
        .initialize()
        .await;
    let _third = RawHttp::new(&server.url)
        .with_token(&ann_token)
        .initialize()
        .await;
    let fourth = RawHttp::new(&server.url)
        .with_token(&ann_token)
        .post(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
        )
        .await
        .unwrap();
    assert_eq!(fourth.status(), 429);
    let text = fourth.text().await.unwrap();
    assert!(text.contains("open_sessions"), "{text}");
    let ended = second.end().await;
    assert!(ended.status().is_success(), "{}", ended.status());
    let _again = RawHttp::new(&server.url)
        .with_token(&ann_token)
        .initialize()
        .await;

    // Calls per minute: 2 ran, 20 were refused before counting; 38 more
    // fit in the minute and the next is refused.
    let mut counted = 0;
    let refused = loop {
        let message = call(300 + counted, "increment", json!({"name": "n"}), json!({}));
        match outcome(ann.post(message).await.unwrap()).await {
            Ok(result) => {
                counted += 1;
                assert_eq!(result["value"], counted);
            }
            Err(text) => break text,
        }
    };
    assert_eq!(counted, 38);
    assert!(refused.contains("calls_per_minute"), "{refused}");

    // Nothing committed is lost, and no refused call left a session.
    let listed = sessions_of("ann", &store);
    assert!(!listed.contains("flood-"), "{listed}");
    assert!(
        listed.contains("held-0") && listed.contains("held-1"),
        "{listed}"
    );
    let deps = |session: &str, user: &str| {
        let out = airlock(&[
            "sessions",
            "show",
            session,
            "--user",
            user,
            "--json",
            "--store",
            store.to_str().unwrap(),
        ]);
        let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
        shown["deps"].clone()
    };
    let own = listed
        .split_whitespace()
        .find(|w| w.starts_with("sess_"))
        .unwrap();
    assert_eq!(deps(own, "ann")["counters"]["n"], 38);
}

/// Opaque tokens cost a client nothing to make up, and each costs the
/// authorization server an introspection: at most `max_concurrent` are in
/// flight at once, whatever the number of requests; the rest wait their
/// turn and are answered as the endpoint says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introspections_in_flight_are_bounded() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use airlock::mcp::auth::Authenticator;
    use airlock::policy::AuthSettings;
    use airlock::policy::mcp::{
        DEFAULT_JWKS_MAX_AGE, DEFAULT_JWKS_REFETCH, DEFAULT_LEEWAY, Introspection,
    };

    const ISSUER: &str = "https://issuer.example";
    const AUDIENCE: &str = "http://127.0.0.1:1/mcp";
    // The endpoint counts what is in flight, and holds each request until
    // the test opens it.
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let arrived = Arc::new(tokio::sync::Semaphore::new(0));
    let (open, opened) = tokio::sync::watch::channel(false);
    let endpoint = {
        let (in_flight, most, arrived) = (in_flight.clone(), most.clone(), arrived.clone());
        crate::support::serve(move |_request| {
            let (in_flight, most, arrived) = (in_flight.clone(), most.clone(), arrived.clone());
            let mut opened = opened.clone();
            async move {
                most.fetch_max(
                    in_flight.fetch_add(1, Ordering::SeqCst) + 1,
                    Ordering::SeqCst,
                );
                arrived.add_permits(1);
                let _ = opened.wait_for(|open| *open).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                let answer = json!({"active": true, "sub": "ann", "iss": ISSUER,
                    "aud": AUDIENCE, "scope": "tools"});
                Ok(hyper::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from(answer.to_string()),
                )))
            }
        })
        .await
    };
    let settings = AuthSettings {
        issuer: ISSUER.into(),
        audience: AUDIENCE.into(),
        jwks_url: None,
        algorithms: vec!["RS256".into()],
        leeway: DEFAULT_LEEWAY,
        user_claim: "sub".into(),
        scopes: vec!["tools".into()],
        authorization_servers: vec![ISSUER.into()],
        jwks_refetch: DEFAULT_JWKS_REFETCH,
        jwks_max_age: DEFAULT_JWKS_MAX_AGE,
        introspection: Some(Introspection {
            url: format!("http://{}/introspect", endpoint.addr),
            client_id: "airlock".into(),
            client_secret_env: "UNUSED".into(),
            max_concurrent: 2,
        }),
    };
    let auth = Arc::new(
        Authenticator::with_secret(settings, Some("s".into()))
            .await
            .unwrap(),
    );
    let checks: Vec<_> = (0..12)
        .map(|i| {
            let auth = Arc::clone(&auth);
            tokio::spawn(async move {
                let header = http::HeaderValue::from_str(&format!("Bearer made-up-{i}")).unwrap();
                auth.authenticate(Some(&header)).await
            })
        })
        .collect();
    let _ = arrived.acquire_many(2).await.unwrap();
    open.send_replace(true);
    for check in checks {
        assert_eq!(check.await.unwrap().unwrap().user, "ann");
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "introspections in flight at once"
    );
}

/// A server that cannot check tokens does not start, and says why, naming
/// the key or variable at fault; one that can may listen where other
/// machines reach it, and asks them for a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_check_tokens_does_not_start() {
    let auth = AuthServer::start();
    let dir = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let tool = format!("[[tool]]\npath = {:?}\n\n", guest("stateful"));
    let start = |policy: String, args: &[&str], env: &[(&str, &str)]| {
        let file = dir.path().join("airlock.toml");
        std::fs::write(&file, policy).unwrap();
        let mut all = vec![
            "mcp",
            "--transport",
            "http",
            "--config",
            file.to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        let out = crate::support::airlock_command(&all, env).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let audience = "http://127.0.0.1:8931/mcp";
    let section = auth.auth_section(audience);
    let unreachable = section.replace(
        &format!("{}/jwks", auth.issuer),
        &format!("http://{closed}/jwks"),
    );
    let (code, said) = start(format!("{tool}{unreachable}"), &[], &[]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("AIRLOCK_TEST_INTROSPECTION_SECRET"), "{said}");
    let secret = [("AIRLOCK_TEST_INTROSPECTION_SECRET", "x")];
    let (code, said) = start(format!("{tool}{unreachable}"), &[], &secret);
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains(&format!("jwks_url http://{closed}/jwks")),
        "{said}"
    );
    let hmac = section.replace("scopes = [\"tools\"]", "algorithms = [\"HS256\"]");
    let (code, said) = start(format!("{tool}{hmac}"), &[], &secret);
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains("airlock.toml:") && said.contains("\"HS256\" is not accepted"),
        "{said}"
    );
    let (code, said) = start(
        format!("{tool}{section}"),
        &["--allow-unauthenticated"],
        &secret,
    );
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("asks every client for a token"), "{said}");

    // With [mcp.auth], an address other machines reach is served, by the
    // name its audience gives it: a request without a token is refused, one
    // with a token for it is served.
    let public = "https://mcp.example.test/mcp";
    let file = dir.path().join("airlock.toml");
    std::fs::write(&file, format!("{tool}{}", auth.auth_section(public))).unwrap();
    let server = crate::support::mcp::serve_http_at(
        "0.0.0.0:0",
        &["--config", file.to_str().unwrap()],
        &secret,
    );
    let port = server
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches("/mcp");
    let local = format!("http://127.0.0.1:{port}/mcp");
    let refused = RawHttp::new(&local)
        .post(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let token = auth.token(client("ann-laptop"), public).await;
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    let served = RawHttp::new(&local)
        .http
        .post(&local)
        .bearer_auth(&token)
        .header("host", "mcp.example.test")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(initialize.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200);
}

/// A token's scopes reach what components offer beside tools: a
/// component whose `scopes` the token lacks offers that caller no
/// resources, templates, prompts or completions, as if it had none, and
/// what it offers stays the caller's who has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_hide_a_components_resources_and_prompts() {
    let auth = AuthServer::start();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("sessions.db");
    let everything = format!(
        "[[tool]]\npath = {:?}\nscopes = [\"probe\"]\nuri_schemes = [\"test\"]\n",
        guest("everything")
    );
    let (server, audience) = serve_authenticated(
        dir.path(),
        store.to_str().unwrap(),
        policy(&auth, &everything),
    );
    let session = |token: String| {
        let url = server.url.clone();
        async move { RawHttp::new(&url).with_token(&token).initialize().await }
    };
    let ann = session(auth.token(client("ann-laptop"), &audience).await).await;
    let bob = session(auth.token(client("bob-ci"), &audience).await).await;
    let ask = |id: u64, method: &str, params: Value| json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let requests = [
        ask(2, "resources/list", json!({})),
        ask(3, "resources/templates/list", json!({})),
        ask(4, "prompts/list", json!({})),
        ask(5, "resources/read", json!({"uri": "test://static-text"})),
        ask(6, "prompts/get", json!({"name": "test_simple_prompt"})),
        ask(
            7,
            "completion/complete",
            json!({"ref": {"type": "ref/prompt", "name": "test_prompt_with_arguments"},
                   "argument": {"name": "arg1", "value": "te"}}),
        ),
    ];
    let mut answers = Vec::new();
    for who in [&ann, &bob] {
        let mut said = Vec::new();
        for request in &requests {
            said.push(message(who.post(request.clone()).await.unwrap()).await);
        }
        answers.push(said);
    }
    let (ann, bob) = (&answers[0], &answers[1]);
    assert_eq!(
        ann[0]["result"]["resources"].as_array().unwrap().len(),
        4,
        "{}",
        ann[0]
    );
    assert_eq!(
        ann[1]["result"]["resourceTemplates"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(ann[2]["result"]["prompts"].as_array().unwrap().len(), 4);
    assert!(
        ann[3]["result"]["contents"][0]["text"].is_string(),
        "{}",
        ann[3]
    );
    assert!(ann[4]["result"]["messages"].is_array(), "{}", ann[4]);
    assert_eq!(
        ann[5]["result"]["completion"]["values"],
        json!(["test", "testValue1"])
    );
    // bob sees only the session's own deps resource, and nothing else.
    let uris: Vec<&str> = bob[0]["result"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    assert_eq!(uris, ["airlock://session/deps"]);
    assert_eq!(bob[1]["result"]["resourceTemplates"], json!([]));
    assert_eq!(bob[2]["result"]["prompts"], json!([]));
    assert_eq!(bob[3]["error"]["code"], -32002, "{}", bob[3]);
    assert_eq!(bob[4]["error"]["code"], -32602, "{}", bob[4]);
    let said = bob[4]["error"]["message"].as_str().unwrap();
    assert!(said.contains("the prompts are []"), "{said}");
    assert_eq!(bob[5]["error"]["code"], -32602, "{}", bob[5]);
}
