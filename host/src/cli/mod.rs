//! The `airlock` commands.
//!
//! Exit codes: 0 success; 1 the tool ran and its call failed (a tool
//! error, a trap, a limit, rejected ops); 2 bad input (usage, a file that
//! cannot be loaded, JSON that does not parse, an unknown tool, arguments the
//! tool refused); 3 an internal error.

mod call;
mod inspect;
mod run;
mod terminal;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use serde_json::{Value, json};

use airlock::context::DepsError;
use airlock::policy::Policy;
use airlock::{CallError, CallFailure, Host, LoadError, RunContext};

pub const EXIT_TOOL_FAILED: u8 = 1;
pub const EXIT_INPUT: u8 = 2;
pub const EXIT_INTERNAL: u8 = 3;

/// Run untrusted LLM-agent tools as sandboxed WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "airlock", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the tools a component exports and what it imports.
    Inspect(inspect::InspectArgs),
    /// Call one tool once and show its result, ops and the new deps.
    Call(call::CallArgs),
    /// Run an agent: a model that calls the tools until it answers.
    Run(run::RunArgs),
}

pub async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Inspect(args) => inspect::run(args).await,
        Command::Call(args) => call::run(args).await,
        Command::Run(args) => run::run(args).await,
    }
}

/// A failure as the CLI reports it: a kind for `--json`, a message, and an
/// exit code.
#[derive(Debug)]
pub struct Failure {
    pub kind: &'static str,
    pub message: String,
    pub exit: u8,
}

impl Failure {
    fn input(kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            exit: EXIT_INPUT,
        }
    }

    fn to_json(&self) -> Value {
        json!({"kind": self.kind, "message": self.message})
    }
}

impl From<LoadError> for Failure {
    fn from(e: LoadError) -> Self {
        let kind = match e {
            LoadError::Read { .. } => "file_not_readable",
            LoadError::NotWasm { .. } | LoadError::CoreModule { .. } => "not_a_component",
            LoadError::Invalid { .. } => "invalid_component",
            LoadError::Incompatible { .. } => "incompatible_component",
            LoadError::Describe { .. } | LoadError::BadSpec { .. } => "bad_describe",
            LoadError::DuplicateTool { .. } => "duplicate_tool",
            LoadError::PoolShare { .. } => "too_large_for_pool",
            LoadError::UnsafeCache(_) => "unsafe_cache",
            LoadError::CompileLimit { .. } => "compile_limit",
            LoadError::FuelNotMetered { .. } | LoadError::BadLimits { .. } => "invalid_config",
            _ => {
                return Self {
                    kind: "internal",
                    message: e.to_string(),
                    exit: EXIT_INTERNAL,
                };
            }
        };
        Self::input(kind, e.to_string())
    }
}

impl From<CallError> for Failure {
    fn from(e: CallError) -> Self {
        let exit = match e {
            CallError::UnknownTool { .. }
            | CallError::BadArguments(_)
            | CallError::InvalidArgs(_)
            | CallError::Grant(_) => EXIT_INPUT,
            _ => EXIT_TOOL_FAILED,
        };
        Self {
            kind: e.kind(),
            message: e.to_string(),
            exit,
        }
    }
}

impl From<CallFailure> for Failure {
    fn from(f: CallFailure) -> Self {
        f.error.into()
    }
}

