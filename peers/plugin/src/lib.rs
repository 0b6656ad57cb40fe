//! The Rust `increment` tool's work (guest-examples/rust/stateful) as an
//! Extism plugin: [`work::increment`] behind Extism's calling convention.

use extism_pdk::{FnResult, plugin_fn};

mod work;

#[plugin_fn]
pub fn increment(input: String) -> FnResult<String> {
    Ok(work::increment(&input).map_err(extism_pdk::Error::msg)?)
}
