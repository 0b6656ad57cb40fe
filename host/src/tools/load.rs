//! Loading components: compile or take from the cache, check the world,
//! ask `describe`, validate the specs.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use wasmtime::component::Component;

use super::call::{classify, timer_deadline};
use super::{CallError, Host, LoadError, LoadedComponent, ToolHostPre, guest};
use crate::context::KeyRules;
use crate::policy::ToolConfig;
use crate::sandbox::{
    CacheOutcome, CallState, CancelToken, CompileFailure, FileStamp, Grants, Limits, Sandbox,
    ToolGate, UnsafeCache, until,
};
use crate::spec::{MAX_DESCRIPTION_BYTES, MAX_SCHEMA_BYTES, MAX_TOOLS, ToolSpec, compile_schema};

impl Host {
    /// Loads the component at `path` with the host's default limits and
    /// nothing granted.
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
    /// compiles it or takes it from the cache, checks that it fits the
    /// `tool-host` world, and asks it to `describe` its tools.
    ///
    /// May block a worker thread for seconds on a cache miss. Fails, loading
    /// nothing, if any of its tool names is already loaded.
    pub async fn load_with(
        &mut self,
        path: impl AsRef<Path>,
        config: ToolConfig,
    ) -> Result<Arc<LoadedComponent>, LoadError> {
        let ToolConfig {
            limits,
            grants,
            access,
            approval,
            idempotent,
        } = config;
        let path = path.as_ref().to_path_buf();
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
            .linker
            .instantiate_pre(&component)
            .map_err(incompatible)?;
        let pre = ToolHostPre::new(instance_pre).map_err(incompatible)?;
        let footprint = Sandbox::footprint(&component, &limits);
        let gate = self
            .sandbox
            .admission()
            .gate(footprint)
            .map_err(|problem| LoadError::PoolShare {
                path: path.clone(),
                problem,
            })?;

        let specs = self
            .describe(&pre, &limits, &gate)
            .await
            .map_err(|e| LoadError::Describe {
                path: path.clone(),
                source: Box::new(e),
            })?;
        let (specs, validators) = validate_specs(&path, specs)?;
        for spec in &specs {
            if let Some(&other) = self.tools.get(&spec.name) {
                return Err(LoadError::DuplicateTool {
                    name: spec.name.clone(),
                    first: self.components[other].path.clone(),
                    second: path,
                });
            }
        }

        let loaded = Arc::new(LoadedComponent {
            path,
            component,
            pre,
            limits,
            grants: Arc::new(grants),
            rules: KeyRules {
                access: Arc::new(access),
                context: Arc::clone(&self.context_rules),
            },
            approval,
            idempotent,
            specs,
            validators,
            cache: cache_outcome,
            gate,
        });
        let index = self.components.len();
        for spec in &loaded.specs {
            self.tools.insert(spec.name.clone(), index);
        }
        self.components.push(Arc::clone(&loaded));
        Ok(loaded)
    }

    async fn describe(
        &self,
        pre: &ToolHostPre<CallState>,
        limits: &Limits,
        gate: &ToolGate,
    ) -> Result<Vec<guest::ToolSpec>, CallError> {
        // `describe` runs with nothing granted, whatever the tool's grants.
        let mut store = self
            .new_store(limits, &Arc::new(Grants::none()), gate, CancelToken::new())
            .await?;
        let run = async {
            let instance = pre.instantiate_async(&mut store).await?;
            instance.airlock_tool_tool().call_describe(&mut store).await
        };
        match until(
            run,
            Some(timer_deadline(limits)),
            None,
            &tracing::Span::none(),
        )
        .await
        {
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
    /// It is compiled (or failed to), after `took`.
    Finished {
        /// The component.
        path: &'a Path,
        /// How long compiling took.
        took: Duration,
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
    let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    check_header(path, &bytes)?;
    let mut started = None;
    let on_compile = || {
        if let Some(hook) = hook {
            hook(CompileProgress::Started { path });
        }
        started = Some(Instant::now());
    };
    let loaded = cache.load_with(engine, &bytes, on_compile, |bytes| {
        sandbox.precompile(bytes)
    });
    if let (Some(hook), Some(started)) = (hook, started) {
        hook(CompileProgress::Finished {
            path,
            took: started.elapsed(),
        });
    }
    let loaded = loaded.map_err(|e| {
        if let Some(failure) = e.downcast_ref::<CompileFailure>() {
            return LoadError::CompileLimit {
                path: path.to_path_buf(),
                problem: failure.0.clone(),
            };
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
        Some(b'(') | Some(b';') => Ok(()),
        _ => Err(LoadError::NotWasm {
            path: path.to_path_buf(),
        }),
    }
}

fn validate_specs(
    path: &Path,
    specs: Vec<guest::ToolSpec>,
) -> Result<(Vec<ToolSpec>, Validators), LoadError> {
    if specs.len() > MAX_TOOLS {
        return Err(LoadError::BadSpec {
            path: path.to_path_buf(),
            name: String::new(),
            problem: format!("describes {} tools; the limit is {MAX_TOOLS}", specs.len()),
        });
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::with_capacity(specs.len());
    let mut validators = BTreeMap::new();
    for spec in specs {
        let bad = |problem: String| LoadError::BadSpec {
            path: path.to_path_buf(),
            name: crate::text::truncate(&spec.name, 64),
            problem,
        };
        let name_ok = !spec.name.is_empty()
            && spec.name.len() <= 64
            && spec
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !name_ok {
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
        validators.insert(spec.name.clone(), Arc::new(validator));
        out.push(ToolSpec {
            name: spec.name,
            description: spec.description,
            parameters,
        });
    }
    Ok((out, validators))
}

type Validators = BTreeMap<String, Arc<jsonschema::Validator>>;