/// The flags every command that runs tools takes: the starting context,
/// the policy, and the output form.
#[derive(Debug, Args)]
pub struct RunFlags {
    /// The operator's policy: the tools to load, what each may do, the
    /// context rules. Without it, a tool gets nothing.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Starting deps: inline JSON (`{...}`) or a JSON file. Default `{}`.
    #[arg(long, value_name = "FILE_OR_JSON")]
    deps: Option<String>,
    /// Write the deps at the end to FILE (atomically). Unchanged when a
    /// call fails.
    #[arg(long, value_name = "FILE")]
    save_deps: Option<PathBuf>,
    /// Continue this session instead of starting a new one.
    #[arg(long)]
    session_id: Option<String>,
    /// The end user the run is for.
    #[arg(long)]
    user_id: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

impl RunFlags {
    /// The starting context: deps, session and user.
    fn context(&self) -> Result<RunContext, Failure> {
        let mut ctx = read_deps(self.deps.as_deref().unwrap_or("{}"))?;
        if let Some(id) = &self.session_id {
            ctx = ctx.with_session_id(id.as_str());
        }
        if let Some(id) = &self.user_id {
            ctx = ctx.with_user_id(id.as_str());
        }
        Ok(ctx)
    }
}

/// Reports a failure the way every command does: with `--json`, one object
/// `{"ok": false, "error": {kind, message}, ...extra}` on stdout; otherwise
/// one `error:` line on stderr. Returns the failure's exit code.
fn report_failure(
    failure: &Failure,
    json: bool,
    extra: serde_json::Map<String, Value>,
) -> ExitCode {
    if json {
        let mut doc = serde_json::Map::new();
        doc.insert("ok".into(), Value::Bool(false));
        doc.insert("error".into(), failure.to_json());
        doc.extend(extra);
        print_json(&Value::Object(doc));
    } else {
        print_error(&failure.message);
    }
    ExitCode::from(failure.exit)
}

/// Writes `ctx`'s deps to `path` as pretty JSON, atomically.
fn save_deps(path: &Path, ctx: &RunContext) -> Result<(), Failure> {
    let mut text = serde_json::to_vec_pretty(ctx.deps())
        .map_err(|e| Failure::input("save_deps", format!("--save-deps {}: {e}", path.display())))?;
    text.push(b'\n');
    airlock::fs::write_atomic(path, &text)
        .map_err(|e| Failure::input("save_deps", format!("--save-deps {}: {e}", path.display())))
}

/// Prints an error the way every command does: one `error:` line on
/// stderr, plus any lines the message carries, indented so that none can
/// pass for a line of the CLI's own. Control characters are escaped.
pub fn print_error(e: &dyn std::fmt::Display) {
    let text = e.to_string();
    let text = terminal::shown(&text).replace('\n', "\n  ");
    #[allow(clippy::print_stderr)]
    {
        eprintln!("error: {text}");
    }
}

/// Writes text to stdout, control characters escaped. The one place the CLI
/// prints results as text.
pub fn print_out(text: &str) {
    #[allow(clippy::print_stdout)]
    {
        println!("{}", terminal::shown(text));
    }
}

/// Writes `value` to stdout as one line of JSON (exact JSON, with the
/// characters a terminal acts on written as escapes).
pub fn print_json(value: &Value) {
    #[allow(clippy::print_stdout)]
    {
        println!("{}", terminal::json(&value.to_string()));
    }
}

/// How long a first compile may take before the CLI says what it is doing.
const COMPILE_NOTICE_AFTER: std::time::Duration = std::time::Duration::from_millis(500);

/// One compilation the CLI may announce.
#[derive(Debug, Default)]
struct CompileNotice {
    finished: std::sync::atomic::AtomicBool,
    announced: std::sync::atomic::AtomicBool,
}

/// The policy at `config`, if given.
fn load_policy(config: Option<&Path>) -> Result<Option<Policy>, Failure> {
    config
        .map(Policy::load)
        .transpose()
        .map_err(|e| Failure::input("invalid_config", e.to_string()))
}

/// A host builder whose first-time compilations that take more than a
/// moment are announced on stderr (stdout stays clean for `--json`).
fn host_builder() -> airlock::HostBuilder {
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex};

