//! Host bindings for `wit/tool.wit` and the host side of its imports:
//! the read-only `run-context` view and the `log` sink.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use wasmtime::component::{HasSelf, Instance, InstancePre, Linker, Resource};
use wasmtime::{AsContextMut, Store};

use crate::context::{Deps, KeyRules, RunContext, Usage};
use crate::sandbox::{
    CallEvent, CallState, ImportMisused, LogLevel, LogRecord, MAX_PROGRESS_MESSAGE,
    MAX_PROGRESS_REPORTS,
};

wasmtime::component::bindgen!({
    path: "../wit",
    // The world with every export; a component need have only `tool`
    // ([`Exports`] finds the others).
    world: "tool-server",
    imports: {
        // A question waits for a person; everything else answers at once.
        "airlock:tool/ask.ask-user": async | trappable,
        "airlock:tool/ask.ask-model": async | trappable,
        default: trappable,
    },
    exports: { default: async },
    with: {
        "airlock:tool/context.run-context": ContextView,
    },
});

pub(crate) use self::airlock::tool::{ask, show};
use self::airlock::tool::{context, log, progress, types};
pub(crate) use self::exports::airlock::tool::{prompts, resources, tool};

/// Where an Airlock component's exports are, found once when it is
/// loaded: its tools, and its resources and prompts when it offers them.
#[derive(Clone)]
pub(crate) struct Exports {
    tool: tool::GuestIndices,
    resources: Option<resources::GuestIndices>,
    prompts: Option<prompts::GuestIndices>,
}

impl Exports {
    /// The exports of `pre`'s component: an error when it lacks `tool`,
    /// or exports `resources` or `prompts` without all their functions.
    pub(crate) fn new<T>(pre: &InstancePre<T>) -> wasmtime::Result<Self> {
        let exports = |interface: &str| {
            pre.component()
                .get_export_index(None, format!("airlock:tool/{interface}@{WIT_VERSION}"))
                .is_some()
        };
        Ok(Self {
            tool: tool::GuestIndices::new(pre)?,
            resources: exports("resources")
                .then(|| resources::GuestIndices::new(pre))
                .transpose()?,
            prompts: exports("prompts")
                .then(|| prompts::GuestIndices::new(pre))
                .transpose()?,
        })
    }

    /// Whether the component exports `resources`.
    pub(crate) fn has_resources(&self) -> bool {
        self.resources.is_some()
    }

    /// Whether the component exports `prompts`.
    pub(crate) fn has_prompts(&self) -> bool {
        self.prompts.is_some()
    }

    /// The `tool` interface of `instance`.
    pub(crate) fn tool(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
    ) -> wasmtime::Result<tool::Guest> {
        self.tool.load(store, instance)
    }

    /// The `resources` interface of `instance`, if the component has it.
    pub(crate) fn resources(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
    ) -> wasmtime::Result<Option<resources::Guest>> {
        self.resources
            .as_ref()
            .map(|indices| indices.load(store, instance))
            .transpose()
    }

    /// The `prompts` interface of `instance`, if the component has it.
    pub(crate) fn prompts(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
    ) -> wasmtime::Result<Option<prompts::Guest>> {
        self.prompts
            .as_ref()
            .map(|indices| indices.load(store, instance))
            .transpose()
    }
}

/// The version of the WIT package the host implements (a component's
/// exports of any 0.1 version are found under it).
pub const WIT_VERSION: &str = "0.1.2";

/// An Airlock component ready to instantiate, and where its exports are.
#[derive(Clone)]
pub(crate) struct AirlockPre {
    pre: InstancePre<CallState>,
    exports: Exports,
}

impl AirlockPre {
    /// `pre`'s exports found: fails as [`Exports::new`] does.
    pub(crate) fn new(pre: InstancePre<CallState>) -> wasmtime::Result<Self> {
        let exports = Exports::new(&pre)?;
        Ok(Self { pre, exports })
    }

    pub(crate) fn instance_pre(&self) -> &InstancePre<CallState> {
        &self.pre
    }

    pub(crate) fn exports(&self) -> &Exports {
        &self.exports
    }

    /// A new instance in `store`.
    pub(crate) async fn instantiate_async(
        &self,
        store: &mut Store<CallState>,
    ) -> wasmtime::Result<Instance> {
        self.pre.instantiate_async(store).await
    }
}

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
    /// What the tool read, when asked to record it (a speculative call of
    /// a parallel turn); `None` keeps the plain call path free of it.
    reads: Option<Reads>,
}

