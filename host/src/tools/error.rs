//! Errors from loading components and calling tools.

use std::path::PathBuf;
use std::time::Duration;

use crate::context::{OpRejected, OutputError};
use crate::journal::CANCELLED_MESSAGE;
use crate::kind::ErrorKind;
use crate::sandbox::{GrantError, GuestOutput, Stream};

/// A component could not be loaded. Every variant but `Sandbox` names the
/// file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read.
    #[error("{}: cannot read: {source}", .path.display())]
    Read {
        /// The component's path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Neither a wasm binary nor WAT text.
    #[error("{}: not a WebAssembly file (no `\\0asm` header, and not WAT text)", .path.display())]
    NotWasm {
        /// The file's path.
        path: PathBuf,
    },
    #[error(
        "{}: a core WebAssembly module, not a component; build for `wasm32-wasip2`, or wrap it with `wasm-tools component new`",
        .path.display()
    )]
    /// A core module, not a component.
    CoreModule {
        /// The file's path.
        path: PathBuf,
    },
    /// The compiler refused it (malformed, or uses unsupported features).
    #[error("{}: invalid component: {message}", .path.display())]
    Invalid {
        /// The file's path.
        path: PathBuf,
        /// The compiler's explanation.
        message: String,
    },
    /// It cannot be linked: it imports something this host does not
    /// provide (the host provides WASI 0.2, `wasi:http` and Airlock's
    /// `context` and `log`), or exports Airlock's `tool` interface in a
    /// shape other than `airlock:tool/tool-host`'s.
    #[error("{}: cannot be linked (this host provides WASI 0.2, wasi:http and airlock:tool's imports): {message}", .path.display())]
    Incompatible {
        /// The file's path.
        path: PathBuf,
        /// What does not fit.
        message: String,
    },
    /// Its `describe` failed (trapped, timed out, ...).
    #[error("{}: `describe` failed: {source}", .path.display())]
    Describe {
        /// The file's path.
        path: PathBuf,
        /// How the call failed.
        #[source]
        source: Box<CallError>,
    },
    /// A tool it describes is unusable (bad name, bad schema).
    #[error("{}: tool {name:?}: {problem}", .path.display())]
    BadSpec {
        /// The file's path.
        path: PathBuf,
        /// The tool's name as described.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// It offers more than one component may: more than
    /// [`MAX_TOOLS`](crate::spec::MAX_TOOLS) tools, or parameter schemas
    /// over [`MAX_TOTAL_SCHEMA_BYTES`](crate::spec::MAX_TOTAL_SCHEMA_BYTES)
    /// together. Refused before the rest is read or described.
    #[error("{}: {problem}", .path.display())]
    OffersTooMuch {
        /// The file's path.
        path: PathBuf,
        /// What is over which bound.
        problem: String,
    },
    /// A plain component exports no function that can be a tool.
    #[error("{}: no exported function can be a tool{}", .path.display(), skipped_list(.skipped))]
    NoTools {
        /// The file's path.
        path: PathBuf,
        /// Each function, and why it cannot be a tool.
        skipped: Vec<crate::tools::plain::Skipped>,
    },
    /// The policy names a tool by reference that has not been resolved to
    /// a pulled component ([`crate::oci::Resolver::resolve_policy`]).
    #[error(
        "tool {tool}: named by reference and not pulled yet (resolve the policy's references first: `airlock pull`)"
    )]
    NotPulled {
        /// The tool's name (its reference).
        tool: String,
    },
    /// The policy's `functions` or `rename` names a tool the component does
    /// not offer, or names several where it must name one.
    #[error("{}: {problem}", .path.display())]
    Selection {
        /// The file's path.
        path: PathBuf,
        /// Which entry, and what the component offers.
        problem: String,
    },
    /// Two components offer the same tool name.
    #[error("tool {name:?} is defined twice: by {} and by {}", .first.display(), .second.display())]
    DuplicateTool {
        /// The tool's name.
        name: String,
        /// The component loaded first.
        first: PathBuf,
        /// The component that was refused.
        second: PathBuf,
    },
    /// A resource or prompt it offers is unusable (bad URI or template,
    /// a scheme its policy does not allow, a name too long).
    #[error("{}: {what} {name:?}: {problem}", .path.display())]
    BadOffer {
        /// The file's path.
        path: PathBuf,
        /// `resource` or `prompt`.
        what: &'static str,
        /// Its URI or name as described (cut to 64 bytes).
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// Two components offer the same resource URI (or template) or prompt
    /// name.
    #[error("{what} {name:?} is offered twice: by {} and by {}", .first.display(), .second.display())]
    DuplicateOffer {
        /// `resource` or `prompt`.
        what: &'static str,
        /// The URI or name.
        name: String,
        /// The component loaded first.
        first: PathBuf,
        /// The component that was refused.
        second: PathBuf,
    },
    /// A fuel limit on a host built without fuel metering.
    #[error("{}: a fuel limit needs a host built with fuel metering", .path.display())]
    FuelNotMetered {
        /// The file's path.
        path: PathBuf,
    },
    /// Its limits cannot be enforced (a timeout of zero or over a day, a
    /// memory limit over the host's ceiling).
    #[error("{}: {problem}", .path.display())]
    BadLimits {
        /// The file's path.
        path: PathBuf,
        /// Which limit, and why.
        problem: String,
    },
    /// One call of the component would need more of the instance pool than
    /// one tool may hold (half of each kind of slot).
    #[error("{}: {problem}", .path.display())]
    PoolShare {
        /// The file's path.
        path: PathBuf,
        /// What it needs and what it may hold.
        problem: String,
    },
    /// The component asks the compiler for more than a component may
    /// ([`crate::sandbox::complexity`]), or compiling it ran past its
    /// limits (time, memory) or crashed, in its compile child. Nothing is
    /// cached.
    #[error("{}: {problem}", .path.display())]
    CompileLimit {
        /// The file's path.
        path: PathBuf,
        /// What happened.
        problem: String,
    },
    /// The compile cache cannot be trusted (see [`UnsafeCache`]).
    ///
    /// [`UnsafeCache`]: crate::sandbox::UnsafeCache
    #[error(transparent)]
    UnsafeCache(#[from] crate::sandbox::UnsafeCache),
    /// The process may not map an instance pool of even one call (see
    /// [`AddressSpaceTooSmall`]).
    ///
    /// [`AddressSpaceTooSmall`]: crate::sandbox::AddressSpaceTooSmall
    #[error("cannot set up the sandbox: {0}")]
    AddressSpace(#[from] crate::sandbox::AddressSpaceTooSmall),
    /// The engine or linker could not be set up.
    #[error("cannot set up the sandbox: {0}")]
    Sandbox(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl LoadError {
    pub(crate) fn sandbox(error: wasmtime::Error) -> Self {
        match error.downcast::<crate::sandbox::AddressSpaceTooSmall>() {
            Ok(too_small) => LoadError::AddressSpace(too_small),
            Err(error) => LoadError::Sandbox(error.into_boxed_dyn_error()),
        }
    }
}

/// A failed call: what went wrong, and what the guest logged and printed
/// before it did (empty when it never ran). No op of the call was applied.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{error}")]
pub struct CallFailure {
    /// What went wrong.
    #[source]
    pub error: CallError,
    /// What the guest wrote before the call failed.
    pub output: GuestOutput,
}

impl CallFailure {
    /// See [`CallError::kind`].
    pub fn kind(&self) -> ErrorKind {
        self.error.kind()
    }
}

/// What the model (or an MCP client) is told of a failed call: the
/// failure's kind and message (a `retry` asks it to try again), and what
/// the host refused the tool, with why ([`GuestOutput::refusals`]).
pub fn failure_text(failure: &CallFailure) -> String {
    let text = match &failure.error {
        CallError::Retry(message) => format!("Error (retry): {message}. Please try again."),
        CallError::Cancelled => CANCELLED_MESSAGE.to_owned(),
        other => format!("Error ({}): {other}", other.kind()),
    };
    with_refusals(text, &failure.output)
}

/// `text`, followed by what the host refused the call, if anything.
pub fn with_refusals(text: String, output: &GuestOutput) -> String {
    if output.refusals.is_empty() {
        return text;
    }
    format!("{text} (the host refused: {})", output.refusals.join("; "))
}

impl From<CallError> for CallFailure {
    fn from(error: CallError) -> Self {
        Self {
            error,
            output: GuestOutput::default(),
        }
    }
}

/// A tool call failed. No op of the call was applied: deps are unchanged.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// No loaded tool has this name (said cut to 256 bytes: a model or a
    /// client may ask for any).
    #[error("unknown tool {:?}; available: {}", crate::text::truncate(.name, 256), list(.available))]
    UnknownTool {
        /// The name asked for.
        name: String,
        /// Every loaded tool, sorted.
        available: Vec<String>,
    },
    /// The host refused the arguments before the tool ran: not JSON, not
    /// an object, or not what the tool's parameter schema allows.
    /// Its kind is [`ErrorKind::InvalidArgs`], as [`CallError::InvalidArgs`]'s:
    /// to the model and the client both mean "fix the arguments".
    #[error("the host refused the arguments: {0}")]
    BadArguments(String),
    /// The tool ran and refused the arguments (`invalid-args`).
    #[error("the tool refused the arguments: {0}")]
    InvalidArgs(String),
    /// The tool reported that it could not do its job.
    #[error("the tool failed: {0}")]
    Failed(String),
    /// The tool asks the model to try again.
    #[error("the tool asks to retry: {0}")]
    Retry(String),
    /// The call ran past its timeout.
    #[error("the call ran past its {}", humantime(.limit))]
    Timeout {
        /// The timeout.
        limit: Duration,
    },
    /// The call was cancelled (Ctrl-C, a [`CancelToken`](crate::sandbox::CancelToken)).
    #[error("the call was cancelled")]
    Cancelled,
    /// The guest needed more linear memory than allowed.
    #[error("the tool needed more than its {} memory limit", bytes(*.limit))]
    MemoryLimit {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The guest grew a table past its limit.
    #[error("the tool grew a table past its {limit}-element limit")]
    TableLimit {
        /// The limit, in elements.
        limit: usize,
    },
    /// The guest used up its instruction budget.
    #[error("the tool ran out of fuel ({limit} units)")]
    FuelExhausted {
        /// The budget.
        limit: u64,
    },
    /// The guest wrote too much to a captured stream.
    #[error("the tool wrote more than {limit} bytes to {stream}")]
    OutputLimit {
        /// Which stream.
        stream: Stream,
        /// The limit, in bytes.
        limit: usize,
    },
    /// The guest trapped: a panic, `unreachable`, stack overflow, an
    /// out-of-bounds access. `stderr` holds the tail of what it printed
    /// (a Rust panic message, for example).
    #[error("the tool crashed: {message}{}", stderr_suffix(.stderr))]
    Trap {
        /// The trap, as wasmtime describes it.
        message: String,
        /// The tail of the guest's stderr.
        stderr: String,
    },
    /// A plain component's result was over its limit while being read
    /// (before it could be measured as JSON).
    #[error("the result is larger than its {limit}-byte limit")]
    ResultOverLimit {
        /// The limit, in bytes of JSON.
        limit: usize,
    },
    /// The result JSON text is over its limit.
    #[error("the result is {bytes} bytes; the limit is {limit}")]
    ResultTooLarge {
        /// The result's size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The result was not JSON, or its `__update_context__` was malformed.
    #[error("invalid result: {0}")]
    InvalidResult(String),
    /// An op was rejected, and with it the call.
    #[error(transparent)]
    OpRejected(#[from] OpRejected),
    /// A grant could not be prepared for this call (a granted directory
    /// disappeared, a secret's variable is unset).
    #[error("a grant could not be prepared: {0}")]
    Grant(#[from] GrantError),
    /// The guest held more host-side resources (WASI handles) at once than
    /// [`Limits::max_host_resources`](crate::sandbox::Limits::max_host_resources).
    #[error("the tool held more than {limit} host resources (WASI handles) at once")]
    ResourceLimit {
        /// The limit.
        limit: usize,
    },
    /// Too many calls are in flight for the instance pool.
    #[error("the host is at capacity: {0}")]
    Busy(String),
}

impl CallError {
    /// What kind of failure this is (its stable name is what JSON output,
    /// events and the journal hold).
    pub fn kind(&self) -> ErrorKind {
        match self {
            CallError::UnknownTool { .. } => ErrorKind::UnknownTool,
            CallError::BadArguments(_) | CallError::InvalidArgs(_) => ErrorKind::InvalidArgs,
            CallError::Failed(_) => ErrorKind::Failed,
            CallError::Retry(_) => ErrorKind::Retry,
            CallError::Timeout { .. } => ErrorKind::Timeout,
            CallError::Cancelled => ErrorKind::Cancelled,
            CallError::MemoryLimit { .. } => ErrorKind::MemoryLimit,
            CallError::TableLimit { .. } => ErrorKind::TableLimit,
            CallError::FuelExhausted { .. } => ErrorKind::FuelExhausted,
            CallError::OutputLimit { .. } => ErrorKind::OutputLimit,
            CallError::Trap { .. } => ErrorKind::Trap,
            CallError::ResultTooLarge { .. } | CallError::ResultOverLimit { .. } => {
                ErrorKind::ResultTooLarge
            }
            CallError::InvalidResult(_) => ErrorKind::InvalidResult,
            CallError::OpRejected(_) => ErrorKind::OpRejected,
            CallError::Grant(_) => ErrorKind::GrantUnavailable,
            CallError::ResourceLimit { .. } => ErrorKind::ResourceLimit,
            CallError::Busy(_) => ErrorKind::Busy,
        }
    }
}

impl From<OutputError> for CallError {
    fn from(e: OutputError) -> Self {
        match e {
            OutputError::InvalidResult(message) => CallError::InvalidResult(message),
            OutputError::OpRejected(rejected) => CallError::OpRejected(rejected),
        }
    }
}

fn skipped_list(skipped: &[crate::tools::plain::Skipped]) -> String {
    if skipped.is_empty() {
        return " (it exports no function)".to_owned();
    }
    let each: Vec<String> = skipped
        .iter()
        .map(|s| format!("{}: {}", s.function, s.reason))
        .collect();
    format!(": {}", each.join("; "))
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
