//! The `ResourceLimiter` that enforces a call's memory and table bounds
//! ([`Limits`], the policy's).

use super::{Limits, TABLE_ELEMENT_BYTES};

/// Which resource bound a guest ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResourceHit {
    Memory { desired: usize },
    Table { desired: usize },
}

/// Enforces [`Limits`] on memory and tables for one store.
///
/// A refused growth is reported to the guest the way wasm specifies
/// (`memory.grow` returns -1), so a guest that handles allocation failure
/// keeps running. The refusal is remembered: if the call then traps, the
/// error is reported as the limit, not as a generic trap.
#[derive(Debug)]
pub(crate) struct CallLimiter {
    max_memory_bytes: usize,
    max_table_elements: usize,
    max_instances: usize,
    /// Bytes of linear memory over all memories.
    memory_in_use: usize,
    /// Bytes of table elements over all tables.
    tables_in_use: usize,
    pub(crate) hit: Option<ResourceHit>,
}

impl CallLimiter {
    pub(crate) fn new(limits: &Limits) -> Self {
        Self {
            max_memory_bytes: limits.max_memory_bytes,
            max_table_elements: limits.max_table_elements,
            max_instances: limits.max_instances,
            memory_in_use: 0,
            tables_in_use: 0,
            hit: None,
        }
    }

    /// Takes `memory` bytes of linear memory and `tables` bytes of tables
    /// as the call's new totals if together they fit the memory limit;
    /// otherwise remembers the refusal and changes nothing.
    fn account(&mut self, memory: usize, tables: usize) -> bool {
        let total = memory.saturating_add(tables);
        if total > self.max_memory_bytes {
            self.hit = Some(ResourceHit::Memory { desired: total });
            return false;
        }
        self.memory_in_use = memory;
        self.tables_in_use = tables;
        true
    }
}

impl wasmtime::ResourceLimiter for CallLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // `current` is part of `memory_in_use`: the sum over all memories.
        let memory = self
            .memory_in_use
            .saturating_sub(current)
            .saturating_add(desired);
        Ok(self.account(memory, self.tables_in_use))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_table_elements {
            self.hit = Some(ResourceHit::Table { desired });
            return Ok(false);
        }
        // Tables are host memory the guest causes: they count against the
        // same limit as linear memory.
        let bytes = |elements: usize| elements.saturating_mul(TABLE_ELEMENT_BYTES);
        let tables = self
            .tables_in_use
            .saturating_sub(bytes(current))
            .saturating_add(bytes(desired));
        Ok(self.account(self.memory_in_use, tables))
    }

    fn instances(&self) -> usize {
        self.max_instances
    }

    fn tables(&self) -> usize {
        self.max_instances
    }

    fn memories(&self) -> usize {
        self.max_instances
    }
}
