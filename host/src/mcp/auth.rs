//! HTTP MCP as an OAuth 2.1 resource server (the MCP authorization
//! specification): who a request comes from, from its bearer token.
//!
//! A signed token (a JWT) is checked here against the issuer's JWK set:
//! its signature with a key of the set and an algorithm the policy
//! accepts (never `none`, never HMAC, whatever the token's header says,
//! and never with a key the set marks for encryption or another
//! algorithm), its `iss`, its `aud` (this server), `exp` and `nbf` within
//! the policy's leeway, and the scopes every request needs. A token that
//! is not a JWT is asked about at the introspection endpoint (RFC 7662),
//! when the policy names one. The set is fetched at start, used for
//! [`AuthSettings::jwks_max_age`], and fetched again when a token names a
//! key it lacks, at most once per [`AuthSettings::jwks_refetch`] (one
//! fetch at a time): a rotated key works at once, a key the issuer
//! dropped stops working with the next fetch, and tokens naming made-up
//! keys cannot make the server hammer the issuer.
//!
//! Cost per request, keys cached: a read lock of the set, a map lookup,
//! and the token's signature check and claims' parse (an RS256 check is
//! the bulk, about 15 µs here; `make bench` measures it). An introspected
//! token costs a round trip to the authorization server on every request:
//! nothing is cached, so a revoked token stops at once. At most
//! `max_concurrent` introspections are in flight at once (a request past
//! it waits its turn), so made-up opaque tokens cannot make the server
//! hammer the authorization server either.
//!
//! A refusal tells the client where to find the protected resource
//! metadata (RFC 9728, [`Authenticator::metadata`]), which names the
//! authorization server, in a `WWW-Authenticate` header. Its description
//! says what was wrong with the token in general terms (expired, another
//! audience) and never echoes the token.

use std::collections::{BTreeSet, HashMap};
use std::sync::{PoisonError, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use crate::policy::AuthSettings;

/// Where the protected resource metadata is served, under the root of
/// the server (and also with the resource's path after it, RFC 9728
/// §3.1).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// The largest JWK set or introspection answer read.
const MAX_DOCUMENT_BYTES: u64 = 1 << 20;

/// How long a fetch of the JWK set or an introspection may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Who a request comes from, as its token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The Airlock user: the token's subject, or the claim the policy
    /// names.
    pub user: String,
    /// The OAuth client the token was issued to (`client_id`, else
    /// `azp`), when the token says.
    pub client_id: Option<String>,
    /// The scopes the token grants.
    pub scopes: BTreeSet<String>,
}

impl Caller {
    /// Whether the token grants every scope of `needed`.
    pub fn has_scopes(&self, needed: &[String]) -> bool {
        needed.iter().all(|s| self.scopes.contains(s))
    }
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// No `Authorization: Bearer` header (401).
    #[error("this server needs an OAuth access token (Authorization: Bearer)")]
    Missing,
    /// The token is not one this server accepts (401); what was wrong, in
    /// general terms.
    #[error("the access token is not valid: {0}")]
    Invalid(String),
    /// The token lacks scopes every request needs (403); they are named.
    #[error("the access token lacks the scope {0}")]
    InsufficientScope(String),
    /// The authorization server could not be asked (503): its keys or its
    /// introspection endpoint are out of reach.
    #[error("cannot check access tokens now: {0}")]
    Unavailable(String),
}

/// Why an [`Authenticator`] could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthSetupError {
    /// The introspection secret's environment variable is not set.
    #[error("[mcp.auth.introspection] client_secret_env: the environment variable {0} is not set")]
    MissingSecret(String),
    /// The HTTP client could not be built.
    #[error("[mcp.auth]: {0}")]
    Client(String),
    /// The JWK set could not be fetched or holds no usable key.
    #[error("[mcp.auth] jwks_url {url}: {problem}")]
    Keys {
        /// The set's URL.
        url: String,
        /// What went wrong.
        problem: String,
    },
}

/// Checks bearer tokens for one resource server (see the module's
/// documentation).
pub struct Authenticator {
    settings: AuthSettings,
    /// The accepted algorithms, each with the checks of its tokens (made
    /// once: a check allocates none).
    algorithms: Vec<(Algorithm, Validation)>,
    http: reqwest::Client,
    keys: RwLock<KeySet>,
    /// Held by the one fetch of the set at a time.
    fetching: tokio::sync::Mutex<()>,
    /// A place for each introspection in flight
    /// ([`Introspection::max_concurrent`](crate::policy::mcp::Introspection::max_concurrent)).
    introspecting: tokio::sync::Semaphore,
    secret: Option<String>,
    metadata_url: String,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("issuer", &self.settings.issuer)
            .field("audience", &self.settings.audience)
            .finish_non_exhaustive()
    }
}

