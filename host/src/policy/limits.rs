//! A tool's limits (`[tool.limits]`): what the operator may write
//! ([`LimitsConfig`]), and what a call is held to ([`Limits`]), checked
//! against the host's ceilings when the policy is read.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::context::OpLimits;

/// What one tool call may consume. Every bound applies per call: a fresh
/// instance starts from zero each time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Wall-clock time for the whole call, instantiation included.
    /// Enforced by epoch interruption while wasm runs and by a timer while
    /// the host awaits I/O for the guest. Default 5 s.
    pub timeout: Duration,
    /// Memory the guest makes the host hold for its call: linear memory
    /// summed over the component's memories, plus its tables (each element
    /// counted as [`TABLE_ELEMENT_BYTES`]). Default 128 MiB.
    pub max_memory_bytes: usize,
    /// Elements of any one table. Default 1,000,000.
    pub max_table_elements: usize,
    /// Core instances, tables and memories a component may create.
    /// Default 100 each.
    pub max_instances: usize,
    /// Host-side resources (WASI handles: HTTP fields and requests, streams,
    /// pollables, descriptors, ...) the guest may hold at once. Each byte
    /// buffer such a resource holds is capped (HTTP fields at
    /// [`Limits::host_resource_bytes`]), so together they stay within
    /// [`Limits::max_memory_bytes`]. Default 1,024.
    pub max_host_resources: usize,
    /// Optional instruction budget (wasmtime fuel); `None` means unmetered.
    pub fuel: Option<u64>,
    /// Bytes of the result JSON text. Default 1 MiB.
    pub max_result_bytes: usize,
    /// Bytes captured from each of stdout, stderr and the log interface.
    /// A tool that writes more fails. Default 1 MiB.
    pub max_output_bytes: usize,
    /// Bytes a call may write into its granted directories: what it
    /// writes to files, what it grows a file by (`set-size`), and a disk
    /// block ([`ENTRY_BYTES`]) for each file, directory or link it may
    /// make. A write past it is refused as a full disk would refuse it
    /// (`ENOSPC`; wasi-libc reports a stream's failed write as an I/O
    /// error) and noted among the call's refusals; the call goes on.
    /// Bounds what one call adds to the disk, not what a directory holds
    /// over many calls. Default 128 MiB.
    #[serde(default = "default_write_bytes")]
    pub max_write_bytes: u64,
    /// Bounds on the context ops of one call.
    pub ops: OpLimits,
    /// Fresh instances of the tool's component kept ready ahead of its
    /// calls, at most [`MAX_PREPARED_INSTANCES`]. Each is instantiated off
    /// the call's path (on another task, started once a call holds its own
    /// instance, while fewer calls run than the host has cores), used by
    /// exactly one call and then dropped, as an instance made during the
    /// call would be: a prepared instance has run only its component's
    /// instantiation, never a call. What it saves a call is the
    /// instantiation (about 90 µs for a Python tool); what it costs is the
    /// same work done ahead, and, while one waits, its memory and its slots
    /// in the instance pool. Calls that need the pool's room take it back
    /// from waiting instances. Not used for tools granted anything (every
    /// call reads its grants as it starts), nor for components that
    /// instantiate in under 30 µs (Rust, C and JavaScript tools: handing
    /// an instance over costs more than making it). Default 1; 0 turns it
    /// off.
    pub prepared_instances: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(5),
            max_memory_bytes: 128 << 20,
            max_table_elements: 1_000_000,
            max_instances: 100,
            max_host_resources: 1_024,
            fuel: None,
            max_result_bytes: 1 << 20,
            max_output_bytes: 1 << 20,
            max_write_bytes: default_write_bytes(),
            ops: OpLimits::default(),
            prepared_instances: 1,
        }
    }
}

/// [`Limits::max_write_bytes`] unless told: 128 MiB.
fn default_write_bytes() -> u64 {
    128 << 20
}

