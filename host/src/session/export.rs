//! Versioned export and import of one session.
//!
//! ```json
//! {
//!   "version": 1,
//!   "session_id": "sess_…", "user_id": null,
//!   "created_at_ms": 1763900000000, "updated_at_ms": 1763900004000,
//!   "metadata": {},
//!   "deps": {…}, "usage": {…}, "iteration": 2,
//!   "messages": [ … ], "items": [ … ],
//!   "journal": [ {"seq": 1, "at_ms": …, "entry": "deps", "deps": {…}}, … ]
//! }
//! ```
//!
//! `journal` is the session itself; `deps`, `usage`, `iteration`,
//! `messages` and `items` are its fold, written out for readers. An import
//! checks that they agree, so a file edited in one place and not the other
//! is refused rather than half believed. Hidden and secret-looking keys are
//! removed on the way out and again on the way in.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::store::{SessionHeader, StoredSession};
use crate::context::{ContextRules, Usage};
use crate::journal::{Event, Folded, Record, secrets};
use crate::llm::Message;

/// The export format this version writes and reads.
pub const EXPORT_VERSION: u64 = 1;

/// A session as a versioned JSON document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionExport {
    /// Always [`EXPORT_VERSION`].
    pub version: u64,
    /// The session's id.
    pub session_id: String,
    /// Its owner (`null`: the anonymous bucket).
    pub user_id: Option<String>,
    /// When it was created (ms since the Unix epoch).
    pub created_at_ms: u64,
    /// When its last record was committed.
    pub updated_at_ms: u64,
    /// Opaque string pairs.
    pub metadata: BTreeMap<String, String>,
    /// Deps: the fold of the journal.
    pub deps: Map<String, Value>,
    /// Usage totals.
    pub usage: Usage,
    /// The last model request's number.
    pub iteration: u32,
    /// The conversation the model sees.
    pub messages: Vec<Message>,
    /// The item log.
    pub items: Vec<Event>,
    /// The journal: every record, in order.
    pub journal: Vec<Record>,
}

/// An export that cannot be imported. Nothing was imported.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// No `version`, or one that is not a whole number.
    #[error("missing or invalid version field")]
    MissingVersion,
    /// A version this Airlock does not read.
    #[error("unsupported version: {0}")]
    UnsupportedVersion(u64),
    /// Not JSON, or not the version's shape.
    #[error("invalid session file: {0}")]
    Invalid(String),
    /// The journal does not fold, or its fold is not what the file says.
    #[error("inconsistent session file: {0}")]
    Inconsistent(String),
}

impl SessionExport {
    /// The export of `session` (read from a store). Keys that are hidden by
    /// `rules` or look secret are removed, in deps and in every record.
    pub fn new(session: &StoredSession, rules: &ContextRules) -> Result<Self, ImportError> {
        let journal: Vec<Record> = session
            .records
            .iter()
            .map(|r| secrets::scrub_record(r, rules))
            .collect();
        let folded =
            Folded::fold(&journal).map_err(|e| ImportError::Inconsistent(e.to_string()))?;
        Ok(Self {
            version: EXPORT_VERSION,
            session_id: session.header.session_id.clone(),
            user_id: session.header.user_id.clone(),
            created_at_ms: session.header.created_at_ms,
            updated_at_ms: session.updated_at_ms,
            metadata: session.header.metadata.clone(),
            deps: folded.deps,
            usage: folded.usage,
            iteration: folded.iteration,
            messages: folded.transcript.messages,
            items: folded.transcript.items,
            journal,
        })
    }

    /// Parses an export: the version first (so an unknown version is named
    /// as such, whatever else the file holds), then the rest; then checks
    /// that the journal folds to what the file says. Secrets are removed
    /// before that check, in the journal and in the file's own fields.
    pub fn parse(text: &str, rules: &ContextRules) -> Result<Self, ImportError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| ImportError::Invalid(e.to_string()))?;
        let version = value
            .get("version")
            .and_then(Value::as_u64)
            .ok_or(ImportError::MissingVersion)?;
        if version != EXPORT_VERSION {
            return Err(ImportError::UnsupportedVersion(version));
        }
        let mut export: SessionExport =
            serde_json::from_value(value).map_err(|e| ImportError::Invalid(e.to_string()))?;
        super::check_session_id(&export.session_id)
            .map_err(|e| ImportError::Invalid(e.to_string()))?;
        if let Some(user) = &export.user_id {
            super::check_user_id(user).map_err(|e| ImportError::Invalid(e.to_string()))?;
        }
        export.journal = export
            .journal
            .iter()
            .map(|r| secrets::scrub_record(r, rules))
            .collect();
        export.deps = secrets::scrub_deps(&export.deps, rules);
        for event in &mut export.items {
            secrets::scrub_event(event, rules);
        }
        let folded = Folded::fold(&export.journal)
            .map_err(|e| ImportError::Inconsistent(format!("journal {e}")))?;
        let disagree = |field: &str| {
            ImportError::Inconsistent(format!("`{field}` is not what the journal says"))
        };
        if folded.deps != export.deps {
            return Err(disagree("deps"));
        }
        if folded.usage != export.usage {
            return Err(disagree("usage"));
        }
        if folded.iteration != export.iteration {
            return Err(disagree("iteration"));
        }
        if folded.transcript.messages != export.messages {
            return Err(disagree("messages"));
        }
        if folded.transcript.items != export.items {
            return Err(disagree("items"));
        }
        Ok(export)
    }

    /// The session's header. An imported session is kept like a named
    /// one (never ephemeral: someone chose to keep it).
    pub fn header(&self) -> SessionHeader {
        SessionHeader {
            session_id: self.session_id.clone(),
            user_id: self.user_id.clone(),
            created_at_ms: self.created_at_ms,
            metadata: self.metadata.clone(),
            ephemeral: false,
        }
    }
}
