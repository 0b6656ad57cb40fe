//! What a component offers beside its tools (the WIT package's
//! `resources` and `prompts` exports, since 0.1.2): found and checked
//! when it is loaded, and read, filled in and completed like a call.
//!
//! A read, a `get` or a completion runs as a call does (DESIGN §4): a
//! fresh instance, the component's grants and limits, a read-only view of
//! the context, the call's time limit and cancellation. It returns no ops
//! and is not journaled. What it returns is checked before anyone sees
//! it: contents and messages as [`crate::spec::Shown`] blocks are (MIME
//! types against the bytes, URI schemes against the policy, at most
//! [`MAX_BLOCKS`](crate::sandbox::shown::MAX_BLOCKS) and `max_result_bytes` in all), completions at most
//! [`MAX_COMPLETIONS`] of at most [`MAX_COMPLETION_BYTES`] each.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::bindings::{prompts as guest_prompts, resources as guest_resources, show};
use super::call::{Armed, Run, take_reads};
use super::{CallError, Host, Kind, LoadError, LoadedComponent, Reads, ToolCall};
use crate::context::RunContext;
use crate::sandbox::CancelToken;
use crate::sandbox::shown::{Block, Body, ShownSoFar, scheme_allowed, uri_scheme};
use crate::spec::{
    MAX_DESCRIPTION_BYTES, MAX_OFFERS, Prompt, PromptArgument, PromptSpec, ResourceSpec, Role,
    Shown,
};

/// The most values one completion may offer (MCP's own bound).
pub const MAX_COMPLETIONS: usize = 100;

/// The longest completion value.
pub const MAX_COMPLETION_BYTES: usize = 1024;

/// The longest URI or template a component may offer or a client may ask
/// for, and the longest name.
const MAX_URI_BYTES: usize = 2048;
const MAX_NAME_BYTES: usize = 256;

/// The most arguments a prompt may declare, and the most bytes a client
/// may give in all of them.
const MAX_PROMPT_ARGUMENTS: usize = 32;
const MAX_ARGUMENT_BYTES: usize = 64 << 10;

/// A failed read, `get` or completion.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// No component offers the resource (or the one whose template matched
    /// says there is no such thing).
    #[error("no resource {uri:?}")]
    UnknownResource {
        /// The URI asked for (cut to 256 bytes).
        uri: String,
    },
    /// No component offers the prompt.
    #[error("no prompt {name:?}; the prompts are {available:?}")]
    UnknownPrompt {
        /// The name asked for (cut to 256 bytes).
        name: String,
        /// The prompts there are.
        available: Vec<String>,
    },
    /// The request does not fit what the component declared: an argument
    /// it does not have, a required one missing, too much text.
    #[error("{0}")]
    BadRequest(String),
    /// The component ran and said it could not: its message.
    #[error("{0}")]
    Failed(String),
    /// It did not run, or ran and broke a rule (trapped, timed out, went
    /// over a limit, returned what the host refuses).
    #[error(transparent)]
    Call(#[from] CallError),
}

/// What a component offers beside its tools, checked when it was loaded.
#[derive(Debug, Clone, Default)]
pub(crate) struct Offers {
    /// Fixed resources, in the component's order.
    pub(crate) resources: Vec<ResourceSpec>,
    /// Templates, in the component's order.
    pub(crate) templates: Vec<(ResourceSpec, Template)>,
    pub(crate) prompts: Vec<PromptSpec>,
    /// Resources not offered: their URI's scheme is not one the policy
    /// allows the component (`uri_schemes`).
    pub(crate) withheld: Vec<Withheld>,
}

/// A resource a component describes that is not offered, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Withheld {
    /// Its URI or template.
    pub uri: String,
    /// Why it is not offered.
    pub reason: String,
}

impl Offers {
    /// Every URI and template, and every prompt name, to check that no
    /// two components offer the same.
    pub(crate) fn names(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let uris = self
            .resources
            .iter()
            .chain(self.templates.iter().map(|(spec, _)| spec))
            .map(|spec| ("resource", spec.uri.as_str()));
        uris.chain(self.prompts.iter().map(|p| ("prompt", p.name.as_str())))
    }

