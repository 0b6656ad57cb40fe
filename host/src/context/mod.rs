//! The run context: the state a run owns and tools read.
//!
//! Invariants:
//!
//! - `deps` is always a JSON object, and changes only through
//!   [`RunContext::apply`] (all of a call's ops or none) or through the
//!   embedder's own `deps_mut`.
//! - `run_id` is fresh for every `RunContext` and for every agent run on
//!   it ([`RunContext::start_run`]); it is never taken from a caller.
//! - `session_id` is always set: generated when the caller gives none.

mod access;
mod ops;
mod output;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use access::{ContextRules, KeyAccess, KeyPatterns, KeyRules, RuleError};
pub use ops::{
    ContextOp, JsonType, MAX_VALUE_DEPTH, OpKind, OpLimits, OpRejected, RejectReason,
    SchemaViolation,
};
pub use output::{LEGACY_UPDATE_KEY, OutputError, ParsedOutput, WireOp, parse_output};

/// Deps as a shared, copy-on-write JSON object.
///
/// A call's read-only view holds a clone of the `Arc`, so starting a call
/// never copies deps; applying ops after the call has ended mutates in place.
pub type Deps = Arc<Map<String, Value>>;

/// Token and request totals for a run. Serialized with `total_tokens`
/// (input plus output) as well.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    /// Model requests made.
    pub requests: u32,
    /// Tool calls the model asked for.
    pub tool_calls: u32,
    /// Prompt tokens, as the provider counted them.
    pub input_tokens: u64,
    /// Completion tokens, as the provider counted them.
    pub output_tokens: u64,
}

/// The state of one run, owned by the host.
#[derive(Debug, Clone)]
pub struct RunContext {
    deps: Deps,
    /// Length of deps as compact JSON, once measured; kept up to date by
    /// `apply`, forgotten by `deps_mut`.
    deps_bytes: Option<usize>,
    run_id: String,
    session_id: String,
    user_id: Option<String>,
    metadata: BTreeMap<String, String>,
    /// Totals so far; the agent loop adds to it.
    pub usage: Usage,
    /// The number of the current model request (0 outside an agent run).
    pub iteration: u32,
}

/// Deps given by a user that are not a JSON object.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DepsError {
    /// The text does not parse.
    #[error("deps are not valid JSON: {0}")]
    InvalidJson(#[from] serde_json::Error),
    /// It parses, but is not an object.
    #[error("deps must be a JSON object, not {0}")]
    NotAnObject(JsonType),
}

impl Default for RunContext {
    fn default() -> Self {
        Self::new(Map::new())
    }
}

impl RunContext {
    /// A new run with the given deps, a fresh run id and a fresh session id.
    pub fn new(deps: Map<String, Value>) -> Self {
        Self {
            deps: Arc::new(deps),
            deps_bytes: None,
            run_id: new_id("run"),
            session_id: new_id("sess"),
            user_id: None,
            metadata: BTreeMap::new(),
            usage: Usage::default(),
            iteration: 0,
        }
    }

    /// A new run whose deps are `value`, which must be a JSON object.
    pub fn from_value(value: Value) -> Result<Self, DepsError> {
        match value {
            Value::Object(map) => Ok(Self::new(map)),
            other => Err(DepsError::NotAnObject(JsonType::of(&other))),
        }
    }

    /// A new run whose deps are parsed from JSON text (a JSON object).
    pub fn from_json(text: &str) -> Result<Self, DepsError> {
        Self::from_value(serde_json::from_str(text)?)
    }

    /// Continues the session `id` instead of starting a new one. An empty id
    /// is ignored.
    pub fn with_session_id(mut self, id: impl Into<String>) -> Self {
        let id = id.into();
        if !id.is_empty() {
            self.session_id = id;
        }
        self
    }

    /// Attributes the run to a user. Sessions of one user are never visible
    /// to another.
    pub fn with_user_id(mut self, id: impl Into<String>) -> Self {
        self.user_id = Some(id.into());
        self
    }

    /// Attaches an opaque string pair that tools may read.
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// The deps, in insertion order.
    pub fn deps(&self) -> &Map<String, Value> {
        &self.deps
    }

    /// A cheap shared handle to the current deps (no copy).
    pub fn deps_snapshot(&self) -> Deps {
        Arc::clone(&self.deps)
    }

    /// Direct access for the embedder. Tools never get this; they return ops.
    pub fn deps_mut(&mut self) -> &mut Map<String, Value> {
        self.deps_bytes = None;
        Arc::make_mut(&mut self.deps)
    }

