//! Calling a tool: a fresh instance, the guest's `call`, its output parsed
//! and its ops applied, and failures mapped to typed errors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use wasmtime::{Store, Trap};

use super::{
    Approval, CallError, CallOutcome, ContextView, GuestOp, Host, LEGACY_UPDATE_KEY,
    LoadedComponent, ToolCall, guest,
};
use crate::context::{ContextOp, JsonType, OpKind, RunContext, check_bounds};
use crate::sandbox::{
    CallState, CancelToken, Grants, Interrupted, Limits, LogRecord, OutputLimitExceeded,
    ResourceHit,
};

impl Host {
    pub(super) fn component_of(&self, name: &str) -> Result<&LoadedComponent, CallError> {
        match self.tools.get(name) {
            Some(&index) => Ok(&self.components[index]),
            None => Err(CallError::UnknownTool {
                name: name.to_owned(),
                available: self.tool_names(),
            }),
        }
    }

    /// Whether calls of tool `name` need approval (`Never` for unknown tools).
    pub fn approval(&self, name: &str) -> Approval {
        self.tools
            .get(name)
            .map_or(Approval::Never, |&i| self.components[i].approval)
    }

    /// Runs one tool call and applies its ops to `ctx`, all or none.
    ///
    /// On `Ok`, `ctx.deps()` holds the result of applying every op in
    /// `updates`. On `Err`, `ctx` is unchanged, whatever the guest did.
    pub async fn call(
        &self,
        ctx: &mut RunContext,
        call: &ToolCall,
    ) -> Result<CallOutcome, CallError> {
        self.call_cancellable(ctx, call, &CancelToken::new()).await
    }

    /// [`Host::call`], stopped with [`CallError::Cancelled`] (and `ctx`
    /// unchanged) as soon as `cancel` fires.
    pub async fn call_cancellable(
        &self,
        ctx: &mut RunContext,
        call: &ToolCall,
        cancel: &CancelToken,
    ) -> Result<CallOutcome, CallError> {
        let component = self.component_of(&call.name)?;
        check_arguments(
            &call.arguments,
            component.validators.get(&call.name).map(Arc::as_ref),
        )?;
        let started = Instant::now();
        let span = tracing::debug_span!("tool_call", tool = %call.name, id = %call.id);
        let _enter = span.enter();

        let (output, captured) = tokio::select! {
            done = self.invoke(component, ctx, call, cancel) => done?,
            () = cancel.cancelled() => return Err(CallError::Cancelled),
        };
        let (result, updates) = parse_output(output, &component.limits)?;
        ctx.apply_with_rules(&updates, &component.limits.ops, &component.rules)?;

        let duration = started.elapsed();
        tracing::debug!(ops = updates.len(), ?duration, "tool call applied");
        Ok(CallOutcome {
            result,
            updates,
            logs: captured.logs,
            stdout: captured.stdout,
            stderr: captured.stderr,
            duration,
        })
    }

    /// Instantiates a fresh instance and runs the guest's `call`. The store
    /// is dropped before this returns, so the context's deps are no longer
    /// shared with the view when ops are applied.
    async fn invoke(
        &self,
        component: &LoadedComponent,
        ctx: &RunContext,
        call: &ToolCall,
        cancel: &CancelToken,
    ) -> Result<(guest::ToolOutput, Captured), CallError> {
        let limits = &component.limits;
        let mut store = self.new_store(limits, &component.grants, cancel.clone())?;
        let view = push_view(&mut store, component, ctx, call)?;
        let run = instantiate_and_call(&mut store, component, view, call);
        let outcome = tokio::time::timeout(limits.timeout + TIMER_GRACE, run).await;
        let returned = match outcome {
            Ok(Ok(returned)) => returned,
            Ok(Err(e)) => return Err(classify(e, &store, limits)),
            Err(_) => {
                return Err(CallError::Timeout {
                    limit: limits.timeout,
                });
            }
        };
        let state = store.data_mut();
        let captured = Captured {
            logs: state.log.take(),
            stdout: state.stdout.text(),
            stderr: state.stderr.text(),
        };
        drop(store);
        match returned {
            Ok(output) => Ok((output, captured)),
            Err(guest::ToolError::InvalidArgs(msg)) => Err(CallError::InvalidArgs(msg)),
            Err(guest::ToolError::Failed(msg)) => Err(CallError::Failed(msg)),
            Err(guest::ToolError::Retry(msg)) => Err(CallError::Retry(msg)),
        }
    }

    pub(super) fn new_store(
        &self,
        limits: &Limits,
        grants: &Arc<Grants>,
        cancel: CancelToken,
    ) -> Result<Store<CallState>, CallError> {
        let state =
            CallState::new(limits, grants, cancel).map_err(|e| CallError::Grant(e.to_string()))?;
        self.sandbox
            .store(state)
            .map_err(|e| CallError::Busy(format!("{e:#}")))
    }
}

/// Host-side timer slack beyond [`Limits::timeout`]. Epoch interruption
/// normally stops the guest first; the timer catches a guest that is
/// blocked in a host call rather than running wasm.
pub(super) const TIMER_GRACE: Duration = Duration::from_millis(250);

/// How much of a crashed guest's stderr an error carries.
const STDERR_TAIL_BYTES: usize = 2048;

/// Puts the call's read-only context view into the store's table; the
/// guest gets a borrow of it.
pub(super) fn push_view(
    store: &mut Store<CallState>,
    component: &LoadedComponent,
    ctx: &RunContext,
    call: &ToolCall,
) -> Result<wasmtime::component::Resource<ContextView>, CallError> {
    let view = ContextView::new(ctx, &call.id, call.retry, component.rules.clone());
    store
        .data_mut()
        .table
        .push(view)
        .map_err(|e| CallError::Busy(e.to_string()))
}