    /// Checks what the component's `describe`s returned: each URI with a
    /// scheme, each template parsed, names unique within the component,
    /// sizes bounded (a component that breaks one of these is refused). A
    /// resource whose scheme is not one of `schemes` (the component's
    /// `uri_schemes`) is withheld, not offered, and the component loads:
    /// its tools do not depend on the operator allowing its resources.
    pub(crate) fn check(
        path: &Path,
        resources: Vec<guest_resources::ResourceSpec>,
        prompts: Vec<guest_prompts::PromptSpec>,
        schemes: &[String],
    ) -> Result<Self, LoadError> {
        let bad = |what: &'static str, name: &str, problem: String| LoadError::BadOffer {
            path: path.to_path_buf(),
            what,
            name: crate::text::truncate(name, 64),
            problem,
        };
        for (what, count) in [("resources", resources.len()), ("prompts", prompts.len())] {
            if count > MAX_OFFERS {
                return Err(LoadError::OffersTooMuch {
                    path: path.to_path_buf(),
                    problem: format!("describes {count} {what}; the limit is {MAX_OFFERS}"),
                });
            }
        }
        let mut offers = Offers::default();
        let mut seen = BTreeSet::new();
        for spec in resources {
            let uri = spec.uri.clone();
            let bad = |problem| bad("resource", &uri, problem);
            check_text("its name", &spec.name, MAX_NAME_BYTES, false).map_err(bad)?;
            check_text("its URI", &spec.uri, MAX_URI_BYTES, false).map_err(bad)?;
            check_about(&spec.title, &spec.description).map_err(bad)?;
            if !seen.insert(spec.uri.clone()) {
                return Err(bad("described twice by the same component".into()));
            }
            let scheme =
                uri_scheme(&spec.uri).ok_or_else(|| bad("its URI has no scheme".into()))?;
            if !scheme_allowed(scheme, schemes) {
                let reason = format!(
                    "its scheme {}: is not one the policy allows this component (uri_schemes)",
                    scheme.to_ascii_lowercase()
                );
                // `airlock inspect` lists it with why.
                tracing::debug!(path = %path.display(), resource = %spec.uri, "{reason}: not offered");
                offers.withheld.push(Withheld {
                    uri: spec.uri,
                    reason,
                });
                continue;
            }
            let spec = ResourceSpec {
                uri: spec.uri.clone(),
                name: spec.name,
                title: spec.title,
                description: spec.description,
                mime_type: spec.mime_type,
            };
            if spec.is_template() {
                let template = Template::parse(&uri).map_err(bad)?;
                offers.templates.push((spec, template));
            } else {
                offers.resources.push(spec);
            }
        }
        let mut seen = BTreeSet::new();
        for spec in prompts {
            let name = spec.name.clone();
            let bad = |problem| bad("prompt", &name, problem);
            check_text("its name", &spec.name, MAX_NAME_BYTES, false).map_err(bad)?;
            check_about(&spec.title, &spec.description).map_err(bad)?;
            if !seen.insert(spec.name.clone()) {
                return Err(bad("described twice by the same component".into()));
            }
            if spec.arguments.len() > MAX_PROMPT_ARGUMENTS {
                return Err(bad(format!(
                    "it has {} arguments; the limit is {MAX_PROMPT_ARGUMENTS}",
                    spec.arguments.len()
                )));
            }
            let mut names = BTreeSet::new();
            let mut arguments = Vec::with_capacity(spec.arguments.len());
            for argument in spec.arguments {
                check_text("an argument's name", &argument.name, MAX_NAME_BYTES, false)
                    .map_err(bad)?;
                if let Some(text) = &argument.description {
                    check_text(
                        "an argument's description",
                        text,
                        MAX_DESCRIPTION_BYTES,
                        true,
                    )
                    .map_err(bad)?;
                }
                if !names.insert(argument.name.clone()) {
                    return Err(bad(format!(
                        "the argument {:?} is declared twice",
                        crate::text::truncate(&argument.name, 64)
                    )));
                }
                arguments.push(PromptArgument {
                    name: argument.name,
                    description: argument.description,
                    required: argument.required,
                });
            }
            offers.prompts.push(PromptSpec {
                name: spec.name,
                title: spec.title,
                description: spec.description,
                arguments,
            });
        }
        Ok(offers)
    }
}

/// Refuses a title or description over [`MAX_DESCRIPTION_BYTES`].
fn check_about(title: &Option<String>, description: &Option<String>) -> Result<(), String> {
    for (field, text) in [("its title", title), ("its description", description)] {
        if let Some(text) = text {
            check_text(field, text, MAX_DESCRIPTION_BYTES, true)?;
        }
    }
    Ok(())
}