/// The issuer's keys as last fetched.
#[derive(Default)]
struct KeySet {
    by_id: HashMap<String, Key>,
    /// Keys without a `kid`, tried for a token that names none.
    unnamed: Vec<Key>,
    /// When they were fetched (`None`: never).
    fetched: Option<Instant>,
}

struct Key {
    decoding: DecodingKey,
    /// The one algorithm the set allows for this key, when it says.
    algorithm: Option<Algorithm>,
}

/// The claims read from a token; the signature and the registered
/// claims (`exp`, `nbf`, `iss`, `aud`) are checked by jsonwebtoken.
type Claims = serde_json::Map<String, Value>;

impl Authenticator {
    /// Checks tokens as `settings` say, the introspection secret read
    /// from the environment variable they name; see
    /// [`Authenticator::with_secret`].
    pub async fn new(settings: AuthSettings) -> Result<Self, AuthSetupError> {
        let secret = match &settings.introspection {
            None => None,
            Some(i) => Some(
                std::env::var(&i.client_secret_env)
                    .map_err(|_| AuthSetupError::MissingSecret(i.client_secret_env.clone()))?,
            ),
        };
        Self::with_secret(settings, secret).await
    }

    /// Checks tokens as `settings` say, introspecting with `secret` (this
    /// server's client secret at the authorization server); fetches the
    /// JWK set now, so a server whose keys are out of reach does not
    /// start.
    pub async fn with_secret(
        settings: AuthSettings,
        secret: Option<String>,
    ) -> Result<Self, AuthSetupError> {
        let tls = crate::tls::client_config().map_err(AuthSetupError::Client)?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls((*tls).clone())
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("airlock/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| AuthSetupError::Client(format!("cannot build an HTTP client: {e}")))?;
        let algorithms = settings
            .algorithms
            .iter()
            .filter_map(|name| name.parse::<Algorithm>().ok())
            .map(|algorithm| {
                let mut validation = Validation::new(algorithm);
                validation.leeway = settings.leeway.as_secs();
                validation.set_audience(&[&settings.audience]);
                validation.set_issuer(&[&settings.issuer]);
                validation.set_required_spec_claims(&["exp", "iss", "aud"]);
                validation.validate_nbf = true;
                (algorithm, validation)
            })
            .collect();
        let metadata_url = metadata_url(&settings.audience);
        let places = settings
            .introspection
            .as_ref()
            .map_or(0, |i| i.max_concurrent);
        let authenticator = Self {
            settings,
            algorithms,
            http,
            keys: RwLock::default(),
            fetching: tokio::sync::Mutex::new(()),
            introspecting: tokio::sync::Semaphore::new(places),
            secret,
            metadata_url,
        };
        if let Some(url) = &authenticator.settings.jwks_url {
            let keys =
                authenticator
                    .fetch_keys(url)
                    .await
                    .map_err(|problem| AuthSetupError::Keys {
                        url: url.clone(),
                        problem,
                    })?;
            *authenticator.write_keys() = keys;
        }
        Ok(authenticator)
    }

    /// What the server checks tokens against.
    pub fn settings(&self) -> &AuthSettings {
        &self.settings
    }

    /// Who the request with `authorization` (its `Authorization` header)
    /// comes from.
    pub async fn authenticate(
        &self,
        authorization: Option<&http::HeaderValue>,
    ) -> Result<Caller, AuthError> {
        let token = authorization
            .and_then(|h| h.to_str().ok())
            .and_then(|h| {
                let (scheme, token) = h.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or(AuthError::Missing)?;
        let caller = if token.split('.').count() == 3 {
            self.check_jwt(token).await?
        } else if self.settings.introspection.is_some() {
            self.introspect(token).await?
        } else {
            return Err(AuthError::Invalid("not a signed token (JWT)".into()));
        };
        let missing: Vec<&str> = self
            .settings
            .scopes
            .iter()
            .filter(|s| !caller.scopes.contains(*s))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(AuthError::InsufficientScope(missing.join(" ")));
        }
        Ok(caller)
    }

    /// A JWT's caller: its signature, registered claims and user checked.
    async fn check_jwt(&self, token: &str) -> Result<Caller, AuthError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| AuthError::Invalid("its header is not one this server reads".into()))?;
        let Some((_, validation)) = self.algorithms.iter().find(|(a, _)| *a == header.alg) else {
            return Err(AuthError::Invalid(format!(
                "it is signed with {:?}, which this server does not accept",
                header.alg
            )));
        };
        if self.settings.jwks_url.is_none() {
            return Err(AuthError::Invalid(
                "this server accepts only tokens it can introspect".into(),
            ));
        }
        let kid = header.kid.as_deref();
        if self.stale() || !self.knows(kid) {
            self.refetch(kid).await?;
        }
        let claims = {
            let keys = self.read_keys();
            let candidates: Vec<&Key> = match kid {
                Some(kid) => keys.by_id.get(kid).into_iter().collect(),
                None => keys.unnamed.iter().collect(),
            };
            if candidates.is_empty() {
                return Err(AuthError::Invalid(
                    "it names no key the issuer publishes".into(),
                ));
            }
            let mut last = None;
            let mut found = None;
            for key in candidates {
                if key.algorithm.is_some_and(|a| a != header.alg) {
                    last = Some(jsonwebtoken::errors::ErrorKind::InvalidAlgorithm.into());
                    continue;
                }
                match jsonwebtoken::decode::<Claims>(token, &key.decoding, validation) {
                    Ok(data) => {
                        found = Some(data.claims);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            match (found, last) {
                (Some(claims), _) => claims,
                (None, Some(e)) => return Err(AuthError::Invalid(jwt_problem(&e))),
                (None, None) => return Err(AuthError::Invalid("no key checks it".into())),
            }
        };
        self.caller_of(&claims)
    }

    /// An opaque token's caller, as the introspection endpoint says.
    async fn introspect(&self, token: &str) -> Result<Caller, AuthError> {
        let Some(endpoint) = &self.settings.introspection else {
            return Err(AuthError::Invalid("not a signed token (JWT)".into()));
        };
        let unavailable = |e: String| AuthError::Unavailable(format!("introspection: {e}"));
        // Requests past the bound wait their turn, in order, as long as
        // one introspection may take.
        let _place = tokio::time::timeout(FETCH_TIMEOUT, self.introspecting.acquire())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or_else(|| {
                unavailable(format!(
                    "{} are in flight ([mcp.auth.introspection] max_concurrent) and none ended \
                     within {} s",
                    endpoint.max_concurrent,
                    FETCH_TIMEOUT.as_secs()
                ))
            })?;
        let response = self
            .http
            .post(&endpoint.url)
            .basic_auth(&endpoint.client_id, self.secret.as_deref())
            .form(&[("token", token), ("token_type_hint", "access_token")])
            .send()
            .await
            .map_err(|e| unavailable(crate::text::error_chain(&e)))?;
        if !response.status().is_success() {
            return Err(unavailable(format!("answered {}", response.status())));
        }
        let body = read_bounded(response).await.map_err(unavailable)?;
        let answer: Claims = serde_json::from_slice(&body)
            .map_err(|e| unavailable(format!("not a JSON object: {e}")))?;
        if answer.get("active") != Some(&Value::Bool(true)) {
            return Err(AuthError::Invalid(
                "it is not active (revoked or expired)".into(),
            ));
        }
        if let Some(iss) = answer.get("iss")
            && iss.as_str() != Some(&self.settings.issuer)
        {
            return Err(AuthError::Invalid("another issuer made it".into()));
        }
        if let Some(aud) = answer.get("aud")
            && !audience_names(aud, &self.settings.audience)
        {
            return Err(AuthError::Invalid("it is for another audience".into()));
        }
        self.caller_of(&answer)
    }

    /// The caller `claims` name: the user claim, the client, the scopes.
    fn caller_of(&self, claims: &Claims) -> Result<Caller, AuthError> {
        let user = claims
            .get(&self.settings.user_claim)
            .and_then(Value::as_str)
            .filter(|u| crate::session::check_user_id(u).is_ok())
            .ok_or_else(|| {
                AuthError::Invalid(format!(
                    "its {:?} claim is missing or not a usable user id",
                    self.settings.user_claim
                ))
            })?;
        let client_id = ["client_id", "azp"]
            .iter()
            .find_map(|c| claims.get(*c).and_then(Value::as_str))
            .map(str::to_owned);
        let mut scopes = BTreeSet::new();
        for claim in ["scope", "scp"] {
            match claims.get(claim) {
                Some(Value::String(list)) => {
                    scopes.extend(list.split_ascii_whitespace().map(str::to_owned));
                }
                Some(Value::Array(list)) => {
                    scopes.extend(list.iter().filter_map(Value::as_str).map(str::to_owned));
                }
                _ => {}
            }
        }
        Ok(Caller {
            user: user.to_owned(),
            client_id,
            scopes,
        })
    }

    fn read_keys(&self) -> std::sync::RwLockReadGuard<'_, KeySet> {
        self.keys.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_keys(&self) -> std::sync::RwLockWriteGuard<'_, KeySet> {
        self.keys.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the set was fetched longer than its max age ago.
    fn stale(&self) -> bool {
        self.read_keys()
            .fetched
            .is_none_or(|at| at.elapsed() >= self.settings.jwks_max_age)
    }

    /// Whether the set holds a key for `kid` (any key, for a token that
    /// names none).
    fn knows(&self, kid: Option<&str>) -> bool {
        let keys = self.read_keys();
        match kid {
            Some(kid) => keys.by_id.contains_key(kid),
            None => !keys.unnamed.is_empty(),
        }
    }

    /// Fetches the set again, unless it was fetched within the refetch
    /// interval (or, once this fetch's turn comes, another fetch brought
    /// `kid` meanwhile). A failed fetch keeps the keys it had.
    async fn refetch(&self, kid: Option<&str>) -> Result<(), AuthError> {
        let Some(url) = &self.settings.jwks_url else {
            return Ok(());
        };
        let _turn = self.fetching.lock().await;
        let recent = self
            .read_keys()
            .fetched
            .is_some_and(|at| at.elapsed() < self.settings.jwks_refetch);
        if recent || (self.knows(kid) && !self.stale()) {
            return Ok(());
        }
        match self.fetch_keys(url).await {
            Ok(keys) => {
                *self.write_keys() = keys;
                Ok(())
            }
            Err(problem) => {
                tracing::warn!(url = %url, %problem, "cannot fetch the issuer's keys");
                // Not asked again before the interval passes.
                self.write_keys().fetched = Some(Instant::now());
                if self.knows(kid) {
                    Ok(())
                } else {
                    Err(AuthError::Unavailable(format!(
                        "the issuer's keys: {problem}"
                    )))
                }
            }
        }
    }

    /// The JWK set at `url`: its signing keys that are not symmetric.
    async fn fetch_keys(&self, url: &str) -> Result<KeySet, String> {
        let response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| crate::text::error_chain(&e))?;
        if !response.status().is_success() {
            return Err(format!("answered {}", response.status()));
        }
        let body = read_bounded(response).await?;
        let document: Value =
            serde_json::from_slice(&body).map_err(|e| format!("not a JWK set: {e}"))?;
        let listed = document
            .get("keys")
            .and_then(Value::as_array)
            .ok_or("not a JWK set: no \"keys\" array")?;
        let mut set = KeySet {
            fetched: Some(Instant::now()),
            ..KeySet::default()
        };
        for entry in listed {
            let Some(key) = usable_key(entry) else {
                continue;
            };
            let (kid, key) = key;
            match kid {
                Some(kid) => {
                    set.by_id.insert(kid, key);
                }
                None => set.unnamed.push(key),
            }
        }
        if set.by_id.is_empty() && set.unnamed.is_empty() {
            return Err("the set holds no signing key this server can use".into());
        }
        Ok(set)
    }

    /// The protected resource metadata (RFC 9728): this resource, the
    /// authorization servers, the scopes it knows of, and that tokens
    /// come in the `Authorization` header.
    pub fn metadata(&self, scopes: &BTreeSet<String>) -> Value {
        let mut all: BTreeSet<&str> = scopes.iter().map(String::as_str).collect();
        all.extend(self.settings.scopes.iter().map(String::as_str));
        serde_json::json!({
            "resource": self.settings.audience,
            "authorization_servers": self.settings.authorization_servers,
            "scopes_supported": all,
            "bearer_methods_supported": ["header"],
            "resource_name": "Airlock",
        })
    }

    /// The `WWW-Authenticate` header that answers a refusal for `error`,
    /// and the status that goes with it.
    pub fn challenge(&self, error: &AuthError) -> (http::StatusCode, String) {
        let quoted = |text: &str| text.replace(['\\', '"'], "'");
        let metadata = format!("resource_metadata=\"{}\"", self.metadata_url);
        match error {
            AuthError::Missing => (http::StatusCode::UNAUTHORIZED, format!("Bearer {metadata}")),
            AuthError::Invalid(why) => (
                http::StatusCode::UNAUTHORIZED,
                format!(
                    "Bearer error=\"invalid_token\", error_description=\"{}\", {metadata}",
                    quoted(why)
                ),
            ),
            AuthError::InsufficientScope(scope) => (
                http::StatusCode::FORBIDDEN,
                format!(
                    "Bearer error=\"insufficient_scope\", scope=\"{}\", {metadata}",
                    quoted(scope)
                ),
            ),
            AuthError::Unavailable(_) => (
                http::StatusCode::SERVICE_UNAVAILABLE,
                format!("Bearer {metadata}"),
            ),
        }
    }
}

/// A key of a JWK set this server may check signatures with: not
/// symmetric (an `oct` key in a public set would let anyone sign), not
/// marked for encryption. Its `kid`, if it has one.
fn usable_key(entry: &Value) -> Option<(Option<String>, Key)> {
    let jwk: Jwk = serde_json::from_value(entry.clone())
        .map_err(|e| tracing::debug!(error = %e, "a JWK this server cannot read is skipped"))
        .ok()?;
    if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_))
        || matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption))
    {
        return None;
    }
    let decoding = DecodingKey::from_jwk(&jwk).ok()?;
    let algorithm = jwk
        .common
        .key_algorithm
        .and_then(|a| a.to_string().parse::<Algorithm>().ok());
    Some((
        jwk.common.key_id,
        Key {
            decoding,
            algorithm,
        },
    ))
}