/// What a call read through its view that another call of the same turn
/// could change: the deps keys it asked for (`get`), whether it listed the
/// keys (`keys`: that depends on every key), and whether it asked for its
/// retry count. Everything else a view shows is fixed for a turn.
///
/// Bounded: past [`Reads::MAX_KEYS`] distinct keys it counts as having read
/// everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reads {
    keys: BTreeSet<String>,
    everything: bool,
    retry: bool,
}

impl Reads {
    /// How many keys are remembered one by one.
    pub const MAX_KEYS: usize = 1024;

    fn key(&mut self, key: &str) {
        if self.everything || self.keys.contains(key) {
            return;
        }
        if self.keys.len() >= Self::MAX_KEYS {
            self.everything = true;
            self.keys.clear();
        } else {
            self.keys.insert(key.to_owned());
        }
    }

    /// Whether what was read could differ once `written` keys have been
    /// written.
    pub fn depends_on(&self, written: &BTreeSet<String>) -> bool {
        !written.is_empty()
            && (self.everything || self.keys.iter().any(|key| written.contains(key)))
    }

    /// Reads that depend on every key (what a read of all of deps is).
    pub fn everything() -> Self {
        Self {
            everything: true,
            ..Self::default()
        }
    }

    /// Whether the call asked for its retry count.
    pub fn read_retry(&self) -> bool {
        self.retry
    }
}

impl ContextView {
    pub(crate) fn new(
        ctx: &RunContext,
        tool_call_id: &str,
        retry: u32,
        rules: KeyRules,
        record_reads: bool,
    ) -> Self {
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
            reads: record_reads.then(Reads::default),
        }
    }

    /// What the tool has read, if the view records it; taken once the
    /// call is over.
    pub(crate) fn take_reads(&mut self) -> Option<Reads> {
        self.reads.take()
    }
}

/// Adds the `context`, `log` and `progress` imports to `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    context::add_to_linker::<CallState, HasSelf<CallState>>(linker, |state| state)?;
    log::add_to_linker::<CallState, HasSelf<CallState>>(linker, |state| state)?;
    progress::add_to_linker::<CallState, HasSelf<CallState>>(linker, |state| state)?;
    show::add_to_linker::<CallState, HasSelf<CallState>>(linker, |state| state)?;
    ask::add_to_linker::<CallState, HasSelf<CallState>>(linker, |state| state)?;
    Ok(())
}

impl types::Host for CallState {}

impl context::Host for CallState {}

impl CallState {
    fn view(&self, handle: &Resource<ContextView>) -> wasmtime::Result<&ContextView> {
        Ok(self.table.get(handle)?)
    }

    fn view_mut(&mut self, handle: &Resource<ContextView>) -> wasmtime::Result<&mut ContextView> {
        Ok(self.table.get_mut(handle)?)
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
        let view = self.view_mut(&this)?;
        if let Some(reads) = &mut view.reads {
            reads.retry = true;
        }
        Ok(view.retry)
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
        let view = self.view_mut(&this)?;
        if !view.rules.can_read(&key) {
            return Ok(None);
        }
        if let Some(reads) = &mut view.reads {
            reads.key(&key);
        }
        Ok(view.deps.get(&key).map(|value| value.to_string()))
    }

    fn keys(&mut self, this: Resource<ContextView>) -> wasmtime::Result<Vec<String>> {
        let view = self.view_mut(&this)?;
        if let Some(reads) = &mut view.reads {
            reads.everything = true;
        }
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
        let record = LogRecord { level, message };
        let kept = self.log.push(record).map_err(wasmtime::Error::new)?;
        self.cancel.report(CallEvent::Log(Cow::Borrowed(kept)));
        Ok(())
    }
}

impl show::Host for CallState {
    /// Checks the block and keeps it with the call's output; a block that
    /// breaks a rule fails the call.
    fn show(&mut self, block: show::Block) -> wasmtime::Result<()> {
        self.shown
            .push(block.into(), &self.grants.uri_schemes)
            .map_err(|why| wasmtime::Error::new(ImportMisused(why)))
    }
}

