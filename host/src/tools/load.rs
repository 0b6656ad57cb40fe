//! Loading components, in two steps: each component is prepared (compiled
//! or taken from the cache, linked, and asked what it offers: `describe`
//! for an Airlock tool, its exported functions for a plain component),
//! then the tools of every component loaded together are named at once,
//! so that a plain function keeps its bare name whenever no other tool of
//! the batch (or already loaded) has it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use wasmtime::component::Component;

use super::ahead::Ahead;
use super::bindings::AirlockPre;
use super::call::{classify, timer_deadline};
use super::plain::docs::PackageDocs;
use super::plain::{self, Function, Skipped};
use super::serve::Offers;
use super::{CallError, Host, Kind, LoadError, LoadedComponent, Target, guest};
use crate::context::{KeyAccess, KeyRules};
use crate::policy::{Approval, ToolConfig, ToolPolicy};
use crate::sandbox::{
    CacheOutcome, CancelToken, CompileFailure, FileStamp, Grants, Limits, Sandbox, Sources,
    ToolGate, UnsafeCache, until,
};
use crate::spec::{
    MAX_DESCRIPTION_BYTES, MAX_SCHEMA_BYTES, MAX_TOOLS, MAX_TOTAL_SCHEMA_BYTES, ToolSpec,
    compile_schema,
};

/// A component compiled, linked and asked what it offers; its tools not
/// yet named.
struct Prepared {
    path: PathBuf,
    component: Component,
    kind: Kind,
    limits: Limits,
    grants: Grants,
    access: KeyAccess,
    approval: Approval,
    idempotent: bool,
    scopes: Vec<String>,
    offered: Vec<Offered>,
    skipped: Vec<Skipped>,
    cache: CacheOutcome,
    gate: ToolGate,
    /// How long `describe`'s instantiation took (an Airlock tool's).
    instantiated: Option<Duration>,
    /// Its resources and prompts.
    offers: Offers,
}

/// What an Airlock component's `describe`s returned.
struct Described {
    tools: Vec<guest::ToolSpec>,
    resources: Vec<super::bindings::resources::ResourceSpec>,
    prompts: Vec<super::bindings::prompts::PromptSpec>,
}

/// One tool a prepared component offers.
struct Offered {
    /// Its name when fixed: as `describe` gave it, or as the policy
    /// renamed it. `None`: a plain function, named with the batch.
    fixed: Option<String>,
    description: String,
    parameters: Value,
    /// The compiled parameter schema an Airlock tool's arguments are
    /// checked against; none for a plain function, whose arguments are
    /// checked, exactly as its derived schema says, as they are converted
    /// to its WIT types.
    validator: Option<Arc<jsonschema::Validator>>,
    target: Target,
}

impl Offered {
    /// Whether a policy's `functions`/`rename` entry names this tool.
    fn matches(&self, selector: &str) -> bool {
        match &self.target {
            Target::Described(name) => name == selector,
            Target::Function(function) => function.matches(selector),
        }
    }

    /// How the tool is known in the component, for messages.
    fn label(&self) -> String {
        match &self.target {
            Target::Described(name) => name.clone(),
            Target::Function(function) => function.qualified(),
        }
    }
}

impl Host {
    /// Loads the component at `path` with the host's default limits (the
    /// builder's, or the policy's `[limits]` for a host built with
    /// [`HostBuilder::build_with_policy`](super::HostBuilder::build_with_policy))
    /// and nothing granted.
    pub async fn load(
        &mut self,
        path: impl AsRef<Path>,
    ) -> Result<Arc<LoadedComponent>, LoadError> {
        let config = ToolConfig {
            limits: self.limits.clone(),
            ..ToolConfig::default()
        };
        self.load_with(path, config).await
    }

