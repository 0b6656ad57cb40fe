//! What a policy says about serving MCP (`[mcp]`): the OAuth resource
//! server that admits an HTTP request (`[mcp.auth]`, [`AuthSettings`]),
//! what one user may use at once (`[mcp.limits]`, [`UserLimits`]), how
//! many MCP sessions and connections an HTTP server holds (`[mcp]
//! max_sessions`, `max_connections`, `max_connections_per_peer`) and
//! when a call becomes a task (`[mcp.tasks]`, [`TaskSettings`]).
//! Data only: validating tokens and counting calls are `crate::mcp`'s.

use std::time::Duration;

use serde::Deserialize;

/// Algorithms a token may be signed with: asymmetric only. An HMAC
/// algorithm would let anyone holding the JWKS (it is public) sign tokens
/// (the key-confusion attack), and `none` signs nothing.
pub const ALGORITHMS: [&str; 9] = [
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];

/// Algorithms accepted when the policy names none: what authorization
/// servers sign access tokens with.
pub const DEFAULT_ALGORITHMS: [&str; 3] = ["RS256", "ES256", "EdDSA"];

/// How far a token's `exp` and `nbf` may be off when the policy does not
/// say (clock skew between the authorization server and this host).
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);

/// The shortest time between two fetches of the JWKS that a token with a
/// key id the cached set lacks may cause, unless the policy says: a flood
/// of tokens naming made-up keys fetches it at most this often.
pub const DEFAULT_JWKS_REFETCH: Duration = Duration::from_secs(10);

/// How long a fetched JWKS is used before it is fetched again (a key the
/// server stopped publishing stops working by then at the latest),
/// unless the policy says.
pub const DEFAULT_JWKS_MAX_AGE: Duration = Duration::from_secs(300);

/// The most MCP sessions an HTTP server holds open at once, all users'
/// together, unless the policy says (`[mcp] max_sessions`). Each costs
/// the server about 70 KiB while it lives (until its client ends it or
/// it idles out), so this bounds what a client that opens session after
/// session can take: about 70 MiB.
pub const DEFAULT_MAX_SESSIONS: usize = 1024;

/// The most connections an HTTP server serves at once, unless the policy
/// says (`[mcp] max_connections`): past it, new ones wait, unaccepted,
/// until one closes. An open connection costs the server 20–40 KiB (a
/// request being read, more), so this bounds what clients that open
/// connections and send little or nothing can take, whatever the
/// process's file descriptor limit: about 160 MiB.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// The most connections an HTTP server serves at once from one peer (an
/// IPv4 address, or an IPv6 address's /64, what one machine is given),
/// unless the policy says (`[mcp] max_connections_per_peer`): past it, a
/// new one from that peer is closed as soon as it is accepted, so one
/// client that opens connection after connection (or leaks them) cannot
/// take all of [`DEFAULT_MAX_CONNECTIONS`] and keep every other client
/// waiting. A server behind a reverse proxy sees every client as the
/// proxy's address: raise it there to the proxy's connections.
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 256;

/// The policy's `[mcp]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpSettings {
    /// Who may call over HTTP; `None` asks for no credentials.
    pub auth: Option<AuthSettings>,
    /// What one user may use at once.
    pub limits: UserLimits,
    /// The most MCP sessions an HTTP server holds open at once, all
    /// users' together ([`DEFAULT_MAX_SESSIONS`] unless told).
    pub max_sessions: usize,
    /// The most connections an HTTP server serves at once
    /// ([`DEFAULT_MAX_CONNECTIONS`] unless told).
    pub max_connections: usize,
    /// The most connections an HTTP server serves at once from one peer
    /// ([`DEFAULT_MAX_CONNECTIONS_PER_PEER`] unless told).
    pub max_connections_per_peer: usize,
    /// When a call becomes a task, and how long one is kept.
    pub tasks: TaskSettings,
    /// The environment variable holding the key that seals a 2026-07-28
    /// client's round states (the policy never holds the key itself);
    /// `None`: each process draws its own.
    pub state_key_env: Option<String>,
}

impl Default for McpSettings {
    fn default() -> Self {
        Self {
            auth: None,
            limits: UserLimits::default(),
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            tasks: TaskSettings::default(),
            state_key_env: None,
        }
    }
}

/// `[mcp.tasks]`: calls as tasks (the MCP tasks extension), for clients
/// that declare it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskSettings {
    /// A call still running this long after its request becomes a task
    /// (its handle answers the request); one that ends sooner is answered
    /// with its result. Zero makes every such call a task.
    pub after: Duration,
    /// How long after it starts a task can be looked up (`ttlMs`).
    pub ttl: Duration,
    /// How often a client is asked to poll (`pollIntervalMs`), and how
    /// often the host that runs a task reads its mail (answers and a
    /// cancellation another host left).
    pub poll: Duration,
}

