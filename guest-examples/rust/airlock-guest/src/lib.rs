//! Write Airlock tools in Rust without the boilerplate.
//!
//! ```ignore
//! use airlock_guest::{Context, Output, Spec, Tool, ToolError, Updates, json};
//!
//! struct Counter;
//!
//! impl Tool for Counter {
//!     fn describe() -> Vec<Spec> {
//!         vec![Spec::new("increment", "Add 1 to a counter.", json!({
//!             "type": "object",
//!             "properties": {"name": {"type": "string"}},
//!             "required": ["name"]
//!         }))]
//!     }
//!
//!     fn call(ctx: &Context, name: &str, args: &Value) -> Result<Output, ToolError> {
//!         let counter = airlock_guest::str_arg(args, "name")?;
//!         let mut counters = ctx.object("counters")?;
//!         let value = counters.get(counter).and_then(Value::as_i64).unwrap_or(0) + 1;
//!         counters.insert(counter.into(), json!(value));
//!         Ok(Output::new(json!({"value": value})).with(Updates::new().set("counters", counters)))
//!     }
//! }
//!
//! airlock_guest::export_tool!(Counter);
//! ```
//!
//! The host calls every tool in a fresh instance: keep state in deps (read
//! it through [`Context`], change it with [`Updates`]), never in statics.
//! The host checks arguments against your `parameters` schema before your
//! code runs, and applies your updates all or none.

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../../wit",
        world: "tool-server",
        pub_export_macro: true,
        default_bindings_module: "airlock_guest::bindings",
    });
}

use bindings::airlock::tool::context::RunContext;
use bindings::airlock::tool::types::{self as wit};

pub use bindings::airlock::tool::ask::{Answer, Reply, Said, Speaker};
pub use bindings::airlock::tool::log::Level as LogLevel;
pub use bindings::airlock::tool::show::{
    Block, EmbeddedResource, Media, ResourceBody, ResourceLink,
};
pub use bindings::airlock::tool::types::ToolError;
pub use bindings::exports::airlock::tool::prompts::{
    Argument as PromptArgument, Message as PromptMessage, Prompt, PromptSpec,
};
pub use bindings::exports::airlock::tool::resources::{
    Contents, ReadError, Request as ResourceRequest, ResourceSpec,
};
pub use serde_json::{Map, Value, json};

/// One tool, as the model sees it.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    pub description: String,
    /// A JSON Schema (an object schema) for the arguments.
    pub parameters: Value,
}

impl Spec {
    pub fn new(name: &str, description: &str, parameters: Value) -> Self {
        Self {
            name: name.to_owned(),
            description: description.to_owned(),
            parameters,
        }
    }
}

/// The read-only run context, with JSON helpers.
pub struct Context<'a> {
    raw: &'a RunContext,
}

impl<'a> Context<'a> {
    #[doc(hidden)]
    pub fn of(raw: &'a RunContext) -> Self {
        Self { raw }
    }
}

impl Context<'_> {
    /// The value of a deps key, parsed; `None` if missing.
    pub fn get(&self, key: &str) -> Result<Option<Value>, ToolError> {
        self.raw
            .get(key)
            .map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(|e| ToolError::Failed(format!("deps key {key:?} is not JSON: {e}")))
    }

    /// The object under `key`; an empty one if the key is missing or null.
    pub fn object(&self, key: &str) -> Result<Map<String, Value>, ToolError> {
        match self.get(key)? {
            None | Some(Value::Null) => Ok(Map::new()),
            Some(Value::Object(map)) => Ok(map),
            Some(_) => Err(ToolError::Failed(format!(
                "deps key {} is not an object",
                Value::from(key)
            ))),
        }
    }

    /// The array under `key`; an empty one if the key is missing or null.
    pub fn array(&self, key: &str) -> Result<Vec<Value>, ToolError> {
        match self.get(key)? {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => Ok(items),
            Some(_) => Err(ToolError::Failed(format!(
                "deps key {} is not an array",
                Value::from(key)
            ))),
        }
    }

    /// The top-level keys this tool may read, in deps order.
    pub fn keys(&self) -> Vec<String> {
        self.raw.keys()
    }

    pub fn run_id(&self) -> String {
        self.raw.run_id()
    }

    pub fn session_id(&self) -> String {
        self.raw.session_id()
    }

    pub fn user_id(&self) -> Option<String> {
        self.raw.user_id()
    }

    pub fn tool_call_id(&self) -> String {
        self.raw.tool_call_id()
    }

    /// How many times this tool has already failed in this run.
    pub fn retry(&self) -> u32 {
        self.raw.retry()
    }

    pub fn iteration(&self) -> u32 {
        self.raw.iteration()
    }

    pub fn metadata(&self, key: &str) -> Option<String> {
        self.raw.metadata(key)
    }
}