impl ask::Host for CallState {
    /// Checks the question against the call's bounds (a question past them
    /// fails the call), asks whoever answers for the call (when its policy
    /// lets it ask), and keeps question and answer with the call's output.
    async fn ask_user(&mut self, message: String, schema: String) -> wasmtime::Result<ask::Answer> {
        use crate::sandbox::{MAX_QUESTION_BYTES, MAX_QUESTIONS};
        use crate::spec::{Answer, Asked};
        let misused = |why: String| Err(wasmtime::Error::new(ImportMisused(why)));
        if self.asked.len() >= MAX_QUESTIONS {
            return misused(format!(
                "the tool asked more than {MAX_QUESTIONS} questions in one call"
            ));
        }
        if message.len() > MAX_QUESTION_BYTES || schema.len() > MAX_QUESTION_BYTES {
            return misused(format!(
                "the tool's question or its schema is over {MAX_QUESTION_BYTES} bytes"
            ));
        }
        let schema: serde_json::Value = match serde_json::from_str(&schema) {
            Ok(schema @ serde_json::Value::Object(_)) => schema,
            _ => {
                return misused(
                    "the tool's question has a schema that is not a JSON object".into(),
                );
            }
        };
        // Whoever answers, the answer is checked against it before the
        // tool sees it (and before it is kept).
        let fits = match crate::spec::compile_schema(&schema) {
            Ok(fits) => fits,
            Err(e) => {
                return misused(format!(
                    "the tool's question has a schema that does not compile: {e}"
                ));
            }
        };
        let mut asked = Asked {
            message,
            schema,
            answer: Answer::Cancel,
        };
        asked.answer = if !self.grants.ask_user {
            Answer::Unavailable {
                why: "the operator's policy does not let this tool ask its user (ask = true)"
                    .into(),
            }
        } else if let Some(asker) = self.cancel.asker() {
            let answer = asker(asked.clone()).await;
            // A call cancelled while it waited stops here, whatever it
            // was told.
            if self.cancel.is_cancelled() {
                return Err(wasmtime::Error::new(crate::sandbox::Stop::Cancelled));
            }
            fitting(answer, &fits)
        } else {
            Answer::Unavailable {
                why: "nobody can be asked here: the call's caller takes no questions".into(),
            }
        };
        let answer = match &asked.answer {
            Answer::Accept { content } => ask::Answer::Accept(content.to_string()),
            Answer::Decline => ask::Answer::Decline,
            Answer::Cancel => ask::Answer::Cancel,
            Answer::Unavailable { why } => ask::Answer::Unavailable(why.clone()),
        };
        self.asked.push(asked);
        Ok(answer)
    }

    /// Checks the request against the policy's `sample` (one past its
    /// `max_requests`, or past 64 KiB of messages, fails the call), asks
    /// whoever answers for the call, and keeps request and reply with the
    /// call's output.
    async fn ask_model(
        &mut self,
        messages: Vec<ask::Said>,
        system: Option<String>,
        max_tokens: u32,
    ) -> wasmtime::Result<Result<ask::Reply, String>> {
        use crate::policy::grants::SampleGrant;
        use crate::sandbox::MAX_SAMPLE_BYTES;
        use crate::spec::{SampleReply, SampleRequest, Sampled};
        let misused = |why: String| Err(wasmtime::Error::new(ImportMisused(why)));
        let size = messages.iter().map(|m| m.text.len()).sum::<usize>()
            + system.as_ref().map_or(0, String::len);
        if size > MAX_SAMPLE_BYTES {
            return misused(format!(
                "the tool asked the model with more than {MAX_SAMPLE_BYTES} bytes of messages"
            ));
        }
        // Refused requests count too: a tool denied the model cannot make
        // the host keep a list without end.
        let limit = self
            .grants
            .sampling
            .map_or(SampleGrant::DEFAULT.max_requests, |g| g.max_requests);
        if self.sampled.len() >= limit as usize {
            return misused(format!(
                "the tool asked the model more than {limit} times in one call (sample.max_requests)"
            ));
        }
        let request = |max_tokens| SampleRequest {
            messages: messages
                .iter()
                .map(|m| {
                    let role = match m.speaker {
                        ask::Speaker::User => "user",
                        ask::Speaker::Assistant => "assistant",
                    };
                    (role.to_owned(), m.text.clone())
                })
                .collect(),
            system: system.clone(),
            max_tokens,
        };
        let reply = match self.grants.sampling {
            None => SampleReply::Refused {
                why: "the operator's policy does not let this tool ask the model (sample)".into(),
            },
            Some(grant) => {
                let request = request(max_tokens.min(grant.max_tokens));
                match self.cancel.sampler() {
                    Some(sampler) => {
                        let tokens = request.max_tokens;
                        let reply = sampler(request).await;
                        // A call cancelled while it waited stops here.
                        if self.cancel.is_cancelled() {
                            return Err(wasmtime::Error::new(crate::sandbox::Stop::Cancelled));
                        }
                        bounded(reply, tokens)
                    }
                    None => SampleReply::Refused {
                        why: "nobody can be asked here: the call's caller has no model for it"
                            .into(),
                    },
                }
            }
        };
        let answer = match &reply {
            SampleReply::Answered {
                text,
                model,
                stop_reason,
            } => Ok(ask::Reply {
                text: text.clone(),
                model: model.clone(),
                stop_reason: stop_reason.clone(),
            }),
            SampleReply::Refused { why } => Err(why.clone()),
        };
        self.sampled.push(Sampled {
            request: request(max_tokens),
            reply,
        });
        Ok(answer)
    }
}