impl Default for TaskSettings {
    fn default() -> Self {
        Self {
            after: Duration::from_secs(1),
            ttl: Duration::from_secs(24 * 60 * 60),
            poll: Duration::from_secs(1),
        }
    }
}

/// `[mcp.auth]`: the server is an OAuth 2.1 resource server (the MCP
/// authorization specification). Every HTTP request carries
/// `Authorization: Bearer TOKEN`, a token the issuer signed for this
/// server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSettings {
    /// The authorization server's issuer identifier: a token's `iss` must
    /// be exactly this.
    pub issuer: String,
    /// This server's canonical URL (RFC 8707 resource indicator,
    /// `https://mcp.example.com/mcp`): a token's `aud` must name it, and
    /// the protected resource metadata says it.
    pub audience: String,
    /// Where the issuer publishes its signing keys (a JWK set); `None`
    /// accepts only tokens the introspection endpoint vouches for.
    pub jwks_url: Option<String>,
    /// Algorithms a token may be signed with (from [`ALGORITHMS`]).
    pub algorithms: Vec<String>,
    /// Clock-skew allowance on `exp` and `nbf`.
    pub leeway: Duration,
    /// The claim whose value is the Airlock user (`sub` unless told).
    pub user_claim: String,
    /// Scopes every request needs, whatever it calls.
    pub scopes: Vec<String>,
    /// Authorization servers the protected resource metadata names
    /// (`[issuer]` unless told).
    pub authorization_servers: Vec<String>,
    /// The shortest time between two JWKS fetches an unknown key id causes.
    pub jwks_refetch: Duration,
    /// How long a fetched JWKS is used.
    pub jwks_max_age: Duration,
    /// RFC 7662 token introspection, for tokens that are not JWTs.
    pub introspection: Option<Introspection>,
}

/// `[mcp.auth.introspection]`: where to ask whether an opaque token is
/// active, and as whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Introspection {
    /// The endpoint (RFC 7662).
    pub url: String,
    /// This server's client id at the authorization server.
    pub client_id: String,
    /// The environment variable holding its client secret (the policy
    /// never holds the secret itself).
    pub client_secret_env: String,
    /// Introspections in flight at once, all requests' together: a
    /// request past it waits its turn (see [`DEFAULT_INTROSPECTIONS`]).
    pub max_concurrent: usize,
}

/// [`Introspection::max_concurrent`] unless the policy says: every
/// request with an opaque token costs the authorization server a
/// request, and tokens cost a client nothing to make up.
pub const DEFAULT_INTROSPECTIONS: usize = 16;

