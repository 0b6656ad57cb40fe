//! Errors from loading components and calling tools.

use std::path::PathBuf;
use std::time::Duration;

use crate::context::OpRejected;
use crate::sandbox::Stream;

/// A component could not be loaded. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}: cannot read: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a WebAssembly file (no `\\0asm` header, and not WAT text)", .path.display())]
    NotWasm { path: PathBuf },
    #[error(
        "{}: a core WebAssembly module, not a component; build for `wasm32-wasip2`, or wrap it with `wasm-tools component new`",
        .path.display()
    )]
    CoreModule { path: PathBuf },
    #[error("{}: invalid component: {message}", .path.display())]
    Invalid { path: PathBuf, message: String },
    #[error("{}: does not fit the `airlock:tool/tool-host` world: {message}", .path.display())]
    Incompatible { path: PathBuf, message: String },
    #[error("{}: `describe` failed: {source}", .path.display())]
    Describe {
        path: PathBuf,
        #[source]
        source: Box<CallError>,
    },
    #[error("{}: tool {name:?}: {problem}", .path.display())]
    BadSpec {
        path: PathBuf,
        name: String,
        problem: String,
    },
    #[error("tool {name:?} is defined twice: by {} and by {}", .first.display(), .second.display())]
    DuplicateTool {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("cannot set up the sandbox: {0}")]
    Sandbox(String),
}

/// A tool call failed. No op of the call was applied: deps are unchanged.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    #[error("unknown tool {name:?}; available: {}", list(.available))]
    UnknownTool {
        name: String,
        available: Vec<String>,
    },
    /// The arguments were not a JSON object, or the tool refused them.
    #[error("invalid arguments: {0}")]
    InvalidArgs(String),
    /// The tool reported that it could not do its job.
    #[error("the tool failed: {0}")]
    Failed(String),
    /// The tool asks the model to try again.
    #[error("the tool asks to retry: {0}")]
    Retry(String),
    #[error("the call ran past its {}", humantime(.limit))]
    Timeout { limit: Duration },
    #[error("the call was cancelled")]
    Cancelled,
    #[error("the tool needed more than its {} memory limit", bytes(*.limit))]
    MemoryLimit { limit: usize },
    #[error("the tool grew a table past its {limit}-element limit")]
    TableLimit { limit: usize },
    #[error("the tool ran out of fuel ({limit} units)")]
    FuelExhausted { limit: u64 },
    #[error("the tool wrote more than {limit} bytes to {stream}")]
    OutputLimit { stream: Stream, limit: usize },
    /// The guest trapped: a panic, `unreachable`, stack overflow, an
    /// out-of-bounds access. `stderr` holds the tail of what it printed
    /// (a Rust panic message, for example).
    #[error("the tool crashed: {message}{}", stderr_suffix(.stderr))]
    Trap { message: String, stderr: String },
    #[error("the result is {bytes} bytes; the limit is {limit}")]
    ResultTooLarge { bytes: usize, limit: usize },
    /// The result was not JSON, or its `__update_context__` was malformed.
    #[error("invalid result: {0}")]
    InvalidResult(String),
    #[error(transparent)]
    OpRejected(#[from] OpRejected),
    /// A grant could not be prepared for this call (a granted directory
    /// disappeared, say).
    #[error("a grant could not be prepared: {0}")]
    Grant(String),
    /// Too many calls are in flight for the instance pool.
    #[error("the host is at capacity: {0}")]
    Busy(String),
}

impl CallError {
    /// A stable `snake_case` name for the kind of failure, for JSON output
    /// and events.
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::UnknownTool { .. } => "unknown_tool",
            CallError::InvalidArgs(_) => "invalid_args",
            CallError::Failed(_) => "failed",
            CallError::Retry(_) => "retry",
            CallError::Timeout { .. } => "timeout",
            CallError::Cancelled => "cancelled",
            CallError::MemoryLimit { .. } => "memory_limit",
            CallError::TableLimit { .. } => "table_limit",
            CallError::FuelExhausted { .. } => "fuel_exhausted",
            CallError::OutputLimit { .. } => "output_limit",
            CallError::Trap { .. } => "trap",
            CallError::ResultTooLarge { .. } => "result_too_large",
            CallError::InvalidResult(_) => "invalid_result",
            CallError::OpRejected(_) => "op_rejected",
            CallError::Grant(_) => "grant_unavailable",
            CallError::Busy(_) => "busy",
        }
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// `128 MiB` for whole mebibytes, else bytes.
fn bytes(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else {
        format!("{n} bytes")
    }
}

fn humantime(d: &Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s timeout", d.as_secs())
    } else {
        format!("{} ms timeout", d.as_millis())
    }
}

fn stderr_suffix(stderr: &str) -> String {
    let tail = stderr.trim();
    if tail.is_empty() {
        String::new()
    } else {
        format!("\nguest stderr: {tail}")
    }
}
