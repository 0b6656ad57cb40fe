//! The one TLS client configuration of the process: the Mozilla root
//! certificates (webpki-roots) and the ring crypto provider. Used by tools'
//! HTTP grant and by the model providers. And the one way the host's own
//! HTTP clients (model providers, registries, an authorization server's
//! keys) read an answer: within a bound, so that no server can make the
//! host hold more than that.

use std::sync::{Arc, OnceLock};

/// The shared client configuration, built on first use.
pub(crate) fn client_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            };
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map(|b| Arc::new(b.with_root_certificates(roots).with_no_client_auth()))
            .map_err(|e| format!("TLS configuration: {e}"))
        })
        .clone()
}

/// Makes ring the process's default crypto provider (once), for HTTP
/// clients built by a crate Airlock cannot hand its configuration to (the
/// OCI client builds its own reqwest client). Harmless when a provider is
/// already installed.
pub(crate) fn install_default_provider() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        // An error means a provider is already installed: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The body of `response`, or `None` once it would pass `limit` bytes
/// (what was read is dropped, and the rest is not read). Holds at most
/// `limit` bytes, and one chunk beside them.
pub(crate) async fn read_bounded(
    mut response: reqwest::Response,
    limit: u64,
) -> reqwest::Result<Option<Vec<u8>>> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if (body.len() as u64).saturating_add(chunk.len() as u64) > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}
