//! Resources, templates, prompts and completions over MCP: what the
//! components offer beside their tools ([`crate::tools::ServeError`] has
//! the rules), and the session's own deps resource ([`DEPS_URI`]).
//!
//! Each is served per MCP session, as a call is: on the session the
//! request works on (its `_meta`'s, or the server's), with that session's
//! context as the component's view, within the caller's scopes (a
//! component whose tools the token may not use offers it nothing) and its
//! per-user limits. A subscription remembers which deps keys its resource
//! read; a call on the server's session that changes one of them sends
//! `notifications/resources/updated`.

use std::collections::BTreeMap;

use rmcp::model::{
    CompleteRequestParams, CompleteResult, CompletionInfo, GetPromptResult, Prompt, PromptArgument,
    PromptMessage, Reference, Resource, ResourceContents, ResourceTemplate, Role as Speaker,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData, RoleServer};
use serde_json::Value;

use super::{DEPS_URI, McpServer, Working, caller_of, content_block, resource_contents, watch};
use crate::context::RunContext;
use crate::sandbox::CancelToken;
use crate::spec::{Role, Shown};
use crate::tools::{Completing, Host, LoadedComponent, Reads, ServeError};

/// What the server's session's subscribers asked to hear about: each URI
/// and what its last read looked at.
#[derive(Debug, Default)]
pub(super) struct Subscriptions {
    uris: std::sync::Mutex<BTreeMap<String, Reads>>,
    /// Whom to tell (the client that subscribed).
    peer: std::sync::OnceLock<Peer<RoleServer>>,
}

impl Subscriptions {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Reads>> {
        self.uris
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Tells the client about each subscribed resource whose last read
    /// looked at a key of `written`.
    pub(super) async fn changed(&self, written: &std::collections::BTreeSet<String>) {
        if written.is_empty() {
            return;
        }
        let Some(peer) = self.peer.get() else {
            return;
        };
        let touched: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, reads)| reads.depends_on(written))
            .map(|(uri, _)| uri.clone())
            .collect();
        for uri in touched {
            let note = rmcp::model::ResourceUpdatedNotificationParam::new(uri);
            if peer.notify_resource_updated(note).await.is_err() {
                tracing::debug!("cannot tell a client that a resource changed");
            }
        }
    }
}

/// Whether `caller` may use what `component` offers (its tools' scopes).
fn may_use(component: &LoadedComponent, context: &RequestContext<RoleServer>) -> bool {
    caller_of(context).is_none_or(|caller| caller.has_scopes(component.scopes()))
}

fn served_error(error: ServeError) -> ErrorData {
    match error {
        ServeError::UnknownResource { .. } => {
            ErrorData::resource_not_found(error.to_string(), None)
        }
        ServeError::UnknownPrompt { .. } | ServeError::BadRequest(_) => {
            ErrorData::invalid_params(error.to_string(), None)
        }
        _ => ErrorData::internal_error(error.to_string(), None),
    }
}

impl McpServer {
    /// The session's deps resource and the components' fixed resources
    /// the caller may use.
    pub(super) fn resource_list(&self, context: &RequestContext<RoleServer>) -> Vec<Resource> {
        let host = self.tools.current();
        let deps = Resource::new(DEPS_URI, "deps")
            .with_description(
                "The tools' shared state in this session (hidden and secret-looking keys removed)",
            )
            .with_mime_type("application/json");
        let offered = host
            .resources()
            .filter(|(component, _)| may_use(component, context))
            .map(|(_, spec)| {
                let mut resource = Resource::new(spec.uri.clone(), spec.name.clone());
                if let Some(title) = &spec.title {
                    resource = resource.with_title(title.clone());
                }
                if let Some(description) = &spec.description {
                    resource = resource.with_description(description.clone());
                }
                if let Some(mime_type) = &spec.mime_type {
                    resource = resource.with_mime_type(mime_type.clone());
                }
                resource
            });
        std::iter::once(deps).chain(offered).collect()
    }