impl progress::Host for CallState {
    /// Checks the report against the call's bounds (a report past them
    /// fails the call) and hands it to the caller's observer.
    fn report(
        &mut self,
        done: f64,
        total: Option<f64>,
        message: Option<String>,
    ) -> wasmtime::Result<()> {
        let misused = |why: String| Err(wasmtime::Error::new(ImportMisused(why)));
        if self.progress.len() >= MAX_PROGRESS_REPORTS as usize {
            return misused(format!(
                "the tool reported progress more than {MAX_PROGRESS_REPORTS} times in one call"
            ));
        }
        let usable = |n: f64| n.is_finite() && n >= 0.0;
        if !usable(done) || !total.is_none_or(usable) {
            return misused(format!(
                "the tool reported progress that is not a number of at least 0 (done {done}, total {total:?})"
            ));
        }
        if let Some(text) = &message
            && text.len() > MAX_PROGRESS_MESSAGE
        {
            return misused(format!(
                "the tool's progress message is {} bytes, over {MAX_PROGRESS_MESSAGE}",
                text.len()
            ));
        }
        let report = crate::sandbox::Progress {
            done,
            total,
            message,
        };
        self.progress.push(report);
        if let Some(kept) = self.progress.last() {
            self.cancel.report(CallEvent::Progress(Cow::Borrowed(kept)));
        }
        Ok(())
    }
}

/// `answer` as the tool may be given it: an accepted answer that does not
/// fit the question ([`misfit`]) is replaced by an unavailable one that
/// says where it does not fit and by which rule, never with what it holds.
/// Whoever answered (a client, a terminal, a script, a recorded answer),
/// the tool gets what the contract promises: an object shaped by the
/// schema.
fn fitting(answer: crate::spec::Answer, fits: &jsonschema::Validator) -> crate::spec::Answer {
    use crate::spec::Answer;
    let Answer::Accept { content } = &answer else {
        return answer;
    };
    match misfit(content, fits) {
        Some(why) => Answer::Unavailable {
            why: format!("the answer given does not fit the question: {why}"),
        },
        None => answer,
    }
}

/// Why `content` is not an answer to a question whose schema compiled to
/// `fits` ([`compile_schema`](crate::spec::compile_schema)): it is not a
/// JSON object, it is over
/// [`MAX_ANSWER_BYTES`](crate::sandbox::MAX_ANSWER_BYTES) of JSON, or
/// where and by which rule it breaks the schema; never what it holds, so
/// the reason may be shown to whoever did not give it. `None`: it fits.
/// Cost: one measuring pass and one validation.
pub fn misfit(content: &serde_json::Value, fits: &jsonschema::Validator) -> Option<String> {
    use crate::sandbox::MAX_ANSWER_BYTES;
    if !content.is_object() {
        let kind = crate::context::JsonType::of(content);
        return Some(format!("it is {kind}, not a JSON object"));
    }
    let bytes = crate::json::len(content);
    if bytes > MAX_ANSWER_BYTES {
        return Some(format!(
            "it is {bytes} bytes; the limit is {MAX_ANSWER_BYTES}"
        ));
    }
    crate::context::SchemaViolation::first(fits, content).map(|v| v.to_string())
}

/// `reply` as the tool may be given it: one whose text is longer than a
/// reply of `max_tokens` tokens could be
/// ([`max_reply_bytes`](crate::sandbox::max_reply_bytes)), or whose model
/// or stop reason is over 1 KiB, is replaced by a refusal that says so.
/// Whoever replied (an MCP client, the run's model, a recorded reply), it
/// is what was asked for, not what a client chose to send.
fn bounded(reply: crate::spec::SampleReply, max_tokens: u32) -> crate::spec::SampleReply {
    use crate::spec::SampleReply;
    const MAX_NAME_BYTES: usize = 1 << 10;
    let SampleReply::Answered {
        text,
        model,
        stop_reason,
    } = &reply
    else {
        return reply;
    };
    let limit = crate::sandbox::max_reply_bytes(max_tokens);
    let why = if text.len() > limit {
        format!(
            "the reply is {} bytes, more than {max_tokens} tokens could be (at most {limit})",
            text.len()
        )
    } else if model.len() > MAX_NAME_BYTES
        || stop_reason
            .as_ref()
            .is_some_and(|r| r.len() > MAX_NAME_BYTES)
    {
        format!("the reply's model or stop reason is over {MAX_NAME_BYTES} bytes")
    } else {
        return reply;
    };
    SampleReply::Refused {
        why: format!("the model's reply was not used: {why}"),
    }
}