/// Changes to deps, applied by the host in order, all or none.
#[derive(Debug, Default)]
pub struct Updates {
    ops: Vec<wit::ContextOp>,
}

impl Updates {
    pub fn new() -> Self {
        Self::default()
    }

    /// Insert or replace `key`.
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.ops.push(wit::ContextOp::Set(entry(key, value.into())));
        self
    }

    /// Deep-merge an object into `key` (arrays are replaced, `null` sets null).
    pub fn merge(mut self, key: &str, object: Map<String, Value>) -> Self {
        self.ops
            .push(wit::ContextOp::Merge(entry(key, Value::Object(object))));
        self
    }

    /// Push onto the array under `key` (creating it if missing or null).
    pub fn append(mut self, key: &str, item: impl Into<Value>) -> Self {
        self.ops
            .push(wit::ContextOp::Append(entry(key, item.into())));
        self
    }

    pub fn delete(mut self, key: &str) -> Self {
        self.ops.push(wit::ContextOp::Delete(key.to_owned()));
        self
    }
}

fn entry(key: &str, value: Value) -> wit::Entry {
    wit::Entry {
        key: key.to_owned(),
        value: value.to_string(),
    }
}

/// A successful call: the result the model sees, and the updates.
#[derive(Debug)]
pub struct Output {
    result: Value,
    updates: Updates,
}

impl Output {
    pub fn new(result: Value) -> Self {
        Self {
            result,
            updates: Updates::new(),
        }
    }

    pub fn with(mut self, updates: Updates) -> Self {
        self.updates = updates;
        self
    }
}

/// A component's tools, and the resources and prompts it offers an MCP
/// client beside them (none unless you say). Implement it and call
/// [`export_tool!`].
pub trait Tool {
    fn describe() -> Vec<Spec>;
    /// `args` is the model's JSON object, already checked against the
    /// tool's `parameters` schema by the host.
    fn call(ctx: &Context, name: &str, args: &Value) -> Result<Output, ToolError>;

    /// Resources at fixed URIs, and templates with `{name}` variables.
    fn resources() -> Vec<ResourceSpec> {
        Vec::new()
    }

    /// Reads one of [`Tool::resources`]' URIs, or a match of a template
    /// (the host has matched it, and gives the variables).
    fn read(ctx: &Context, request: &ResourceRequest) -> Result<Vec<Contents>, ReadError> {
        let _ = (ctx, request);
        Err(ReadError::NotFound)
    }

    /// Values for a template's variable that a person typing `value` may
    /// mean (at most 100).
    fn complete_resource(
        ctx: &Context,
        template: &str,
        variable: &str,
        value: &str,
        resolved: &[(String, String)],
    ) -> Vec<String> {
        let _ = (ctx, template, variable, value, resolved);
        Vec::new()
    }

    /// Prompts a person may pick, with their arguments.
    fn prompts() -> Vec<PromptSpec> {
        Vec::new()
    }

    /// Fills in one of [`Tool::prompts`] (the host has checked the
    /// arguments against what it declares).
    fn prompt(ctx: &Context, name: &str, arguments: &[(String, String)]) -> Result<Prompt, String> {
        let _ = (ctx, arguments);
        Err(format!("no prompt {name:?}"))
    }

    /// Values for a prompt's argument that a person typing `value` may
    /// mean (at most 100).
    fn complete_prompt(
        ctx: &Context,
        name: &str,
        argument: &str,
        value: &str,
        resolved: &[(String, String)],
    ) -> Vec<String> {
        let _ = (ctx, name, argument, value, resolved);
        Vec::new()
    }
}

/// The value of `name` among a request's or prompt's `pairs`.
pub fn arg<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.as_str())
}

/// The string field `field` of `args`.
pub fn str_arg<'a>(args: &'a Value, field: &str) -> Result<&'a str, ToolError> {
    args.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::InvalidArgs(format!("`{field}` must be a string")))
}

/// Writes a record to the host's log for this call.
pub fn log(level: LogLevel, message: &str) {
    bindings::airlock::tool::log::log(level, message);
}

/// Reports how far this call has come: `done` of `total` (when known),
/// and what is happening now. A client that asked for progress hears it
/// as it happens; at most 1,000 reports a call.
pub fn progress(done: f64, total: Option<f64>, message: Option<&str>) {
    bindings::airlock::tool::progress::report(done, total, message);
}

/// Shows `block` beside this call's result: text, an image, audio, a
/// link or a resource. The host checks it at once (a block that breaks a
/// rule fails the call) and keeps it only if the call succeeds.
pub fn show(block: Block) {
    bindings::airlock::tool::show::show(&block);
}