    /// This run's id (fresh for every context, and for every agent run).
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The same context under run `id` (a replayed call's own run).
    pub(crate) fn with_run_id(mut self, id: String) -> Self {
        self.run_id = id;
        self
    }

    /// Starts a new run on this context: a fresh run id, and the iteration
    /// count back to 0. Deps, ids of the session and user, and usage
    /// totals carry on. The agent loop calls it at the start of every run,
    /// so two runs on one context never share a run id.
    pub fn start_run(&mut self) {
        self.run_id = new_id("run");
        self.iteration = 0;
    }

    /// The session's id (generated when not given).
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The user the run is for, if any.
    pub fn user_id(&self) -> Option<&str> {
        self.user_id.as_deref()
    }

    /// The opaque string pairs tools may read.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Applies a call's ops in order: all of them, or none and an error
    /// naming the first op that failed (its index, key and reason).
    ///
    /// Costs the size of the values the ops touch, not the size of deps
    /// (deps are measured once, for [`OpLimits::max_deps_bytes`], and again
    /// only after [`RunContext::deps_mut`]).
    pub fn apply(&mut self, ops: &[ContextOp], limits: &OpLimits) -> Result<(), OpRejected> {
        self.apply_with_rules(ops, limits, &KeyRules::default())
    }

    /// [`RunContext::apply`] for a tool bound by `rules`: a hidden key or a
    /// key outside the tool's `write` patterns rejects the call, and every
    /// key with a schema must satisfy it once all the ops are applied.
    pub fn apply_with_rules(
        &mut self,
        ops: &[ContextOp],
        limits: &OpLimits,
        rules: &KeyRules,
    ) -> Result<(), OpRejected> {
        if ops.is_empty() {
            return Ok(());
        }
        let current = *self
            .deps_bytes
            .get_or_insert_with(|| crate::json::len(&*self.deps));
        let new = ops::apply(Arc::make_mut(&mut self.deps), current, ops, limits, rules)?;
        self.deps_bytes = Some(new);
        Ok(())
    }
}

impl Usage {
    /// Input plus output tokens.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// What was used since `earlier` (totals taken before), field by
    /// field; never below zero.
    pub fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            requests: self.requests.saturating_sub(earlier.requests),
            tool_calls: self.tool_calls.saturating_sub(earlier.tool_calls),
            input_tokens: self.input_tokens.saturating_sub(earlier.input_tokens),
            output_tokens: self.output_tokens.saturating_sub(earlier.output_tokens),
        }
    }
}

impl Serialize for Usage {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut usage = serializer.serialize_struct("Usage", 5)?;
        usage.serialize_field("requests", &self.requests)?;
        usage.serialize_field("tool_calls", &self.tool_calls)?;
        usage.serialize_field("input_tokens", &self.input_tokens)?;
        usage.serialize_field("output_tokens", &self.output_tokens)?;
        usage.serialize_field("total_tokens", &self.total_tokens())?;
        usage.end()
    }
}

/// Applies ops that were validated when they were first applied (a
/// session's journal): no limits or key rules, only the op semantics. An
/// error means the ops do not fit these deps, which a journal Airlock wrote
/// never does. A session's writer replays every commit's ops, so the
/// rules (every key readable and writable, none hidden) are made once.
pub(crate) fn replay(deps: &mut Map<String, Value>, ops: &[ContextOp]) -> Result<(), OpRejected> {
    static UNRESTRICTED: std::sync::LazyLock<KeyRules> =
        std::sync::LazyLock::new(KeyRules::default);
    const UNLIMITED: OpLimits = OpLimits {
        max_ops: usize::MAX,
        max_key_bytes: usize::MAX,
        max_op_bytes: usize::MAX,
        max_deps_bytes: usize::MAX,
    };
    ops::apply(deps, 0, ops, &UNLIMITED, &UNRESTRICTED).map(|_| ())
}

pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_fresh_and_session_can_be_continued() {
        let a = RunContext::default();
        let b = RunContext::default().with_session_id(a.session_id());
        assert_ne!(a.run_id(), b.run_id());
        assert_eq!(a.session_id(), b.session_id());
        assert_eq!(
            RunContext::default().with_session_id("").session_id().len(),
            37
        );
    }

    #[test]
    fn deps_must_be_an_object() {
        assert!(matches!(
            RunContext::from_json("[1]"),
            Err(DepsError::NotAnObject(JsonType::Array))
        ));
        assert!(matches!(
            RunContext::from_json("{"),
            Err(DepsError::InvalidJson(_))
        ));
    }
}