    // Components load one at a time, so one slot suffices.
    let current: Arc<Mutex<Option<Arc<CompileNotice>>>> = Arc::default();
    let mut builder = Host::builder();
    if let Some(compiler) = child_compiler() {
        builder = builder.compiler(compiler);
    }
    builder.on_compile(move |progress| match progress {
        airlock::tools::CompileProgress::Started { path } => {
            let state = Arc::new(CompileNotice::default());
            if let Ok(mut slot) = current.lock() {
                *slot = Some(Arc::clone(&state));
            }
            let shown = path.display().to_string();
            std::thread::spawn(move || {
                std::thread::sleep(COMPILE_NOTICE_AFTER);
                if !state.finished.load(Ordering::SeqCst) {
                    state.announced.store(true, Ordering::SeqCst);
                    print_note(&format!(
                        "compiling {shown} (first use; later runs load it from the cache)..."
                    ));
                }
            });
        }
        airlock::tools::CompileProgress::Finished { path, took } => {
            let state = current.lock().ok().and_then(|mut slot| slot.take());
            if let Some(state) = state {
                state.finished.store(true, Ordering::SeqCst);
                if state.announced.load(Ordering::SeqCst) {
                    print_note(&format!(
                        "compiled {} in {:.1} s",
                        path.display(),
                        took.as_secs_f64()
                    ));
                }
            }
        }
    })
}

/// Compiling in a bounded child process of this binary:
/// `AIRLOCK_COMPILE_TIMEOUT_MS` (default 120,000) and
/// `AIRLOCK_COMPILE_MEMORY_MB` (default 4,096) set the bounds. `None` (and
/// compiling in this process) only if this binary's path is unknown.
fn child_compiler() -> Option<airlock::sandbox::Compiler> {
    let exe = std::env::current_exe().ok()?;
    let mut limits = airlock::sandbox::CompileLimits::default();
    let number = |name: &str| {
        let text = std::env::var(name).ok()?;
        let parsed = text.parse::<u64>().ok().filter(|n| *n > 0);
        if parsed.is_none() {
            tracing::warn!("{name} is not a positive whole number; using the default");
        }
        parsed
    };
    if let Some(ms) = number("AIRLOCK_COMPILE_TIMEOUT_MS") {
        limits.timeout = std::time::Duration::from_millis(ms);
    }
    if let Some(mb) = number("AIRLOCK_COMPILE_MEMORY_MB") {
        limits.max_memory_bytes = mb.saturating_mul(1 << 20);
    }
    Some(airlock::sandbox::Compiler::Child { exe, limits })
}

/// A progress note on stderr.
fn print_note(text: &str) {
    #[allow(clippy::print_stderr)]
    {
        eprintln!("airlock: {}", terminal::field(text));
    }
}

/// Builds a host and loads the component at `path` under the policy at
/// `config`. A component the policy does not list, or any component without
/// a policy, gets nothing beyond the default limits.
async fn load_host(path: &Path, config: Option<&Path>) -> Result<Host, Failure> {
    let Some(policy) = load_policy(config)? else {
        let mut host = host_builder().build()?;
        host.load(path).await?;
        return Ok(host);
    };
    let scoped = policy.restricted_to(path);
    let mut host = host_builder().build_with_policy(&scoped).await?;
    if scoped.tools.is_empty() {
        tracing::warn!(
            "{} does not list {}; it gets nothing",
            policy.source.display(),
            path.display()
        );
        host.load(path).await?;
    }
    Ok(host)
}

/// `--deps` takes inline JSON (starting with `{` or `[`) or a file path.
fn read_deps(arg: &str) -> Result<RunContext, Failure> {
    let (text, origin) = if arg.trim_start().starts_with(['{', '[']) {
        (arg.to_owned(), "--deps".to_owned())
    } else {
        let path = PathBuf::from(arg);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Failure::input(
                "invalid_deps",
                format!("--deps {}: cannot read: {e}", path.display()),
            )
        })?;
        (text, format!("--deps {}", path.display()))
    };
    RunContext::from_json(&text)
        .map_err(|e: DepsError| Failure::input("invalid_deps", format!("{origin}: {e}")))
}

/// JSON for humans: one line if short, indented otherwise.
fn show_json(value: &Value) -> String {
    let line = value.to_string();
    if line.len() <= 100 {
        line
    } else {
        serde_json::to_string_pretty(value).unwrap_or(line)
    }
}
