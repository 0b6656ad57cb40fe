//! From a reference to a local file: through the lock, the store, and —
//! when allowed — the registry.
//!
//! The order is what makes it safe: the manifest is read and checked
//! against its digest (and the lock), the signatures are checked against
//! the manifest digest, and only then is the component downloaded, checked
//! against its digest as it streams, and kept. Nothing unverified reaches
//! the store, so nothing unverified is ever compiled.

use std::path::{Path, PathBuf};

use super::manifest::{Names, names, nested_index};
use super::registry::Resolution;
use super::signature::{PublicKey, Signature};
use super::{
    Credentials, Lock, Locked, OciError, OciSettings, OciStore, OciTool, Reference, Registry,
};
use crate::policy::{Policy, Resolved};

/// How far a resolution may go to the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetch {
    /// Never: the lock and the store must hold it (what a run needs to be
    /// offline, and what a benchmark measures).
    Never,
    /// Only for what the store lacks: an entry the lock pins is fetched by
    /// its digest; a reference the lock does not know is resolved and
    /// added to the lock. What `run`, `call`, `inspect` and `mcp` do.
    Missing,
    /// Always ask the registry, and refuse a reference whose tag now names
    /// other bytes than the lock pins. What `airlock pull` does.
    Check,
    /// Always ask the registry, and move the lock to what it says now.
    /// What `airlock pull --update` does.
    Update,
}

/// Resolves references against one lock, one store, one set of registry
/// settings and credentials. Changes to the lock are kept in memory until
/// [`Resolver::save`].
#[derive(Debug)]
pub struct Resolver {
    settings: OciSettings,
    credentials: Credentials,
    store: OciStore,
    lock: Lock,
    changed: bool,
}

impl Resolver {
    /// Resolves every tool `policy` names by reference that is not
    /// resolved yet, pointing its `path` at the pulled component and
    /// recording what it resolved to in its `pulled`. Stops at the first
    /// that cannot be used.
    pub async fn resolve_policy(
        &mut self,
        policy: &mut Policy,
        fetch: Fetch,
    ) -> Result<(), OciError> {
        for tool in &mut policy.tools {
            let Some(oci) = &tool.oci else { continue };
            if tool.pulled.is_some() {
                continue;
            }
            let resolved = self.resolve(oci, fetch).await?;
            tool.path = resolved.path.clone();
            tool.pulled = Some(resolved);
        }
        Ok(())
    }

    /// A resolver over `lock` and `store`.
    pub fn new(
        settings: OciSettings,
        credentials: Credentials,
        store: OciStore,
        lock: Lock,
    ) -> Self {
        Self {
            settings,
            credentials,
            store,
            lock,
            changed: false,
        }
    }

    /// The lock, with the changes made so far.
    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    /// The store.
    pub fn store(&self) -> &OciStore {
        &self.store
    }

    /// The settings.
    pub fn settings(&self) -> &OciSettings {
        &self.settings
    }

    /// Writes the lock if a resolution changed it; whether it did.
    pub fn save(&mut self) -> Result<bool, OciError> {
        if !self.changed {
            return Ok(false);
        }
        self.lock.save()?;
        self.changed = false;
        Ok(true)
    }

