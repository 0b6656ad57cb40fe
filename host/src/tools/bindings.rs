//! Host bindings for `wit/tool.wit` and the host side of its imports:
//! the read-only `run-context` view and the `log` sink.

use std::collections::BTreeMap;

use wasmtime::component::{HasSelf, Linker, Resource};

use crate::context::{Deps, KeyRules, RunContext, Usage};
use crate::sandbox::{CallState, LogLevel, LogRecord};

wasmtime::component::bindgen!({
    path: "../wit",
    world: "tool-host",
    imports: { default: trappable },
    exports: { default: async },
    with: {
        "airlock:tool/context.run-context": ContextView,
    },
});

use self::airlock::tool::{context, log, types};

/// What a tool can see of the run context during one call.
///
/// It holds a shared handle to deps as they were when the call started
/// (no copy is made) and serializes only the keys the tool reads. Keys the
/// tool may not read (hidden, or outside its `read` patterns) are absent
/// from `get` and `keys`, exactly as if they did not exist.
#[derive(Debug)]
pub struct ContextView {
    deps: Deps,
    run_id: String,
    session_id: String,
    user_id: Option<String>,
    metadata: BTreeMap<String, String>,
    usage: Usage,
    iteration: u32,
    tool_call_id: String,
    retry: u32,
    rules: KeyRules,
}

impl ContextView {
    pub(crate) fn new(ctx: &RunContext, tool_call_id: &str, retry: u32, rules: KeyRules) -> Self {
        Self {
            deps: ctx.deps_snapshot(),
            run_id: ctx.run_id().to_owned(),
            session_id: ctx.session_id().to_owned(),
            user_id: ctx.user_id().map(str::to_owned),
            metadata: ctx.metadata().clone(),
            usage: ctx.usage,
            iteration: ctx.iteration,
            tool_call_id: tool_call_id.to_owned(),
            retry,
            rules,
        }
    }
}

/// Adds the `context` and `log` imports to `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    context::add_to_linker::<CallState, HasSelf<CallState>>(linker, |state| state)?;
    log::add_to_linker::<CallState, HasSelf<CallState>>(linker, |state| state)?;
    Ok(())
}

impl types::Host for CallState {}

impl context::Host for CallState {}

impl CallState {
    fn view(&self, handle: &Resource<ContextView>) -> wasmtime::Result<&ContextView> {
        Ok(self.table.get(handle)?)
    }
}

impl context::HostRunContext for CallState {
    fn run_id(&mut self, this: Resource<ContextView>) -> wasmtime::Result<String> {
        Ok(self.view(&this)?.run_id.clone())
    }

    fn session_id(&mut self, this: Resource<ContextView>) -> wasmtime::Result<String> {
        Ok(self.view(&this)?.session_id.clone())
    }

    fn user_id(&mut self, this: Resource<ContextView>) -> wasmtime::Result<Option<String>> {
        Ok(self.view(&this)?.user_id.clone())
    }

    fn tool_call_id(&mut self, this: Resource<ContextView>) -> wasmtime::Result<String> {
        Ok(self.view(&this)?.tool_call_id.clone())
    }

    fn retry(&mut self, this: Resource<ContextView>) -> wasmtime::Result<u32> {
        Ok(self.view(&this)?.retry)
    }

    fn iteration(&mut self, this: Resource<ContextView>) -> wasmtime::Result<u32> {
        Ok(self.view(&this)?.iteration)
    }

    fn usage(&mut self, this: Resource<ContextView>) -> wasmtime::Result<types::Usage> {
        let u = self.view(&this)?.usage;
        Ok(types::Usage {
            requests: u.requests,
            tool_calls: u.tool_calls,
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
        })
    }

    fn get(
        &mut self,
        this: Resource<ContextView>,
        key: String,
    ) -> wasmtime::Result<Option<String>> {
        let view = self.view(&this)?;
        if !view.rules.can_read(&key) {
            return Ok(None);
        }
        Ok(view.deps.get(&key).map(|value| value.to_string()))
    }

    fn keys(&mut self, this: Resource<ContextView>) -> wasmtime::Result<Vec<String>> {
        let view = self.view(&this)?;
        Ok(view
            .deps
            .keys()
            .filter(|key| view.rules.can_read(key))
            .cloned()
            .collect())
    }

    fn metadata(
        &mut self,
        this: Resource<ContextView>,
        key: String,
    ) -> wasmtime::Result<Option<String>> {
        Ok(self.view(&this)?.metadata.get(&key).cloned())
    }

    fn drop(&mut self, this: Resource<ContextView>) -> wasmtime::Result<()> {
        // The host owns the view and removes it after the call; a guest can
        // only hold a borrow, so there is nothing to drop on its behalf.
        let _ = this;
        Ok(())
    }
}

impl log::Host for CallState {
    fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        let level = match level {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        self.log
            .push(LogRecord { level, message })
            .map_err(wasmtime::Error::new)
    }
}
