//! Talking to a registry over the OCI distribution API: resolving a
//! reference to a manifest and its component layer, downloading the layer
//! into the store (checked against its digest as it streams, bounded in
//! size), pushing the wasm artifact layout and cosign signatures.
//!
//! Every request goes through one client per reference whose resolver,
//! redirect policy and URL check are the private-address rule
//! ([`Guard`]), and every body read is bounded. Credentials go only to the
//! host they were given for ([`Credentials`]): the registry's own
//! requests, and a token service only when credentials are filed for its
//! host; never across a redirect to another host.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};
use sha2::{Digest as _, Sha256};

use super::credentials::Auth;
use super::guard::{Guard, refusal, shown};
use super::manifest::{
    Descriptor, ImageManifest, MANIFEST_TYPES, Names, names, nested_index, sha256_digest,
};
use super::signature::{self, PAYLOAD_MEDIA_TYPE, SIGNATURE_ANNOTATION, Signature};
use super::{Credentials, OciError, OciSettings, OciStore, Reference};

/// Largest signature payload read.
const MAX_PAYLOAD_BYTES: u64 = 64 << 10;

/// Most signatures read for one manifest.
const MAX_SIGNATURES: usize = 64;

/// Largest token-service answer, or error body, read.
const MAX_SMALL_BODY: u64 = 64 << 10;

/// How long connecting to a registry may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a registry may leave a response without a byte.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// What a request is for: the token scope it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Pull = 0,
    Push = 1,
}

/// One registry, for one reference.
pub struct Registry {
    http: reqwest::Client,
    guard: Guard,
    credentials: Credentials,
    /// `SCHEME://REGISTRY`.
    base: Url,
    pub(super) reference: Reference,
    settings: OciSettings,
    /// The `Authorization` for pulls and for pushes once known (`Some(None)`:
    /// none is needed or none can be had).
    authorized: Mutex<[Option<Option<HeaderValue>>; 2]>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("reference", &self.reference)
            .finish_non_exhaustive()
    }
}

/// What a reference resolved to at the registry.
#[derive(Debug, Clone)]
pub struct Resolution {
    /// The digest of the manifest the reference names.
    pub manifest: String,
    /// The component layer (its `urls` dropped).
    pub layer: Descriptor,
    /// Each manifest read, by digest: the one named, then the index's
    /// entry when it is an index.
    pub manifests: Vec<(String, Vec<u8>)>,
}