/// Asks the person this call works for `message`, wanting an answer
/// shaped by `schema` (a JSON Schema object of flat properties), and waits
/// for the answer. The operator's policy must let the tool ask (`ask =
/// true`); otherwise, and when nobody can be asked, the answer is
/// [`Answer::Unavailable`] with why. At most 8 questions a call.
pub fn ask_user(message: &str, schema: &Value) -> Answer {
    bindings::airlock::tool::ask::ask_user(message, &schema.to_string())
}

/// Asks the model to continue `messages` (after `system` instructions), in
/// at most `max_tokens` tokens. The operator's policy must let the tool
/// ask (`sample = { … }`); `Err` says why nobody answered.
pub fn ask_model(
    messages: &[Said],
    system: Option<&str>,
    max_tokens: u32,
) -> Result<Reply, String> {
    bindings::airlock::tool::ask::ask_model(messages, system, max_tokens)
}

#[doc(hidden)]
pub fn describe<T: Tool>() -> Vec<wit::ToolSpec> {
    T::describe()
        .into_iter()
        .map(|spec| wit::ToolSpec {
            name: spec.name,
            description: spec.description,
            parameters: spec.parameters.to_string(),
        })
        .collect()
}

#[doc(hidden)]
pub fn call<T: Tool>(
    raw: &RunContext,
    name: String,
    args: String,
) -> Result<wit::ToolOutput, ToolError> {
    let args: Value = serde_json::from_str(&args)
        .map_err(|e| ToolError::InvalidArgs(format!("arguments are not JSON: {e}")))?;
    let output = T::call(&Context { raw }, &name, &args)?;
    Ok(wit::ToolOutput {
        result: output.result.to_string(),
        updates: output.updates.ops,
    })
}

/// Exports `$tool` (a type implementing [`Tool`]) as the component's tools.
#[macro_export]
macro_rules! export_tool {
    ($tool:ty) => {
        struct __AirlockExport;

        impl $crate::bindings::exports::airlock::tool::tool::Guest for __AirlockExport {
            fn describe() -> ::std::vec::Vec<$crate::bindings::airlock::tool::types::ToolSpec> {
                $crate::describe::<$tool>()
            }

            fn call(
                ctx: &$crate::bindings::airlock::tool::context::RunContext,
                name: ::std::string::String,
                args: ::std::string::String,
            ) -> ::std::result::Result<$crate::bindings::airlock::tool::types::ToolOutput, $crate::ToolError> {
                $crate::call::<$tool>(ctx, name, args)
            }
        }

        impl $crate::bindings::exports::airlock::tool::resources::Guest for __AirlockExport {
            fn describe() -> ::std::vec::Vec<$crate::ResourceSpec> {
                <$tool as $crate::Tool>::resources()
            }

            fn read(
                ctx: &$crate::bindings::airlock::tool::context::RunContext,
                request: $crate::ResourceRequest,
            ) -> ::std::result::Result<::std::vec::Vec<$crate::Contents>, $crate::ReadError> {
                <$tool as $crate::Tool>::read(&$crate::Context::of(ctx), &request)
            }

            fn complete(
                ctx: &$crate::bindings::airlock::tool::context::RunContext,
                template: ::std::string::String,
                variable: ::std::string::String,
                value: ::std::string::String,
                resolved: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
            ) -> ::std::vec::Vec<::std::string::String> {
                <$tool as $crate::Tool>::complete_resource(
                    &$crate::Context::of(ctx),
                    &template,
                    &variable,
                    &value,
                    &resolved,
                )
            }
        }

        impl $crate::bindings::exports::airlock::tool::prompts::Guest for __AirlockExport {
            fn describe() -> ::std::vec::Vec<$crate::PromptSpec> {
                <$tool as $crate::Tool>::prompts()
            }

            fn get(
                ctx: &$crate::bindings::airlock::tool::context::RunContext,
                name: ::std::string::String,
                arguments: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
            ) -> ::std::result::Result<$crate::Prompt, ::std::string::String> {
                <$tool as $crate::Tool>::prompt(&$crate::Context::of(ctx), &name, &arguments)
            }

            fn complete(
                ctx: &$crate::bindings::airlock::tool::context::RunContext,
                name: ::std::string::String,
                argument: ::std::string::String,
                value: ::std::string::String,
                resolved: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
            ) -> ::std::vec::Vec<::std::string::String> {
                <$tool as $crate::Tool>::complete_prompt(
                    &$crate::Context::of(ctx),
                    &name,
                    &argument,
                    &value,
                    &resolved,
                )
            }
        }

        $crate::bindings::export!(__AirlockExport with_types_in $crate::bindings);
    };
}
