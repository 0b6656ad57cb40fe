//! Which deps keys a tool may read and write, which keys no tool may see,
//! and what values keys must hold.

use std::collections::BTreeMap;
use std::sync::Arc;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde_json::Value;

use super::SchemaViolation;

/// A list of glob patterns over deps keys (`*` matches any run of
/// characters, `?` one; `[abc]` a class), or "every key".
#[derive(Debug, Clone)]
pub struct KeyPatterns {
    set: Option<GlobSet>,
    patterns: Vec<String>,
}

/// A pattern or schema the operator wrote that cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    /// A key glob does not parse.
    #[error("key pattern {pattern:?}: {problem}")]
    Pattern {
        /// The pattern as written.
        pattern: String,
        /// What is wrong.
        problem: String,
    },
    /// A key's JSON Schema does not compile.
    #[error("schema for key {key:?}: {problem}")]
    Schema {
        /// The key the schema is for.
        key: String,
        /// Why it does not compile.
        problem: String,
    },
}

impl KeyPatterns {
    /// Matches every key.
    pub fn all() -> Self {
        Self {
            set: None,
            patterns: vec!["*".into()],
        }
    }

    /// Matches no key.
    pub fn none() -> Self {
        Self {
            set: Some(GlobSet::empty()),
            patterns: Vec::new(),
        }
    }

    /// Compiles `patterns` once; matching costs one pass over the key.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, RuleError> {
        let mut builder = GlobSetBuilder::new();
        for pattern in patterns {
            let pattern = pattern.as_ref();
            let glob = Glob::new(pattern).map_err(|e| RuleError::Pattern {
                pattern: pattern.to_owned(),
                problem: e.kind().to_string(),
            })?;
            builder.add(glob);
        }
        let set = builder.build().map_err(|e| RuleError::Pattern {
            pattern: patterns
                .iter()
                .map(|p| p.as_ref())
                .collect::<Vec<_>>()
                .join(", "),
            problem: e.to_string(),
        })?;
        Ok(Self {
            set: Some(set),
            patterns: patterns.iter().map(|p| p.as_ref().to_owned()).collect(),
        })
    }

    /// Whether any pattern matches `key`.
    pub fn matches(&self, key: &str) -> bool {
        self.set.as_ref().is_none_or(|set| set.is_match(key))
    }

    /// The patterns as written.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }
}

/// What one tool may do with deps keys. Default: read and write every key
/// that is not hidden.
#[derive(Debug, Clone)]
pub struct KeyAccess {
    /// Keys it may see through `get` and `keys`.
    pub read: KeyPatterns,
    /// Keys its ops may change.
    pub write: KeyPatterns,
}

impl Default for KeyAccess {
    fn default() -> Self {
        Self {
            read: KeyPatterns::all(),
            write: KeyPatterns::all(),
        }
    }
}

/// Host-wide rules for deps: hidden keys and per-key JSON Schemas.
#[derive(Debug, Clone)]
pub struct ContextRules {
    hidden: KeyPatterns,
    schemas: BTreeMap<String, Arc<jsonschema::Validator>>,
}

impl Default for ContextRules {
    fn default() -> Self {
        Self {
            hidden: KeyPatterns::none(),
            schemas: BTreeMap::new(),
        }
    }
}

impl ContextRules {
    /// Keys matching `hidden` are never visible to any tool, never listed by
    /// `keys`, never writable by a tool, and never serialized into
    /// sessions. `schemas` maps a key to a JSON Schema its value must
    /// satisfy after a call's ops are applied. Schemas cannot reference
    /// remote or file documents.
    pub fn new(hidden: KeyPatterns, schemas: BTreeMap<String, Value>) -> Result<Self, RuleError> {
        let schemas = schemas
            .into_iter()
            .map(|(key, schema)| {
                let validator =
                    crate::spec::compile_schema(&schema).map_err(|problem| RuleError::Schema {
                        key: key.clone(),
                        problem,
                    })?;
                Ok((key, Arc::new(validator)))
            })
            .collect::<Result<_, RuleError>>()?;
        Ok(Self { hidden, schemas })
    }

    /// Whether `key` is hidden from every tool.
    pub fn is_hidden(&self, key: &str) -> bool {
        !self.hidden.patterns().is_empty() && self.hidden.matches(key)
    }

    /// The hidden-key patterns.
    pub fn hidden(&self) -> &KeyPatterns {
        &self.hidden
    }

    /// The keys that have a schema, sorted.
    pub fn schema_keys(&self) -> impl Iterator<Item = &str> {
        self.schemas.keys().map(String::as_str)
    }

    /// Checks `value` against the schema for `key`, if any; the error is
    /// the first violation: where in the value and which rule, never the
    /// value itself (jsonschema's own messages quote it).
    pub(crate) fn check(&self, key: &str, value: &Value) -> Result<(), SchemaViolation> {
        let Some(validator) = self.schemas.get(key) else {
            return Ok(());
        };
        SchemaViolation::first(validator, value).map_or(Ok(()), Err)
    }
}

/// The rules one call is checked against: the tool's access and the host's
/// context rules.
#[derive(Debug, Clone, Default)]
pub struct KeyRules {
    /// The tool's own read and write patterns.
    pub access: Arc<KeyAccess>,
    /// The host-wide hidden keys and schemas.
    pub context: Arc<ContextRules>,
}

impl KeyRules {
    /// Whether the tool may see `key` (through `get` and `keys`).
    pub fn can_read(&self, key: &str) -> bool {
        !self.context.is_hidden(key) && self.access.read.matches(key)
    }
}
