//! The keys a policy trusts to sign components (`verify = { key = … }`),
//! read when the policy is.

use std::path::{Path, PathBuf};

use base64::Engine as _;

/// The DER prefix of a P-256 public key's SubjectPublicKeyInfo, before its
/// 65-byte uncompressed point.
pub(crate) const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// A key file that cannot be used: which, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key {}: {problem}", .path.display())]
pub struct KeyError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub problem: String,
}

/// A public key trusted to sign components, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    /// The file it was read from (how errors and `inspect` name it).
    pub path: PathBuf,
    /// The uncompressed P-256 point.
    pub(crate) point: Vec<u8>,
}

/// The bytes of the first PEM block labelled `label` in `text`.
pub(crate) fn pem_body(text: &str, label: &str) -> Option<Vec<u8>> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = text.find(&begin)? + begin.len();
    let stop = text[start..].find(&end)? + start;
    let body: String = text[start..stop]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD.decode(body).ok()
}

impl PublicKey {
    /// Reads a P-256 public key (PEM `PUBLIC KEY`) from `path`.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let bad = |problem: String| KeyError {
            path: path.to_path_buf(),
            problem,
        };
        let text =
            crate::fs::read_settings_text(path).map_err(|e| bad(format!("cannot read: {e}")))?;
        let der =
            pem_body(&text, "PUBLIC KEY").ok_or_else(|| bad("not a PEM `PUBLIC KEY`".into()))?;
        let point = der
            .strip_prefix(&P256_SPKI_PREFIX[..])
            .filter(|point| point.len() == 65 && point[0] == 4)
            .ok_or_else(|| bad("not an ECDSA P-256 public key (the kind cosign uses)".into()))?;
        Ok(Self {
            path: path.to_path_buf(),
            point: point.to_vec(),
        })
    }
}
