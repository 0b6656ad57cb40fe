//! The OCI documents Airlock reads and writes: image manifests and their
//! descriptors (the artifact layout of a component, a cosign signature
//! manifest), and what a manifest's bytes name ([`names`]): the component
//! layer, or an index's wasm entry.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{OciError, OciSettings, Reference};

/// An OCI image manifest's media type.
pub const OCI_IMAGE_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// An OCI image index's media type.
pub const OCI_IMAGE_INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

/// An OCI image config's media type.
pub const OCI_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";

/// The manifest media types asked for: OCI's and Docker's v2.
pub(super) const MANIFEST_TYPES: [&str; 4] = [
    OCI_IMAGE_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

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

/// A blob as a manifest names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// What the blob is.
    pub media_type: String,
    /// `sha256:<hex>` of its bytes.
    pub digest: String,
    /// Its length in bytes.
    pub size: i64,
    /// Other places it may be fetched from: never used (a layer comes
    /// from the registry the reference names, or from nowhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urls: Option<Vec<String>>,
    /// Annotations (a cosign signature is one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

impl Descriptor {
    /// A descriptor of `bytes` as `media_type`.
    pub(super) fn of(media_type: &str, bytes: &[u8]) -> Self {
        Self {
            media_type: media_type.to_owned(),
            digest: sha256_digest(bytes),
            size: i64::try_from(bytes.len()).unwrap_or(i64::MAX),
            urls: None,
            annotations: None,
        }
    }
}

/// An OCI image manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ImageManifest {
    pub(super) schema_version: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) media_type: Option<String>,
    pub(super) config: Descriptor,
    #[serde(default)]
    pub(super) layers: Vec<Descriptor>,
}

impl ImageManifest {
    /// An OCI image manifest of `config` and `layers`.
    pub(super) fn new(config: Descriptor, layers: Vec<Descriptor>) -> Self {
        Self {
            schema_version: 2,
            media_type: Some(OCI_IMAGE_MEDIA_TYPE.to_owned()),
            config,
            layers,
        }
    }

    /// Its bytes as pushed (and so as signed): compact JSON.
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What one manifest's bytes name.
#[derive(Debug)]
pub(super) enum Names {
    /// An image manifest's one component layer (its `urls` dropped).
    Layer(Descriptor),
    /// An index's wasm entry: the digest of the image manifest to read.
    Entry(String),
}

/// An index whose wasm entry is an index again (never followed further).
pub(super) fn nested_index(reference: &Reference) -> OciError {
    OciError::NotWasm {
        reference: reference.clone(),
        problem: "the wasm entry of the manifest list is a manifest list itself".into(),
    }
}

/// What the manifest `bytes` name (for `reference`, whose errors these
/// are): the wasm entry of an index, or the one component layer of an
/// image manifest, checked (a sha256 digest, within `max_layer_bytes`).
/// The same reading serves a pull and every offline start, which
/// re-derives the component from the manifest bytes the store kept.
pub(super) fn names(
    reference: &Reference,
    settings: &OciSettings,
    bytes: &[u8],
) -> Result<Names, OciError> {
    let not_wasm = |problem: String| OciError::NotWasm {
        reference: reference.clone(),
        problem,
    };
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| not_wasm(format!("the manifest is not JSON: {e}")))?;
    if let Some(entries) = value.get("manifests") {
        // An index (manifest list): its wasm entry.
        let entries = entries.as_array().map(Vec::as_slice).unwrap_or_default();
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
        if !crate::policy::reference::is_digest(entry_digest) {
            return Err(not_wasm("the wasm entry's digest is not sha256".into()));
        }
        return Ok(Names::Entry(entry_digest.to_owned()));
    }
    let manifest: ImageManifest = serde_json::from_value(value)
        .map_err(|e| not_wasm(format!("the manifest is not an OCI image manifest: {e}")))?;
    let mut layers = manifest
        .layers
        .iter()
        .filter(|l| WASM_LAYERS.contains(&l.media_type.as_str()));
    let layer = match (layers.next(), layers.next()) {
        (Some(layer), None) => layer.clone(),
        (None, _) => {
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
        (Some(_), Some(_)) => {
            return Err(not_wasm(format!(
                "{} wasm layers; one is expected",
                2 + layers.count()
            )));
        }
    };
    // A layer's `urls` would send the download elsewhere; the registry
    // serves it, or nothing does.
    let layer = Descriptor {
        urls: None,
        ..layer
    };
    if !crate::policy::reference::is_digest(&layer.digest) {
        return Err(not_wasm(
            "the component layer's digest is not sha256".into(),
        ));
    }
    let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
    if size > settings.max_layer_bytes {
        return Err(OciError::TooLarge {
            reference: reference.clone(),
            what: "layer",
            size,
            limit: settings.max_layer_bytes,
        });
    }
    Ok(Names::Layer(layer))
}

/// The `sha256:…` digest of `bytes`, as registries name blobs and
/// manifests.
pub(crate) fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::{Digest as _, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}