/// Refuses `text` (what `field` is) when empty (unless `may_be_empty`),
/// over `max` bytes, or holding a control character a list would print.
fn check_text(field: &str, text: &str, max: usize, may_be_empty: bool) -> Result<(), String> {
    if text.is_empty() && !may_be_empty {
        return Err(format!("{field} is empty"));
    }
    if text.len() > max {
        return Err(format!(
            "{field} is {} bytes; the limit is {max}",
            text.len()
        ));
    }
    if !may_be_empty && text.chars().any(char::is_control) {
        return Err(format!("{field} has a control character"));
    }
    Ok(())
}

/// A URI template of RFC 6570's level 1: literal text and `{name}`
/// variables, each standing for one or more characters other than `/`,
/// `?` and `#` (percent-decoded when matched).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Variable(String),
}

impl Template {
    /// Parses `uri`; why not, when it is not a level-1 template.
    pub(crate) fn parse(uri: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = uri;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Literal(rest[..open].to_owned()));
            } else if matches!(parts.last(), Some(Part::Variable(_))) {
                return Err("two variables with nothing between them cannot be told apart".into());
            }
            let close = rest[open..].find('}').ok_or("a `{` without its `}`")? + open;
            let name = &rest[open + 1..close];
            let plain = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
            if !plain {
                return Err(format!(
                    "the variable {{{}}} is not a plain name (only level-1 `{{name}}` variables)",
                    crate::text::truncate(name, 32)
                ));
            }
            if parts
                .iter()
                .any(|p| matches!(p, Part::Variable(v) if v == name))
            {
                return Err(format!("the variable {{{name}}} is there twice"));
            }
            parts.push(Part::Variable(name.to_owned()));
            rest = &rest[close + 1..];
        }
        if rest.contains('}') {
            return Err("a `}` without its `{`".into());
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_owned()));
        }
        Ok(Self { parts })
    }

    /// The variables' names, in order.
    pub(crate) fn variables(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|part| match part {
            Part::Variable(name) => Some(name.as_str()),
            Part::Literal(_) => None,
        })
    }

    /// Each variable and the text it matched in `uri`, when `uri` matches
    /// (within [`MATCH_STEPS`] tries: a template and a URI made to
    /// backtrack without end do not match).
    pub(crate) fn matches(&self, uri: &str) -> Option<Vec<(String, String)>> {
        let mut found = Vec::new();
        let mut steps = MATCH_STEPS;
        match_parts(&self.parts, uri, &mut found, &mut steps).then_some(found)
    }
}

/// The most tries one match may make.
const MATCH_STEPS: usize = 10_000;

/// Whether `parts` match all of `input`, pushing each variable's decoded
/// text onto `found`. A variable is followed by a literal or by the end
/// (never by another variable); where several ends fit, each is tried in
/// turn, at most `steps` tries in all.
fn match_parts(
    parts: &[Part],
    input: &str,
    found: &mut Vec<(String, String)>,
    steps: &mut usize,
) -> bool {
    if *steps == 0 {
        return false;
    }
    *steps -= 1;
    let Some((first, rest)) = parts.split_first() else {
        return input.is_empty();
    };
    match first {
        Part::Literal(literal) => input
            .strip_prefix(literal.as_str())
            .is_some_and(|after| match_parts(rest, after, found, steps)),
        Part::Variable(name) => {
            // The variable's text ends at the first character it may not
            // hold; the next literal must start at or before it.
            let limit = input.find(['/', '?', '#']).unwrap_or(input.len());
            let ends: Vec<usize> = match rest.first() {
                None => vec![input.len()],
                Some(Part::Literal(next)) => input[..limit.min(input.len())]
                    .char_indices()
                    .map(|(i, _)| i)
                    .chain(std::iter::once(limit))
                    .filter(|&i| i > 0 && input[i..].starts_with(next.as_str()))
                    .collect(),
                Some(Part::Variable(_)) => return false,
            };
            for end in ends {
                if end == 0 || end > limit {
                    continue;
                }
                let Some(value) = percent_decode(&input[..end]) else {
                    continue;
                };
                found.push((name.clone(), value));
                if match_parts(rest, &input[end..], found, steps) {
                    return true;
                }
                found.pop();
            }
            false
        }
    }
}