    /// `tool` as a local file, going to the registry only as `fetch`
    /// allows. Refused (before anything is downloaded) when the policy
    /// wants a signature and no trusted key's verifies for the manifest.
    pub async fn resolve(&mut self, tool: &OciTool, fetch: Fetch) -> Result<Resolved, OciError> {
        let reference = &tool.reference;
        if tool.keys.is_empty() && self.settings.require_signature {
            return Err(OciError::NoKey {
                reference: reference.clone(),
            });
        }
        let locked = self.lock.get(reference).cloned();
        if let (Some(digest), Some(locked)) = (reference.digest(), &locked)
            && locked.manifest != digest
        {
            return Err(self.lock_error(format!(
                "{reference}: pinned to manifest {}, but the reference names {digest}",
                locked.manifest
            )));
        }
        match (fetch, locked) {
            (Fetch::Never | Fetch::Missing, Some(locked)) => {
                let stored = if self.stored_manifest_names(reference, &locked)? {
                    self.store.component(&locked.component)?
                } else {
                    None
                };
                if let Some(path) = stored {
                    let signatures = self.store.signatures(&locked.manifest);
                    let signed_by = signers(tool, &locked.manifest, &signatures)?;
                    return Ok(Resolved {
                        reference: reference.clone(),
                        path,
                        manifest: locked.manifest,
                        component: locked.component,
                        signed_by,
                    });
                }
                if fetch == Fetch::Never {
                    return Err(OciError::NotPulled {
                        reference: reference.clone(),
                    });
                }
                let component = locked.component.clone();
                self.pull(tool, Pin::Digest(locked))
                    .await
                    .map_err(|e| match e {
                        // Say what was missing, and from where.
                        OciError::Unreachable { reference, problem } => OciError::Unreachable {
                            problem: format!(
                                "{problem}; it was asked for {component}, which {} pins and \
                                 the store at {} lacks",
                                self.lock.path().display(),
                                self.store.dir().display()
                            ),
                            reference,
                        },
                        other => other,
                    })
            }
            (Fetch::Never, None) => Err(OciError::NotPulled {
                reference: reference.clone(),
            }),
            (Fetch::Check, Some(locked)) => self.pull(tool, Pin::Expect(locked)).await,
            (Fetch::Missing | Fetch::Check, None) | (Fetch::Update, _) => {
                self.pull(tool, Pin::Free).await
            }
        }
    }

    /// Whether the stored bytes of `locked`'s manifest (through its index
    /// entry when it is an index) name the component the lock pins: `false`
    /// when the store lacks a manifest, an error naming both digests when
    /// they name another. What makes an edited lock unable to point a
    /// signed tool's name and grants at another component in the store.
    fn stored_manifest_names(
        &self,
        reference: &Reference,
        locked: &Locked,
    ) -> Result<bool, OciError> {
        let Some(bytes) = self.store.manifest(&locked.manifest)? else {
            return Ok(false);
        };
        let layer = match names(reference, &self.settings, &bytes)? {
            Names::Layer(layer) => layer,
            Names::Entry(entry) => {
                let Some(image) = self.store.manifest(&entry)? else {
                    return Ok(false);
                };
                match names(reference, &self.settings, &image)? {
                    Names::Layer(layer) => layer,
                    Names::Entry(_) => return Err(nested_index(reference)),
                }
            }
        };
        if layer.digest != locked.component {
            return Err(self.pins_another(reference, locked, &layer.digest));
        }
        Ok(true)
    }

    /// The lock pins `locked.component`, but its manifest names `named`.
    fn pins_another(&self, reference: &Reference, locked: &Locked, named: &str) -> OciError {
        self.lock_error(format!(
            "{reference}: pins component {}, but its manifest {} names {named}",
            locked.component, locked.manifest
        ))
    }

    fn lock_error(&self, problem: String) -> OciError {
        OciError::Lock {
            path: self.lock.path().to_path_buf(),
            line: None,
            problem,
        }
    }

