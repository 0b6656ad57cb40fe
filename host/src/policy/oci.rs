//! What a policy says about registries: `[oci]` ([`OciSettings`]), a
//! tool named by reference ([`OciTool`]: `oci = "…"` and its `verify`),
//! and what such a tool resolved to once a loader pulled it
//! ([`Resolved`]). Data only: pulling and verifying are `crate::oci`'s.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::keys::PublicKey;
use super::reference::Reference;

/// Default bound on a manifest: registries cap theirs at 4 MiB.
pub const DEFAULT_MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// Default bound on a component layer: generous (an interpreter-based
/// component is tens of MiB).
pub const DEFAULT_MAX_LAYER_BYTES: u64 = 256 << 20;

/// The policy's `[oci]` settings, and the command line's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciSettings {
    /// Refuse every reference whose tool has no verifying key, and every
    /// component no trusted key signed.
    pub require_signature: bool,
    /// Plain HTTP to registries on this machine (never to others).
    pub insecure: bool,
    /// Largest manifest accepted, in bytes.
    pub max_manifest_bytes: u64,
    /// Largest component layer accepted, in bytes.
    pub max_layer_bytes: u64,
}

impl Default for OciSettings {
    fn default() -> Self {
        Self {
            require_signature: false,
            insecure: false,
            max_manifest_bytes: DEFAULT_MAX_MANIFEST_BYTES,
            max_layer_bytes: DEFAULT_MAX_LAYER_BYTES,
        }
    }
}

/// A tool the policy names by reference: where, and whose signature it
/// must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciTool {
    /// The reference as written.
    pub reference: Reference,
    /// The keys one of which must have signed it (`verify = { key = … }`).
    pub keys: Vec<PublicKey>,
    /// Repositories besides the reference's own whose signatures count
    /// for it (`verify = { repositories = […] }`, `registry/repository`):
    /// a mirror's copy keeps the signature made for the original.
    pub repositories: Vec<String>,
}

impl OciTool {
    /// A tool named by `reference`, with no key to check.
    pub fn unverified(reference: Reference) -> Self {
        Self {
            reference,
            keys: Vec::new(),
            repositories: Vec::new(),
        }
    }

    /// The repositories a signature may name to count for this tool: its
    /// reference's own, then those the policy adds.
    pub fn signed_for(&self) -> Vec<String> {
        let mut names = vec![self.reference.repository_name()];
        names.extend(self.repositories.iter().cloned());
        names
    }
}

/// A reference made local.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The reference.
    pub reference: Reference,
    /// The component's file in the store.
    pub path: PathBuf,
    /// The manifest digest the reference resolved to.
    pub manifest: String,
    /// The component's digest.
    pub component: String,
    /// The trusted keys whose signature verified (empty when none was
    /// asked for).
    pub signed_by: Vec<PathBuf>,
}

/// `[oci]`: registries' settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OciFile {
    #[serde(default)]
    require_signature: bool,
    #[serde(default)]
    insecure: bool,
    max_manifest_bytes: Option<u64>,
    max_layer_bytes: Option<u64>,
}

impl OciFile {
    pub(crate) fn settings(self) -> Result<OciSettings, String> {
        let defaults = OciSettings::default();
        let positive = |name: &str, value: Option<u64>, default: u64| match value {
            Some(0) => Err(format!("{name} must be at least 1")),
            Some(n) => Ok(n),
            None => Ok(default),
        };
        Ok(OciSettings {
            require_signature: self.require_signature,
            insecure: self.insecure,
            max_manifest_bytes: positive(
                "max_manifest_bytes",
                self.max_manifest_bytes,
                defaults.max_manifest_bytes,
            )?,
            max_layer_bytes: positive(
                "max_layer_bytes",
                self.max_layer_bytes,
                defaults.max_layer_bytes,
            )?,
        })
    }
}

/// `verify = { key = "a.pub" }` or `{ key = ["a.pub", "b.pub"] }`, with
/// `repositories = ["REGISTRY/REPO", …]` whose signatures also count.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VerifyFile {
    key: OneOrMany,
    #[serde(default)]
    repositories: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl VerifyFile {
    /// The key files, as written.
    pub(crate) fn files(&self) -> &[String] {
        match &self.key {
            OneOrMany::One(file) => std::slice::from_ref(file),
            OneOrMany::Many(files) => files,
        }
    }

    /// The repositories besides the tool's own whose signatures count, as
    /// `registry/repository`; an error names the one that is not that.
    pub(crate) fn repositories(&self) -> Result<Vec<String>, String> {
        self.repositories
            .iter()
            .map(|name| {
                let named = format!("{name}:tag")
                    .parse::<Reference>()
                    .ok()
                    .map(|r| r.repository_name())
                    .filter(|parsed| parsed.eq_ignore_ascii_case(name));
                named.ok_or_else(|| {
                    format!(
                        "verify.repositories: {:?} is not REGISTRY/REPOSITORY (no tag or digest)",
                        crate::text::truncate(name, 200)
                    )
                })
            })
            .collect()
    }
}

/// The lock file's name, beside the policy.
pub const LOCK_FILE: &str = "airlock.lock";

/// Where a policy's lock file is: `airlock.lock` beside the policy (or in
/// the current directory, for references given on the command line alone).
pub fn lock_path(policy: Option<&Path>) -> PathBuf {
    match policy.and_then(Path::parent) {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(LOCK_FILE),
        _ => PathBuf::from(LOCK_FILE),
    }
}
