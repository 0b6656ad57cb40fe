//! Publishing: pushing a component as the wasm artifact layout, and its
//! cosign signature beside it.

use std::collections::BTreeMap;

use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest};
use serde_json::json;

use super::registry::sha256_digest;
use super::signature::{self, PAYLOAD_MEDIA_TYPE, SIGNATURE_ANNOTATION, Signature};
use super::{OciError, Registry, WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE};

impl Registry {
    /// Pushes `component` (the bytes of a component) as the wasm artifact
    /// layout: an OCI image manifest whose config
    /// (`application/vnd.wasm.config.v0+json`) names its imports and
    /// exports, and one `application/wasm` layer. The manifest's digest
    /// and the component's.
    pub async fn push(&self, component: &[u8]) -> Result<(String, String), OciError> {
        let component_digest = sha256_digest(component);
        let (imports, exports) = component_names(component);
        let config = json!({
            "created": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [component_digest],
            "component": {"exports": exports, "imports": imports},
        })
        .to_string()
        .into_bytes();
        let layer = ImageLayer::new(component.to_vec(), WASM_LAYER_MEDIA_TYPE.to_owned(), None);
        let config = Config::new(config, WASM_CONFIG_MEDIA_TYPE.to_owned(), None);
        let mut manifest = OciImageManifest::build(std::slice::from_ref(&layer), &config, None);
        manifest.media_type = Some(OCI_IMAGE_MEDIA_TYPE.to_owned());
        self.client
            .push(
                &self.reference.to_client(),
                &[layer],
                config,
                &self.auth,
                Some(manifest),
            )
            .await
            .map_err(|e| self.failed("component", e))?;
        let (manifest_digest, _) = self.resolve(&self.reference).await?;
        Ok((manifest_digest, component_digest))
    }

    /// Adds `signature` to the signatures of `manifest_digest` (kept with
    /// those already there, as cosign does).
    pub async fn push_signature(
        &self,
        manifest_digest: &str,
        signature: &Signature,
    ) -> Result<(), OciError> {
        let at = self
            .reference
            .at_tag(&signature::signature_tag(manifest_digest));
        let mut layers: Vec<OciDescriptor> = match self.manifest_at(&at).await {
            Ok((_, bytes)) => serde_json::from_slice::<OciImageManifest>(&bytes)
                .map(|m| m.layers)
                .unwrap_or_default(),
            Err(OciError::NotFound { .. }) => Vec::new(),
            Err(e) => return Err(e),
        };
        let payload = signature.payload.as_bytes();
        let payload_digest = sha256_digest(payload);
        let already = layers.iter().any(|l| {
            l.digest == payload_digest
                && l.annotations
                    .as_ref()
                    .and_then(|a| a.get(SIGNATURE_ANNOTATION))
                    == Some(&signature.signature)
        });
        if already {
            return Ok(());
        }
        let client_at = at.to_client();
        self.client
            .store_auth_if_needed(at.registry(), &self.auth)
            .await;
        self.client
            .push_blob(&client_at, payload, &payload_digest)
            .await
            .map_err(|e| self.failed("signature", e))?;
        layers.push(OciDescriptor {
            media_type: PAYLOAD_MEDIA_TYPE.to_owned(),
            digest: payload_digest,
            size: i64::try_from(payload.len()).unwrap_or(i64::MAX),
            urls: None,
            annotations: Some(BTreeMap::from([(
                SIGNATURE_ANNOTATION.to_owned(),
                signature.signature.clone(),
            )])),
        });
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
        let config_digest = sha256_digest(&config);
        self.client
            .push_blob(&client_at, &config, &config_digest)
            .await
            .map_err(|e| self.failed("signature", e))?;
        let manifest = OciImageManifest {
            schema_version: 2,
            media_type: Some(OCI_IMAGE_MEDIA_TYPE.to_owned()),
            config: OciDescriptor {
                media_type: "application/vnd.oci.image.config.v1+json".to_owned(),
                digest: config_digest,
                size: i64::try_from(config.len()).unwrap_or(i64::MAX),
                urls: None,
                annotations: None,
            },
            layers,
            subject: None,
            artifact_type: None,
            annotations: None,
        };
        self.client
            .push_manifest(&client_at, &manifest.into())
            .await
            .map_err(|e| self.failed("signature", e))?;
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
