//! Talking to a registry, through `oci-client`: resolving a reference to a
//! manifest and its component layer, downloading the layer into the store
//! (checked against its digest as it streams, bounded in size), pushing
//! the wasm artifact layout, and reading and writing cosign signatures.

use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use oci_client::RegistryOperation;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest,
};
use oci_client::secrets::RegistryAuth;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::signature::{self, PAYLOAD_MEDIA_TYPE, SIGNATURE_ANNOTATION, Signature};
use super::{Credentials, OciError, OciSettings, OciStore, Reference};

/// The wasm artifact layout's config media type (CNCF TAG Runtime's wasm
/// OCI artifact, what `wkg oci push` writes).
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";

/// The layer media type of a component.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";

/// Layer media types read as a component: the artifact layout's, and the
/// older wasm-to-oci one.
const WASM_LAYERS: [&str; 2] = [
    WASM_LAYER_MEDIA_TYPE,
    "application/vnd.wasm.content.layer.v1+wasm",
];

/// Largest signature payload read.
const MAX_PAYLOAD_BYTES: u64 = 64 << 10;

/// Most signatures read for one manifest.
const MAX_SIGNATURES: usize = 64;

/// How long connecting to a registry may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a registry may leave a response without a byte.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The manifest media types asked for.
const MANIFEST_TYPES: [&str; 4] = [
    OCI_IMAGE_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];