    /// Reads the manifest, checks it against the lock and the signatures
    /// against it, then downloads the component; pins what it found.
    async fn pull(&mut self, tool: &OciTool, pin: Pin) -> Result<Resolved, OciError> {
        let reference = &tool.reference;
        let registry = Registry::connect(reference, &self.settings, &self.credentials)?;
        let at = match &pin {
            Pin::Digest(locked) => reference.at_digest(&locked.manifest),
            Pin::Expect(_) | Pin::Free => reference.clone(),
        };
        let Resolution {
            manifest,
            layer,
            manifests,
        } = registry.resolve(&at).await?;
        if let Pin::Expect(locked) | Pin::Digest(locked) = &pin {
            if locked.manifest != manifest {
                return Err(OciError::Moved {
                    reference: reference.clone(),
                    lock: self.lock.path().display().to_string(),
                    locked: locked.manifest.clone(),
                    registry: manifest,
                });
            }
            if locked.component != layer.digest {
                return Err(self.pins_another(reference, locked, &layer.digest));
            }
        }
        let signatures = if tool.keys.is_empty() {
            Vec::new()
        } else {
            registry.signatures(&manifest).await?
        };
        let signed_by = signers(tool, &manifest, &signatures)?;
        let path = registry.download(&layer, &self.store).await?;
        for (digest, bytes) in &manifests {
            self.store.keep_manifest(digest, bytes)?;
        }
        if !signatures.is_empty() {
            self.store.keep_signatures(&manifest, &signatures)?;
        }
        let entry = Locked {
            reference: reference.to_string(),
            manifest: manifest.clone(),
            component: layer.digest.clone(),
            signed_by: signed_by
                .iter()
                .map(|key| relative_to(key, self.lock.path()))
                .collect(),
        };
        if self.lock.get(reference) != Some(&entry) {
            self.lock.set(reference, entry);
            self.changed = true;
        }
        Ok(Resolved {
            reference: reference.clone(),
            path,
            manifest,
            component: layer.digest,
            signed_by,
        })
    }
}

/// What the lock says a pull must find.
enum Pin {
    /// Fetch this manifest by its digest.
    Digest(Locked),
    /// Resolve the reference, and refuse anything but this manifest.
    Expect(Locked),
    /// Resolve the reference; whatever it names now.
    Free,
}

/// The keys of `tool` whose signature verifies for `manifest`; an error
/// when it has keys and none does.
fn signers(
    tool: &OciTool,
    manifest: &str,
    signatures: &[Signature],
) -> Result<Vec<PathBuf>, OciError> {
    if tool.keys.is_empty() {
        return Ok(Vec::new());
    }
    let repositories = tool.signed_for();
    let signed_by: Vec<PathBuf> = tool
        .keys
        .iter()
        .filter(|key| {
            signatures
                .iter()
                .any(|s| key.verifies(s, manifest, &repositories))
        })
        .map(|key| key.path.clone())
        .collect();
    if signed_by.is_empty() {
        return Err(OciError::Unsigned {
            reference: tool.reference.clone(),
            digest: manifest.to_owned(),
            keys: key_list(&tool.keys),
            found: signatures.len(),
        });
    }
    Ok(signed_by)
}

fn key_list(keys: &[PublicKey]) -> String {
    keys.iter()
        .map(|k| k.path.display().to_string())
        .collect::<Vec<_>>()
        .join(" or ")
}

/// `path` as the lock at `lock` should name it: relative to the lock's
/// directory (with `..` where needed), as the policy beside it names keys;
/// absolute only when the two share no root.
fn relative_to(path: &Path, lock: &Path) -> String {
    let dir = match lock.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let full = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let Ok(dir) = dir.canonicalize() else {
        return full.display().to_string();
    };
    let (from, to): (Vec<_>, Vec<_>) = (dir.components().collect(), full.components().collect());
    let shared = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    if shared == 0 {
        return full.display().to_string();
    }
    let mut relative = PathBuf::new();
    for _ in shared..from.len() {
        relative.push("..");
    }
    relative.extend(&to[shared..]);
    relative.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::relative_to;

    #[test]
    fn the_lock_names_keys_relative_to_itself() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for sub in ["policy/keys", "keys"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        std::fs::write(root.join("policy/keys/a.pub"), "").unwrap();
        std::fs::write(root.join("keys/b.pub"), "").unwrap();
        let lock = root.join("policy/airlock.lock");
        assert_eq!(
            relative_to(&root.join("policy/keys/a.pub"), &lock),
            "keys/a.pub"
        );
        assert_eq!(
            relative_to(&root.join("policy/../keys/b.pub"), &lock),
            "../keys/b.pub"
        );
    }
}