    /// The components' resource templates the caller may use.
    pub(super) fn template_list(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Vec<ResourceTemplate> {
        let host = self.tools.current();
        host.resource_templates()
            .filter(|(component, _)| may_use(component, context))
            .map(|(_, spec)| {
                let mut template = ResourceTemplate::new(spec.uri.clone(), spec.name.clone());
                if let Some(title) = &spec.title {
                    template = template.with_title(title.clone());
                }
                if let Some(description) = &spec.description {
                    template = template.with_description(description.clone());
                }
                if let Some(mime_type) = &spec.mime_type {
                    template = template.with_mime_type(mime_type.clone());
                }
                template
            })
            .collect()
    }

    /// The components' prompts the caller may use.
    pub(super) fn prompt_list(&self, context: &RequestContext<RoleServer>) -> Vec<Prompt> {
        let host = self.tools.current();
        host.prompts()
            .filter(|(component, _)| may_use(component, context))
            .map(|(_, spec)| {
                let arguments = spec
                    .arguments
                    .iter()
                    .map(|a| {
                        let mut argument =
                            PromptArgument::new(a.name.clone()).with_required(a.required);
                        if let Some(description) = &a.description {
                            argument = argument.with_description(description.clone());
                        }
                        argument
                    })
                    .collect();
                let mut prompt =
                    Prompt::new(spec.name.clone(), spec.description.clone(), Some(arguments));
                if let Some(title) = &spec.title {
                    prompt = prompt.with_title(title.clone());
                }
                prompt
            })
            .collect()
    }

    /// The context of the session `context`'s request works on, as it is
    /// now (the session is not held while a component reads it), and the
    /// session to release after.
    async fn context_of(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<(RunContext, Working), ErrorData> {
        let session = self
            .session_for(&context.meta, caller_of(context))
            .await
            .map_err(|message| ErrorData::internal_error(message, None))?;
        let ctx = session.handle().lock().await.context().clone();
        Ok((ctx, session))
    }

    /// Runs `work` (a component's read, prompt or completion) on the
    /// request's session within the caller's limits, stopped when the
    /// client cancels the request.
    async fn serving<T>(
        &self,
        context: &RequestContext<RoleServer>,
        work: impl AsyncFnOnce(&Host, &RunContext, &CancelToken) -> Result<T, ServeError>,
    ) -> Result<T, ErrorData> {
        let _permit = self
            .permit(caller_of(context))
            .map_err(|message| ErrorData::invalid_request(message, None))?;
        let (ctx, session) = self.context_of(context).await?;
        let host = self.tools.current();
        let cancel = CancelToken::new();
        let served = async { work(&host, &ctx, &cancel).await };
        let result = tokio::select! {
            biased;
            result = served => result,
            never = watch(context, cancel.clone()) => match never {},
        };
        session.done().await;
        result.map_err(served_error)
    }

    /// Reads `uri`: the session's deps, or a component's resource. When
    /// the client subscribed to it, what this read looked at is what a
    /// change is measured against from now on.
    pub(super) async fn read(
        &self,
        uri: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<Vec<ResourceContents>, ErrorData> {
        if uri == DEPS_URI {
            let session = self
                .session_for(&context.meta, caller_of(context))
                .await
                .map_err(|message| ErrorData::internal_error(message, None))?;
            let host = self.tools.current();
            let deps = Value::Object(
                session
                    .handle()
                    .lock()
                    .await
                    .stored_deps(host.context_rules()),
            );
            session.done().await;
            return Ok(vec![
                ResourceContents::text(deps.to_string(), DEPS_URI)
                    .with_mime_type("application/json"),
            ]);
        }
        self.offered_to(
            context,
            |host| host.resource_for(uri),
            || ServeError::UnknownResource {
                uri: crate::text::truncate(uri, 256),
            },
        )?;
        let read = self
            .serving(context, async |host, ctx, cancel| {
                host.read_resource(ctx, uri, cancel).await
            })
            .await?;
        let mut uris = self.subscriptions.lock();
        if let Some(reads) = uris.get_mut(uri) {
            *reads = read.reads;
        }
        drop(uris);
        Ok(read.contents.into_iter().filter_map(contents).collect())
    }

    /// Subscribes the client to `uri` (reading it once, to learn what it
    /// looks at: a URI nothing offers is refused).
    pub(super) async fn subscribe(
        &self,
        uri: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let _ = self.subscriptions.peer.set(context.peer.clone());
        let reads = if uri == DEPS_URI {
            Reads::everything()
        } else {
            self.offered_to(
                context,
                |host| host.resource_for(uri),
                || ServeError::UnknownResource {
                    uri: crate::text::truncate(uri, 256),
                },
            )?;
            self.serving(context, async |host, ctx, cancel| {
                host.read_resource(ctx, uri, cancel).await
            })
            .await?
            .reads
        };
        self.subscriptions.lock().insert(uri.to_owned(), reads);
        Ok(())
    }

    /// Forgets the client's subscription to `uri` (none is not an error).
    pub(super) fn unsubscribe(&self, uri: &str) {
        self.subscriptions.lock().remove(uri);
    }

    /// The prompt `name` filled in with `arguments` (strings).
    pub(super) async fn prompt(
        &self,
        name: &str,
        arguments: Option<rmcp::model::JsonObject>,
        context: &RequestContext<RoleServer>,
    ) -> Result<GetPromptResult, ErrorData> {
        self.offered_to(
            context,
            |host| host.prompt_for(name).map(|(c, _)| c),
            || ServeError::UnknownPrompt {
                name: crate::text::truncate(name, 256),
                available: self
                    .prompt_list(context)
                    .into_iter()
                    .map(|p| p.name)
                    .collect(),
            },
        )?;
        let mut given = BTreeMap::new();
        for (key, value) in arguments.unwrap_or_default() {
            let Value::String(value) = value else {
                return Err(ErrorData::invalid_params(
                    format!("prompt {name:?}: the argument {key:?} must be a string"),
                    None,
                ));
            };
            given.insert(key, value);
        }
        let prompt = self
            .serving(context, async |host, ctx, cancel| {
                host.get_prompt(ctx, name, &given, cancel).await
            })
            .await?;
        let messages = prompt
            .messages
            .into_iter()
            .map(|(role, shown)| {
                let role = match role {
                    Role::User => Speaker::User,
                    Role::Assistant => Speaker::Assistant,
                };
                PromptMessage::new(role, content_block(shown))
            })
            .collect();
        let mut result = GetPromptResult::new(messages);
        result.description = prompt.description;
        Ok(result)
    }

    /// Values for a prompt's argument or a template's variable.
    pub(super) async fn completion(
        &self,
        request: CompleteRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let completing = match &request.r#ref {
            Reference::Prompt(prompt) => Completing::Prompt(&prompt.name),
            Reference::Resource(template) => Completing::Template(&template.uri),
            _ => {
                return Err(ErrorData::invalid_params(
                    "the completion's ref is neither ref/prompt nor ref/resource",
                    None,
                ));
            }
        };
        let offered = self.offered_to(
            context,
            |host| completed_by(host, completing),
            || ServeError::BadRequest(String::new()),
        );
        if offered.is_err() {
            return Err(ErrorData::invalid_params(
                "the completion names no prompt or resource template of this server",
                None,
            ));
        }
        let resolved: BTreeMap<String, String> = request
            .context
            .and_then(|c| c.arguments)
            .unwrap_or_default()
            .into_iter()
            .collect();
        let argument = &request.argument;
        let values = self
            .serving(context, async |host, ctx, cancel| {
                host.complete(
                    ctx,
                    completing,
                    &argument.name,
                    &argument.value,
                    &resolved,
                    cancel,
                )
                .await
            })
            .await?;
        let mut info = CompletionInfo::default();
        info.total = u32::try_from(values.len()).ok();
        info.has_more = Some(false);
        info.values = values;
        Ok(CompleteResult::new(info))
    }

    /// Refuses with `unknown` what no component offers to the caller:
    /// `owner`'s answer when there is none, or its component's scopes are
    /// not the caller's (as if it did not exist).
    fn offered_to(
        &self,
        context: &RequestContext<RoleServer>,
        owner: impl Fn(&Host) -> Option<&LoadedComponent>,
        unknown: impl FnOnce() -> ServeError,
    ) -> Result<(), ErrorData> {
        let host = self.tools.current();
        match owner(&host) {
            Some(component) if may_use(component, context) => Ok(()),
            _ => Err(served_error(unknown())),
        }
    }
}

/// The component whose prompt or template `completing` names.
fn completed_by<'h>(host: &'h Host, completing: Completing<'_>) -> Option<&'h LoadedComponent> {
    match completing {
        Completing::Prompt(name) => host.prompt_for(name).map(|(c, _)| c),
        Completing::Template(uri) => host
            .resource_templates()
            .find(|(_, spec)| spec.uri == uri)
            .map(|(c, _)| c),
    }
}

/// A checked resource's contents as MCP carries them.
fn contents(shown: Shown) -> Option<ResourceContents> {
    match shown {
        Shown::Resource {
            uri,
            mime_type,
            text,
            blob,
        } => Some(resource_contents(uri, mime_type, text, blob)),
        _ => None,
    }
}