/// Whether `aud` (a string or a list of them) names `audience`.
fn audience_names(aud: &Value, audience: &str) -> bool {
    match aud {
        Value::String(one) => one == audience,
        Value::Array(all) => all.iter().any(|a| a.as_str() == Some(audience)),
        _ => false,
    }
}

/// What was wrong with a JWT, in general terms.
fn jwt_problem(error: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind as K;
    match error.kind() {
        K::ExpiredSignature => "it has expired".into(),
        K::ImmatureSignature => "it is not valid yet".into(),
        K::InvalidAudience => "it is for another audience".into(),
        K::InvalidIssuer => "another issuer made it".into(),
        K::InvalidSignature => "its signature does not check".into(),
        K::InvalidAlgorithm => "its algorithm does not go with its key".into(),
        K::MissingRequiredClaim(claim) => format!("it has no {claim:?} claim"),
        _ => "it cannot be read".into(),
    }
}

/// `response`'s body, at most [`MAX_DOCUMENT_BYTES`].
async fn read_bounded(response: reqwest::Response) -> Result<Vec<u8>, String> {
    crate::tls::read_bounded(response, MAX_DOCUMENT_BYTES)
        .await
        .map_err(|e| crate::text::error_chain(&e))?
        .ok_or_else(|| format!("the answer is over {MAX_DOCUMENT_BYTES} bytes"))
}

