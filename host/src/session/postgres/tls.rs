//! TLS to Postgres, as libpq's URL parameters ask for it, through rustls
//! (the process's one TLS stack).
//!
//! `sslmode`:
//!
//! - `disable`, or absent: plain TCP (as before; use it on a private
//!   network or a Unix socket only);
//! - `require`: encrypted; the server's certificate is not checked unless
//!   `sslrootcert` is given (then as `verify-ca`), as libpq does;
//! - `verify-ca`: encrypted, and the server's certificate chains to a
//!   trusted root;
//! - `verify-full`: that, and the certificate names the host connected to.
//!
//! `sslrootcert=FILE` (PEM) gives the trusted roots; without it, the
//! process's roots (Mozilla's, as for every other TLS connection).
//! `prefer` and `allow` are refused: they fall back to plain text when
//! anyone on the path says so. Neither mode ever falls back to plain TCP.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

/// What a URL asks of TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    mode: Mode,
    root: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Disable,
    Require,
    VerifyCa,
    VerifyFull,
}

impl TlsSettings {
    /// Whether the connection is encrypted.
    pub(crate) fn encrypted(&self) -> bool {
        self.mode != Mode::Disable
    }

    /// The rustls configuration for these settings (`None`: plain TCP).
    pub(crate) fn client_config(&self) -> Result<Option<rustls::ClientConfig>, String> {
        if self.mode == Mode::Disable {
            return Ok(None);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS configuration: {e}"))?;
        let roots = match &self.root {
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                let at = |e: &dyn std::fmt::Display| format!("sslrootcert {}: {e}", path.display());
                let pem =
                    crate::fs::read_settings(path).map_err(|e| at(&format!("cannot read: {e}")))?;
                let certs = CertificateDer::pem_slice_iter(&pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| at(&e))?;
                let (added, _) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(format!(
                        "sslrootcert {}: no certificate in it",
                        path.display()
                    ));
                }
                roots
            }
            None => rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            },
        };
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| format!("TLS roots: {e}"))?;
        let verifier: Arc<dyn ServerCertVerifier> = match (self.mode, &self.root) {
            (Mode::VerifyFull, _) => webpki,
            (Mode::VerifyCa, _) | (Mode::Require, Some(_)) => Arc::new(RelaxedVerifier {
                check: Relaxed::AnyName(webpki),
                provider,
            }),
            (Mode::Require, None) => Arc::new(RelaxedVerifier {
                check: Relaxed::Unchecked,
                provider,
            }),
            (Mode::Disable, _) => return Ok(None),
        };
        Ok(Some(
            builder
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth(),
        ))
    }
}

/// Takes `sslmode` and `sslrootcert` out of a `postgres://` URL (which
/// tokio-postgres would refuse, or ignore): the URL without them, and what
/// they ask for.
pub(crate) fn split_url(url: &str) -> Result<(String, TlsSettings), String> {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, query),
        None => (url, ""),
    };
    let mut settings = TlsSettings {
        mode: Mode::Disable,
        root: None,
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_encoding::percent_decode_str(value)
            .decode_utf8_lossy()
            .into_owned();
        match key {
            "sslmode" => {
                settings.mode = match value.as_str() {
                    "disable" => Mode::Disable,
                    "require" => Mode::Require,
                    "verify-ca" => Mode::VerifyCa,
                    "verify-full" => Mode::VerifyFull,
                    "prefer" | "allow" => {
                        return Err(format!(
                            "sslmode={value} falls back to plain text when anyone on the path \
                             says so; use require, verify-ca or verify-full (or disable)"
                        ));
                    }
                    _ => {
                        return Err(
                            "sslmode must be disable, require, verify-ca or verify-full".into()
                        );
                    }
                }
            }
            "sslrootcert" => settings.root = Some(PathBuf::from(value)),
            _ => kept.push(pair),
        }
    }
    if settings.root.is_some() && settings.mode == Mode::Disable {
        return Err("sslrootcert is given but sslmode is not verify-ca or verify-full".into());
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, settings))
}

/// What a relaxed mode checks of the server's certificate. The
/// handshake's signatures are always checked, so the peer holds the key
/// of the certificate it sent.
#[derive(Debug)]
enum Relaxed {
    /// `verify-ca` (or `require` with roots): the chain must verify; the
    /// name need not match.
    AnyName(Arc<WebPkiServerVerifier>),
    /// `require` without roots: encrypted, the certificate not checked
    /// (libpq's meaning).
    Unchecked,
}

/// A verifier for a relaxed mode, with the crypto provider whose
/// algorithms check the handshake's signatures.
#[derive(Debug)]
struct RelaxedVerifier {
    check: Relaxed,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for RelaxedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Relaxed::AnyName(webpki) = &self.check else {
            return Ok(ServerCertVerified::assertion());
        };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_out_of_the_url() {
        let (url, tls) = split_url(
            "postgres://u:p@db:5432/x?application_name=a&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(url, "postgres://u:p@db:5432/x?application_name=a");
        assert_eq!(tls.mode, Mode::VerifyFull);
        assert_eq!(tls.root, Some(PathBuf::from("/etc/ca.pem")));
        let (url, tls) = split_url("postgres://db/x").unwrap();
        assert_eq!(url, "postgres://db/x");
        assert!(!tls.encrypted());
        for bad in [
            "postgres://db/x?sslmode=prefer",
            "postgres://db/x?sslmode=allow",
            "postgres://db/x?sslmode=on",
            "postgres://db/x?sslrootcert=/ca.pem",
        ] {
            assert!(split_url(bad).is_err(), "{bad}");
        }
    }
}