/// One registry, for one reference.
pub struct Registry {
    pub(super) client: oci_client::Client,
    /// For manifests, read with a bound (oci-client reads them whole).
    http: reqwest::Client,
    pub(super) auth: RegistryAuth,
    pub(super) reference: Reference,
    settings: OciSettings,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("reference", &self.reference)
            .finish_non_exhaustive()
    }
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
        let protocol = if settings.insecure {
            if !reference.is_loopback() {
                return Err(OciError::Insecure {
                    reference: reference.clone(),
                });
            }
            ClientProtocol::HttpsExcept(vec![reference.registry().to_owned()])
        } else {
            ClientProtocol::Https
        };
        let config = ClientConfig {
            protocol,
            platform_resolver: None,
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            ..ClientConfig::default()
        };
        let tls = crate::tls::client_config().map_err(|problem| OciError::Registry {
            reference: reference.clone(),
            problem,
        })?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls((*tls).clone())
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .build()
            .map_err(|e| OciError::Registry {
                reference: reference.clone(),
                problem: format!("cannot build an HTTP client: {e}"),
            })?;
        Ok(Self {
            client: oci_client::Client::new(config),
            http,
            auth: credentials.for_registry(reference.registry()),
            reference: reference.clone(),
            settings: settings.clone(),
        })
    }

    /// The error for a failure of the registry client. What a registry
    /// says is shortened: it is the registry's text, not ours.
    pub(super) fn failed(&self, what: &'static str, e: OciDistributionError) -> OciError {
        use oci_client::errors::OciErrorCode as Code;
        let reference = self.reference.clone();
        let said = |text: &str| crate::text::truncate(text, 200);
        match e {
            OciDistributionError::AuthenticationFailure(problem) => OciError::AuthRefused {
                reference,
                problem: said(&problem),
            },
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::ServerError {
                code: 401 | 403, ..
            } => OciError::AuthRefused {
                reference,
                problem: "the registry answered 401/403".into(),
            },
            OciDistributionError::ImageManifestNotFoundError(_)
            | OciDistributionError::ServerError { code: 404, .. } => {
                OciError::NotFound { reference }
            }
            OciDistributionError::RegistryError { envelope, .. } => {
                let codes: Vec<&Code> = envelope.errors.iter().map(|e| &e.code).collect();
                if codes.iter().any(|c| {
                    matches!(
                        c,
                        Code::BlobUnknown
                            | Code::ManifestUnknown
                            | Code::NameUnknown
                            | Code::NotFound
                    )
                }) {
                    OciError::NotFound { reference }
                } else if codes
                    .iter()
                    .any(|c| matches!(c, Code::Unauthorized | Code::Denied))
                {
                    OciError::AuthRefused {
                        reference,
                        problem: said(&envelope.to_string()),
                    }
                } else {
                    OciError::Registry {
                        reference,
                        problem: format!("the {what}: {}", said(&envelope.to_string())),
                    }
                }
            }
            OciDistributionError::DigestError(e) => OciError::DigestMismatch {
                reference,
                what,
                problem: e.to_string(),
            },
            OciDistributionError::RequestError(e) => self.request_failed(what, &e),
            OciDistributionError::IoError(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
                OciError::TooLarge {
                    reference,
                    what: "layer",
                    size: self.settings.max_layer_bytes.saturating_add(1),
                    limit: self.settings.max_layer_bytes,
                }
            }
            other => OciError::Registry {
                reference,
                problem: format!(
                    "the {what} could not be read: {}",
                    said(&error_chain(&other))
                ),
            },
        }
    }

    /// Reads the manifest `at` names: its digest and bytes. Read with its
    /// own request (oci-client's reads a body whole, unbounded), after the
    /// client's auth handshake, and refused past `max_manifest_bytes`
    /// whatever the registry declares; the bytes are checked against the
    /// digest the reference pins and the one the registry states.
    pub(super) async fn manifest_at(&self, at: &Reference) -> Result<(String, Vec<u8>), OciError> {
        let client_ref = at.to_client();
        let token = self
            .client
            .auth(&client_ref, &self.auth, RegistryOperation::Pull)
            .await
            .map_err(|e| self.failed("manifest", e))?;
        let scheme = if self.settings.insecure {
            "http"
        } else {
            "https"
        };
        let url = format!(
            "{scheme}://{}/v2/{}/manifests/{}",
            client_ref.resolve_registry(),
            client_ref.repository(),
            client_ref.digest().or(client_ref.tag()).unwrap_or("latest")
        );
        let mut request = self
            .http
            .get(&url)
            .header(reqwest::header::ACCEPT, MANIFEST_TYPES.join(", "));
        request = match (token, &self.auth) {
            (Some(token), _) => request.bearer_auth(token),
            (None, RegistryAuth::Basic(user, password)) => request.basic_auth(user, Some(password)),
            (None, _) => request,
        };
        let reference = || self.reference.clone();
        let mut response = request
            .send()
            .await
            .map_err(|e| self.request_failed("manifest", &e))?;
        let status = response.status();
        match status.as_u16() {
            200 => {}
            404 => {
                return Err(OciError::NotFound {
                    reference: reference(),
                });
            }
            401 | 403 => {
                return Err(OciError::AuthRefused {
                    reference: reference(),
                    problem: status.to_string(),
                });
            }
            _ => {
                return Err(OciError::Registry {
                    reference: reference(),
                    problem: format!("the registry answered {status} for the manifest"),
                });
            }
        }
        let limit = self.settings.max_manifest_bytes;
        let too_large = |size: u64| OciError::TooLarge {
            reference: reference(),
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
        let mut bytes = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| self.request_failed("manifest", &e))?
        {
            bytes.extend_from_slice(&chunk);
            if bytes.len() as u64 > limit {
                return Err(too_large(bytes.len() as u64));
            }
        }
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
                    reference: reference(),
                    what: "manifest",
                    problem: format!("expected {expected}, got {digest}"),
                });
            }
        }
        Ok((digest, bytes))
    }

    /// The error for a request that got no (whole) answer: unreachable,
    /// or cut off (a truncated download).
    fn request_failed(&self, what: &str, e: &reqwest::Error) -> OciError {
        let reference = self.reference.clone();
        match e.status().map(|s| s.as_u16()) {
            Some(404) => return OciError::NotFound { reference },
            Some(401 | 403) => {
                return OciError::AuthRefused {
                    reference,
                    problem: "the registry answered 401/403".into(),
                };
            }
            _ => {}
        }
        let problem = crate::text::truncate(&error_chain(e), 300);
        if e.is_connect() || (e.is_timeout() && !e.is_body()) {
            OciError::Unreachable {
                reference: self.reference.clone(),
                problem,
            }
        } else {
            OciError::Registry {
                reference: self.reference.clone(),
                problem: format!("the {what} could not be read whole: {problem}"),
            }
        }
    }

    /// Resolves the reference: the digest of the manifest it names (an
    /// index's, when it names an index) and the component layer of the
    /// image manifest (the index's wasm entry).
    pub async fn resolve(&self, at: &Reference) -> Result<(String, OciDescriptor), OciError> {
        let not_wasm = |problem: String| OciError::NotWasm {
            reference: self.reference.clone(),
            problem,
        };
        let (digest, bytes) = self.manifest_at(at).await?;
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| not_wasm(format!("the manifest is not JSON: {e}")))?;
        let image = if value.get("manifests").is_some() {
            // An index (manifest list): its wasm entry.
            let entries = value["manifests"].as_array().cloned().unwrap_or_default();
            let wasm = entries.iter().find(|entry| {
                let platform = &entry["platform"];
                platform["architecture"] == "wasm"
                    || platform["os"]
                        .as_str()
                        .is_some_and(|os| os.starts_with("wasi"))
            });
            let Some(entry_digest) = wasm.and_then(|e| e["digest"].as_str()) else {
                return Err(not_wasm(format!(
                    "a manifest list with no wasm entry ({} entries, none for architecture `wasm` or OS `wasip*`)",
                    entries.len()
                )));
            };
            if !super::reference::is_digest(entry_digest) {
                return Err(not_wasm("the wasm entry's digest is not sha256".into()));
            }
            let (_, image) = self.manifest_at(&at.at_digest(entry_digest)).await?;
            image
        } else {
            bytes
        };
        let manifest: OciImageManifest = serde_json::from_slice(&image)
            .map_err(|e| not_wasm(format!("the manifest is not an OCI image manifest: {e}")))?;
        let layers: Vec<&OciDescriptor> = manifest
            .layers
            .iter()
            .filter(|l| WASM_LAYERS.contains(&l.media_type.as_str()))
            .collect();
        let layer = match layers.as_slice() {
            [layer] => (*layer).clone(),
            [] => {
                let found: Vec<&str> = manifest
                    .layers
                    .iter()
                    .map(|l| l.media_type.as_str())
                    .collect();
                return Err(not_wasm(format!(
                    "no `{WASM_LAYER_MEDIA_TYPE}` layer (found: {})",
                    if found.is_empty() {
                        "no layers".to_owned()
                    } else {
                        found.join(", ")
                    }
                )));
            }
            _ => {
                return Err(not_wasm(format!(
                    "{} wasm layers; one is expected",
                    layers.len()
                )));
            }
        };
        // A layer's `urls` would send the download elsewhere; the
        // registry serves it, or nothing does.
        let layer = OciDescriptor {
            urls: None,
            ..layer
        };
        if !super::reference::is_digest(&layer.digest) {
            return Err(not_wasm(
                "the component layer's digest is not sha256".into(),
            ));
        }
        let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
        if size > self.settings.max_layer_bytes {
            return Err(OciError::TooLarge {
                reference: self.reference.clone(),
                what: "layer",
                size,
                limit: self.settings.max_layer_bytes,
            });
        }
        Ok((digest, layer))
    }

    /// Downloads the component `layer` into `store` (unless it is there):
    /// written to a temporary file as it streams, counted against
    /// `max_layer_bytes`, checked against its digest, and kept only then.
    pub async fn download(
        &self,
        layer: &OciDescriptor,
        store: &OciStore,
    ) -> Result<PathBuf, OciError> {
        if let Some(path) = store.component(&layer.digest)? {
            return Ok(path);
        }
        let download = store.download(&layer.digest)?;
        let file = download.reopen().map_err(|e| OciError::Store {
            path: download.path().to_path_buf(),
            problem: e.to_string(),
        })?;
        let mut out = Bounded {
            inner: tokio::fs::File::from_std(file),
            left: self.settings.max_layer_bytes,
        };
        self.client
            .pull_blob(&self.reference.to_client(), layer, &mut out)
            .await
            .map_err(|e| self.failed("component", e))?;
        tokio::io::AsyncWriteExt::flush(&mut out)
            .await
            .map_err(|e| OciError::Store {
                path: download.path().to_path_buf(),
                problem: e.to_string(),
            })?;
        store.keep(download, &layer.digest)
    }

    /// The cosign signatures the registry holds for `manifest_digest` (none
    /// when there is no signature manifest).
    pub async fn signatures(&self, manifest_digest: &str) -> Result<Vec<Signature>, OciError> {
        let at = self
            .reference
            .at_tag(&signature::signature_tag(manifest_digest));
        let manifest = match self.manifest_at(&at).await {
            Ok((_, bytes)) => bytes,
            Err(OciError::NotFound { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let manifest: OciImageManifest =
            serde_json::from_slice(&manifest).map_err(|e| OciError::Registry {
                reference: self.reference.clone(),
                problem: format!("its signature manifest is not an image manifest: {e}"),
            })?;
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
            {
                continue;
            }
            let layer = OciDescriptor {
                urls: None,
                ..layer.clone()
            };
            let mut payload = Bounded {
                inner: Vec::new(),
                left: MAX_PAYLOAD_BYTES,
            };
            self.client
                .pull_blob(&at.to_client(), &layer, &mut payload)
                .await
                .map_err(|e| self.failed("signature", e))?;
            let Ok(payload) = String::from_utf8(payload.inner) else {
                continue;
            };
            found.push(Signature {
                payload,
                signature: signature.clone(),
            });
        }
        Ok(found)
    }
}

/// Writes through, refusing (`FileTooLarge`) past a bound.
struct Bounded<W> {
    inner: W,
    left: u64,
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Bounded<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let len = buf.len() as u64;
        if len > self.left {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "the layer is larger than its bound",
            )));
        }
        let written = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &written {
            self.left -= *n as u64;
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// `sha256:<hex>` of `bytes`.
pub(crate) fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.contains(&next) {
            text = format!("{text}: {next}");
        }
        source = cause.source();
    }
    text
}
