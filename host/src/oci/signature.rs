//! Signatures as cosign writes and reads them (key-based): a "simple
//! signing" payload naming the signed manifest's digest, signed with ECDSA
//! P-256 over SHA-256, stored in the same repository under the tag
//! `sha256-<hex>.sig` as a manifest whose layers are the payloads
//! (`application/vnd.dev.cosign.simplesigning.v1+json`), each with its
//! signature (base64 DER) in the annotation `dev.cosignproject.cosign/signature`.
//!
//! Keys are PEM: a public key as SubjectPublicKeyInfo (`PUBLIC KEY`, what
//! `cosign generate-key-pair` and `openssl pkey -pubout` write), a private
//! key as unencrypted PKCS#8 (`PRIVATE KEY`: `airlock keygen`, or `openssl
//! genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256`). Verifying
//! costs one ECDSA check per signature (tens of microseconds).

use std::path::Path;

use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair,
    UnparsedPublicKey,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{OciError, Reference};
pub use crate::policy::PublicKey;
use crate::policy::keys::{P256_SPKI_PREFIX, pem_body};

/// The layer media type of a signature payload.
pub const PAYLOAD_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";

/// The annotation that carries a payload's signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";

/// What the payload says it is.
const PAYLOAD_TYPE: &str = "cosign container image signature";

/// The tag under which cosign keeps the signatures of `manifest_digest`.
pub fn signature_tag(manifest_digest: &str) -> String {
    format!("{}.sig", manifest_digest.replace(':', "-"))
}

/// One signature: the payload as stored (its bytes are what was signed)
/// and the signature over them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// The simple-signing payload, as the registry holds it.
    pub payload: String,
    /// The ECDSA signature, base64 of its DER form.
    pub signature: String,
}

impl PublicKey {
    /// Whether `signature` is this key's, over its payload, and the payload
    /// names `manifest_digest` as the signed image and one of
    /// `repositories` (`registry/repository`, as
    /// [`Reference::repository_name`] writes it) as where it was signed
    /// for. A signature made for another repository does not verify here,
    /// even for the same bytes: what a key signed for one tool is not a
    /// word about another (or about an old version of it pushed elsewhere).
    pub fn verifies(
        &self,
        signature: &Signature,
        manifest_digest: &str,
        repositories: &[String],
    ) -> bool {
        let Ok(der) = base64::engine::general_purpose::STANDARD.decode(signature.signature.trim())
        else {
            return false;
        };
        let key = UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &self.point);
        key.verify(signature.payload.as_bytes(), &der).is_ok()
            && signed(&signature.payload).is_some_and(|(repository, digest)| {
                digest == manifest_digest
                    && repositories
                        .iter()
                        .any(|r| r.eq_ignore_ascii_case(&repository))
            })
    }
}

/// What a payload says was signed, if it is a cosign container image
/// signature: the repository it was made for (`docker-reference`) and the
/// manifest digest.
fn signed(payload: &str) -> Option<(String, String)> {
    let value: serde_json::Value = serde_json::from_str(payload).ok()?;
    let critical = value.get("critical")?;
    if critical.get("type")?.as_str()? != PAYLOAD_TYPE {
        return None;
    }
    let field = |section: &str, name: &str| {
        critical
            .get(section)?
            .get(name)?
            .as_str()
            .map(str::to_owned)
    };
    Some((
        field("identity", "docker-reference")?,
        field("image", "docker-manifest-digest")?,
    ))
}

/// A private key to sign with.
pub struct PrivateKey {
    pair: EcdsaKeyPair,
}

impl std::fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrivateKey(…)")
    }
}