/// A fresh instance from the component's `InstancePre`, and its `call`.
/// The whole of the guest's part of a tool call.
pub(super) async fn instantiate_and_call(
    store: &mut Store<CallState>,
    component: &LoadedComponent,
    view: wasmtime::component::Resource<ContextView>,
    call: &ToolCall,
) -> wasmtime::Result<Result<guest::ToolOutput, guest::ToolError>> {
    let instance = component.pre.instantiate_async(&mut *store).await?;
    instance
        .airlock_tool_tool()
        .call_call(&mut *store, view, &call.name, &call.arguments)
        .await
}

/// What a call's guest wrote besides its result.
struct Captured {
    logs: Vec<LogRecord>,
    stdout: String,
    stderr: String,
}

/// Checks that `arguments` is a JSON object that satisfies the tool's
/// parameter schema.
fn check_arguments(
    arguments: &str,
    validator: Option<&jsonschema::Validator>,
) -> Result<(), CallError> {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => {
            match validator.and_then(|v| v.iter_errors(&value).next()) {
                None => Ok(()),
                Some(e) => {
                    let at = e.instance_path().to_string();
                    let at = if at.is_empty() {
                        String::new()
                    } else {
                        format!(" at {at}")
                    };
                    Err(CallError::InvalidArgs(format!(
                        "the arguments do not match the tool's schema{at}: {e}"
                    )))
                }
            }
        }
        Ok(other) => Err(CallError::InvalidArgs(format!(
            "arguments must be a JSON object, not {}",
            JsonType::of(&other)
        ))),
        Err(e) => Err(CallError::InvalidArgs(format!(
            "arguments are not valid JSON: {e}"
        ))),
    }
}

/// Turns a guest's output into a result value and parsed ops, enforcing the
/// result and op bounds. Applies nothing.
fn parse_output(
    output: guest::ToolOutput,
    limits: &Limits,
) -> Result<(Value, Vec<ContextOp>), CallError> {
    if output.result.len() > limits.max_result_bytes {
        return Err(CallError::ResultTooLarge {
            bytes: output.result.len(),
            limit: limits.max_result_bytes,
        });
    }
    let mut result: Value = serde_json::from_str(&output.result)
        .map_err(|e| CallError::InvalidResult(format!("the result is not valid JSON: {e}")))?;

    let raw: Vec<(OpKind, String, Option<String>)> = output
        .updates
        .into_iter()
        .map(|op| match op {
            GuestOp::Set(e) => (OpKind::Set, e.key, Some(e.value)),
            GuestOp::Merge(e) => (OpKind::Merge, e.key, Some(e.value)),
            GuestOp::Append(e) => (OpKind::Append, e.key, Some(e.value)),
            GuestOp::Delete(key) => (OpKind::Delete, key, None),
        })
        .collect();
    check_bounds(
        raw.iter()
            .map(|(kind, key, value)| (*kind, key.as_str(), value.as_ref().map_or(0, String::len))),
        &limits.ops,
    )?;
    let mut ops = Vec::with_capacity(raw.len());
    for (index, (kind, key, value)) in raw.into_iter().enumerate() {
        ops.push(ContextOp::from_json_text(
            index,
            kind,
            key,
            value.as_deref(),
        )?);
    }

    if let Value::Object(map) = &mut result
        && let Some(legacy) = map.remove(LEGACY_UPDATE_KEY)
    {
        let Value::Object(entries) = legacy else {
            return Err(CallError::InvalidResult(format!(
                "`{LEGACY_UPDATE_KEY}` must be a JSON object of key → value"
            )));
        };
        ops.extend(
            entries
                .into_iter()
                .map(|(key, value)| ContextOp::Set { key, value }),
        );
    }
    Ok((result, ops))
}

/// Maps a failure inside the guest (or at its boundary) to a typed error.
pub(super) fn classify(
    error: wasmtime::Error,
    store: &Store<CallState>,
    limits: &Limits,
) -> CallError {
    if let Some(interrupted) = find::<Interrupted>(&error) {
        return match interrupted {
            Interrupted::Timeout => CallError::Timeout {
                limit: limits.timeout,
            },
            Interrupted::Cancelled => CallError::Cancelled,
        };
    }
    if let Some(over) = find::<OutputLimitExceeded>(&error) {
        return CallError::OutputLimit {
            stream: over.stream,
            limit: over.limit,
        };
    }
    if find::<wasmtime::PoolConcurrencyLimitError>(&error).is_some() {
        return CallError::Busy(error.to_string());
    }
    match store.data().limiter.hit {
        Some(ResourceHit::Memory { .. }) => {
            return CallError::MemoryLimit {
                limit: limits.max_memory_bytes,
            };
        }
        Some(ResourceHit::Table { .. }) => {
            return CallError::TableLimit {
                limit: limits.max_table_elements,
            };
        }
        None => {}
    }
    let trap = find::<Trap>(&error).copied();
    if trap == Some(Trap::OutOfFuel) {
        return CallError::FuelExhausted {
            limit: limits.fuel.unwrap_or(0),
        };
    }
    tracing::debug!(error = ?error, "guest trapped");
    let message = match trap {
        Some(trap) => trap.to_string(),
        None => error.to_string(),
    };
    CallError::Trap {
        message,
        stderr: tail(&store.data().stderr.text(), STDERR_TAIL_BYTES),
    }
}

/// Finds an error of type `T` in `error` or the errors it wraps.
fn find<T: std::error::Error + Send + Sync + 'static>(error: &wasmtime::Error) -> Option<&T> {
    error
        .downcast_ref::<T>()
        .or_else(|| error.chain().find_map(|cause| cause.downcast_ref::<T>()))
}

fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}
