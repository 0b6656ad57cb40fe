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

/// Most tools one component may describe.
pub const MAX_TOOLS: usize = 256;
/// Largest tool description, in bytes. Every description rides along with
/// every model request.
pub const MAX_DESCRIPTION_BYTES: usize = 16 << 10;
/// Largest parameter schema (or context schema), as JSON text, in bytes.
pub const MAX_SCHEMA_BYTES: usize = 64 << 10;
/// Deepest nesting of arrays and objects in a schema.
pub const MAX_SCHEMA_DEPTH: usize = 32;

/// Compiles a JSON Schema the host will evaluate, from a tool (parameters)
/// or the operator (context rules), within bounds that keep compiling and
/// evaluating it cheap whatever its author intended: at most
/// [`MAX_SCHEMA_BYTES`] of JSON and [`MAX_SCHEMA_DEPTH`] levels, `pattern`s
/// on a linear-time regex engine (no catastrophic backtracking) with a
/// size cap, and no references to documents outside the schema (nothing
/// is fetched). The error says which bound or what does not compile.
pub fn compile_schema(schema: &Value) -> Result<jsonschema::Validator, String> {
    let bytes = crate::json::len(schema);
    if bytes > MAX_SCHEMA_BYTES {
        return Err(format!(
            "the schema is {bytes} bytes; the limit is {MAX_SCHEMA_BYTES}"
        ));
    }
    let depth = crate::json::depth(schema);
    if depth > MAX_SCHEMA_DEPTH {
        return Err(format!(
            "the schema nests {depth} levels deep; the limit is {MAX_SCHEMA_DEPTH}"
        ));
    }
    jsonschema::options()
        .with_pattern_options(jsonschema::PatternOptions::regex().size_limit(1 << 20))
        .build(schema)
        .map_err(|e| e.to_string())
}
