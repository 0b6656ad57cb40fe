//! Plain data shared by the layers: what a tool looks like to a model.
//!
//! Nothing here depends on the sandbox, the tools or the model providers,
//! so any of them (and embedders) can use these types.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One tool, as its component's `describe` reported it (and as the model
/// sees it).
///
/// Invariant, once loaded by a host: `name` matches `[a-zA-Z0-9_-]{1,64}`
/// and is unique among the host's tools; `parameters` is a JSON object that
/// compiled as a JSON Schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls the tool by.
    pub name: String,
    /// What the tool does, written for the model.
    pub description: String,
    /// JSON Schema for the arguments.
    pub parameters: Value,
}