    /// Loads the component at `path` (a binary component or WAT text):
    /// compiles it or takes it from the cache, and finds what it offers:
    /// the tools its `describe` lists if it exports Airlock's `tool`
    /// interface, otherwise each function it exports (see
    /// [`super::plain`]), named by their WIT names unless a loaded tool has
    /// that name already.
    ///
    /// May block a worker thread for seconds on a cache miss. Fails,
    /// loading nothing, if any of its tool names is already loaded (and
    /// cannot be qualified, for a plain function), or if it offers no
    /// usable tool.
    pub async fn load_with(
        &mut self,
        path: impl AsRef<Path>,
        config: ToolConfig,
    ) -> Result<Arc<LoadedComponent>, LoadError> {
        let prepared = self.prepare(path.as_ref(), config).await?;
        let mut loaded = self.register(vec![prepared])?;
        loaded
            .pop()
            .ok_or_else(|| LoadError::Sandbox("a loaded component went missing".into()))
    }

    /// Loads every tool of a policy as one batch: a plain function keeps its
    /// bare name when no other tool of the policy has it.
    pub(crate) async fn load_all(&mut self, tools: &[ToolPolicy]) -> Result<(), LoadError> {
        let mut prepared = Vec::with_capacity(tools.len());
        for tool in tools {
            prepared.push(self.prepare(&tool.path, tool.config.clone()).await?);
        }
        self.register(prepared).map(drop)
    }

    /// Compiles (or takes from the cache) and links the component at
    /// `path`, and finds what it offers under `config`.
    async fn prepare(&self, path: &Path, config: ToolConfig) -> Result<Prepared, LoadError> {
        let ToolConfig {
            limits,
            grants,
            access,
            approval,
            idempotent,
            scopes,
            functions,
            rename,
        } = config;
        let path = path.to_path_buf();
        if limits.fuel.is_some() && !self.sandbox.fuel_metering() {
            return Err(LoadError::FuelNotMetered { path });
        }
        if let Err(problem) = limits.check(self.sandbox.max_memory_ceiling()) {
            return Err(LoadError::BadLimits { path, problem });
        }
        let sandbox = self.sandbox.clone();
        let hook = self.on_compile.clone();
        let file = path.clone();
        let compiled =
            tokio::task::spawn_blocking(move || compile_file(&sandbox, &file, hook.as_ref())).await;
        let (component, cache_outcome) = match compiled {
            Ok(done) => done?,
            Err(join) => {
                return Err(LoadError::Invalid {
                    path,
                    message: format!("compilation aborted: {join}"),
                });
            }
        };
        tracing::debug!(path = %path.display(), cache = ?cache_outcome, "component compiled");

        let incompatible = |e: wasmtime::Error| LoadError::Incompatible {
            path: path.clone(),
            message: format!("{e:#}"),
        };
        let instance_pre = self
            .linker_for(&component)
            .instantiate_pre(&component)
            .map_err(incompatible)?;
        let footprint = Sandbox::footprint(&component, &limits);
        let gate = self
            .sandbox
            .admission()
            .gate(footprint)
            .map_err(|problem| LoadError::PoolShare {
                path: path.clone(),
                problem,
            })?;

        let engine = component.engine();
        let mut instantiated = None;
        let mut offers = Offers::default();
        let (kind, offered, skipped) = if plain::is_airlock_tool(&component, engine) {
            let pre = AirlockPre::new(instance_pre).map_err(incompatible)?;
            let (described, took) =
                self.describe(&pre, &limits, &gate)
                    .await
                    .map_err(|e| LoadError::Describe {
                        path: path.clone(),
                        source: Box::new(e),
                    })?;
            instantiated = Some(took);
            let offered = validate_specs(&path, described.tools)?;
            offers = Offers::check(
                &path,
                described.resources,
                described.prompts,
                &grants.uri_schemes,
            )?;
            (Kind::Airlock(pre), offered, Vec::new())
        } else {
            let file = path.clone();
            let docs = tokio::task::spawn_blocking(move || {
                crate::fs::read_component(&file)
                    .ok()
                    .and_then(|b| PackageDocs::of(&b))
            })
            .await
            .ok()
            .flatten();
            let (functions, skipped) =
                plain::functions(&component, engine, docs.as_ref(), MAX_SCHEMA_BYTES).map_err(
                    |too_much| LoadError::OffersTooMuch {
                        path: path.clone(),
                        problem: too_much.to_string(),
                    },
                )?;
            if functions.is_empty() {
                return Err(LoadError::NoTools { path, skipped });
            }
            let offered = functions
                .into_iter()
                .map(|function| offer_function(&path, function))
                .collect::<Result<_, _>>()?;
            (Kind::Plain(instance_pre), offered, skipped)
        };
        let offered = select(&path, offered, &skipped, functions.as_deref(), &rename)?;
        Ok(Prepared {
            path,
            component,
            kind,
            limits,
            grants,
            access,
            approval,
            idempotent,
            scopes,
            offered,
            skipped,
            cache: cache_outcome,
            gate,
            instantiated,
            offers,
        })
    }

