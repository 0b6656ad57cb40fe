//! Tools from OCI registries (DESIGN §11): a component named by reference
//! (`REGISTRY/REPO:TAG` or `@sha256:…`), pulled once into a private,
//! content-addressed store, pinned by a lock file beside the policy, and
//! refused unless its signature verifies with a key the operator trusts —
//! all before anything of it is compiled.
//!
//! - [`Reference`]: what a policy's `oci = "…"` and the CLI's `oci://…`
//!   name.
//! - [`Registry`]: pulls (every blob checked against its digest while it
//!   streams, sizes bounded), pushes the wasm artifact layout, reads and
//!   writes cosign signatures ([`signature`]), with anonymous, basic or
//!   token auth from the docker credential file or the environment, each
//!   credential for its own registry; every request it makes obeys the
//!   private-address rule (`guard`), redirects and token services
//!   included.
//! - [`OciStore`]: the pulled components by digest, private like the
//!   compile cache; written only after the digest matched.
//! - [`Lock`]: `airlock.lock`, each reference's manifest and component
//!   digests (and who signed them), reviewed like `Cargo.lock`. Runs use
//!   it and need no network once the store holds what it names.
//! - `resolve`: a policy's references to local files, through the lock
//!   (and a pull for those not yet pulled).

mod credentials;
mod guard;
mod lock;
mod manifest;
mod publish;
mod registry;
mod resolve;
pub mod signature;
mod store;

pub use crate::policy::oci::{
    DEFAULT_MAX_LAYER_BYTES, DEFAULT_MAX_MANIFEST_BYTES, LOCK_FILE, OciSettings, OciTool, Resolved,
    lock_path,
};
pub use crate::policy::reference::{InvalidReference, Reference, SCHEME};
pub use credentials::Credentials;
pub use guard::Refused;
pub use lock::{Lock, Locked};
pub use manifest::{Descriptor, WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE};
pub use publish::Pushed;
pub use registry::{Registry, Resolution};
pub use resolve::{Fetch, Resolver};
pub use store::OciStore;

use std::path::PathBuf;

