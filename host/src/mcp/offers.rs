//! Resources, templates, prompts and completions over MCP: what the
//! components offer beside their tools ([`crate::tools::ServeError`] has
//! the rules), and the session's own deps resource ([`DEPS_URI`]).
//!
//! Each is served per MCP session, as a call is: on the session the
//! request works on (its `_meta`'s, or the server's), with that session's
//! context as the component's view, within the caller's scopes (a
//! component whose tools the token may not use offers it nothing) and its
//! per-user limits. A subscription (`resources/subscribe`, or a
//! 2026-07-28 `subscriptions/listen`) remembers which deps keys its
//! resource read; a call on that Airlock session, over any MCP session of
//! this process, that changes one of them sends
//! `notifications/resources/updated`.

use std::collections::{BTreeMap, BTreeSet};

use rmcp::model::ServerNotification;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, CompletionInfo, GetPromptResult, Prompt, PromptArgument,
    PromptMessage, Reference, Resource, ResourceContents, ResourceTemplate, Role as Speaker,
};
use rmcp::service::{Peer, RequestContext, SubscriptionContext, SubscriptionSink};
use rmcp::{ErrorData, RoleServer};
use serde_json::Value;

use super::auth::Caller;
use super::{DEPS_URI, McpServer, Working, caller_of, content_block, resource_contents, watch};
use crate::context::RunContext;
use crate::sandbox::CancelToken;
use crate::spec::{Role, Shown};
use crate::tools::{Completing, Host, LoadedComponent, Reads, ResourceRead, ServeError};

/// Who waits to hear that a resource changed, across the server's MCP
/// sessions: each watch names an Airlock session (its user and id), a
/// URI, what the URI's last read looked at, and whom to tell. A call on
/// that session, over any MCP session of this process, that writes a key
/// the read looked at tells them (`notifications/resources/updated`).
#[derive(Debug, Default)]
pub(super) struct Watchers {
    watches: std::sync::Mutex<Vec<Watch>>,
    /// The next listener's number.
    next: std::sync::atomic::AtomicU64,
}

/// The most resources one client (or one listen) may watch.
pub(super) const MAX_WATCHES: usize = 256;

/// An Airlock session, as watches name it: its user and its id.
pub(super) type SessionKey = (Option<String>, String);

#[derive(Debug)]
struct Watch {
    session: SessionKey,
    uri: String,
    reads: Reads,
    /// Who asked: an MCP server's number (`resources/subscribe`), or a
    /// listen request's (`subscriptions/listen`).
    by: u64,
    to: Notifier,
}

/// How a watcher is told.
#[derive(Debug, Clone)]
pub(super) enum Notifier {
    /// A client of the 2025 revisions, on its session's own stream.
    Peer(Peer<RoleServer>),
    /// A `subscriptions/listen` request's stream (2026-07-28).
    Listen(SubscriptionSink),
}

impl Watchers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Watch>> {
        self.watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether anyone watches anything.
    pub(super) fn any(&self) -> bool {
        !self.lock().is_empty()
    }

