//! Airlock's integration tests: one binary, a module per feature (wasmtime's
//! layout). Every test runs real components built from `guest-examples/`
//! through the real host.

// Tests state their expectations with unwrap/expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent;
mod architecture;
mod baseline;
mod cache;
mod cli;
mod conformance;
mod context_rules;
mod documented;
mod durability;
mod environment;
mod errors;
mod filesystem;
mod http;
mod isolation;
mod limits;
mod mcp;
mod mcp_offers;
mod mcp_tasks;
mod oauth;
mod oci;
mod oci_trust;
mod ops;
mod plain;
mod policy;
mod postgres_tls;
mod readme;
mod scale;
mod script;
mod sessions;
mod stateful;
mod support;
mod turns;
mod view;
