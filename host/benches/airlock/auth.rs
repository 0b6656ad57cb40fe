//! §17 Access tokens: what checking a request's bearer token costs HTTP
//! MCP, against a real authorization server (authlib, the tests' own).

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::{Bench, median, root, us, verdict};
use airlock::mcp::auth::Authenticator;
use airlock::policy::AuthSettings;
use airlock::policy::mcp::{DEFAULT_JWKS_MAX_AGE, DEFAULT_JWKS_REFETCH, DEFAULT_LEEWAY};

const AUDIENCE: &str = "http://127.0.0.1:8931/mcp";

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(
        out,
        "## 17. Access tokens: checking a request's bearer token\n"
    )
    .unwrap();
    writeln!(
        out,
        "HTTP MCP with `[mcp.auth]` checks every request's token before anything else runs. A JWT \
         (RS256, 2048-bit key, from the tests' authlib authorization server) is checked against the \
         cached JWK set: header, key lookup, signature, registered claims, user and scopes. An \
         opaque token is asked about at the introspection endpoint on every request (a loopback \
         round trip here; nothing is cached, so a revoked token stops at once).\n"
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let clients = dir.path().join("clients.json");
    std::fs::write(
        &clients,
        r#"[{"id":"bench","secret":"s","sub":"ann","scope":"tools"},
            {"id":"opaque","secret":"s","sub":"ann","scope":"tools","format":"opaque"},
            {"id":"airlock","secret":"s"}]"#,
    )
    .unwrap();
    let mut server = Command::new(root().join("target/toolchains/venv/bin/python"))
        .arg(root().join("tests/oauth/server.py"))
        .arg(&clients)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the tests' authorization server (make oauth-packages)");
    let issuer = {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        line.trim().trim_start_matches("listening ").to_owned()
    };
    let settings = AuthSettings {
        issuer: issuer.clone(),
        audience: AUDIENCE.into(),
        jwks_url: Some(format!("{issuer}/jwks")),
        algorithms: vec!["RS256".into()],
        leeway: DEFAULT_LEEWAY,
        user_claim: "sub".into(),
        scopes: vec!["tools".into()],
        authorization_servers: vec![issuer.clone()],
        jwks_refetch: DEFAULT_JWKS_REFETCH,
        jwks_max_age: DEFAULT_JWKS_MAX_AGE,
        introspection: Some(airlock::policy::mcp::Introspection {
            url: format!("{issuer}/introspect"),
            client_id: "airlock".into(),
            client_secret_env: "UNUSED".into(),
            max_concurrent: airlock::policy::mcp::DEFAULT_INTROSPECTIONS,
        }),
    };
    let auth = Authenticator::with_secret(settings, Some("s".into()))
        .await
        .unwrap();
    let token = |client: &'static str| {
        let issuer = issuer.clone();
        async move {
            let answer: serde_json::Value = reqwest_client()
                .post(format!("{issuer}/token"))
                .basic_auth(client, Some("s"))
                .form(&[("grant_type", "client_credentials"), ("resource", AUDIENCE)])
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let token = answer["access_token"].as_str().unwrap().to_owned();
            http::HeaderValue::from_str(&format!("Bearer {token}")).unwrap()
        }
    };
    let jwt = token("bench").await;
    let opaque = token("opaque").await;
    let check = |header: &http::HeaderValue| {
        let (auth, header) = (&auth, header.clone());
        async move {
            auth.authenticate(Some(&header)).await.unwrap();
        }
    };
    // The signature check alone (ring's RSA verification, which parses
    // the key on every call: ring keeps no parsed public key), for how
    // much of a request's check is the cryptography's.
    let signature_time = {
        let jwks: serde_json::Value = reqwest_client()
            .get(format!("{issuer}/jwks"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let jwk: jsonwebtoken::jwk::Jwk = serde_json::from_value(jwks["keys"][0].clone()).unwrap();
        let key = jsonwebtoken::DecodingKey::from_jwk(&jwk).unwrap();
        let text = jwt.to_str().unwrap().trim_start_matches("Bearer ");
        let (signed, signature) = text.rsplit_once('.').unwrap();
        median(b.iters(5000), async || {
            let rs256 = jsonwebtoken::Algorithm::RS256;
            assert!(
                jsonwebtoken::crypto::verify(signature, signed.as_bytes(), &key, rs256).unwrap()
            );
        })
        .await
    };
    let jwt_time = median(b.iters(5000), async || check(&jwt).await).await;
    let opaque_time = median(b.iters(300), async || check(&opaque).await).await;
    let _ = server.kill();
    let _ = server.wait();
    writeln!(out, "| token | per request |").unwrap();
    writeln!(out, "|---|---|").unwrap();
    writeln!(out, "| JWT, RS256, keys cached | {} |", us(jwt_time)).unwrap();
    writeln!(
        out,
        "| of which the RS256 signature check alone (ring) | {} |",
        us(signature_time)
    )
    .unwrap();
    writeln!(out, "| opaque, introspected | {} |", us(opaque_time)).unwrap();
    eprintln!(
        "token check: jwt {} (signature {}) opaque {}",
        us(jwt_time),
        us(signature_time),
        us(opaque_time)
    );
    writeln!(
        out,
        "\nTarget: a JWT checked on cached keys in ≤ 20 µs: {} — {}\n",
        us(jwt_time),
        verdict(jwt_time <= Duration::from_micros(20))
    )
    .unwrap();
}

/// reqwest with ring's rustls (reqwest is built without a provider).
fn reqwest_client() -> reqwest::Client {
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .build()
        .unwrap()
}