    /// A number for a new listener.
    pub(super) fn number(&self) -> u64 {
        self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// `by` watches `uri` of `session`, whose read looked at `reads`
    /// (replacing its earlier watch of the same); refused past
    /// [`MAX_WATCHES`] of its own.
    pub(super) fn watch(
        &self,
        session: SessionKey,
        uri: &str,
        reads: Reads,
        by: u64,
        to: Notifier,
    ) -> Result<(), ErrorData> {
        let mut watches = self.lock();
        watches.retain(|w| !(w.by == by && w.uri == uri));
        if watches.iter().filter(|w| w.by == by).count() >= MAX_WATCHES {
            return Err(ErrorData::invalid_request(
                format!("a client may watch at most {MAX_WATCHES} resources"),
                None,
            ));
        }
        watches.push(Watch {
            session,
            uri: uri.to_owned(),
            reads,
            by,
            to,
        });
        Ok(())
    }

    /// `by` read `uri` of `session` again: what it looked at now.
    pub(super) fn read_again(&self, session: &SessionKey, uri: &str, reads: &Reads) {
        for watch in self.lock().iter_mut() {
            if watch.uri == uri && &watch.session == session {
                watch.reads = reads.clone();
            }
        }
    }

    /// `by` stops watching `uri` (every URI, without one).
    pub(super) fn forget(&self, by: u64, uri: Option<&str>) {
        self.lock()
            .retain(|w| !(w.by == by && uri.is_none_or(|uri| w.uri == uri)));
    }

    /// Tells whoever watches a resource of `session` whose last read
    /// looked at a key of `written`; forgets those gone.
    pub(super) async fn changed(&self, session: &SessionKey, written: &BTreeSet<String>) {
        if written.is_empty() {
            return;
        }
        let touched: Vec<(u64, String, Notifier)> = self
            .lock()
            .iter()
            .filter(|w| &w.session == session && w.reads.depends_on(written))
            .map(|w| (w.by, w.uri.clone(), w.to.clone()))
            .collect();
        for (by, uri, to) in touched {
            let note = rmcp::model::ResourceUpdatedNotificationParam::new(uri.clone());
            let sent = match to {
                Notifier::Peer(peer) => peer.notify_resource_updated(note).await.is_ok(),
                Notifier::Listen(sink) => sink
                    .send(ServerNotification::ResourceUpdatedNotification(
                        rmcp::model::Notification::new(note),
                    ))
                    .await
                    .is_ok(),
            };
            if !sent {
                tracing::debug!("cannot tell a client that a resource changed");
                self.forget(by, Some(&uri));
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
        let (read, session) = self.read_offered(uri, context).await?;
        self.tools.watchers.read_again(&session, uri, &read.reads);
        Ok(read.contents.into_iter().filter_map(contents).collect())
    }

    /// Reads a component's resource `uri` for `context`'s caller (one
    /// nothing offers them is unknown), and names the session it read.
    async fn read_offered(
        &self,
        uri: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(ResourceRead, SessionKey), ErrorData> {
        self.offered_to(
            context,
            |host| host.resource_for(uri),
            || ServeError::UnknownResource {
                uri: crate::text::truncate(uri, 256),
            },
        )?;
        self.serving(context, async |host, ctx, cancel| {
            let read = host.read_resource(ctx, uri, cancel).await?;
            Ok((read, session_key(ctx)))
        })
        .await
    }

    /// What a watch of `uri` for `context` starts from: the session it is
    /// of, and what a read of it looks at (every key, for the deps).
    /// The session a request of `meta` works on, as watches name it,
    /// without opening it: the one `meta` names (the caller's), or the
    /// server's own once it has one.
    fn session_named(
        &self,
        meta: &rmcp::model::RequestMetaObject,
        caller: Option<&Caller>,
    ) -> Option<SessionKey> {
        match meta.get(super::SESSION_META_KEY) {
            Some(named) => Some((self.user(caller), named.as_str()?.to_owned())),
            None => self
                .session
                .get()
                .map(|held| (held.user.clone(), held.id.clone())),
        }
    }

    async fn first_read(
        &self,
        uri: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(SessionKey, Reads), ErrorData> {
        if uri == DEPS_URI {
            let session = self
                .session_for(&context.meta, caller_of(context))
                .await
                .map_err(|message| ErrorData::internal_error(message, None))?;
            let key = session_key(session.handle().lock().await.context());
            session.done().await;
            return Ok((key, Reads::everything()));
        }
        let (read, key) = self.read_offered(uri, context).await?;
        Ok((key, read.reads))
    }

    /// Subscribes the client to `uri` (reading it once, to learn what it
    /// looks at: a URI nothing offers is refused).
    pub(super) async fn subscribe(
        &self,
        uri: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (session, reads) = self.first_read(uri, context).await?;
        let to = Notifier::Peer(context.peer.clone());
        self.tools
            .watchers
            .watch(session, uri, reads, self.number, to)
    }

    /// Forgets the client's subscription to `uri` (none is not an error).
    pub(super) fn unsubscribe(&self, uri: &str) {
        self.tools.watchers.forget(self.number, Some(uri));
    }

    /// Serves one `subscriptions/listen` (2026-07-28) until the client
    /// ends it: what it accepted of list changes goes to it as the tools
    /// are reloaded, and each resource it named as a call changes what the
    /// resource's read looked at (a URI nothing offers the caller is
    /// refused, before anything is heard).
    pub(super) async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let by = self.tools.watchers.number();
        let sink = context.sink().clone();
        let uris = context
            .accepted()
            .resource_subscriptions
            .clone()
            .unwrap_or_default();
        if uris.len() > MAX_WATCHES {
            return Err(ErrorData::invalid_request(
                format!("a listen may name at most {MAX_WATCHES} resources"),
                None,
            ));
        }
        // The client has the acknowledgment already (the SDK sends it
        // before this runs), and each first read runs its component: until
        // it has, each resource is watched as reading all of the session,
        // so that a call made as soon as the client is told is heard.
        let request = context.request_context();
        if let Some(session) = self.session_named(&request.meta, caller_of(request)) {
            for uri in &uris {
                let to = Notifier::Listen(sink.clone());
                let all = Reads::everything();
                if let Err(refused) = self.tools.watchers.watch(session.clone(), uri, all, by, to) {
                    self.tools.watchers.forget(by, None);
                    return Err(refused);
                }
            }
        }
        let mut watched = Vec::with_capacity(uris.len());
        for uri in uris {
            match self.first_read(&uri, context.request_context()).await {
                Ok(read) => watched.push((read, uri)),
                Err(refused) => {
                    self.tools.watchers.forget(by, None);
                    return Err(refused);
                }
            }
        }
        // Each watch narrowed to what its resource's read looked at.
        for ((session, reads), uri) in watched {
            let to = Notifier::Listen(sink.clone());
            if let Err(refused) = self.tools.watchers.watch(session, &uri, reads, by, to) {
                self.tools.watchers.forget(by, None);
                return Err(refused);
            }
        }
        self.tools.listen(by, sink).await;
        context.cancelled().await;
        self.tools.watchers.forget(by, None);
        self.tools.unlisten(by).await;
        Ok(())
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
                    format!(
                        "prompt {name:?}: the argument {:?} must be a string",
                        crate::text::truncate(&key, 128)
                    ),
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

/// The Airlock session `ctx` is of, as watches name it.
pub(super) fn session_key(ctx: &RunContext) -> SessionKey {
    (
        ctx.user_id().map(str::to_owned),
        ctx.session_id().to_owned(),
    )
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
