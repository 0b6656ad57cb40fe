//! A real OAuth 2.1 authorization server for the tests (authlib, in
//! `tests/oauth/server.py`, from the venv `make test` fills from
//! `tests/oauth/requirements.txt`) on a free loopback port, killed when
//! dropped; and `airlock mcp` as its resource server.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use super::mcp::{HttpServer, serve_http_at};
use super::root;

/// The venv's Python, with authlib, Flask and the MCP Python SDK.
pub fn python() -> PathBuf {
    let python = root().join("target/toolchains/venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: `make test` installs it with tests/oauth/requirements.txt",
        python.display()
    );
    python
}

/// A client the authorization server knows.
pub struct OAuthClient {
    pub id: &'static str,
    pub secret: &'static str,
    /// The token's subject: the Airlock user.
    pub sub: &'static str,
    /// The scopes it may have, space-separated.
    pub scope: &'static str,
    /// Opaque tokens (checked by introspection) rather than JWTs.
    pub opaque: bool,
}

/// The clients most tests use: ann (JWTs, every scope), bob (opaque
/// tokens, `tools` only), eve (JWTs, no scope), and Airlock's own client
/// for introspection.
pub const CLIENTS: [OAuthClient; 4] = [
    OAuthClient {
        id: "ann-laptop",
        secret: "ann-secret",
        sub: "ann",
        scope: "tools probe",
        opaque: false,
    },
    OAuthClient {
        id: "bob-ci",
        secret: "bob-secret",
        sub: "bob",
        scope: "tools",
        opaque: true,
    },
    OAuthClient {
        id: "eve-app",
        secret: "eve-secret",
        sub: "eve",
        scope: "",
        opaque: false,
    },
    OAuthClient {
        id: "airlock",
        secret: "airlock-secret",
        sub: "airlock",
        scope: "",
        opaque: false,
    },
];

/// The client named `id` of [`CLIENTS`].
pub fn client(id: &str) -> &'static OAuthClient {
    CLIENTS
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no test client {id}"))
}

/// The authorization server, running.
pub struct AuthServer {
    child: Child,
    /// Its issuer identifier, `http://127.0.0.1:PORT`.
    pub issuer: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl AuthServer {
    /// Starts it with [`CLIENTS`].
    pub fn start() -> Self {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let clients: Vec<Value> = CLIENTS
            .iter()
            .map(|c| {
                json!({"id": c.id, "secret": c.secret, "sub": c.sub, "scope": c.scope,
                       "format": if c.opaque { "opaque" } else { "jwt" }})
            })
            .collect();
        let file = dir.path().join("clients.json");
        std::fs::write(&file, Value::from(clients).to_string()).unwrap();
        let mut child = Command::new(python())
            .arg(root().join("tests/oauth/server.py"))
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the authorization server starts");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        let issuer = line
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("the authorization server said {line:?}"))
            .trim()
            .to_owned();
        Self {
            child,
            issuer,
            http: super::tls::reqwest_client(rustls::RootCertStore::empty()),
            _dir: dir,
        }
    }

    /// A token for `client`, for the resource `resource` (RFC 8707).
    pub async fn token(&self, client: &OAuthClient, resource: &str) -> String {
        let answer: Value = self
            .http
            .post(format!("{}/token", self.issuer))
            .basic_auth(client.id, Some(client.secret))
            .form(&[("grant_type", "client_credentials"), ("resource", resource)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        answer["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token for {}: {answer}", client.id))
            .to_owned()
    }

    /// `claims`, signed with the server's current key (RS256).
    pub async fn sign(&self, claims: Value) -> String {
        self.http
            .post(format!("{}/test/sign", self.issuer))
            .json(&claims)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Rotates the signing key: the JWKS holds only the new one.
    pub async fn rotate(&self) {
        let rotated = self
            .http
            .post(format!("{}/test/rotate", self.issuer))
            .send()
            .await
            .unwrap();
        assert!(rotated.status().is_success());
    }

    /// The current public key, PEM.
    pub async fn public_pem(&self) -> String {
        let url = format!("{}/test/public.pem", self.issuer);
        self.http
            .get(url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Revokes `token`, as `client` (whose token it is).
    pub async fn revoke(&self, token: &str, client: &OAuthClient) {
        let revoked = self
            .http
            .post(format!("{}/revoke", self.issuer))
            .basic_auth(client.id, Some(client.secret))
            .form(&[("token", token), ("token_type_hint", "access_token")])
            .send()
            .await
            .unwrap();
        assert!(revoked.status().is_success(), "{}", revoked.status());
    }

    /// The `[mcp.auth]` section for a server at `audience`: JWTs checked
    /// against the JWKS (refetched at once on an unknown key), opaque
    /// tokens introspected, `tools` needed by every request.
    pub fn auth_section(&self, audience: &str) -> String {
        format!(
            "[mcp.auth]\nissuer = {issuer:?}\naudience = {audience:?}\njwks_url = \"{issuer}/jwks\"\n\
             scopes = [\"tools\"]\njwks_refetch_secs = 0\n\n[mcp.auth.introspection]\n\
             url = \"{issuer}/introspect\"\nclient_id = \"airlock\"\nclient_secret_env = \"AIRLOCK_TEST_INTROSPECTION_SECRET\"\n",
            issuer = self.issuer
        )
    }
}

/// `airlock mcp` over HTTP on a loopback port chosen first (the policy
/// names it as the audience), with the policy `policy(audience)` written
/// to `dir`, sessions in `store`.
pub fn serve_authenticated(
    dir: &std::path::Path,
    store: &str,
    policy: impl Fn(&str) -> String,
) -> (HttpServer, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let audience = format!("http://127.0.0.1:{port}/mcp");
    let file = dir.join("airlock.toml");
    std::fs::write(&file, policy(&audience)).unwrap();
    let listen = format!("127.0.0.1:{port}");
    let config = file.to_str().unwrap();
    let server = serve_http_at(
        &listen,
        &["--config", config, "--store", store],
        &[(
            "AIRLOCK_TEST_INTROSPECTION_SECRET",
            client("airlock").secret,
        )],
    );
    assert_eq!(server.url, audience);
    (server, audience)
}
