//! The limits unit: a tool's (or the policy's default) `limits` table.
//!
//! In `airlock.toml`: `[limits]` for every tool, and `limits = { ... }` in a
//! `[[tool]]` table over it. Each unset field keeps the value it is layered
//! on. The limits are armed on every call's store by
//! [`Sandbox`](crate::sandbox::Sandbox) (the memory and table limiter, the
//! epoch deadline, fuel) and described by
//! [`Limits::describe`](crate::sandbox::Limits::describe).

use std::time::Duration;

use serde::Deserialize;

use crate::sandbox::Limits;

/// Limits as written; every field is optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Wall-clock time per call, in milliseconds (at least 1).
    pub timeout_ms: Option<u64>,
    /// Linear memory per call, in MiB.
    pub memory_mb: Option<u64>,
    /// Instruction budget per call (needs fuel metering).
    pub fuel: Option<u64>,
    /// Bytes of result JSON.
    pub max_result_bytes: Option<usize>,
    /// Bytes captured from each of stdout, stderr and the log.
    pub max_output_bytes: Option<usize>,
    /// Ops per call.
    pub max_ops: Option<usize>,
    /// Bytes of keys and values over a call's ops.
    pub max_op_bytes: Option<usize>,
    /// Bytes deps may grow to (as JSON text) through this tool's ops.
    pub max_deps_bytes: Option<usize>,
    /// Elements of any one table.
    pub max_table_elements: Option<usize>,
    /// Core instances, tables and memories per component.
    pub max_instances: Option<usize>,
    /// Host-side resources (WASI handles) a call may hold at once.
    pub max_host_resources: Option<usize>,
    /// Fresh instances kept ready ahead of calls (0 turns it off).
    pub prepared_instances: Option<usize>,
}

impl LimitsConfig {
    /// `limits` with every field this config sets replaced, checked by
    /// [`Limits::check`]. The error says which limit is out of range.
    pub fn apply(&self, mut limits: Limits) -> Result<Limits, String> {
        if let Some(ms) = self.timeout_ms {
            limits.timeout = Duration::from_millis(ms);
        }
        if let Some(mb) = self.memory_mb {
            let bytes = usize::try_from(mb)
                .ok()
                .and_then(|mb| mb.checked_mul(1 << 20));
            limits.max_memory_bytes = bytes.ok_or("memory_mb is too large")?;
        }
        if let Some(fuel) = self.fuel {
            limits.fuel = Some(fuel);
        }
        let set = |field: &mut usize, value: Option<usize>| {
            if let Some(v) = value {
                *field = v;
            }
        };
        set(&mut limits.max_result_bytes, self.max_result_bytes);
        set(&mut limits.max_output_bytes, self.max_output_bytes);
        set(&mut limits.ops.max_ops, self.max_ops);
        set(&mut limits.ops.max_op_bytes, self.max_op_bytes);
        set(&mut limits.ops.max_deps_bytes, self.max_deps_bytes);
        set(&mut limits.max_table_elements, self.max_table_elements);
        set(&mut limits.max_instances, self.max_instances);
        set(&mut limits.max_host_resources, self.max_host_resources);
        set(&mut limits.prepared_instances, self.prepared_instances);
        // The same rule as at load; the memory ceiling belongs to the
        // engine, so it is checked there.
        limits.check(usize::MAX)?;
        Ok(limits)
    }
}
