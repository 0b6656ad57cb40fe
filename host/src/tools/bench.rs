//! Measurement hooks for `make bench` (the `bench` cargo feature, off
//! otherwise): the same component, engine and linker as [`Host::call`],
//! minus the host's own work (apart from the store's admission to the
//! instance pool, which every store has), so the benchmark can report what
//! that work costs.

use std::time::{Duration, Instant};

use super::bindings::AirlockPre;
use super::call::{classify, push_view};
use super::{CallError, ContextView, Host, Kind, LoadedComponent, ToolCall, guest};
use crate::context::RunContext;
use crate::sandbox::CallState;
use crate::sandbox::CancelToken;

impl Host {
    /// `call`'s component, its `InstancePre`, and a new store for it (with
    /// its admission to the pool), as [`Host::call`] makes them.
    async fn bench_store(
        &self,
        call: &ToolCall,
    ) -> Result<(&LoadedComponent, &AirlockPre, wasmtime::Store<CallState>), CallError> {
        let component = self.component_of(&call.name)?;
        let pre = airlock_pre(component)?;
        let store = self
            .new_store(
                component.component.engine(),
                &component.limits,
                &component.grants,
                component.sources,
                &component.gate,
                CancelToken::new(),
            )
            .await?;
        Ok((component, pre, store))
    }

    /// The floor under [`Host::call`]: a fresh store and instance from the
    /// cached `InstancePre`, one `call`, drop. No argument checks, no
    /// result parsing, no ops applied.
    pub async fn bench_raw_call(&self, ctx: &RunContext, call: &ToolCall) -> Result<(), CallError> {
        let (component, pre, mut store) = self.bench_store(call).await?;
        let view = push_view(&mut store, component, ctx, call, false)?;
        match instantiate_and_call(&mut store, pre, view, call).await {
            Ok(_) => Ok(()),
            Err(e) => Err(classify(e, &store, &component.limits)),
        }
    }

    /// One fresh-instance call in phases, as [`Host::bench_raw_call`]
    /// makes it: a new store (with its admission to the pool) and the
    /// context view; instantiating; the call; dropping the store (which
    /// returns the instance's memories and tables to the pool, resetting
    /// them).
    pub async fn bench_phases(
        &self,
        ctx: &RunContext,
        call: &ToolCall,
    ) -> Result<[Duration; 4], CallError> {
        let started = Instant::now();
        let (component, pre, mut store) = self.bench_store(call).await?;
        let view = push_view(&mut store, component, ctx, call, false)?;
        let stored = Instant::now();
        let instance = match pre.instantiate_async(&mut store).await {
            Ok(instance) => instance,
            Err(e) => return Err(classify(e, &store, &component.limits)),
        };
        let instantiated = Instant::now();
        if let Err(e) = call_in(&mut store, pre, &instance, view, call).await {
            return Err(classify(e, &store, &component.limits));
        }
        let called = Instant::now();
        drop(store);
        let dropped = Instant::now();
        Ok([
            stored - started,
            instantiated - stored,
            called - instantiated,
            dropped - called,
        ])
    }

    /// What an instance-reusing host (such as Extism) pays: one store and
    /// instance, then `n` calls on it. Returns the time of the `n` calls.
    /// Airlock never does this outside benchmarks: state would leak
    /// between calls.
    pub async fn bench_reused_calls(
        &self,
        ctx: &RunContext,
        call: &ToolCall,
        n: u32,
    ) -> Result<Duration, CallError> {
        let (component, pre, mut store) = self.bench_store(call).await?;
        let instance = match pre.instantiate_async(&mut store).await {
            Ok(instance) => instance,
            Err(e) => return Err(classify(e, &store, &component.limits)),
        };
        let started = Instant::now();
        for _ in 0..n {
            let view = push_view(&mut store, component, ctx, call, false)?;
            let rep = view.rep();
            if let Err(e) = call_in(&mut store, pre, &instance, view, call).await {
                return Err(classify(e, &store, &component.limits));
            }
            // A reusing host frees each call's handles, as its table is
            // bounded like ours.
            let own = wasmtime::component::Resource::<ContextView>::new_own(rep);
            let _ = store.data_mut().table.delete(own);
        }
        Ok(started.elapsed())
    }
}

/// The Airlock tool's `InstancePre` (the hooks measure Airlock tools).
fn airlock_pre(component: &LoadedComponent) -> Result<&AirlockPre, CallError> {
    match &component.kind {
        Kind::Airlock(pre) => Ok(pre),
        Kind::Plain(_) => Err(CallError::Busy(
            "the bench hooks measure Airlock tools, not plain components".into(),
        )),
    }
}

/// A fresh instance from an Airlock tool's `InstancePre`, and its `call`
/// of tool `name` (as the component describes it) with `call`'s
/// arguments. The whole of the guest's part of a tool call.
async fn instantiate_and_call(
    store: &mut wasmtime::Store<CallState>,
    pre: &AirlockPre,
    view: wasmtime::component::Resource<ContextView>,
    call: &ToolCall,
) -> wasmtime::Result<Result<guest::ToolOutput, guest::ToolError>> {
    let instance = pre.instantiate_async(&mut *store).await?;
    call_in(store, pre, &instance, view, call).await
}

/// The guest's `call` of `call` (its tool as the component describes it,
/// its arguments) with `view`, in `instance` (one of `pre`'s).
async fn call_in(
    store: &mut wasmtime::Store<CallState>,
    pre: &AirlockPre,
    instance: &wasmtime::component::Instance,
    view: wasmtime::component::Resource<ContextView>,
    call: &ToolCall,
) -> wasmtime::Result<Result<guest::ToolOutput, guest::ToolError>> {
    pre.exports()
        .tool(&mut *store, instance)?
        .call_call(&mut *store, view, &call.name, &call.arguments)
        .await
}
