//! Publishing: pushing a component as the wasm artifact layout, and its
//! cosign signature beside it.

use std::collections::BTreeMap;

use serde_json::json;

use super::manifest::{Descriptor, ImageManifest, OCI_CONFIG_MEDIA_TYPE};
use super::signature::{self, PAYLOAD_MEDIA_TYPE, SIGNATURE_ANNOTATION, Signature};
use super::{OciError, Registry, WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE};

/// What `push` put in the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// The digest of the manifest bytes Airlock sent: what the tag names
    /// now, and what a signature of this push signs. Never read back from
    /// the registry.
    pub manifest: String,
    /// The component's digest.
    pub component: String,
}

impl Registry {
    /// Pushes `component` (the bytes of a component) to the reference's
    /// tag as the wasm artifact layout: an OCI image manifest whose config
    /// (`application/vnd.wasm.config.v0+json`) names its imports and
    /// exports, and one `application/wasm` layer.
    pub async fn push(&self, component: &[u8]) -> Result<Pushed, OciError> {
        let Some(tag) = self.reference.tag().map(str::to_owned) else {
            return Err(OciError::InvalidReference {
                reference: self.reference.to_string(),
                problem: "a push names a tag: REGISTRY/REPO:TAG".into(),
            });
        };
        let (imports, exports) = component_names(component);
        let layer = Descriptor::of(WASM_LAYER_MEDIA_TYPE, component);
        let config = json!({
            "created": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [layer.digest],
            "component": {"exports": exports, "imports": imports},
        })
        .to_string()
        .into_bytes();
        self.push_blob(component, "component").await?;
        self.push_blob(&config, "component's config").await?;
        let manifest = ImageManifest::new(
            Descriptor::of(WASM_CONFIG_MEDIA_TYPE, &config),
            vec![layer.clone()],
        );
        let manifest = self.push_manifest(&tag, &manifest, "manifest").await?;
        Ok(Pushed {
            manifest,
            component: layer.digest,
        })
    }

    /// Adds `signature` to the signatures of `manifest_digest` (kept with
    /// those already there, as cosign does).
    pub async fn push_signature(
        &self,
        manifest_digest: &str,
        signature: &Signature,
    ) -> Result<(), OciError> {
        let tag = signature::signature_tag(manifest_digest);
        let mut layers = self
            .signature_manifest(manifest_digest)
            .await?
            .map(|m| m.layers)
            .unwrap_or_default();
        let payload = signature.payload.as_bytes();
        let mut layer = Descriptor::of(PAYLOAD_MEDIA_TYPE, payload);
        let already = layers.iter().any(|l| {
            l.digest == layer.digest
                && l.annotations
                    .as_ref()
                    .and_then(|a| a.get(SIGNATURE_ANNOTATION))
                    == Some(&signature.signature)
        });
        if already {
            return Ok(());
        }
        self.push_blob(payload, "signature").await?;
        layer.annotations = Some(BTreeMap::from([(
            SIGNATURE_ANNOTATION.to_owned(),
            signature.signature.clone(),
        )]));
        layers.push(layer);
        let diff_ids: Vec<&str> = layers.iter().map(|l| l.digest.as_str()).collect();
        let config = json!({
            "architecture": "",
            "config": {},
            "created": "0001-01-01T00:00:00Z",
            "history": [{"created": "0001-01-01T00:00:00Z"}],
            "os": "",
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        })
        .to_string()
        .into_bytes();
        self.push_blob(&config, "signature").await?;
        let manifest = ImageManifest::new(Descriptor::of(OCI_CONFIG_MEDIA_TYPE, &config), layers);
        self.push_manifest(&tag, &manifest, "signature").await?;
        Ok(())
    }
}

/// The names a component imports and exports at its top level.
fn component_names(bytes: &[u8]) -> (Vec<String>, Vec<String>) {
    let (mut imports, mut exports) = (Vec::new(), Vec::new());
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload {
            Ok(wasmparser::Payload::ComponentImportSection(section)) => {
                imports.extend(
                    section
                        .into_iter()
                        .flatten()
                        .map(|i| i.name.name.to_owned()),
                );
            }
            Ok(wasmparser::Payload::ComponentExportSection(section)) => {
                exports.extend(
                    section
                        .into_iter()
                        .flatten()
                        .map(|e| e.name.name.to_owned()),
                );
            }
            Ok(
                wasmparser::Payload::ModuleSection { .. }
                | wasmparser::Payload::ComponentSection { .. },
            ) => {}
            Err(_) => break,
            _ => {}
        }
    }
    (imports, exports)
}