/// `text` with `%XX` escapes decoded; `None` when an escape is malformed
/// or the bytes are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_owned());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// What a component is asked to do, beside calling a tool.
pub(super) enum Serving<'a> {
    /// `resources.read`.
    Read(&'a guest_resources::Request),
    /// `prompts.get`.
    Get {
        name: &'a str,
        arguments: &'a [(String, String)],
    },
    /// `resources.complete` (`prompt` false) or `prompts.complete`.
    Complete {
        prompt: bool,
        owner: &'a str,
        argument: &'a str,
        value: &'a str,
        resolved: &'a [(String, String)],
    },
}

/// What it gave back.
pub(super) enum Served {
    Read(Result<Vec<guest_resources::Contents>, guest_resources::ReadError>),
    Get(Result<guest_prompts::Prompt, String>),
    Complete(Vec<String>),
}

/// A resource read: its contents, checked, and what it read of deps (to
/// tell a subscriber when that changes).
#[derive(Debug, Clone)]
pub struct ResourceRead {
    /// Each document, a [`Shown::Resource`].
    pub contents: Vec<Shown>,
    /// The deps keys it read.
    pub reads: Reads,
}

/// What a completion is for: a prompt's argument or a template's variable.
#[derive(Debug, Clone, Copy)]
pub enum Completing<'a> {
    /// The argument of the prompt with this name.
    Prompt(&'a str),
    /// The variable of the resource template with this URI.
    Template(&'a str),
}

impl Host {
    /// The fixed resources of every component, in load order.
    pub fn resources(&self) -> impl Iterator<Item = (&LoadedComponent, &ResourceSpec)> {
        self.components
            .iter()
            .flat_map(|c| c.offers.resources.iter().map(move |r| (&**c, r)))
    }

    /// The resource templates of every component, in load order.
    pub fn resource_templates(&self) -> impl Iterator<Item = (&LoadedComponent, &ResourceSpec)> {
        self.components
            .iter()
            .flat_map(|c| c.offers.templates.iter().map(move |(r, _)| (&**c, r)))
    }

    /// The prompts of every component, in load order.
    pub fn prompts(&self) -> impl Iterator<Item = (&LoadedComponent, &PromptSpec)> {
        self.components
            .iter()
            .flat_map(|c| c.offers.prompts.iter().map(move |p| (&**c, p)))
    }

    /// The component that offers `uri`, and what it is asked: a fixed URI
    /// first, then the first template (in load order) that matches.
    pub fn resource_for(&self, uri: &str) -> Option<&LoadedComponent> {
        self.resource_request(uri).map(|(c, _)| c)
    }

    fn resource_request(&self, uri: &str) -> Option<(&LoadedComponent, guest_resources::Request)> {
        if uri.len() > MAX_URI_BYTES {
            return None;
        }
        let request = |template: Option<String>, variables| guest_resources::Request {
            uri: uri.to_owned(),
            template,
            variables,
        };
        if let Some((component, _)) = self.resources().find(|(_, r)| r.uri == uri) {
            return Some((component, request(None, Vec::new())));
        }
        self.components.iter().find_map(|component| {
            component
                .offers
                .templates
                .iter()
                .find_map(|(spec, template)| {
                    let variables = template.matches(uri)?;
                    Some((&**component, request(Some(spec.uri.clone()), variables)))
                })
        })
    }

    /// The component that offers prompt `name`.
    pub fn prompt_for(&self, name: &str) -> Option<(&LoadedComponent, &PromptSpec)> {
        self.prompts().find(|(_, p)| p.name == name)
    }

    /// Reads the resource `uri` with `ctx` as its view, recording what it
    /// reads of deps.
    pub async fn read_resource(
        &self,
        ctx: &RunContext,
        uri: &str,
        cancel: &CancelToken,
    ) -> Result<ResourceRead, ServeError> {
        let unknown = || ServeError::UnknownResource {
            uri: crate::text::truncate(uri, 256),
        };
        let (component, request) = self.resource_request(uri).ok_or_else(unknown)?;
        let (served, reads) = self
            .serve(component, ctx, cancel, &Serving::Read(&request), true)
            .await?;
        let Served::Read(read) = served else {
            return Err(mismatch());
        };
        let contents = match read {
            Ok(contents) => contents,
            Err(guest_resources::ReadError::NotFound) => return Err(unknown()),
            Err(guest_resources::ReadError::Failed(message)) => {
                return Err(ServeError::Failed(super::call::bounded_message(message)));
            }
        };
        let mut shown = ShownSoFar::new(component.limits.max_result_bytes);
        let misused = |why: String| ServeError::Call(CallError::InvalidResult(why));
        for item in contents {
            let body = match item.body {
                show::ResourceBody::Text(text) => Body::Text(text),
                show::ResourceBody::Blob(data) => Body::Blob(data),
            };
            let block = Block::Embedded {
                uri: item.uri,
                mime_type: item.mime_type,
                body,
            };
            shown
                .push(block, &component.grants.uri_schemes)
                .map_err(misused)?;
        }
        Ok(ResourceRead {
            contents: shown.take(),
            reads,
        })
    }

    /// The prompt `name` filled in with `arguments` (checked against what
    /// it declares before it runs), with `ctx` as its view.
    pub async fn get_prompt(
        &self,
        ctx: &RunContext,
        name: &str,
        arguments: &BTreeMap<String, String>,
        cancel: &CancelToken,
    ) -> Result<Prompt, ServeError> {
        let (component, spec) = self
            .prompt_for(name)
            .ok_or_else(|| ServeError::UnknownPrompt {
                name: crate::text::truncate(name, 256),
                available: self.prompts().map(|(_, p)| p.name.clone()).collect(),
            })?;
        check_arguments(spec, arguments)?;
        let arguments: Vec<(String, String)> = arguments
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let serving = Serving::Get {
            name,
            arguments: &arguments,
        };
        let (served, _) = self.serve(component, ctx, cancel, &serving, false).await?;
        let Served::Get(got) = served else {
            return Err(mismatch());
        };
        let prompt = got.map_err(|m| ServeError::Failed(super::call::bounded_message(m)))?;
        let mut shown = ShownSoFar::new(component.limits.max_result_bytes);
        let misused = |why: String| ServeError::Call(CallError::InvalidResult(why));
        let mut roles = Vec::with_capacity(prompt.messages.len());
        for message in prompt.messages {
            roles.push(match message.speaker {
                super::bindings::ask::Speaker::User => Role::User,
                super::bindings::ask::Speaker::Assistant => Role::Assistant,
            });
            shown
                .push(Block::from(message.content), &component.grants.uri_schemes)
                .map_err(misused)?;
        }
        if let Some(description) = &prompt.description {
            check_text("the description", description, MAX_DESCRIPTION_BYTES, true)
                .map_err(misused)?;
        }
        Ok(Prompt {
            description: prompt.description,
            messages: roles.into_iter().zip(shown.take()).collect(),
        })
    }

    /// Values for `argument` of what `completing` names that a person
    /// typing `value` may mean; `resolved` holds the arguments given so far.
    /// Nothing (not an error) for a prompt or template whose component
    /// does not complete, or an argument it does not have.
    pub async fn complete(
        &self,
        ctx: &RunContext,
        completing: Completing<'_>,
        argument: &str,
        value: &str,
        resolved: &BTreeMap<String, String>,
        cancel: &CancelToken,
    ) -> Result<Vec<String>, ServeError> {
        let (component, prompt, owner) = match completing {
            Completing::Prompt(name) => {
                let (component, spec) =
                    self.prompt_for(name)
                        .ok_or_else(|| ServeError::UnknownPrompt {
                            name: crate::text::truncate(name, 256),
                            available: self.prompts().map(|(_, p)| p.name.clone()).collect(),
                        })?;
                if !spec.arguments.iter().any(|a| a.name == argument) {
                    return Ok(Vec::new());
                }
                (component, true, name)
            }
            Completing::Template(uri) => {
                let (component, template) = self
                    .components
                    .iter()
                    .find_map(|c| {
                        c.offers
                            .templates
                            .iter()
                            .find(|(spec, _)| spec.uri == uri)
                            .map(|(_, t)| (&**c, t))
                    })
                    .ok_or_else(|| ServeError::UnknownResource {
                        uri: crate::text::truncate(uri, 256),
                    })?;
                if !template.variables().any(|v| v == argument) {
                    return Ok(Vec::new());
                }
                (component, false, uri)
            }
        };
        let given = value.len()
            + resolved
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
        if given > MAX_ARGUMENT_BYTES {
            return Err(ServeError::BadRequest(format!(
                "the completion's arguments are {given} bytes; the limit is {MAX_ARGUMENT_BYTES}"
            )));
        }
        let offers_it = if prompt {
            component.exports_prompts()
        } else {
            component.exports_resources()
        };
        if !offers_it {
            return Ok(Vec::new());
        }
        let resolved: Vec<(String, String)> = resolved
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let serving = Serving::Complete {
            prompt,
            owner,
            argument,
            value,
            resolved: &resolved,
        };
        let (served, _) = self.serve(component, ctx, cancel, &serving, false).await?;
        let Served::Complete(values) = served else {
            return Err(mismatch());
        };
        let refused = |why: String| ServeError::Call(CallError::InvalidResult(why));
        if values.len() > MAX_COMPLETIONS {
            return Err(refused(format!(
                "the component offered {} completions; the limit is {MAX_COMPLETIONS}",
                values.len()
            )));
        }
        if let Some(long) = values.iter().find(|v| v.len() > MAX_COMPLETION_BYTES) {
            return Err(refused(format!(
                "the component offered a completion of {} bytes; the limit is {MAX_COMPLETION_BYTES}",
                long.len()
            )));
        }
        Ok(values)
    }

    /// Runs `serving` on a fresh instance of `component` with `ctx` as its
    /// view, as a call of it would run.
    async fn serve(
        &self,
        component: &LoadedComponent,
        ctx: &RunContext,
        cancel: &CancelToken,
        serving: &Serving<'_>,
        record_reads: bool,
    ) -> Result<(Served, Reads), CallError> {
        let (id, what) = match serving {
            Serving::Read(_) => ("resources/read", "read"),
            Serving::Get { .. } => ("prompts/get", "get"),
            Serving::Complete { .. } => ("completion/complete", "complete"),
        };
        // What the view says of the call: the request's method as its id.
        let call = ToolCall {
            id: id.to_owned(),
            name: what.to_owned(),
            arguments: String::new(),
            retry: 0,
        };
        if !matches!(component.kind, Kind::Airlock(_)) {
            return Err(CallError::Busy(
                "a plain component offers no resources or prompts".into(),
            ));
        }
        let span = tracing::debug_span!("serve", what = %call.id);
        let run = Run {
            host: self,
            component,
            ctx,
            call: &call,
            cancel,
            span: &span,
        };
        run.serve(serving, record_reads).await
    }
}

impl Run<'_> {
    /// An Airlock component's read, prompt or completion, run as a call
    /// of it is: a fresh instance, the export's function with the view,
    /// bounded by the call's deadline and cancellation. What the guest
    /// logged or printed is dropped (nothing records it).
    async fn serve(
        self,
        serving: &Serving<'_>,
        record_reads: bool,
    ) -> Result<(Served, Reads), CallError> {
        let _running = self.host.sandbox.admission().running();
        let Armed {
            mut store,
            prepared,
            view,
            view_rep,
            deadline,
        } = self.armed(record_reads).await.map_err(|f| f.error)?;
        let ahead = &self.component.ahead;
        let run = async {
            let instance = ahead.instance(&mut store, prepared).await?;
            let exports = ahead.exports()?;
            let absent = || wasmtime::Error::msg("the component does not export this interface");
            Ok(match serving {
                Serving::Read(request) => {
                    let resources = exports
                        .resources(&mut store, &instance)?
                        .ok_or_else(absent)?;
                    Served::Read(resources.call_read(&mut store, view, request).await?)
                }
                Serving::Get { name, arguments } => {
                    let prompts = exports.prompts(&mut store, &instance)?.ok_or_else(absent)?;
                    Served::Get(prompts.call_get(&mut store, view, name, arguments).await?)
                }
                Serving::Complete {
                    prompt: true,
                    owner,
                    argument,
                    value,
                    resolved,
                } => {
                    let prompts = exports.prompts(&mut store, &instance)?.ok_or_else(absent)?;
                    Served::Complete(
                        prompts
                            .call_complete(&mut store, view, owner, argument, value, resolved)
                            .await?,
                    )
                }
                Serving::Complete {
                    prompt: false,
                    owner,
                    argument,
                    value,
                    resolved,
                } => {
                    let resources = exports
                        .resources(&mut store, &instance)?
                        .ok_or_else(absent)?;
                    Served::Complete(
                        resources
                            .call_complete(&mut store, view, owner, argument, value, resolved)
                            .await?,
                    )
                }
            })
        };
        let ran = self.bounded(deadline, run).await;
        let returned = self.ended(ran, &store);
        drop(store.data_mut().take_output());
        let reads = take_reads(&mut store, view_rep, record_reads);
        self.retire(store);
        returned.map(|served| (served, reads))
    }
}

