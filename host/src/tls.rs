//! The one TLS client configuration of the process: the Mozilla root
//! certificates (webpki-roots) and the ring crypto provider. Used by tools'
//! HTTP grant and by the model providers.

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