    /// Names the tools of `batch` and adds its components to the host: a
    /// fixed name (described, or renamed by the policy) as it is, unless
    /// taken; a plain function by the first of its candidate names
    /// ([`Function::candidate_names`]) that no other tool of the host or
    /// the batch has or wants. Adds nothing on error.
    fn register(&mut self, batch: Vec<Prepared>) -> Result<Vec<Arc<LoadedComponent>>, LoadError> {
        self.check_offers(&batch)?;
        let mut taken: BTreeMap<String, PathBuf> = self
            .tools
            .iter()
            .map(|(name, &index)| (name.clone(), self.components[index].path.clone()))
            .collect();
        let mut names: Vec<Vec<Option<String>>> =
            batch.iter().map(|p| vec![None; p.offered.len()]).collect();
        let claim = |taken: &mut BTreeMap<String, PathBuf>, name: &str, path: &Path| match taken
            .get(name)
        {
            Some(first) => Err(LoadError::DuplicateTool {
                name: name.to_owned(),
                first: first.clone(),
                second: path.to_path_buf(),
            }),
            None => {
                taken.insert(name.to_owned(), path.to_path_buf());
                Ok(())
            }
        };
        for (c, prepared) in batch.iter().enumerate() {
            for (t, offered) in prepared.offered.iter().enumerate() {
                if let Some(name) = &offered.fixed {
                    claim(&mut taken, name, &prepared.path)?;
                    names[c][t] = Some(name.clone());
                }
            }
        }
        // Plain functions: the bare name when it is theirs alone, else the
        // next candidate, level by level.
        let candidates: Vec<(usize, usize, Vec<String>)> = batch
            .iter()
            .enumerate()
            .flat_map(|(c, p)| {
                p.offered
                    .iter()
                    .enumerate()
                    .filter_map(move |(t, o)| match &o.target {
                        Target::Function(f) if o.fixed.is_none() => {
                            Some((c, t, f.candidate_names()))
                        }
                        _ => None,
                    })
            })
            .collect();
        let levels = candidates.iter().map(|(.., n)| n.len()).max().unwrap_or(0);
        for level in 0..levels {
            let wanted = |entry: &(usize, usize, Vec<String>)| -> Option<String> {
                let (c, t, candidates) = entry;
                names[*c][*t]
                    .is_none()
                    .then(|| candidates.get(level).or(candidates.last()).cloned())
                    .flatten()
            };
            let mut counts: BTreeMap<String, usize> = BTreeMap::new();
            for entry in &candidates {
                if let Some(name) = wanted(entry) {
                    *counts.entry(name).or_default() += 1;
                }
            }
            let mut chosen = Vec::new();
            for entry in &candidates {
                if let Some(name) = wanted(entry)
                    && counts[&name] == 1
                    && !taken.contains_key(&name)
                {
                    chosen.push((entry.0, entry.1, name));
                }
            }
            for (c, t, name) in chosen {
                claim(&mut taken, &name, &batch[c].path)?;
                names[c][t] = Some(name);
            }
        }
        for (c, t, wanted) in &candidates {
            if names[*c][*t].is_none() {
                let name = wanted.last().cloned().unwrap_or_default();
                let first = taken.get(&name).cloned().or_else(|| {
                    candidates
                        .iter()
                        .find(|(oc, ot, n)| (oc, ot) != (c, t) && n.last() == Some(&name))
                        .map(|(oc, ..)| batch[*oc].path.clone())
                });
                return Err(LoadError::DuplicateTool {
                    name,
                    first: first.unwrap_or_default(),
                    second: batch[*c].path.clone(),
                });
            }
        }

        let mut loaded = Vec::with_capacity(batch.len());
        for (prepared, names) in batch.into_iter().zip(names) {
            let mut specs = Vec::with_capacity(prepared.offered.len());
            let mut validators = BTreeMap::new();
            let mut targets = BTreeMap::new();
            for (offered, name) in prepared.offered.into_iter().zip(names) {
                let name = name.unwrap_or_default();
                specs.push(ToolSpec {
                    name: name.clone(),
                    description: offered.description,
                    parameters: offered.parameters,
                });
                if let Some(validator) = offered.validator {
                    validators.insert(name.clone(), validator);
                }
                targets.insert(name, offered.target);
            }
            let grants = Arc::new(prepared.grants);
            let gate = Arc::new(prepared.gate);
            let sources = Sources::of(&prepared.component, prepared.component.engine());
            let ahead = match &prepared.kind {
                // `None` is a plain component's.
                Kind::Airlock(pre) => Ahead::new(
                    &self.sandbox,
                    pre.instance_pre(),
                    Some(pre.exports().clone()),
                    &prepared.limits,
                    &grants,
                    sources,
                    &gate,
                ),
                Kind::Plain(pre) => Ahead::new(
                    &self.sandbox,
                    pre,
                    None,
                    &prepared.limits,
                    &grants,
                    sources,
                    &gate,
                ),
            };
            if let Some(took) = prepared.instantiated {
                ahead.instantiated(took);
            }
            let component = Arc::new(LoadedComponent {
                path: prepared.path,
                component: prepared.component,
                kind: prepared.kind,
                limits: prepared.limits,
                grants,
                rules: KeyRules {
                    access: Arc::new(prepared.access),
                    context: Arc::clone(&self.context_rules),
                },
                approval: prepared.approval,
                idempotent: prepared.idempotent,
                scopes: prepared.scopes,
                specs,
                validators,
                targets,
                skipped: prepared.skipped,
                cache: prepared.cache,
                gate,
                ahead,
                offers: prepared.offers,
                sources,
            });
            let index = self.components.len();
            for spec in &component.specs {
                self.tools.insert(spec.name.clone(), index);
            }
            self.components.push(Arc::clone(&component));
            loaded.push(component);
        }
        Ok(loaded)
    }