impl Registry {
    /// A client for `reference`'s registry: HTTPS (through the process's
    /// rustls, ring provider), or plain HTTP when `settings.insecure` and
    /// the registry is on this machine; anything else asked insecure is
    /// refused.
    pub fn connect(
        reference: &Reference,
        settings: &OciSettings,
        credentials: &Credentials,
    ) -> Result<Self, OciError> {
        crate::tls::install_default_provider();
        if settings.insecure && !reference.is_loopback() {
            return Err(OciError::Insecure {
                reference: reference.clone(),
            });
        }
        let problem = |problem: String| OciError::Registry {
            reference: reference.clone(),
            problem,
        };
        let scheme = if settings.insecure { "http" } else { "https" };
        let base: Url = format!("{scheme}://{}/", reference.registry())
            .parse()
            .map_err(|e| problem(format!("the registry is not a host: {e}")))?;
        let guard = Guard::new(reference, settings.insecure);
        let tls = crate::tls::client_config().map_err(problem)?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls((*tls).clone())
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .no_proxy()
            .dns_resolver(Arc::new(guard.clone()))
            .redirect(guard.redirects())
            .user_agent(concat!("airlock/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| problem(format!("cannot build an HTTP client: {e}")))?;
        Ok(Self {
            http,
            guard,
            credentials: credentials.clone(),
            base,
            reference: reference.clone(),
            settings: settings.clone(),
            authorized: Mutex::default(),
        })
    }

    /// `SCHEME://REGISTRY/v2/REPOSITORY/{path}`.
    fn api(&self, path: &str) -> String {
        format!("{}v2/{}/{path}", self.base, self.reference.repository())
    }

    /// Whether `url` is on the registry's own origin (scheme, host, port).
    fn is_registry(&self, url: &Url) -> bool {
        url.scheme() == self.base.scheme()
            && url
                .host_str()
                .zip(self.base.host_str())
                .is_some_and(|(a, b)| a.eq_ignore_ascii_case(b))
            && url.port_or_known_default() == self.base.port_or_known_default()
    }

    fn registry_error(&self, problem: String) -> OciError {
        OciError::Registry {
            reference: self.reference.clone(),
            problem,
        }
    }

    /// A request to `url`, checked by the guard first, with the registry's
    /// authorization only when it goes to the registry itself.
    async fn request(
        &self,
        method: Method,
        url: &str,
        access: Access,
    ) -> Result<RequestBuilder, OciError> {
        let url = self.checked(url)?;
        let authorization = if self.is_registry(&url) {
            self.authorization(access).await?
        } else {
            None
        };
        let request = self.http.request(method, url);
        Ok(match authorization {
            Some(value) => request.header(AUTHORIZATION, value),
            None => request,
        })
    }

    async fn send(&self, request: RequestBuilder, what: &str) -> Result<Response, OciError> {
        request
            .send()
            .await
            .map_err(|e| self.request_failed(what, &e))
    }

    /// The error for a request that got no (whole) answer: refused by the
    /// guard, unreachable, or cut off (a truncated download).
    fn request_failed(&self, what: &str, e: &reqwest::Error) -> OciError {
        let reference = self.reference.clone();
        if let Some(refused) = refusal(e) {
            return OciError::Refused {
                reference,
                refused: refused.clone(),
            };
        }
        let mut problem = crate::text::truncate(&crate::text::error_chain(e), 300);
        if e.is_connect() || (e.is_timeout() && !e.is_body()) {
            // A registry on this machine that answers HTTPS with plain
            // HTTP is a registry run for testing: say which flag reaches it.
            if !self.settings.insecure && reference.is_loopback() && e.is_connect() {
                problem.push_str(
                    "; a registry on this machine that serves plain HTTP is reached with \
                     --insecure (or `[oci] insecure = true`)",
                );
            }
            OciError::Unreachable { reference, problem }
        } else {
            OciError::Registry {
                reference,
                problem: format!("the {what} could not be read whole: {problem}"),
            }
        }
    }

    /// The error for an answer other than the one expected: not found,
    /// refused, or what the registry says (bounded, shortened: it is the
    /// registry's text, not ours).
    async fn answered(&self, what: &str, response: Response) -> OciError {
        let reference = self.reference.clone();
        let status = response.status();
        match status.as_u16() {
            404 => OciError::NotFound { reference },
            401 | 403 => OciError::AuthRefused {
                reference,
                problem: format!("the registry answered {status}"),
            },
            _ => {
                let said = crate::tls::read_bounded(response, MAX_SMALL_BODY)
                    .await
                    .ok()
                    .flatten()
                    .map(|body| String::from_utf8_lossy(&body).trim().to_owned())
                    .unwrap_or_default();
                let said = if said.is_empty() {
                    String::new()
                } else {
                    format!(": {}", crate::text::truncate(&said, 200))
                };
                OciError::Registry {
                    reference,
                    problem: format!("the registry answered {status} for the {what}{said}"),
                }
            }
        }
    }

    /// The `Authorization` the registry wants for `access`, found once: a
    /// token given as one; else, as the registry's challenge asks, basic
    /// auth or a token from its token service.
    async fn authorization(&self, access: Access) -> Result<Option<HeaderValue>, OciError> {
        let known = self
            .authorized
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[access as usize]
            .clone();
        if let Some(known) = known {
            return Ok(known);
        }
        let own = self.credentials.for_registry(self.reference.registry());
        let found = match &own {
            Auth::Bearer(token) => header(&format!("Bearer {token}")),
            _ => self.handshake(&own, access).await?,
        };
        self.authorized
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[access as usize] = Some(found.clone());
        Ok(found)
    }

    /// Asks `/v2/` what authentication the registry wants, and gets it.
    async fn handshake(&self, own: &Auth, access: Access) -> Result<Option<HeaderValue>, OciError> {
        let url = format!("{}v2/", self.base);
        let request = self.request_unauthorized(&url)?;
        let response = self.send(request, "registry's API root").await?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return Ok(basic(own));
        }
        let challenge = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(Challenge::parse);
        match challenge {
            Some(Challenge::Bearer { realm, service }) => {
                self.token(&realm, service.as_deref(), access).await
            }
            _ => Ok(basic(own)),
        }
    }

    /// A request with no credentials at all, checked by the guard.
    fn request_unauthorized(&self, url: &str) -> Result<RequestBuilder, OciError> {
        Ok(self.http.get(self.checked(url)?))
    }

    /// `url`, parsed and passed by the guard: every request starts here.
    fn checked(&self, url: &str) -> Result<Url, OciError> {
        let url: Url = url
            .parse()
            .map_err(|e| self.registry_error(format!("{url:?} is not a URL: {e}")))?;
        self.guard
            .check(&url)
            .map_err(|refused| OciError::Refused {
                reference: self.reference.clone(),
                refused,
            })?;
        Ok(url)
    }

    /// A token from the service at `realm` for this repository: with the
    /// credentials filed for the service's own host (`host[:port]`), and
    /// none when there are none (an anonymous token, as for a public
    /// repository).
    async fn token(
        &self,
        realm: &str,
        service: Option<&str>,
        access: Access,
    ) -> Result<Option<HeaderValue>, OciError> {
        let mut url: Url = realm
            .parse()
            .map_err(|_| self.registry_error("its token service's realm is not a URL".into()))?;
        let scope = match access {
            Access::Pull => format!("repository:{}:pull", self.reference.repository()),
            Access::Push => format!("repository:{}:pull,push", self.reference.repository()),
        };
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("scope", &scope);
            if let Some(service) = service {
                query.append_pair("service", service);
            }
        }
        let mut request = self.request_unauthorized(url.as_str())?;
        let authority = match (url.host_str(), url.port()) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            (Some(host), None) => host.to_owned(),
            (None, _) => String::new(),
        };
        if let Auth::Basic(user, password) = self.credentials.for_registry(&authority) {
            request = request.basic_auth(user, Some(password));
        }
        let response = self.send(request, "token").await?;
        if !response.status().is_success() {
            return Err(OciError::AuthRefused {
                reference: self.reference.clone(),
                problem: format!(
                    "its token service {} answered {}",
                    shown(&url),
                    response.status()
                ),
            });
        }
        let body = crate::tls::read_bounded(response, MAX_SMALL_BODY)
            .await
            .map_err(|e| self.request_failed("token", &e))?
            .ok_or_else(|| self.registry_error("its token service's answer is too long".into()))?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let token: Token = serde_json::from_slice(&body)
            .map_err(|_| self.registry_error("its token service did not answer a token".into()))?;
        let token = token.token.or(token.access_token).unwrap_or_default();
        Ok(header(&format!("Bearer {token}")))
    }

    /// Reads the manifest `at` names: its digest and bytes, refused past
    /// `max_manifest_bytes` whatever the registry declares; the bytes are
    /// checked against the digest the reference pins and the one the
    /// registry states.
    pub(super) async fn manifest_at(&self, at: &Reference) -> Result<(String, Vec<u8>), OciError> {
        let name = at.digest().or(at.tag()).unwrap_or("latest");
        let request = self
            .request(
                Method::GET,
                &self.api(&format!("manifests/{name}")),
                Access::Pull,
            )
            .await?
            .header(ACCEPT, MANIFEST_TYPES.join(", "));
        let response = self.send(request, "manifest").await?;
        if response.status() != StatusCode::OK {
            return Err(self.answered("manifest", response).await);
        }
        let limit = self.settings.max_manifest_bytes;
        let too_large = |size: u64| OciError::TooLarge {
            reference: self.reference.clone(),
            what: "manifest",
            size,
            limit,
        };
        if let Some(size) = response.content_length().filter(|size| *size > limit) {
            return Err(too_large(size));
        }
        let stated = response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = crate::tls::read_bounded(response, limit)
            .await
            .map_err(|e| self.request_failed("manifest", &e))?
            .ok_or_else(|| too_large(limit.saturating_add(1)))?;
        let digest = sha256_digest(&bytes);
        for expected in [
            at.digest(),
            stated.as_deref().filter(|d| d.starts_with("sha256:")),
        ]
        .into_iter()
        .flatten()
        {
            if expected != digest {
                return Err(OciError::DigestMismatch {
                    reference: self.reference.clone(),
                    what: "manifest",
                    problem: format!("expected {expected}, got {digest}"),
                });
            }
        }
        Ok((digest, bytes))
    }

    /// Resolves the reference: the digest of the manifest it names (an
    /// index's, when it names an index), the component layer of the image
    /// manifest (the index's wasm entry), and the bytes of each manifest
    /// read, for the store to keep.
    pub async fn resolve(&self, at: &Reference) -> Result<Resolution, OciError> {
        let (digest, bytes) = self.manifest_at(at).await?;
        let named = names(&self.reference, &self.settings, &bytes)?;
        let mut manifests = vec![(digest.clone(), bytes)];
        let layer = match named {
            Names::Layer(layer) => layer,
            Names::Entry(entry) => {
                let (entry_digest, image) = self.manifest_at(&at.at_digest(&entry)).await?;
                let layer = match names(&self.reference, &self.settings, &image)? {
                    Names::Layer(layer) => layer,
                    Names::Entry(_) => return Err(nested_index(&self.reference)),
                };
                manifests.push((entry_digest, image));
                layer
            }
        };
        Ok(Resolution {
            manifest: digest,
            layer,
            manifests,
        })
    }

    /// Streams the blob `digest` to `sink`, at most `limit` bytes, and
    /// checks it against its digest; `what` names it in errors, `written`
    /// maps a failed write.
    async fn blob(
        &self,
        digest: &str,
        limit: u64,
        what: &'static str,
        sink: &mut (impl tokio::io::AsyncWrite + Unpin),
        written: impl Fn(std::io::Error) -> OciError,
    ) -> Result<(), OciError> {
        use tokio::io::AsyncWriteExt as _;
        let request = self
            .request(
                Method::GET,
                &self.api(&format!("blobs/{digest}")),
                Access::Pull,
            )
            .await?;
        let mut response = self.send(request, what).await?;
        if response.status() != StatusCode::OK {
            return Err(self.answered(what, response).await);
        }
        let too_large = |size: u64| OciError::TooLarge {
            reference: self.reference.clone(),
            what: "layer",
            size,
            limit,
        };
        if let Some(size) = response.content_length().filter(|size| *size > limit) {
            return Err(too_large(size));
        }
        let (mut hasher, mut read) = (Sha256::new(), 0u64);
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| self.request_failed(what, &e))?
        {
            read = read.saturating_add(chunk.len() as u64);
            if read > limit {
                return Err(too_large(read));
            }
            hasher.update(&chunk);
            sink.write_all(&chunk).await.map_err(&written)?;
        }
        sink.flush().await.map_err(&written)?;
        let found = format!("sha256:{}", hex::encode(hasher.finalize()));
        if found != digest {
            return Err(OciError::DigestMismatch {
                reference: self.reference.clone(),
                what,
                problem: format!("expected {digest}, got {found}"),
            });
        }
        Ok(())
    }

    /// Downloads the component `layer` into `store` (unless it is there):
    /// written to a temporary file as it streams, counted against
    /// `max_layer_bytes`, checked against its digest, and kept only then.
    pub async fn download(
        &self,
        layer: &Descriptor,
        store: &OciStore,
    ) -> Result<std::path::PathBuf, OciError> {
        if let Some(path) = store.component(&layer.digest)? {
            return Ok(path);
        }
        let download = store.download(&layer.digest)?;
        let failed = |e: std::io::Error| OciError::Store {
            path: download.path().to_path_buf(),
            problem: e.to_string(),
        };
        let file = download.reopen().map_err(failed)?;
        let mut out = tokio::fs::File::from_std(file);
        self.blob(
            &layer.digest,
            self.settings.max_layer_bytes,
            "component",
            &mut out,
            failed,
        )
        .await?;
        store.keep(download, &layer.digest)
    }

    /// The signature manifest of `manifest_digest`, if there is one.
    pub(super) async fn signature_manifest(
        &self,
        manifest_digest: &str,
    ) -> Result<Option<ImageManifest>, OciError> {
        let at = self
            .reference
            .at_tag(&signature::signature_tag(manifest_digest));
        let bytes = match self.manifest_at(&at).await {
            Ok((_, bytes)) => bytes,
            Err(OciError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            self.registry_error(format!(
                "its signature manifest is not an image manifest: {e}"
            ))
        })
    }

    /// The cosign signatures the registry holds for `manifest_digest` (none
    /// when there is no signature manifest).
    pub async fn signatures(&self, manifest_digest: &str) -> Result<Vec<Signature>, OciError> {
        let Some(manifest) = self.signature_manifest(manifest_digest).await? else {
            return Ok(Vec::new());
        };
        let mut found = Vec::new();
        for layer in manifest.layers.iter().take(MAX_SIGNATURES) {
            let Some(signature) = layer
                .annotations
                .as_ref()
                .and_then(|a| a.get(SIGNATURE_ANNOTATION))
            else {
                continue;
            };
            if layer.media_type != PAYLOAD_MEDIA_TYPE
                || u64::try_from(layer.size).unwrap_or(u64::MAX) > MAX_PAYLOAD_BYTES
                || !crate::policy::reference::is_digest(&layer.digest)
            {
                continue;
            }
            let mut payload = Vec::new();
            self.blob(
                &layer.digest,
                MAX_PAYLOAD_BYTES,
                "signature",
                &mut payload,
                |e| self.registry_error(e.to_string()),
            )
            .await?;
            let Ok(payload) = String::from_utf8(payload) else {
                continue;
            };
            found.push(Signature {
                payload,
                signature: signature.clone(),
            });
        }
        Ok(found)
    }

    /// Uploads `bytes` as a blob (unless the repository has it): a
    /// monolithic upload, POST then PUT to the location the registry gives
    /// (checked by the guard like any URL; credentials only if it is the
    /// registry's own). Their digest.
    pub(super) async fn push_blob(&self, bytes: &[u8], what: &str) -> Result<String, OciError> {
        let digest = sha256_digest(bytes);
        let head = self
            .request(
                Method::HEAD,
                &self.api(&format!("blobs/{digest}")),
                Access::Push,
            )
            .await?;
        if self.send(head, what).await?.status() == StatusCode::OK {
            return Ok(digest);
        }
        let post = self
            .request(Method::POST, &self.api("blobs/uploads/"), Access::Push)
            .await?
            .header(reqwest::header::CONTENT_LENGTH, 0);
        let started = self.send(post, what).await?;
        if started.status() != StatusCode::ACCEPTED {
            return Err(self.answered(what, started).await);
        }
        let location = started
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| self.registry_error(format!("no upload location for the {what}")))?;
        let mut location = started.url().join(location).map_err(|_| {
            self.registry_error(format!("the {what}'s upload location is not a URL"))
        })?;
        location.query_pairs_mut().append_pair("digest", &digest);
        let put = self
            .request(Method::PUT, location.as_str(), Access::Push)
            .await?
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(bytes.to_vec());
        let done = self.send(put, what).await?;
        if done.status() != StatusCode::CREATED {
            return Err(self.answered(what, done).await);
        }
        Ok(digest)
    }

    /// Puts `manifest` at `tag`: the digest of the bytes sent, which is
    /// what the registry must now serve for it (a registry that says it
    /// stored other bytes is refused).
    pub(super) async fn push_manifest(
        &self,
        tag: &str,
        manifest: &ImageManifest,
        what: &str,
    ) -> Result<String, OciError> {
        let bytes = manifest.to_bytes();
        let digest = sha256_digest(&bytes);
        let media_type = manifest
            .media_type
            .as_deref()
            .unwrap_or(super::manifest::OCI_IMAGE_MEDIA_TYPE);
        let put = self
            .request(
                Method::PUT,
                &self.api(&format!("manifests/{tag}")),
                Access::Push,
            )
            .await?
            .header(CONTENT_TYPE, media_type)
            .body(bytes);
        let done = self.send(put, what).await?;
        if done.status() != StatusCode::CREATED {
            return Err(self.answered(what, done).await);
        }
        let stated = done
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok());
        if let Some(stated) = stated.filter(|stated| *stated != digest) {
            return Err(OciError::DigestMismatch {
                reference: self.reference.clone(),
                what: "manifest",
                problem: format!("sent {digest}, the registry says it stored {stated}"),
            });
        }
        Ok(digest)
    }
}

