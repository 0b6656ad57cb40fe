//! The operator's policy file, `airlock.toml`: which tools to load and what
//! each may do.
//!
//! ```toml
//! [limits]                       # defaults for every tool (optional)
//! timeout_ms = 5000
//! memory_mb = 128
//! prepared_instances = 1         # made ahead of calls; 0 turns it off
//!
//! [context]
//! hidden = ["api_token", "internal_*"]   # never visible to any tool
//! schema.counters = { type = "object", additionalProperties = { type = "integer" } }
//!
//! [[tool]]
//! path = "tools/weather.wasm"     # relative to this file
//! approval = "ask"                # "never" (default) or "ask"
//! env = ["TZ"]
//! dirs = [{ host = "data", guest = "/data", mode = "ro" }]
//! http = ["https://api.weather.example"]
//! secrets = [{ env = "WEATHER_KEY", origins = ["https://api.weather.example"] }]
//! limits = { timeout_ms = 2000 }
//! context = { read = ["city", "units"], write = ["forecast"] }
//! idempotent = true               # safe to run twice: may run speculatively
//! record = true                  # journal what it reads (HTTP, files, env), for replay
//! functions = ["forecast"]         # offer only these of its tools
//! rename = { forecast = "weather" } # under another name
//!
//! [[tool]]
//! oci = "ghcr.io/acme/units:1.0"  # from a registry, pinned by airlock.lock
//! verify = { key = "keys/acme.pub" }  # its signature must verify (or a list),
//!                                      # made for this repository (or one of
//!                                      # `repositories = ["ghcr.io/acme/units"]`,
//!                                      # for a mirror)
//!
//! [oci]                           # registries (optional)
//! require_signature = true        # every `oci` tool needs `verify`
//! insecure = false                # plain HTTP, to loopback registries only
//! max_manifest_bytes = 4194304
//! max_layer_bytes = 268435456
//!
//! [turn]                          # a model turn's calls (optional)
//! parallel = true                 # concurrent, committed in the model's order
//! max_parallel = 8                # at most this many at once
//! max_calls = 64                  # a turn's calls past this many are not run
//! ```
//!
//! Anything not granted is denied. A file that names an unknown key, a
//! missing component, a malformed host pattern or a directory that does not
//! exist fails to load, with an error naming the file, the line and the
//! problem. Secrets are not read here: a secret's variable may be unset
//! when the policy loads (for `airlock inspect`); a call that needs it then
//! fails with `grant_unavailable`.
//!
//! A policy is plain data, parsed and checked here and nothing more: each
//! grant parses its own piece ([`grants`]), limits are checked against the
//! host's ceilings ([`limits`]), a tool named by reference keeps its
//! reference and trusted keys ([`OciTool`]). Nothing here runs a tool or
//! reaches a registry: the sandbox serves the grants to calls, and
//! [`crate::oci::Resolver::resolve_policy`] pulls what the references
//! name.

pub mod grants;
pub(crate) mod keys;
pub mod limits;
pub mod mcp;
pub(crate) mod oci;
pub(crate) mod reference;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::context::{ContextRules, KeyAccess, KeyPatterns};
use crate::retention::Retention;
use grants::{
    DirConfig, DirGrant, DirMode, EnvGrant, Grant, GrantError, Grants, HttpConfig, HttpGrant,
    SecretConfig, SecretGrant,
};
pub use keys::PublicKey;
pub use limits::Limits;
use limits::LimitsConfig;
pub use mcp::{
    AuthSettings, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_PEER, DEFAULT_MAX_SESSIONS,
    McpSettings, TaskSettings, UserLimits,
};
use oci::{OciFile, VerifyFile};
pub use oci::{OciSettings, OciTool, Resolved};
pub use reference::{InvalidReference, Reference};

/// Whether the agent loop asks a person before running a tool's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Approval {
    /// Run calls without asking (the default).
    #[default]
    Never,
    /// Ask to approve, reject or edit each call first.
    Ask,
}