/// Refuses arguments the prompt does not declare, a required one missing,
/// and more than [`MAX_ARGUMENT_BYTES`] in all.
fn check_arguments(
    spec: &PromptSpec,
    arguments: &BTreeMap<String, String>,
) -> Result<(), ServeError> {
    let bad = |problem: String| {
        Err(ServeError::BadRequest(format!(
            "prompt {:?}: {problem}",
            spec.name
        )))
    };
    if let Some(unknown) = arguments
        .keys()
        .find(|name| !spec.arguments.iter().any(|a| &a.name == *name))
    {
        let declared: Vec<&str> = spec.arguments.iter().map(|a| a.name.as_str()).collect();
        return bad(format!(
            "it has no argument {:?}; its arguments are {declared:?}",
            crate::text::truncate(unknown, 64)
        ));
    }
    if let Some(missing) = spec
        .arguments
        .iter()
        .find(|a| a.required && !arguments.contains_key(&a.name))
    {
        return bad(format!("the argument {:?} is required", missing.name));
    }
    let total: usize = arguments.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_ARGUMENT_BYTES {
        return bad(format!(
            "its arguments are {total} bytes; the limit is {MAX_ARGUMENT_BYTES}"
        ));
    }
    Ok(())
}

/// A served request whose answer is of another kind (cannot happen: each
/// request is answered by its own function).
fn mismatch() -> ServeError {
    ServeError::Call(CallError::Busy(
        "the component answered another request".into(),
    ))
}