/// Something about a reference, its registry, its signature or its lock
/// that stops it from being used. Every variant names the reference (or
/// file) at fault and never a credential.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OciError {
    /// Not `REGISTRY/REPO:TAG` or `REGISTRY/REPO@sha256:…`.
    #[error("invalid reference {reference:?}: {problem}")]
    InvalidReference {
        /// The text given (shortened).
        reference: String,
        /// What is wrong.
        problem: String,
    },
    /// The registry could not be reached.
    #[error("{reference}: the registry cannot be reached: {problem}")]
    Unreachable {
        /// The reference.
        reference: Reference,
        /// Why.
        problem: String,
    },
    /// No such tag, digest or repository.
    #[error("{reference}: not found in the registry")]
    NotFound {
        /// The reference.
        reference: Reference,
    },
    /// The registry refused the credentials (or asked for some and none
    /// were given).
    #[error(
        "{reference}: the registry refused access ({problem}); give credentials in the docker config file (REGISTRY_AUTH_FILE, ~/.docker/config.json) or AIRLOCK_REGISTRY_USERNAME/AIRLOCK_REGISTRY_PASSWORD"
    )]
    AuthRefused {
        /// The reference.
        reference: Reference,
        /// What the registry said.
        problem: String,
    },
    /// A manifest or layer over its bound.
    #[error(
        "{reference}: the {what} is {size} bytes; the limit is {limit} (max_{what}_bytes in [oci])"
    )]
    TooLarge {
        /// The reference.
        reference: Reference,
        /// `manifest` or `layer`.
        what: &'static str,
        /// Its size (as declared, or as counted).
        size: u64,
        /// The bound.
        limit: u64,
    },
    /// Not a wasm component artifact.
    #[error("{reference}: not a wasm component: {problem}")]
    NotWasm {
        /// The reference.
        reference: Reference,
        /// What was found instead.
        problem: String,
    },
    /// Bytes that do not match their digest (tampered, or truncated).
    #[error("{reference}: the {what} does not match its digest: {problem}")]
    DigestMismatch {
        /// The reference.
        reference: Reference,
        /// `manifest`, `component` or `signature`.
        what: &'static str,
        /// Expected and found.
        problem: String,
    },
    /// The registry answered something else that cannot be used.
    #[error("{reference}: {problem}")]
    Registry {
        /// The reference.
        reference: Reference,
        /// What went wrong.
        problem: String,
    },
    /// Plain HTTP asked for a registry that is not on this machine.
    #[error(
        "{reference}: plain HTTP is only allowed to registries on this machine (localhost, 127.0.0.1, ::1)"
    )]
    Insecure {
        /// The reference.
        reference: Reference,
    },
    /// No signature by a trusted key (none there, or none that verifies:
    /// another key's, another digest's, tampered).
    #[error(
        "{reference}: no signature by {keys} verifies for manifest {digest} ({found} signatures found)"
    )]
    Unsigned {
        /// The reference.
        reference: Reference,
        /// The manifest digest that needed a signature.
        digest: String,
        /// The keys tried, as their files.
        keys: String,
        /// How many signatures the registry (or the store) holds for it.
        found: usize,
    },
    /// A signature must be checked but no key was given.
    #[error(
        "{reference}: [oci] require_signature is set, and this tool has no `verify = {{ key = … }}`"
    )]
    NoKey {
        /// The reference.
        reference: Reference,
    },
    /// A key file that cannot be used.
    #[error("key {}: {problem}", .path.display())]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the key).
        problem: String,
    },
    /// Signing failed.
    #[error("cannot sign: {0}")]
    Signing(String),
    /// Credentials given in a way that cannot be used safely.
    #[error("{0}")]
    Credentials(String),
    /// A request the private-address rule refuses (a redirect, a token
    /// service or an upload location on this host's network, or plain
    /// HTTP off this machine): made to nothing.
    #[error("{reference}: refused: {refused}")]
    Refused {
        /// The reference.
        reference: Reference,
        /// Where, and why.
        refused: guard::Refused,
    },
    /// The lock pins a reference to other bytes than the registry has now.
    #[error(
        "{reference}: the registry now has manifest {registry}, but {lock} pins {locked}; review the change, then `airlock pull --update`"
    )]
    Moved {
        /// The reference.
        reference: Reference,
        /// The lock file.
        lock: String,
        /// What the lock pins.
        locked: String,
        /// What the registry has.
        registry: String,
    },
    /// The lock file cannot be read.
    #[error("{}{}: {problem}", .path.display(), .line.map(|l| format!(":{l}")).unwrap_or_default())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The line at fault, when known.
        line: Option<usize>,
        /// What is wrong.
        problem: String,
    },
    /// A reference the store does not hold (and that may not be pulled
    /// now).
    #[error("{reference}: not pulled yet: run `airlock pull`")]
    NotPulled {
        /// The reference.
        reference: Reference,
    },
    /// The store (or a file in it) is not private to this user: another
    /// user could put a component in it. Nothing in it is used.
    #[error("OCI store {}: {problem}. Fix: {fix}, or set AIRLOCK_OCI_DIR to a private directory", .path.display())]
    UnsafeStore {
        /// The directory or file at fault.
        path: PathBuf,
        /// Why it is unsafe.
        problem: String,
        /// What would mend it, for this problem.
        fix: &'static str,
    },
    /// The store could not be read or written.
    #[error("OCI store {}: {problem}", .path.display())]
    Store {
        /// Where.
        path: PathBuf,
        /// What went wrong.
        problem: String,
    },
}

impl From<InvalidReference> for OciError {
    fn from(e: InvalidReference) -> Self {
        OciError::InvalidReference {
            reference: e.reference,
            problem: e.problem,
        }
    }
}

impl From<crate::policy::keys::KeyError> for OciError {
    fn from(e: crate::policy::keys::KeyError) -> Self {
        OciError::Key {
            path: e.path,
            problem: e.problem,
        }
    }
}