/// What an operator allows one component: its limits, its grants, which
/// deps keys it may read and write, and whether its calls need approval.
/// The default allows nothing beyond the default limits and full
/// (non-hidden) deps access.
#[derive(Debug, Clone, Default)]
pub struct ToolConfig {
    /// Per-call limits.
    pub limits: Limits,
    /// Files, environment, network, secrets.
    pub grants: Grants,
    /// The deps keys it may read and write.
    pub access: KeyAccess,
    /// Whether a person approves each call.
    pub approval: Approval,
    /// Whether running a call twice does no harm although it has effectful
    /// grants (an HTTP GET-only fetcher): its calls may then run alongside
    /// earlier calls of the turn, and again if what they read changed.
    pub idempotent: bool,
    /// OAuth scopes a caller over authenticated HTTP MCP needs for its
    /// tools (`scopes = ["files:read"]`, all of them): a token without
    /// one is not shown them and cannot call them. Nothing else checks
    /// them (stdio, `airlock run`).
    pub scopes: Vec<String>,
    /// Only these of the component's tools are offered (`functions =
    /// [...]`); `None` offers all. An entry names a tool as the component
    /// describes it, or a plain component's function by its name or as
    /// `INTERFACE#name`.
    pub functions: Option<Vec<String>>,
    /// Tools offered under another name (`rename = { "count-words" = "wc" }`),
    /// keyed as in `functions`.
    pub rename: BTreeMap<String, String>,
}

/// How the agent loop runs the calls of one model turn (`[turn]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnPolicy {
    /// Run a turn's calls concurrently, committed as if one after another
    /// in the model's order. Default `true`.
    pub parallel: bool,
    /// At most this many calls of one turn at once. Default
    /// [`TurnPolicy::DEFAULT_MAX_PARALLEL`].
    pub max_parallel: usize,
    /// At most this many calls of one turn run; the model is told that
    /// each call past them was not run, and why. Default
    /// [`TurnPolicy::DEFAULT_MAX_CALLS`].
    pub max_calls: usize,
}

impl TurnPolicy {
    /// The default per-turn concurrency: enough for a turn of I/O-bound
    /// calls; CPU-bound ones are bounded by the cores anyway.
    pub const DEFAULT_MAX_PARALLEL: usize = 8;

    /// The default most calls of one turn that run: far more than a
    /// model asks for at once, few enough that a model cannot make one
    /// turn run without end.
    pub const DEFAULT_MAX_CALLS: usize = 64;
}

impl Default for TurnPolicy {
    fn default() -> Self {
        Self {
            parallel: true,
            max_parallel: Self::DEFAULT_MAX_PARALLEL,
            max_calls: Self::DEFAULT_MAX_CALLS,
        }
    }
}

/// A loaded, validated policy.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The file it came from.
    pub source: PathBuf,
    /// The components to load, in the order listed.
    pub tools: Vec<ToolPolicy>,
    /// Hidden keys and per-key schemas, for every tool.
    pub context: ContextRules,
    /// The `[limits]` table over the built-in defaults: the limits of each
    /// listed tool where its own `limits` does not say otherwise, and of a
    /// component loaded beside the policy without an entry of its own.
    pub limits: Limits,
    /// How a model turn's calls run (`[turn]`).
    pub turn: TurnPolicy,
    /// Registries: signatures required, plain HTTP, size bounds (`[oci]`).
    pub oci: OciSettings,
    /// How long sessions are kept (`[sessions]`).
    pub sessions: Retention,
    /// Serving MCP over HTTP: who may call, and how much (`[mcp]`).
    pub mcp: McpSettings,
}