/// What making a file, a directory or a link counts against
/// [`Limits::max_write_bytes`]: the disk block it takes at least.
pub const ENTRY_BYTES: u64 = 4096;

/// What one table element is counted as against
/// [`Limits::max_memory_bytes`]: a pointer-sized slot (more for some
/// element types, never less).
pub const TABLE_ELEMENT_BYTES: usize = 8;

/// The most instances a tool may have prepared ahead of its calls
/// ([`Limits::prepared_instances`]).
pub const MAX_PREPARED_INSTANCES: usize = 16;

/// The longest timeout a call may have: one day. Longer is surely a
/// mistake, and deadlines far in the future overflow the clock.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

impl Limits {
    /// The cap on one host resource's own buffer (an HTTP `fields`
    /// resource): the memory limit shared out over the resources a guest
    /// may hold, between 8 KiB and wasi:http's default of 128 KiB.
    pub fn host_resource_bytes(&self) -> usize {
        (self.max_memory_bytes / self.max_host_resources.max(1)).clamp(8 << 10, 128 << 10)
    }

    /// Checks that these limits can be enforced on an engine whose memory
    /// ceiling is `memory_ceiling` bytes: a timeout from 1 ms to
    /// [`MAX_TIMEOUT`], a memory limit within the ceiling. The error says
    /// which limit and why.
    pub fn check(&self, memory_ceiling: usize) -> Result<(), String> {
        if self.timeout.is_zero() {
            return Err("the timeout must be at least 1 ms".into());
        }
        if self.timeout > MAX_TIMEOUT {
            return Err(format!(
                "the timeout ({} s) is over the maximum of {} s",
                self.timeout.as_secs(),
                MAX_TIMEOUT.as_secs()
            ));
        }
        if self.max_host_resources == 0 {
            return Err("max_host_resources must be at least 1".into());
        }
        if self.max_instances > MAX_INSTANCES_CEILING {
            return Err(format!(
                "max_instances ({}) is over the host's ceiling of {}",
                self.max_instances, MAX_INSTANCES_CEILING
            ));
        }
        if self.prepared_instances > MAX_PREPARED_INSTANCES {
            return Err(format!(
                "prepared_instances ({}) is over the maximum of {MAX_PREPARED_INSTANCES}",
                self.prepared_instances
            ));
        }
        if self.max_memory_bytes > memory_ceiling {
            return Err(format!(
                "the memory limit ({} MiB) is over the host's ceiling of {} MiB",
                self.max_memory_bytes >> 20,
                memory_ceiling >> 20
            ));
        }
        Ok(())
    }

    /// One line for `airlock inspect`.
    pub fn describe(&self) -> String {
        format!(
            "{} ms, {} MiB memory, {} result bytes, {} ops{}",
            self.timeout.as_millis(),
            self.max_memory_bytes >> 20,
            self.max_result_bytes,
            self.ops.max_ops,
            self.fuel.map(|f| format!(", {f} fuel")).unwrap_or_default(),
        )
    }
}

/// Core instances one component instance may create, whatever its
/// `max_instances` (which [`Limits::check`] keeps within this).
pub const MAX_INSTANCES_CEILING: usize = 1_000;

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
    /// Bytes written into granted directories per call.
    pub max_write_bytes: Option<u64>,
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
        if let Some(bytes) = self.max_write_bytes {
            limits.max_write_bytes = bytes;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_write_bound_is_set_from_the_policy_and_whole_by_default() {
        assert_eq!(Limits::default().max_write_bytes, 128 << 20);
        let config: LimitsConfig = toml::from_str("max_write_bytes = 4096\n").unwrap();
        let limits = config.apply(Limits::default()).unwrap();
        assert_eq!(limits.max_write_bytes, 4096);
        // Limits written before the bound existed read with the default.
        let mut old = serde_json::to_value(Limits::default()).unwrap();
        old.as_object_mut().unwrap().remove("max_write_bytes");
        let read: Limits = serde_json::from_value(old).unwrap();
        assert_eq!(read.max_write_bytes, 128 << 20);
    }
}
