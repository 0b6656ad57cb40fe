//! The policy's OCI keys, as written: `[oci]` and a tool's `verify`.

use serde::Deserialize;

use super::OciSettings;

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
                    .parse::<super::Reference>()
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