/// What the policy says about one component.
#[derive(Debug, Clone)]
pub struct ToolPolicy {
    /// The component: a file (`path`, resolved against the policy file's
    /// directory), or, for a tool named by reference, its file in the OCI
    /// store once [`Resolver::resolve_policy`](crate::oci::Resolver::resolve_policy)
    /// has pulled it (empty until then).
    pub path: PathBuf,
    /// A label for messages; defaults to the file name (the reference, for
    /// a tool named by one).
    pub name: String,
    /// Limits, grants, deps access and approval.
    pub config: ToolConfig,
    /// The reference and trusted keys, for a tool the policy names by
    /// `oci = "…"`.
    pub oci: Option<OciTool>,
    /// What the reference resolved to, once resolved.
    pub pulled: Option<Resolved>,
}

/// A policy that cannot be used. The message names the file, the line
/// (when known) and the problem.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {message}", .file.display(), .line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct PolicyError {
    /// The policy file.
    pub file: PathBuf,
    /// The line at fault, when known (from 1).
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl Policy {
    /// Reads and validates the policy at `path`. Relative paths in it are
    /// resolved against its directory.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        let path = path.as_ref();
        let text = crate::fs::read_settings_text(path).map_err(|e| PolicyError {
            file: path.to_path_buf(),
            line: None,
            message: format!("cannot read: {e}"),
        })?;
        let base = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Self::parse(&text, path, &base)
    }

    /// Validates policy `text`; `source` names it in errors and `base` is
    /// where relative paths start.
    pub fn parse(text: &str, source: &Path, base: &Path) -> Result<Self, PolicyError> {
        let at = |span: Option<std::ops::Range<usize>>, message: String| PolicyError {
            file: source.to_path_buf(),
            line: span.map(|s| line_of(text, s.start)),
            message,
        };
        let file: PolicyFile =
            toml::from_str(text).map_err(|e| at(e.span(), e.message().to_owned()))?;

        let hidden: Vec<&str> = file
            .context
            .hidden
            .iter()
            .map(|h| h.get_ref().as_str())
            .collect();
        let hidden = KeyPatterns::new(&hidden).map_err(|e| {
            at(
                file.context.hidden.first().map(Spanned::span),
                e.to_string(),
            )
        })?;
        let schemas: BTreeMap<String, serde_json::Value> =
            file.context.schema.into_iter().collect();
        let context =
            ContextRules::new(hidden, schemas).map_err(|e| at(None, format!("[context] {e}")))?;

        let defaults = file
            .limits
            .apply(Limits::default())
            .map_err(|m| at(None, format!("[limits] {m}")))?;
        let oci = match file.oci {
            None => OciSettings::default(),
            Some(oci) => {
                let span = oci.span();
                oci.into_inner()
                    .settings()
                    .map_err(|m| at(Some(span), format!("[oci] {m}")))?
            }
        };
        let sessions = match file.sessions {
            None => Retention::default(),
            Some(sessions) => {
                let span = sessions.span();
                sessions
                    .into_inner()
                    .retention()
                    .map_err(|m| at(Some(span), m))?
            }
        };
        let mcp = match file.mcp {
            None => McpSettings::default(),
            Some(mcp) => {
                let span = mcp.span();
                mcp.into_inner().settings().map_err(|m| at(Some(span), m))?
            }
        };
        let mut tools = Vec::with_capacity(file.tools.len());
        for tool in file.tools {
            let span = tool.span();
            let tool = tool
                .into_inner()
                .resolve(base, &defaults, &at, span.clone())?;
            if oci.require_signature && tool.oci.as_ref().is_some_and(|o| o.keys.is_empty()) {
                return Err(at(
                    Some(span),
                    format!(
                        "tool {:?}: [oci] require_signature is set, and it has no `verify = {{ key = \"….pub\" }}`",
                        tool.name
                    ),
                ));
            }
            tools.push(tool);
        }
        refuse_grants_inside_writable(&tools).map_err(|m| at(None, m))?;
        let turn = match file.turn {
            None => TurnPolicy::default(),
            Some(turn) => {
                let span = turn.span();
                let turn = turn.into_inner();
                let max_parallel = turn
                    .max_parallel
                    .unwrap_or(TurnPolicy::DEFAULT_MAX_PARALLEL);
                if max_parallel == 0 {
                    return Err(at(
                        Some(span),
                        "[turn] max_parallel must be at least 1 (use parallel = false to run calls one at a time)".into(),
                    ));
                }
                let max_calls = turn.max_calls.unwrap_or(TurnPolicy::DEFAULT_MAX_CALLS);
                if max_calls == 0 {
                    return Err(at(Some(span), "[turn] max_calls must be at least 1".into()));
                }
                TurnPolicy {
                    parallel: turn.parallel,
                    max_parallel,
                    max_calls,
                }
            }
        };
        Ok(Self {
            source: source.to_path_buf(),
            tools,
            context,
            limits: defaults,
            turn,
            oci,
            sessions,
            mcp,
        })
    }

    /// Where this policy's lock file is: `airlock.lock` beside it.
    pub fn lock_path(&self) -> PathBuf {
        oci::lock_path(Some(&self.source))
    }

    /// The entry that names `reference`, if any.
    pub fn for_reference(&self, reference: &Reference) -> Option<&ToolPolicy> {
        self.tools
            .iter()
            .find(|t| t.oci.as_ref().is_some_and(|o| &o.reference == reference))
    }

    /// Whether any tool, or the `[limits]` a tool loaded beside the
    /// policy gets, has a fuel limit (the host must then meter fuel).
    pub fn needs_fuel(&self) -> bool {
        self.limits.fuel.is_some() || self.tools.iter().any(|t| t.config.limits.fuel.is_some())
    }

    /// The policy entry for the component at `path`, if the policy lists
    /// it (compared as canonical paths).
    pub fn for_component(&self, path: &Path) -> Option<&ToolPolicy> {
        let wanted = path.canonicalize().ok()?;
        self.tools.iter().find(|t| {
            !t.path.as_os_str().is_empty() && t.path.canonicalize().is_ok_and(|p| p == wanted)
        })
    }
}