impl PrivateKey {
    /// Reads a P-256 private key (PEM `PRIVATE KEY`, unencrypted PKCS#8)
    /// from `path`. Errors never show the key.
    pub fn load(path: &Path) -> Result<Self, OciError> {
        let bad = |problem: &str| OciError::Key {
            path: path.to_path_buf(),
            problem: problem.to_owned(),
        };
        let text = crate::fs::read_settings_text(path).map_err(|e| OciError::Key {
            path: path.to_path_buf(),
            problem: format!("cannot read: {e}"),
        })?;
        if text.contains("ENCRYPTED") {
            return Err(bad(
                "an encrypted key (cosign's own format) is not supported; use `airlock keygen`, or \
                 `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256`",
            ));
        }
        let der = pem_body(&text, "PRIVATE KEY")
            .ok_or_else(|| bad("not a PEM `PRIVATE KEY` (unencrypted PKCS#8)"))?;
        let pair =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &der, &SystemRandom::new())
                .map_err(|_| bad("not an ECDSA P-256 private key"))?;
        Ok(Self { pair })
    }

    /// Signs `reference`'s manifest `manifest_digest`: the cosign payload
    /// and its signature.
    pub fn sign(
        &self,
        reference: &Reference,
        manifest_digest: &str,
    ) -> Result<Signature, OciError> {
        let payload = json!({
            "critical": {
                "identity": {"docker-reference": reference.repository_name()},
                "image": {"docker-manifest-digest": manifest_digest},
                "type": PAYLOAD_TYPE,
            },
            "optional": null,
        })
        .to_string();
        let signed = self
            .pair
            .sign(&SystemRandom::new(), payload.as_bytes())
            .map_err(|_| OciError::Signing("the signature could not be made".into()))?;
        Ok(Signature {
            payload,
            signature: base64::engine::general_purpose::STANDARD.encode(signed.as_ref()),
        })
    }
}

/// A new key pair: the private key as PKCS#8 PEM, the public as SPKI PEM.
pub fn generate() -> Result<(String, String), OciError> {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
        .map_err(|_| OciError::Signing("no key could be generated".into()))?;
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
        .map_err(|_| OciError::Signing("the generated key does not load".into()))?;
    let mut spki = P256_SPKI_PREFIX.to_vec();
    spki.extend_from_slice(pair.public_key().as_ref());
    Ok((pem("PRIVATE KEY", pkcs8.as_ref()), pem("PUBLIC KEY", &spki)))
}

fn pem(label: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|chunk| std::str::from_utf8(chunk).unwrap_or_default())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_with_its_key_only_and_for_its_digest_only() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let (private, public) = generate().unwrap();
        let (_, other) = generate().unwrap();
        let key = PrivateKey::load(&write("k.key", &private)).unwrap();
        let public = PublicKey::load(&write("k.pub", &public)).unwrap();
        let other = PublicKey::load(&write("o.pub", &other)).unwrap();
        let reference: Reference = "127.0.0.1:5000/t:1".parse().unwrap();
        let here = [reference.repository_name()];
        let digest = format!("sha256:{}", "a".repeat(64));
        let signature = key.sign(&reference, &digest).unwrap();
        assert!(public.verifies(&signature, &digest, &here));
        assert!(!other.verifies(&signature, &digest, &here));
        assert!(!public.verifies(&signature, &format!("sha256:{}", "b".repeat(64)), &here));
        let mut tampered = signature.clone();
        tampered.payload = tampered.payload.replace(&"a".repeat(64), &"b".repeat(64));
        assert!(!public.verifies(&tampered, &format!("sha256:{}", "b".repeat(64)), &here));
        // Made for repository t, it says nothing about repository u, nor
        // about t on another registry; a mirror allowed by name accepts it.
        let elsewhere = ["127.0.0.1:5000/u".to_owned(), "127.0.0.1:5001/t".to_owned()];
        assert!(!public.verifies(&signature, &digest, &elsewhere));
        let mut moved = signature.clone();
        moved.payload = moved.payload.replace("5000/t", "5000/u");
        assert!(!public.verifies(&moved, &digest, &elsewhere[..1]));
        assert_eq!(
            signature_tag(&digest),
            format!("sha256-{}.sig", "a".repeat(64))
        );
        assert!(PublicKey::load(&write("bad.pub", "nope")).is_err());
        let encrypted = write(
            "enc.key",
            "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nx\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n",
        );
        let err = PrivateKey::load(&encrypted).unwrap_err().to_string();
        assert!(err.contains("not supported"), "{err}");
    }
}