    /// Refuses a batch in which a resource URI (or template) or a prompt
    /// name is offered twice, by the host's components or the batch's.
    fn check_offers(&self, batch: &[Prepared]) -> Result<(), LoadError> {
        let mut taken: BTreeMap<(&str, &str), &Path> = BTreeMap::new();
        let loaded = self
            .components
            .iter()
            .map(|c| (c.offers.names().collect::<Vec<_>>(), c.path.as_path()));
        let batch = batch
            .iter()
            .map(|p| (p.offers.names().collect::<Vec<_>>(), p.path.as_path()));
        for (names, path) in loaded.chain(batch) {
            for (what, name) in names {
                if let Some(first) = taken.insert((what, name), path) {
                    return Err(LoadError::DuplicateOffer {
                        what,
                        name: name.to_owned(),
                        first: first.to_path_buf(),
                        second: path.to_path_buf(),
                    });
                }
            }
        }
        Ok(())
    }

    /// What an Airlock component says it offers: its tools, and its
    /// resources and prompts if it exports them (all from one instance),
    /// and how long instantiating it took.
    async fn describe(
        &self,
        pre: &AirlockPre,
        limits: &Limits,
        gate: &ToolGate,
    ) -> Result<(Described, Duration), CallError> {
        // `describe` runs with nothing granted, whatever the tool's grants.
        let mut store = self
            .new_store(
                pre.instance_pre().engine(),
                limits,
                &Arc::new(Grants::none()),
                Sources::default(),
                gate,
                CancelToken::new(),
            )
            .await?;
        let deadline = timer_deadline(&store);
        let run = async {
            let started = Instant::now();
            let instance = pre.instantiate_async(&mut store).await?;
            let took = started.elapsed();
            let exports = pre.exports();
            let tools = exports
                .tool(&mut store, &instance)?
                .call_describe(&mut store)
                .await?;
            let resources = match exports.resources(&mut store, &instance)? {
                Some(resources) => resources.call_describe(&mut store).await?,
                None => Vec::new(),
            };
            let prompts = match exports.prompts(&mut store, &instance)? {
                Some(prompts) => prompts.call_describe(&mut store).await?,
                None => Vec::new(),
            };
            let described = Described {
                tools,
                resources,
                prompts,
            };
            Ok::<_, wasmtime::Error>((described, took))
        };
        match until(run, Some(deadline), None, &tracing::Span::none()).await {
            Ok(Ok(specs)) => Ok(specs),
            Ok(Err(e)) => Err(classify(e, &store, limits)),
            Err(_) => Err(CallError::Timeout {
                limit: limits.timeout,
            }),
        }
    }
}