/// A directory grant that lies inside a read-write grant (another tool's or
/// the same tool's) is refused: whoever can write the outer directory could
/// replace the inner one with a symlink before the next load, and the grant
/// would then be checked and bound to wherever the link leads. (Within one
/// host's life a grant stays bound to the directory it checked; see
/// [`DirGrant`].) The same directory granted twice is fine: the root of a
/// grant cannot be replaced through it.
fn refuse_grants_inside_writable(tools: &[ToolPolicy]) -> Result<(), String> {
    let grants = || {
        tools
            .iter()
            .flat_map(|t| t.config.grants.dirs.iter().map(move |d| (&t.name, d)))
    };
    for (outer_tool, outer) in grants().filter(|(_, d)| d.mode() == DirMode::Rw) {
        if let Some((inner_tool, inner)) = grants().find(|(_, d)| outer.contains(d)) {
            return Err(format!(
                "tool {inner_tool:?}: directory {} lies inside tool {outer_tool:?}'s read-write directory {}; \
                 a tool that can write there could replace it with a symlink. Grant the enclosing directory, \
                 or use directories that do not nest",
                inner.host().display(),
                outer.host().display()
            ));
        }
    }
    Ok(())
}

/// Whether `name` is a valid tool name: `^[a-zA-Z0-9_-]{1,64}$`, what
/// OpenAI, Anthropic and MCP clients all accept.
pub fn is_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(0, |before| before.matches('\n').count())
        + 1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    limits: LimitsConfig,
    #[serde(default)]
    context: ContextFile,
    #[serde(default, rename = "tool")]
    tools: Vec<Spanned<ToolFile>>,
    turn: Option<Spanned<TurnFile>>,
    sessions: Option<Spanned<crate::retention::RetentionFile>>,
    oci: Option<Spanned<OciFile>>,
    mcp: Option<Spanned<mcp::McpFile>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TurnFile {
    #[serde(default = "yes")]
    parallel: bool,
    max_parallel: Option<usize>,
    max_calls: Option<usize>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContextFile {
    #[serde(default)]
    hidden: Vec<Spanned<String>>,
    #[serde(default)]
    schema: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolFile {
    path: Option<Spanned<String>>,
    oci: Option<Spanned<String>>,
    verify: Option<Spanned<VerifyFile>>,
    name: Option<String>,
    #[serde(default)]
    approval: Approval,
    #[serde(default)]
    idempotent: bool,
    #[serde(default)]
    scopes: Vec<String>,
    uri_schemes: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    ask: bool,
    sample: Option<Spanned<SampleFile>>,
    functions: Option<Spanned<Vec<String>>>,
    rename: Option<Spanned<BTreeMap<String, String>>>,
    #[serde(default)]
    env: Vec<Spanned<String>>,
    #[serde(default)]
    dirs: Vec<Spanned<DirConfig>>,
    #[serde(default)]
    http: Vec<Spanned<String>>,
    #[serde(default)]
    max_response_bytes: Option<usize>,
    #[serde(default)]
    max_requests: Option<u32>,
    #[serde(default)]
    max_connections: Option<usize>,
    #[serde(default)]
    record: Option<Spanned<bool>>,
    #[serde(default)]
    secrets: Vec<Spanned<SecretConfig>>,
    limits: Option<Spanned<LimitsConfig>>,
    context: Option<Spanned<ToolContextFile>>,
}

/// `sample = { max_tokens, max_requests }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SampleFile {
    max_tokens: Option<u32>,
    max_requests: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolContextFile {
    read: Option<Vec<String>>,
    write: Option<Vec<String>>,
}

type At<'a> = dyn Fn(Option<std::ops::Range<usize>>, String) -> PolicyError + 'a;

impl ToolFile {
    fn resolve(
        self,
        base: &Path,
        defaults: &Limits,
        at: &At<'_>,
        span: std::ops::Range<usize>,
    ) -> Result<ToolPolicy, PolicyError> {
        let (path, oci, default_name) = match (&self.path, &self.oci) {
            (Some(written), None) => {
                let path = crate::fs::tidy_join(base, Path::new(written.get_ref()));
                if !path.is_file() {
                    return Err(at(
                        Some(written.span()),
                        format!(
                            "tool path {:?}: no such file ({})",
                            written.get_ref(),
                            path.display()
                        ),
                    ));
                }
                let name = path.file_name().map_or_else(
                    || written.get_ref().clone(),
                    |n| n.to_string_lossy().into_owned(),
                );
                (path, None, name)
            }
            (None, Some(written)) => {
                let reference: Reference = written
                    .get_ref()
                    .parse()
                    .map_err(|e: InvalidReference| at(Some(written.span()), e.to_string()))?;
                let repositories = match &self.verify {
                    None => Vec::new(),
                    Some(verify) => verify
                        .get_ref()
                        .repositories()
                        .map_err(|e| at(Some(verify.span()), format!("tool {reference}: {e}")))?,
                };
                let keys = match &self.verify {
                    None => Vec::new(),
                    Some(verify) => {
                        let files = verify.get_ref().files();
                        if files.is_empty() {
                            return Err(at(
                                Some(verify.span()),
                                format!("tool {reference}: verify.key lists no key"),
                            ));
                        }
                        files
                            .iter()
                            .map(|file| {
                                PublicKey::load(&crate::fs::tidy_join(base, Path::new(file)))
                            })
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|e| {
                                at(Some(verify.span()), format!("tool {reference}: {e}"))
                            })?
                    }
                };
                let name = reference.to_string();
                (
                    PathBuf::new(),
                    Some(OciTool {
                        reference,
                        keys,
                        repositories,
                    }),
                    name,
                )
            }
            (Some(path), Some(_)) => {
                return Err(at(
                    Some(path.span()),
                    "a tool has `path` or `oci`, not both".into(),
                ));
            }
            (None, None) => {
                return Err(at(
                    Some(span),
                    "a [[tool]] needs `path = \"TOOL.wasm\"` or `oci = \"REGISTRY/REPO:TAG\"`"
                        .into(),
                ));
            }
        };
        if let (Some(verify), None) = (&self.verify, &oci) {
            return Err(at(
                Some(verify.span()),
                "`verify` is for tools named by `oci = \"…\"`: a file on disk carries no signature"
                    .into(),
            ));
        }
        let name = self.name.unwrap_or(default_name);
        let prefix = |m: String| format!("tool {name:?}: {m}");

        let grant_error =
            |span: std::ops::Range<usize>, e: GrantError| at(Some(span), prefix(e.to_string()));
        /// Each entry of a grant list through the grant's own parser; an
        /// error names the entry's line.
        fn each<G: Grant>(
            entries: Vec<Spanned<G::Config>>,
            base: &Path,
            error: &dyn Fn(std::ops::Range<usize>, GrantError) -> PolicyError,
        ) -> Result<Vec<G>, PolicyError> {
            entries
                .into_iter()
                .map(|entry| {
                    let span = entry.span();
                    G::from_config(entry.into_inner(), base).map_err(|e| error(span, e))
                })
                .collect()
        }
        let env_names: Vec<String> = self.env.iter().map(|e| e.get_ref().clone()).collect();
        let env: Vec<EnvGrant> = each(self.env, base, &grant_error)?;
        let dirs: Vec<DirGrant> = each(self.dirs, base, &grant_error)?;
        for secret in &self.secrets {
            if env_names.contains(&secret.get_ref().env) {
                return Err(at(
                    Some(secret.span()),
                    prefix(format!(
                        "{:?} is both a secret and a granted environment variable; secrets never enter the guest",
                        secret.get_ref().env
                    )),
                ));
            }
        }
        let secrets: Vec<SecretGrant> = each(self.secrets, base, &grant_error)?;
        let http_config = HttpConfig {
            allow: self.http.iter().map(|h| h.get_ref().clone()).collect(),
            max_response_bytes: self.max_response_bytes,
            max_requests: self.max_requests,
            max_connections: self.max_connections,
        };
        let record = self.record.as_ref().is_some_and(|r| *r.get_ref());
        if let Some(flag) = &self.record
            && record
            && self.http.is_empty()
            && dirs.is_empty()
            && env.is_empty()
        {
            return Err(at(
                Some(flag.span()),
                prefix(
                    "record = true journals what the tool reads through its grants, but it is \
                     granted no `http` origin, no `dirs` and no `env`"
                        .to_owned(),
                ),
            ));
        }
        let http = HttpGrant::from_config(http_config, base).map_err(|e| {
            // Name the line of the pattern at fault.
            let span = match &e {
                GrantError::HostPattern { pattern, .. } => self
                    .http
                    .iter()
                    .find(|h| h.get_ref() == pattern)
                    .map(Spanned::span),
                _ => None,
            };
            at(span, prefix(e.to_string()))
        })?;

        let limits = match &self.limits {
            None => defaults.clone(),
            Some(limits) => limits
                .get_ref()
                .apply(defaults.clone())
                .map_err(|m| at(Some(limits.span()), prefix(format!("limits: {m}"))))?,
        };

        let (context_span, context) = match self.context {
            None => (None, ToolContextFile::default()),
            Some(c) => (Some(c.span()), c.into_inner()),
        };
        let patterns = |list: Option<Vec<String>>| match list {
            None => Ok(KeyPatterns::all()),
            Some(list) => KeyPatterns::new(&list),
        };
        // `write` defaults to what `read` allows: a tool limited to reading
        // some keys is not silently allowed to overwrite or delete the rest.
        let write = context.write.or_else(|| context.read.clone());
        let access = KeyAccess {
            read: patterns(context.read)
                .map_err(|e| at(context_span.clone(), prefix(format!("context.read: {e}"))))?,
            write: patterns(write)
                .map_err(|e| at(context_span.clone(), prefix(format!("context.write: {e}"))))?,
        };

        let uri_schemes = match self.uri_schemes {
            None => Vec::new(),
            Some(schemes) => {
                let span = schemes.span();
                let schemes = schemes.into_inner();
                if let Some(bad) = schemes.iter().find(|s| !grants::is_uri_scheme(s)) {
                    return Err(at(
                        Some(span),
                        prefix(format!(
                            "uri_schemes: {bad:?} is not a URI scheme (a letter, then letters, digits, `+`, `-` or `.`; no `:`)"
                        )),
                    ));
                }
                schemes
            }
        };

        let sampling = match self.sample {
            None => None,
            Some(sample) => {
                let span = sample.span();
                let sample = sample.into_inner();
                let grant = crate::policy::grants::SampleGrant {
                    max_tokens: sample
                        .max_tokens
                        .unwrap_or(crate::policy::grants::SampleGrant::DEFAULT.max_tokens),
                    max_requests: sample
                        .max_requests
                        .unwrap_or(crate::policy::grants::SampleGrant::DEFAULT.max_requests),
                };
                if grant.max_tokens == 0 || grant.max_requests == 0 {
                    return Err(at(
                        Some(span),
                        prefix("sample: max_tokens and max_requests must be at least 1 (leave `sample` out to allow none)".into()),
                    ));
                }
                Some(grant)
            }
        };

        let rename = match self.rename {
            None => BTreeMap::new(),
            Some(rename) => {
                let span = rename.span();
                let rename = rename.into_inner();
                if let Some((from, to)) = rename.iter().find(|(_, to)| !is_tool_name(to)) {
                    return Err(at(
                        Some(span),
                        prefix(format!(
                            "rename {from:?} = {to:?}: a tool name must match [a-zA-Z0-9_-]{{1,64}}"
                        )),
                    ));
                }
                rename
            }
        };

        Ok(ToolPolicy {
            path,
            name,
            oci,
            pulled: None,
            config: ToolConfig {
                approval: self.approval,
                idempotent: self.idempotent,
                scopes: self.scopes,
                functions: self.functions.map(Spanned::into_inner),
                rename,
                limits,
                grants: Grants {
                    dirs,
                    env,
                    http,
                    secrets,
                    uri_schemes,
                    ask_user: self.ask,
                    sampling,
                    record,
                },
                access,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Policy, PolicyError> {
        let dir = std::env::temp_dir();
        Policy::parse(text, Path::new("airlock.toml"), &dir)
    }

    #[test]
    fn unknown_keys_name_the_line() {
        let err = parse("[limits]\ntimeout_ms = 5\nbogus = 1\n").unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert!(err.to_string().starts_with("airlock.toml:3: "), "{err}");
        assert!(err.message.contains("bogus"), "{err}");
    }

    #[test]
    fn prepared_instances_default_to_one_and_are_bounded() {
        let defaults = |text: &str| {
            LimitsConfig::deserialize(toml::Value::Table(toml::from_str(text).unwrap()))
                .unwrap()
                .apply(Limits::default())
        };
        assert_eq!(defaults("").map(|l| l.prepared_instances), Ok(1));
        assert_eq!(
            defaults("prepared_instances = 0").map(|l| l.prepared_instances),
            Ok(0)
        );
        let err = parse("[limits]\nprepared_instances = 17\n").unwrap_err();
        assert!(
            err.message
                .contains("[limits] prepared_instances (17) is over the maximum of 16"),
            "{err}"
        );
    }

    #[test]
    fn missing_component_names_the_line() {
        let err = parse("\n[[tool]]\npath = \"nope.wasm\"\n").unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert!(err.message.contains("nope.wasm"), "{err}");
    }

    #[test]
    fn a_tool_by_reference_is_checked_where_it_is_written() {
        let policy = parse("[[tool]]\noci = \"ghcr.io/acme/units:1.0\"\n").unwrap();
        let tool = &policy.tools[0];
        assert_eq!(tool.name, "ghcr.io/acme/units:1.0");
        assert!(tool.path.as_os_str().is_empty() && tool.pulled.is_none());
        for (text, line, says) in [
            ("[[tool]]\noci = \"units:1.0\"\n", 2, "name the registry"),
            ("[[tool]]\nname = \"x\"\n", 1, "needs `path"),
            (
                "[[tool]]\npath = \"a.wasm\"\noci = \"r.example/a:1\"\n",
                2,
                "not both",
            ),
            (
                "[[tool]]\noci = \"r.example/a:1\"\nverify = { key = [] }\n",
                3,
                "lists no key",
            ),
            (
                "[[tool]]\noci = \"r.example/a:1\"\nverify = { key = \"none.pub\" }\n",
                3,
                "none.pub",
            ),
            ("[oci]\nmax_layer_bytes = 0\n", 1, "max_layer_bytes"),
            ("[oci]\nbogus = 1\n", 2, "bogus"),
            (
                "[oci]\nrequire_signature = true\n[[tool]]\noci = \"r.example/a:1\"\n",
                3,
                "require_signature",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert_eq!(err.line, Some(line), "{text}: {err}");
            assert!(err.message.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn verify_is_for_tools_by_reference() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("t.wasm"), b"").unwrap();
        let text = "[[tool]]\npath = \"t.wasm\"\nverify = { key = \"k.pub\" }\n";
        let err = Policy::parse(text, Path::new("airlock.toml"), dir.path()).unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert!(err.message.contains("carries no signature"), "{err}");
    }

    #[test]
    fn empty_policy_grants_nothing() {
        let policy = parse("").unwrap();
        assert!(policy.tools.is_empty());
        assert!(!policy.context.is_hidden("anything"));
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    /// A value of some TOML type, right for some keys and wrong for others.
    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("0".to_owned()),
            Just("-1".to_owned()),
            Just("18446744073709551615".to_owned()),
            Just("1e400".to_owned()),
            Just("true".to_owned()),
            "\"[a-z*./:_\\-]{0,12}\"",
            Just("[]".to_owned()),
            Just("[\"*\", \"https://x.example\"]".to_owned()),
            Just("{}".to_owned()),
            Just("{ type = 12 }".to_owned()),
            Just("{ host = \".\", guest = \"/d\", mode = \"rw\" }".to_owned()),
            Just("[{ env = \"X\", hosts = [\"h\"] }]".to_owned()),
            Just("{ read = [\"[\"], write = [] }".to_owned()),
        ]
    }

    fn key() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "path",
            "name",
            "approval",
            "env",
            "dirs",
            "http",
            "secrets",
            "limits",
            "context",
            "max_response_bytes",
            "timeout_ms",
            "memory_mb",
            "fuel",
            "max_ops",
            "hidden",
            "schema.k",
            "bogus",
        ])
        .prop_map(str::to_owned)
    }

    fn document() -> impl Strategy<Value = String> {
        let line = (key(), value()).prop_map(|(k, v)| format!("{k} = {v}"));
        let table = prop::sample::select(vec!["", "[limits]", "[context]", "[[tool]]", "[tool]"]);
        prop::collection::vec((table, prop::collection::vec(line, 0..4)), 0..4).prop_map(
            |sections| {
                sections
                    .into_iter()
                    .map(|(table, lines)| format!("{table}\n{}\n", lines.join("\n")))
                    .collect()
            },
        )
    }

    proptest! {
        /// Random text and random documents over the policy's own keys:
        /// a policy or an error naming the file, never a panic.
        #[test]
        fn parse_never_panics(text in prop_oneof!["\\PC{0,60}", document()]) {
            let dir = std::env::temp_dir();
            if let Err(e) = Policy::parse(&text, Path::new("airlock.toml"), &dir) {
                prop_assert!(e.to_string().starts_with("airlock.toml"), "{}", e);
            }
        }
    }
}
