//! `airlock.lock`: what each reference resolved to when it was pulled.
//!
//! ```toml
//! # Written by `airlock pull`. Review changes to it like Cargo.lock:
//! # each entry pins a reference to exact bytes.
//! version = 1
//!
//! [[component]]
//! reference = "ghcr.io/acme/units:1.0"
//! manifest = "sha256:…"
//! component = "sha256:…"
//! signed_by = ["keys/acme.pub"]
//! ```
//!
//! A run uses the lock: a reference resolves to the component the lock
//! names, offline. Only `airlock pull --update` moves an entry.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{OciError, Reference};
use crate::policy::reference::is_digest;

/// The format version this Airlock writes and reads.
const VERSION: u32 = 1;

const HEADER: &str = "# Written by `airlock pull`. Review changes to it like Cargo.lock: each entry\n# pins a reference to exact bytes (its manifest and component digests).\n";

/// What one reference resolved to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Locked {
    /// The reference, as the policy or command line wrote it.
    pub reference: String,
    /// The manifest's digest.
    pub manifest: String,
    /// The component's (the wasm layer's) digest.
    pub component: String,
    /// The key files whose signature verified, when one was required.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signed_by: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LockFile {
    version: u32,
    #[serde(default, rename = "component")]
    components: Vec<Locked>,
}

/// A lock file and its entries, by reference.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lock {
    path: PathBuf,
    entries: BTreeMap<Reference, Locked>,
}

impl Lock {
    /// Reads the lock at `path`; an empty lock if there is no file. A file
    /// that is not a lock this Airlock wrote (hand-edited into nonsense, a
    /// newer version) is an error naming the file and line.
    pub fn load(path: &Path) -> Result<Self, OciError> {
        let text = match crate::fs::read_settings_text(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self {
                    path: path.to_path_buf(),
                    entries: BTreeMap::new(),
                });
            }
            Err(e) => {
                return Err(OciError::Lock {
                    path: path.to_path_buf(),
                    line: None,
                    problem: format!("cannot read: {e}"),
                });
            }
        };
        let fail = |line: Option<usize>, problem: String| OciError::Lock {
            path: path.to_path_buf(),
            line,
            problem,
        };
        let file: LockFile = toml::from_str(&text).map_err(|e| {
            let line = e
                .span()
                .and_then(|s| text.get(..s.start))
                .map(|before| before.matches('\n').count() + 1);
            fail(line, e.message().to_owned())
        })?;
        if file.version != VERSION {
            return Err(fail(
                None,
                format!(
                    "version {} is not one this Airlock reads ({VERSION})",
                    file.version
                ),
            ));
        }
        let mut entries = BTreeMap::new();
        let line_at = |at: usize| text[..at].matches('\n').count() + 1;
        for locked in file.components {
            // The entry's line, and a value's line within the entry (the
            // parsed document keeps no spans).
            let entry = text.find(&format!("{:?}", locked.reference));
            let line = entry.map(line_at);
            let line_of = |value: &str| {
                let from = entry.unwrap_or(0);
                text[from..]
                    .find(&format!("{value:?}"))
                    .map(|at| line_at(from + at))
                    .or(line)
            };
            let reference: Reference = locked
                .reference
                .parse()
                .map_err(|e: super::InvalidReference| fail(line, e.to_string()))?;
            for (field, digest) in [
                ("manifest", &locked.manifest),
                ("component", &locked.component),
            ] {
                if !is_digest(digest) {
                    return Err(fail(
                        line_of(digest),
                        format!("{reference}: `{field}` is not a sha256 digest"),
                    ));
                }
            }
            if entries.insert(reference.clone(), locked).is_some() {
                return Err(fail(line, format!("{reference} is locked twice")));
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            entries,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What `reference` is pinned to, if it is.
    pub fn get(&self, reference: &Reference) -> Option<&Locked> {
        self.entries.get(reference)
    }

    /// Pins `reference`.
    pub fn set(&mut self, reference: &Reference, locked: Locked) {
        self.entries.insert(reference.clone(), locked);
    }

    /// Writes the lock (atomically), entries sorted by reference.
    pub fn save(&self) -> Result<(), OciError> {
        let file = LockFile {
            version: VERSION,
            components: self.entries.values().cloned().collect(),
        };
        let body = toml::to_string(&file).map_err(|e| OciError::Lock {
            path: self.path.clone(),
            line: None,
            problem: e.to_string(),
        })?;
        crate::fs::write_atomic(&self.path, format!("{HEADER}{body}").as_bytes()).map_err(|e| {
            OciError::Lock {
                path: self.path.clone(),
                line: None,
                problem: format!("cannot write: {e}"),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_round_trips_and_nonsense_names_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(super::super::LOCK_FILE);
        let mut lock = Lock::load(&path).unwrap();
        let reference: Reference = "127.0.0.1:5000/t/u:1".parse().unwrap();
        let digest = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        lock.set(
            &reference,
            Locked {
                reference: reference.to_string(),
                manifest: digest('a'),
                component: digest('b'),
                signed_by: vec!["keys/a.pub".into()],
            },
        );
        lock.save().unwrap();
        assert_eq!(Lock::load(&path).unwrap(), lock);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace(&digest('b'), "sha256:nope")).unwrap();
        let err = Lock::load(&path).unwrap_err().to_string();
        assert!(
            err.contains(":8: 127.0.0.1:5000/t/u:1: `component` is not a sha256 digest"),
            "{err}"
        );
        std::fs::write(&path, "version = 1\n[[component]]\nbogus = 1\n").unwrap();
        let err = Lock::load(&path).unwrap_err().to_string();
        assert!(err.contains("airlock.lock:3: "), "{err}");
        std::fs::write(&path, "version = 7\n").unwrap();
        assert!(
            Lock::load(&path)
                .unwrap_err()
                .to_string()
                .contains("version 7")
        );
    }
}