/// `[mcp.limits]`: what one user may use at once. `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserLimits {
    /// Tool calls running at once.
    pub concurrent_calls: Option<usize>,
    /// Tool calls started in any minute.
    pub calls_per_minute: Option<u32>,
    /// MCP sessions open at once.
    pub open_sessions: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct McpFile {
    auth: Option<AuthFile>,
    #[serde(default)]
    limits: LimitsFile,
    #[serde(default)]
    tasks: TasksFile,
    state_key_env: Option<String>,
    max_sessions: Option<usize>,
    max_connections: Option<usize>,
    max_connections_per_peer: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TasksFile {
    after_ms: Option<u64>,
    ttl_secs: Option<u64>,
    poll_ms: Option<u64>,
}

impl TasksFile {
    fn settings(self) -> Result<TaskSettings, String> {
        let default = TaskSettings::default();
        if self.ttl_secs == Some(0) {
            return Err("[mcp.tasks] ttl_secs must be at least 1".into());
        }
        if self.poll_ms.is_some_and(|ms| ms < 10) {
            return Err("[mcp.tasks] poll_ms must be at least 10".into());
        }
        Ok(TaskSettings {
            after: self.after_ms.map_or(default.after, Duration::from_millis),
            ttl: self.ttl_secs.map_or(default.ttl, Duration::from_secs),
            poll: self.poll_ms.map_or(default.poll, Duration::from_millis),
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthFile {
    issuer: String,
    audience: String,
    jwks_url: Option<String>,
    algorithms: Option<Vec<String>>,
    leeway_secs: Option<u64>,
    user_claim: Option<String>,
    #[serde(default)]
    scopes: Vec<String>,
    authorization_servers: Option<Vec<String>>,
    jwks_refetch_secs: Option<u64>,
    jwks_max_age_secs: Option<u64>,
    introspection: Option<IntrospectionFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IntrospectionFile {
    url: String,
    client_id: String,
    client_secret_env: String,
    max_concurrent: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    concurrent_calls: Option<usize>,
    calls_per_minute: Option<u32>,
    open_sessions: Option<usize>,
}

impl McpFile {
    /// The settings, checked; an error names the key at fault.
    pub(crate) fn settings(self) -> Result<McpSettings, String> {
        let auth = self.auth.map(AuthFile::settings).transpose()?;
        let tasks = self.tasks.settings()?;
        let limits = self.limits;
        for (key, value) in [
            ("concurrent_calls", limits.concurrent_calls),
            (
                "calls_per_minute",
                limits.calls_per_minute.map(|n| n as usize),
            ),
            ("open_sessions", limits.open_sessions),
        ] {
            if value == Some(0) {
                return Err(format!(
                    "[mcp.limits] {key} must be at least 1 (leave it out for no limit)"
                ));
            }
        }
        for (key, value) in [
            ("max_sessions", self.max_sessions),
            ("max_connections", self.max_connections),
            ("max_connections_per_peer", self.max_connections_per_peer),
        ] {
            if value == Some(0) {
                return Err(format!("[mcp] {key} must be at least 1"));
            }
        }
        Ok(McpSettings {
            auth,
            max_sessions: self.max_sessions.unwrap_or(DEFAULT_MAX_SESSIONS),
            max_connections: self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
            max_connections_per_peer: self
                .max_connections_per_peer
                .unwrap_or(DEFAULT_MAX_CONNECTIONS_PER_PEER),
            limits: UserLimits {
                concurrent_calls: limits.concurrent_calls,
                calls_per_minute: limits.calls_per_minute,
                open_sessions: limits.open_sessions,
            },
            tasks,
            state_key_env: self.state_key_env,
        })
    }
}

impl AuthFile {
    fn settings(self) -> Result<AuthSettings, String> {
        let url =
            |key: &str, text: &str| check_url(text).map_err(|e| format!("[mcp.auth] {key}: {e}"));
        url("issuer", &self.issuer)?;
        url("audience", &self.audience)?;
        if let Some(jwks) = &self.jwks_url {
            url("jwks_url", jwks)?;
        }
        let algorithms = match self.algorithms {
            None => DEFAULT_ALGORITHMS.iter().map(|a| (*a).to_owned()).collect(),
            Some(list) if list.is_empty() => {
                return Err("[mcp.auth] algorithms lists none".into());
            }
            Some(list) => list,
        };
        if let Some(bad) = algorithms
            .iter()
            .find(|a| !ALGORITHMS.contains(&a.as_str()))
        {
            return Err(format!(
                "[mcp.auth] algorithms: {bad:?} is not accepted; use one of {} (never `none`, \
                 never an HMAC algorithm: the JWKS is public)",
                ALGORITHMS.join(", ")
            ));
        }
        let introspection = match self.introspection {
            None => None,
            Some(i) => {
                url("introspection.url", &i.url)?;
                let max_concurrent = i.max_concurrent.unwrap_or(DEFAULT_INTROSPECTIONS);
                if max_concurrent == 0 {
                    return Err("[mcp.auth.introspection] max_concurrent must be at least 1".into());
                }
                Some(Introspection {
                    url: i.url,
                    client_id: i.client_id,
                    client_secret_env: i.client_secret_env,
                    max_concurrent,
                })
            }
        };
        if self.jwks_url.is_none() && introspection.is_none() {
            return Err(
                "[mcp.auth] needs `jwks_url` (to check signed tokens), `[mcp.auth.introspection]` \
                 (to ask about opaque ones), or both"
                    .into(),
            );
        }
        let authorization_servers = self
            .authorization_servers
            .unwrap_or_else(|| vec![self.issuer.clone()]);
        for server in &authorization_servers {
            url("authorization_servers", server)?;
        }
        let user_claim = self.user_claim.unwrap_or_else(|| "sub".into());
        if user_claim.is_empty() {
            return Err("[mcp.auth] user_claim is empty".into());
        }
        Ok(AuthSettings {
            issuer: self.issuer,
            audience: self.audience,
            jwks_url: self.jwks_url,
            algorithms,
            leeway: self.leeway_secs.map_or(DEFAULT_LEEWAY, Duration::from_secs),
            user_claim,
            scopes: self.scopes,
            authorization_servers,
            jwks_refetch: self
                .jwks_refetch_secs
                .map_or(DEFAULT_JWKS_REFETCH, Duration::from_secs),
            jwks_max_age: self
                .jwks_max_age_secs
                .map_or(DEFAULT_JWKS_MAX_AGE, Duration::from_secs),
            introspection,
        })
    }
}

/// An authorization server's URL: `https://…`, or `http://` to this
/// machine only (a token or key fetched in the clear from elsewhere could
/// be anyone's).
fn check_url(text: &str) -> Result<(), String> {
    let uri: http::Uri = text.parse().map_err(|_| format!("{text:?} is not a URL"))?;
    let host = uri.host().unwrap_or_default();
    match uri.scheme_str() {
        Some("https") if !host.is_empty() => Ok(()),
        Some("http") if super::grants::address::is_loopback_host(host) => Ok(()),
        Some("http") => Err(format!(
            "{text:?}: plain http is allowed only to this machine (localhost, 127.0.0.1, [::1]); \
             use https"
        )),
        _ => Err(format!("{text:?} is not an https:// URL")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> Result<McpSettings, String> {
        let file: McpFile = toml::from_str(text).map_err(|e| e.to_string())?;
        file.settings()
    }

    #[test]
    fn hmac_and_none_are_never_accepted() {
        let base = "[auth]\nissuer = \"https://as.example\"\naudience = \"https://mcp.example/mcp\"\n\
                    jwks_url = \"https://as.example/jwks\"\n";
        for alg in ["HS256", "none", "HS512"] {
            let err = settings(&format!("{base}algorithms = [\"{alg}\"]\n")).unwrap_err();
            assert!(err.contains("is not accepted"), "{alg}: {err}");
        }
        let ok = settings(base).unwrap();
        let auth = ok.auth.unwrap();
        assert_eq!(auth.algorithms, DEFAULT_ALGORITHMS);
        assert_eq!(auth.authorization_servers, ["https://as.example"]);
        assert_eq!(auth.user_claim, "sub");
    }

    #[test]
    fn keys_come_over_https_or_from_this_machine() {
        let with = |jwks: &str| {
            settings(&format!(
                "[auth]\nissuer = \"https://as.example\"\naudience = \"https://mcp.example/mcp\"\n\
                 jwks_url = \"{jwks}\"\n"
            ))
        };
        assert!(with("http://127.0.0.1:9000/jwks").is_ok());
        assert!(with("http://localhost:9000/jwks").is_ok());
        let err = with("http://as.example/jwks").unwrap_err();
        assert!(
            err.contains("jwks_url") && err.contains("plain http"),
            "{err}"
        );
        let none = settings(
            "[auth]\nissuer = \"https://as.example\"\naudience = \"https://mcp.example/mcp\"\n",
        )
        .unwrap_err();
        assert!(none.contains("needs `jwks_url`"), "{none}");
    }

    #[test]
    fn a_zero_limit_is_refused_by_name() {
        let err = settings("[limits]\ncalls_per_minute = 0\n").unwrap_err();
        assert!(err.contains("calls_per_minute"), "{err}");
        let ok = settings("[limits]\nconcurrent_calls = 2\n").unwrap();
        assert_eq!(ok.limits.concurrent_calls, Some(2));
        assert_eq!(ok.auth, None);
        assert_eq!(
            ok.max_connections_per_peer,
            DEFAULT_MAX_CONNECTIONS_PER_PEER
        );
        let err = settings("max_connections_per_peer = 0\n").unwrap_err();
        assert!(
            err.contains("[mcp] max_connections_per_peer must be at least 1"),
            "{err}"
        );
        let per_peer = settings("max_connections_per_peer = 3\n").unwrap();
        assert_eq!(per_peer.max_connections_per_peer, 3);

        let introspection = |extra: &str| {
            settings(&format!(
                "[auth]\nissuer = \"https://as.example\"\naudience = \"https://mcp.example/mcp\"\n\
                 [auth.introspection]\nurl = \"https://as.example/introspect\"\n\
                 client_id = \"airlock\"\nclient_secret_env = \"S\"\n{extra}"
            ))
        };
        let err = introspection("max_concurrent = 0\n").unwrap_err();
        assert!(
            err.contains("[mcp.auth.introspection] max_concurrent"),
            "{err}"
        );
        let bound = |s: McpSettings| {
            s.auth
                .and_then(|a| a.introspection)
                .map(|i| i.max_concurrent)
        };
        assert_eq!(
            bound(introspection("").unwrap()),
            Some(DEFAULT_INTROSPECTIONS)
        );
        assert_eq!(
            bound(introspection("max_concurrent = 3\n").unwrap()),
            Some(3)
        );
    }
}
