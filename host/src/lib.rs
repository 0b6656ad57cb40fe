//! Airlock runs untrusted LLM-agent tools as sandboxed WebAssembly
//! components.
//!
//! The host owns the run context ([`RunContext`]). A tool gets a read-only
//! view of it and returns a result plus [`ContextOp`]s; the host validates
//! the ops and applies all of them or none. A tool has no files, network,
//! environment or secrets unless an operator grants them, and every call is
//! bounded in time, memory and output ([`Limits`]).
//!
//! # Embedding
//!
//! ```
//! use airlock::{Host, RunContext, ToolCall};
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 1)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let stateful = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/guests/wasm32-wasip2/release/stateful.wasm");
//! # let cache = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/test-cache");
//! let mut host = Host::builder()
//!     .cache(airlock::CompileCache::in_dir(cache))
//!     .build()?;
//! // Built by `make guests` from guest-examples/rust/stateful.
//! host.load(stateful).await?;
//!
//! let mut ctx = RunContext::default();
//! for _ in 0..3 {
//!     let call = ToolCall::new("increment", r#"{"name": "vowels"}"#);
//!     host.call(&mut ctx, &call).await?;
//! }
//! assert_eq!(ctx.deps()["counters"]["vowels"], 3);
//!
//! // A failed call changes nothing.
//! let bad = ToolCall::new("increment", "not json");
//! assert!(host.call(&mut ctx, &bad).await.is_err());
//! assert_eq!(ctx.deps()["counters"]["vowels"], 3);
//! # Ok(())
//! # }
//! ```
//!
//! # Modules
//!
//! - [`context`]: the run context and the op semantics.
//! - [`sandbox`]: the engine, compile cache, limits, captured output.
//! - [`tools`]: loading components and calling tools.

pub mod agent;
pub mod context;
pub mod fs;
pub mod llm;
pub mod policy;
pub mod sandbox;
mod tls;
pub mod tools;

pub use context::{ContextOp, OpLimits, OpRejected, RunContext, Usage};
pub use sandbox::{CompileCache, Limits};
pub use tools::{
    CallError, CallOutcome, Host, HostBuilder, LoadError, ToolCall, ToolConfig, ToolSpec,
};