/// Progress of a compilation that missed the cache (see
/// [`HostBuilder::on_compile`](super::HostBuilder::on_compile)).
#[derive(Debug, Clone, Copy)]
pub enum CompileProgress<'a> {
    /// Compiling the component at `path` has begun.
    Started {
        /// The component.
        path: &'a Path,
    },
    /// It is compiled, or failed to (the load's error then says why),
    /// after `took`.
    Finished {
        /// The component.
        path: &'a Path,
        /// How long compiling took.
        took: Duration,
        /// Whether it compiled.
        compiled: bool,
    },
}

pub(super) type CompileHook = Arc<dyn Fn(CompileProgress<'_>) + Send + Sync>;

/// The compiled component at `path`: from the cache's file index without
/// reading the file, or by content (read, checked, compiled on a miss).
/// Blocks: run it off the async executor.
fn compile_file(
    sandbox: &Sandbox,
    path: &Path,
    hook: Option<&CompileHook>,
) -> Result<(Component, CacheOutcome), LoadError> {
    let (cache, engine) = (sandbox.cache(), sandbox.engine());
    cache.verify()?;
    if let Some(component) = cache.lookup_file(engine, path) {
        return Ok((component, CacheOutcome::Hit));
    }
    // Taken before reading: if the file changes from here on, the result
    // is not filed under its new identity.
    let before = FileStamp::of(path);
    let bytes = crate::fs::read_component(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    check_header(path, &bytes)?;
    let mut started = None;
    // Called once per compile (twice only if the baseline compiler gave
    // up: then the time counts from the first).
    let mut on_compile = || {
        if started.is_some() {
            return;
        }
        if let Some(hook) = hook {
            hook(CompileProgress::Started { path });
        }
        started = Some(Instant::now());
    };
    let loaded = match baseline_first(sandbox, path, &bytes, &mut on_compile) {
        Some(loaded) => loaded,
        None => cache.load_with(engine, &bytes, on_compile, |bytes| {
            sandbox.precompile(bytes)
        }),
    };
    if let (Some(hook), Some(started)) = (hook, started) {
        hook(CompileProgress::Finished {
            path,
            took: started.elapsed(),
            compiled: loaded.is_ok(),
        });
    }
    let loaded = loaded.map_err(|e| {
        match e.downcast_ref::<CompileFailure>() {
            Some(CompileFailure::Invalid(message)) => {
                return LoadError::Invalid {
                    path: path.to_path_buf(),
                    message: message.clone(),
                };
            }
            Some(failure) => {
                return LoadError::CompileLimit {
                    path: path.to_path_buf(),
                    problem: failure.to_string(),
                };
            }
            None => {}
        }
        match e.downcast::<UnsafeCache>() {
            Ok(unsafe_cache) => LoadError::UnsafeCache(unsafe_cache),
            Err(e) => LoadError::Invalid {
                path: path.to_path_buf(),
                message: format!("{e:#}"),
            },
        }
    })?;
    if let Some(before) = before {
        cache.remember_file(engine, path, before, &bytes);
    }
    Ok(loaded)
}

/// The component at `path` (content `bytes`) from the cache, or compiled
/// by the baseline compiler while its optimised code is compiled into the
/// cache in the background, when the sandbox does that for a component of
/// its size ([`Sandbox::baseline_first`]); `None` to load it as every
/// other: the sandbox does not, there is no cache to fill, or the baseline
/// compiler could not compile it (a feature it lacks; an invalid
/// component is then refused by the optimising one, in the same words).
fn baseline_first(
    sandbox: &Sandbox,
    path: &Path,
    bytes: &[u8],
    on_compile: &mut impl FnMut(),
) -> Option<wasmtime::Result<(Component, CacheOutcome)>> {
    let cache = sandbox.cache();
    let baseline = sandbox.baseline_first(bytes.len())?;
    cache.dir()?;
    match cache.lookup(sandbox.engine(), bytes) {
        Ok(Some(component)) => return Some(Ok((component, CacheOutcome::Hit))),
        Ok(None) => {}
        Err(unsafe_cache) => return Some(Err(wasmtime::Error::new(unsafe_cache))),
    }
    on_compile();
    let compiled = sandbox
        .precompile_as(crate::sandbox::Tier::Baseline, bytes)
        .and_then(|code| crate::sandbox::cache::load_compiled(baseline, &code));
    match compiled {
        Ok(component) => {
            sandbox.fill_cache_later(path, bytes);
            Some(Ok((component, CacheOutcome::Baseline)))
        }
        Err(e) => match e.downcast_ref::<CompileFailure>() {
            // Over a bound: the optimising compiler needs more.
            Some(
                CompileFailure::TooComplex(_)
                | CompileFailure::Cpu { .. }
                | CompileFailure::Memory { .. }
                | CompileFailure::Stalled { .. },
            ) => Some(Err(e)),
            _ => {
                tracing::debug!(path = %path.display(), error = %format!("{e:#}"), "the baseline compiler refused; compiling with the optimising one");
                None
            }
        },
    }
}

/// Refuses files that are plainly not components, with a hint, before the
/// compiler produces a less helpful message.
fn check_header(path: &Path, bytes: &[u8]) -> Result<(), LoadError> {
    const MAGIC: &[u8] = b"\0asm";
    if bytes.starts_with(MAGIC) {
        // Bytes 4..8 are the version and layer: layer 0 is a core module,
        // layer 1 a component.
        return match bytes.get(6..8) {
            Some([0, 0]) => Err(LoadError::CoreModule {
                path: path.to_path_buf(),
            }),
            _ => Ok(()),
        };
    }
    let text_start = bytes.iter().find(|b| !b.is_ascii_whitespace());
    match text_start {
        Some(b'(') | Some(b';') if wat_module(bytes) => Err(LoadError::CoreModule {
            path: path.to_path_buf(),
        }),
        Some(b'(') | Some(b';') => Ok(()),
        _ => Err(LoadError::NotWasm {
            path: path.to_path_buf(),
        }),
    }
}

/// Whether WebAssembly text `bytes` is a core module: its first form,
/// past white space and comments (read by `wat`'s own lexer), is
/// `(module`.
fn wat_module(bytes: &[u8]) -> bool {
    use wast::lexer::{Lexer, TokenKind};
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    let lexer = Lexer::new(text);
    let mut tokens = lexer.iter(0).map_while(Result::ok).filter(|t| {
        !matches!(
            t.kind,
            TokenKind::Whitespace | TokenKind::LineComment | TokenKind::BlockComment
        )
    });
    let (Some(open), Some(word)) = (tokens.next(), tokens.next()) else {
        return false;
    };
    open.kind == TokenKind::LParen && word.kind == TokenKind::Keyword && word.src(text) == "module"
}

/// Checks what an Airlock tool's `describe` gave: names, sizes, schemas.
fn validate_specs(path: &Path, specs: Vec<guest::ToolSpec>) -> Result<Vec<Offered>, LoadError> {
    if specs.len() > MAX_TOOLS {
        return Err(LoadError::OffersTooMuch {
            path: path.to_path_buf(),
            problem: format!("describes {} tools; the limit is {MAX_TOOLS}", specs.len()),
        });
    }
    let total: usize = specs.iter().map(|s| s.parameters.len()).sum();
    if total > MAX_TOTAL_SCHEMA_BYTES {
        return Err(LoadError::OffersTooMuch {
            path: path.to_path_buf(),
            problem: format!(
                "its tools' parameter schemas add up to {total} bytes; the limit is {MAX_TOTAL_SCHEMA_BYTES}"
            ),
        });
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(specs.len());
    for spec in specs {
        let bad = |problem: String| LoadError::BadSpec {
            path: path.to_path_buf(),
            name: crate::text::truncate(&spec.name, 64),
            problem,
        };
        if !crate::policy::is_tool_name(&spec.name) {
            return Err(bad("a tool name must match [a-zA-Z0-9_-]{1,64}".into()));
        }
        if !seen.insert(spec.name.clone()) {
            return Err(bad("described twice by the same component".into()));
        }
        if spec.description.len() > MAX_DESCRIPTION_BYTES {
            return Err(bad(format!(
                "the description is {} bytes; the limit is {MAX_DESCRIPTION_BYTES}",
                spec.description.len()
            )));
        }
        if spec.parameters.len() > MAX_SCHEMA_BYTES {
            return Err(bad(format!(
                "the parameter schema is {} bytes; the limit is {MAX_SCHEMA_BYTES}",
                spec.parameters.len()
            )));
        }
        let parameters: Value = serde_json::from_str(&spec.parameters)
            .map_err(|e| bad(format!("parameters are not valid JSON: {e}")))?;
        if !parameters.is_object() {
            return Err(bad("parameters must be a JSON Schema object".into()));
        }
        let validator = compile_schema(&parameters)
            .map_err(|e| bad(format!("parameters are not a usable JSON Schema: {e}")))?;
        out.push(Offered {
            fixed: Some(spec.name.clone()),
            description: spec.description,
            parameters,
            validator: Some(Arc::new(validator)),
            target: Target::Described(spec.name),
        });
    }
    Ok(out)
}

/// A plain function as a tool. Its derived schema must compile (a client
/// will validate against it), though calls are checked by conversion.
fn offer_function(path: &Path, function: Function) -> Result<Offered, LoadError> {
    compile_schema(&function.parameters).map_err(|problem| LoadError::BadSpec {
        path: path.to_path_buf(),
        name: function.qualified(),
        problem: format!("its derived schema does not compile: {problem}"),
    })?;
    Ok(Offered {
        fixed: None,
        description: function.description.clone(),
        parameters: function.parameters.clone(),
        validator: None,
        target: Target::Function(Arc::new(function)),
    })
}

/// The tools the policy's `functions` keeps, renamed as its `rename` says.
/// An entry that names nothing the component offers is an error, naming
/// the entry (and why, when it names a skipped function): a typo must not
/// silently offer everything or nothing.
fn select(
    path: &Path,
    offered: Vec<Offered>,
    skipped: &[Skipped],
    functions: Option<&[String]>,
    rename: &BTreeMap<String, String>,
) -> Result<Vec<Offered>, LoadError> {
    let unknown = |selector: &str, key: &str| {
        let reason = skipped
            .iter()
            .find(|s| s.function == selector || s.function.ends_with(&format!("#{selector}")))
            .map(|s| format!("; it is not offered: {}", s.reason))
            .unwrap_or_default();
        let available: Vec<String> = offered.iter().map(Offered::label).collect();
        LoadError::Selection {
            path: path.to_path_buf(),
            problem: format!(
                "{key} {selector:?} names none of its tools{reason} (it offers: {})",
                available.join(", ")
            ),
        }
    };
    if let Some(selector) = functions.and_then(|wanted| {
        wanted
            .iter()
            .find(|s| !offered.iter().any(|o| o.matches(s)))
    }) {
        return Err(unknown(selector, "functions entry"));
    }
    for selector in rename.keys() {
        let matching = offered.iter().filter(|o| o.matches(selector)).count();
        if matching == 0 {
            return Err(unknown(selector, "rename"));
        }
        if matching > 1 {
            return Err(LoadError::Selection {
                path: path.to_path_buf(),
                problem: format!(
                    "rename {selector:?} names {matching} of its functions; write INTERFACE#name"
                ),
            });
        }
    }
    Ok(offered
        .into_iter()
        .filter(|o| functions.is_none_or(|wanted| wanted.iter().any(|s| o.matches(s))))
        .map(|mut o| {
            if let Some(new) = rename.iter().find(|(s, _)| o.matches(s)).map(|(_, n)| n) {
                o.fixed = Some(new.clone());
            }
            o
        })
        .collect())
}