/// An authentication challenge (`WWW-Authenticate`).
#[derive(Debug, PartialEq, Eq)]
enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

impl Challenge {
    /// Parses `Basic …` or `Bearer realm="…",service="…"` (quoted or
    /// not, with `\` escapes in quotes).
    fn parse(text: &str) -> Option<Self> {
        let (scheme, rest) = text.trim().split_once(' ').unwrap_or((text.trim(), ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Some(Self::Basic);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let (mut realm, mut service) = (None, None);
        let mut chars = rest.chars().peekable();
        loop {
            while chars.next_if(|c| *c == ',' || c.is_whitespace()).is_some() {}
            let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
            if chars.next() != Some('=') {
                break;
            }
            let mut value = String::new();
            if chars.next_if_eq(&'"').is_some() {
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => value.extend(chars.next()),
                        c => value.push(c),
                    }
                }
            } else {
                value.extend(std::iter::from_fn(|| chars.next_if(|c| *c != ',')));
            }
            match key.trim().to_ascii_lowercase().as_str() {
                "realm" => realm = Some(value.trim().to_owned()),
                "service" => service = Some(value.trim().to_owned()),
                _ => {}
            }
        }
        Some(Self::Bearer {
            realm: realm?,
            service,
        })
    }
}

fn header(text: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(text).ok().map(|mut value| {
        value.set_sensitive(true);
        value
    })
}

/// `own` as basic auth, if it is a user and password.
fn basic(own: &Auth) -> Option<HeaderValue> {
    use base64::Engine as _;
    match own {
        Auth::Basic(user, password) => header(&format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )),
        _ => None,
    }
}

/// `sha256:<hex>` of `bytes`.
#[cfg(test)]
mod tests {
    use super::Challenge;

    #[test]
    fn challenges_parse_as_registries_write_them() {
        assert_eq!(
            Challenge::parse(
                r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
            })
        );
        assert_eq!(
            Challenge::parse(r#"bearer service=r, realm="http://x/\"q\"""#),
            Some(Challenge::Bearer {
                realm: "http://x/\"q\"".into(),
                service: Some("r".into()),
            })
        );
        assert_eq!(
            Challenge::parse(r#"Basic realm="registry""#),
            Some(Challenge::Basic)
        );
        assert_eq!(Challenge::parse("Bearer service=r"), None);
        assert_eq!(Challenge::parse("Negotiate"), None);
    }
}