impl From<show::Block> for Block {
    fn from(block: show::Block) -> Self {
        match block {
            show::Block::Text(text) => Block::Text(text),
            show::Block::Image(media) => Block::Image(media.data, media.mime_type),
            show::Block::Audio(media) => Block::Audio(media.data, media.mime_type),
            show::Block::Link(link) => Block::Link {
                uri: link.uri,
                name: link.name,
                description: link.description,
                mime_type: link.mime_type,
            },
            show::Block::Embedded(resource) => Block::Embedded {
                uri: resource.uri,
                mime_type: resource.mime_type,
                body: match resource.body {
                    show::ResourceBody::Text(text) => Body::Text(text),
                    show::ResourceBody::Blob(data) => Body::Blob(data),
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matched(template: &str, uri: &str) -> Option<Vec<(String, String)>> {
        Template::parse(template).unwrap().matches(uri)
    }

    #[test]
    fn templates_match_level_one_variables() {
        let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        assert_eq!(
            matched("test://template/{id}/data", "test://template/123/data"),
            Some(vec![pair("id", "123")])
        );
        assert_eq!(
            matched("test://template/{id}/data", "test://template//data"),
            None
        );
        assert_eq!(
            matched("test://template/{id}/data", "test://template/1/2/data"),
            None
        );
        assert_eq!(
            matched("notes://{day}.{part}", "notes://2026-11-28.am"),
            Some(vec![pair("day", "2026-11-28"), pair("part", "am")])
        );
        assert_eq!(
            matched("notes://{name}", "notes://a%20b"),
            Some(vec![pair("name", "a b")])
        );
        assert_eq!(matched("notes://{name}", "notes://%ff"), None);
        assert_eq!(matched("notes://{name}", "notes://"), None);
        assert_eq!(matched("notes://{name}", "other://x"), None);
    }

    #[test]
    fn a_match_made_to_backtrack_gives_up() {
        let template = Template::parse("x://{a}.{b}.{c}.{d}.{e}.{f}!").unwrap();
        // Without the bound this would try some 2000^5 splits.
        let uri = format!("x://{}", ".".repeat(2000));
        assert_eq!(template.matches(&uri), None);
        assert!(
            Template::parse("x://{a}.{b}")
                .unwrap()
                .matches("x://1.2")
                .is_some()
        );
    }

    #[test]
    fn templates_beyond_level_one_are_refused() {
        for bad in [
            "x://{a}{b}",
            "x://{+path}",
            "x://{a",
            "x://a}",
            "x://{}",
            "x://{a}/{a}",
        ] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
        let vars: Vec<String> = Template::parse("x://{a}/b/{c}")
            .unwrap()
            .variables()
            .map(str::to_owned)
            .collect();
        assert_eq!(vars, ["a", "c"]);
    }
}