/// Where the metadata of resource `audience` is (RFC 9728 §3.1): the
/// well-known path between its host and its path.
fn metadata_url(audience: &str) -> String {
    match audience.parse::<http::Uri>() {
        Ok(uri) if uri.scheme().is_some() && uri.authority().is_some() => {
            let path = uri.path().trim_end_matches('/');
            format!(
                "{}://{}{METADATA_PATH}{path}",
                uri.scheme_str().unwrap_or("https"),
                uri.authority().map_or("", |a| a.as_str()),
            )
        }
        _ => format!("{audience}{METADATA_PATH}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metadata_sits_between_host_and_path() {
        assert_eq!(
            metadata_url("https://mcp.example.com/mcp"),
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            metadata_url("http://127.0.0.1:8931/"),
            "http://127.0.0.1:8931/.well-known/oauth-protected-resource"
        );
    }

    #[test]
    fn a_symmetric_or_encryption_key_is_never_used() {
        let oct = serde_json::json!({"kty": "oct", "kid": "k", "k": "c2VjcmV0"});
        assert!(usable_key(&oct).is_none());
        let enc = serde_json::json!({"kty": "EC", "use": "enc", "crv": "P-256",
            "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
            "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"});
        assert!(usable_key(&enc).is_none());
        let sig = serde_json::json!({"kty": "EC", "kid": "ec", "crv": "P-256",
            "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
            "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"});
        assert_eq!(
            usable_key(&sig).map(|(kid, _)| kid),
            Some(Some("ec".into()))
        );
    }
}
