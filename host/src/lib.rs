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
//! let failure = host.call(&mut ctx, &bad).await.unwrap_err();
//! assert_eq!(failure.kind(), airlock::ErrorKind::InvalidArgs);
//! assert_eq!(ctx.deps()["counters"]["vowels"], 3);
//! # Ok(())
//! # }
//! ```
//!
//! # An agent run under a policy
//!
//! The operator's policy says which tools to load and what each may do;
//! [`HostBuilder::build_with_policy`] builds a host that honours all of it.
//! An [`Agent`] owns shares of the host and the model, so it can be moved
//! into a spawned task.
//!
//! ```
//! use std::sync::Arc;
//! use airlock::llm::ScriptModel;
//! use airlock::policy::Policy;
//! use airlock::{Agent, Host, RunContext, Transcript};
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 1)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
//! # let cache = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/test-cache");
//! let policy = Policy::parse(
//!     r#"
//!     [context]
//!     schema.counters = { type = "object", additionalProperties = { type = "integer" } }
//!
//!     [[tool]]
//!     path = "target/guests/wasm32-wasip2/release/stateful.wasm"
//!     limits = { timeout_ms = 2000 }
//!     context = { read = ["counters", "notes"], write = ["counters", "notes"] }
//!     "#,
//!     "airlock.toml".as_ref(),
//!     root.as_ref(), // relative paths start here
//! )?;
//! let host = Host::builder()
//!     .cache(airlock::CompileCache::in_dir(cache))
//!     .build_with_policy(&policy)
//!     .await?;
//! // The model's turns from a script (offline); `llm::from_spec` gives a
//! // real provider.
//! let model = ScriptModel::load(format!("{root}/guest-examples/scripts/vowels.json"))?;
//! let agent = Agent::new(Arc::new(host), Arc::new(model));
//!
//! let task = tokio::spawn(async move {
//!     let mut ctx = RunContext::default();
//!     let mut transcript = Transcript::default();
//!     let outcome = agent.run(&mut ctx, &mut transcript, "Count the vowels of 'elephant'.").await;
//!     (outcome, ctx)
//! });
//! let (outcome, ctx) = task.await?;
//! assert!(outcome?.answer.contains("3 vowels"));
//! assert_eq!(ctx.deps()["counters"]["vowels"], 3);
//! # Ok(())
//! # }
//! ```
//!
//! # Modules
//!
//! - [`context`]: the run context and the op semantics.
//! - [`policy`]: the operator's policy file, as plain data.
//! - [`sandbox`]: the engine, compile cache, grants, limits, captured output.
//! - [`tools`]: loading components and calling tools.
//! - [`journal`]: what a conversation records, and its fold.
//! - [`agent`]: the loop; [`llm`]: the model providers.
//! - [`session`]: durable sessions: leases, the stores, export.
//! - [`oci`]: tools from OCI registries: pulled, pinned, signature-checked.

pub mod agent;
pub mod context;
pub mod fs;
pub mod journal;
mod json;
pub mod kind;
pub mod llm;
pub mod mcp;
pub mod oci;
pub mod policy;
pub mod retention;
pub mod sandbox;
pub mod session;
pub mod spec;
pub mod text;
mod tls;
pub mod tools;

/// A boxed future, so that traits with async methods ([`llm::Model`],
/// [`session::SessionStore`], [`journal::Sink`], [`agent::Approver`]) can
/// be used as trait objects: the `futures` crate's, which the modules take
/// from it directly.
pub use futures::future::BoxFuture;

/// The wasmtime release this Airlock runs on (a test holds it to
/// Cargo.lock's).
pub const WASMTIME_VERSION: &str = "48.0.8";

pub use agent::Agent;
pub use context::{ContextOp, OpLimits, OpRejected, RunContext, Usage};
pub use journal::Transcript;
pub use kind::ErrorKind;
pub use policy::{Approval, Policy, ToolConfig};
pub use sandbox::{CompileCache, GuestOutput, Limits};
pub use session::{Session, SessionOptions, SessionStore, SqliteStore};
pub use spec::{
    Answer, Asked, Prompt, PromptArgument, PromptSpec, ResourceSpec, Role, SampleReply,
    SampleRequest, Sampled, Shown, ToolSpec,
};
pub use tools::{CallError, CallFailure, CallOutcome, Host, HostBuilder, LoadError, ToolCall};
