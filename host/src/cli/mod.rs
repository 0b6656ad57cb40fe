//! The `airlock` commands.
//!
//! Exit codes: 0 success; 1 the tool ran and its call failed (a tool
//! error, a trap, a limit, rejected ops), its person rejected it, or a
//! replayed call differs or fails; 2 bad input (usage, a file that
//! cannot be loaded, JSON that does not parse, an unknown tool, arguments the
//! tool refused, an unknown session); 3 an internal error (the session
//! store failed); 4 the session is in use by another run.

mod call;
mod compare;
mod inspect;
mod mcp;
mod oci;
mod replay;
mod run;
mod sessions;
mod terminal;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use serde_json::{Value, json};

use airlock::context::DepsError;
use airlock::oci::Resolved;
use airlock::policy::Policy;
use airlock::retention::Retention;
use airlock::session::{
    Durability, PostgresStore, SessionError, SessionStore, StoreError, is_postgres_url,
};
use airlock::tools::LoadedComponent;
use airlock::{
    CallError, CallFailure, Host, LoadError, RunContext, Session, SessionOptions, SqliteStore,
};

pub use oci::{ComponentArg, RegistryFlags};

pub const EXIT_TOOL_FAILED: u8 = 1;
pub const EXIT_INPUT: u8 = 2;
pub const EXIT_INTERNAL: u8 = 3;
pub const EXIT_IN_USE: u8 = 4;

/// Run untrusted LLM-agent tools as sandboxed WebAssembly components.
/// What `airlock --help` adds after the commands: exit codes and the
/// environment (`-h` leaves it out).
const LONG_HELP: &str = "\
Exit codes:
  0    success
  1    the tool ran and failed, or you rejected it (call); the run failed (run: a model error,
       --max-iterations); a replayed call differs or fails (replay, pull --update --replay)
  2    bad input: a file, argument, policy, component, deps, store or session that cannot be used
  3    internal error (the session store failed)
  4    the session is in use by another run (its lease expires unless renewed)
  130  cancelled (Ctrl-C or SIGTERM; the tool in flight is stopped, the session saved)

Environment:
  AIRLOCK_STORE               the session store (--store): a SQLite file or a postgres:// URL
  AIRLOCK_DATA_DIR            where the default store sessions.db lives (else ~/.local/share/airlock)
  AIRLOCK_STORE_SYNC          which commits wait for the disk (else the policy's [sessions] sync):
                              by-effect (default), every-call, or never
  AIRLOCK_LEASE_TTL_MS        how long a session's lease outlives its holder's last renewal (30000)
  AIRLOCK_SNAPSHOT_EVERY      records between a session's snapshots (32; 0: none)
  AIRLOCK_CACHE_DIR           the compile cache (else ~/.cache/airlock)
  AIRLOCK_COMPILE_CPU_MS      how much CPU time compiling a component may take (10 s and 3 s per MiB)
  AIRLOCK_COMPILE_MEMORY_MB   how much memory compiling may take (256 MiB and 48 bytes per byte)
  AIRLOCK_BASELINE_FIRST      from what size (bytes) a first use runs on quickly compiled code while
                              the optimised code compiles into the cache (4194304; off: never)
  AIRLOCK_OCI_DIR             the store of components pulled from registries (else oci/ in the cache)
  AIRLOCK_REGISTRY            the registry (HOST[:PORT]) the three below are for, and no other
  AIRLOCK_REGISTRY_USERNAME   its user and password (or AIRLOCK_REGISTRY_TOKEN), before the
  AIRLOCK_REGISTRY_PASSWORD   docker config's auths
  AIRLOCK_REGISTRY_TOKEN
  OPENAI_API_KEY              --model openai:…; OPENAI_BASE_URL for another OpenAI-compatible server
  OPENAI_BASE_URL
  ANTHROPIC_API_KEY           --model anthropic:…; ANTHROPIC_BASE_URL for another endpoint
  ANTHROPIC_BASE_URL
  RUST_LOG                    tracing on stderr: a bare level is Airlock's own (debug, info, …);
                              name a target to hear a library (wasmtime=debug)";

#[derive(Debug, Parser)]
#[command(name = "airlock", version, about, after_long_help = LONG_HELP)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

impl Cli {
    /// Parses the command line, with help texts that are each command's
    /// own where a shared flag means something different in each.
    pub fn parse_with_help() -> Self {
        use clap::FromArgMatches;
        let matches = Self::command_with_help().get_matches();
        match Self::from_arg_matches(&matches) {
            Ok(cli) => cli,
            Err(e) => e.exit(),
        }
    }

    /// Whether the command is best served by a runtime of one thread: it
    /// waits on one client, one request after another, so every thread it
    /// would wake on the way to an answer is time (`airlock mcp` over
    /// stdio: docs/performance.md, "The MCP layer"). Instances prepared
    /// ahead are still made on a thread of their own.
    pub fn one_thread(&self) -> bool {
        matches!(&self.command, Command::Mcp(args) if args.over_stdio())
    }

    /// The command, with `--session`'s help said for each subcommand.
    pub fn command_with_help() -> clap::Command {
        use clap::CommandFactory;
        let session = [
            (
                "call",
                "Commit the call to this stored session (created if it does not exist) and take the \
                 deps from it. Without it, nothing is stored",
            ),
            (
                "run",
                "Continue this session (created if it does not exist). Without it, the run starts a \
                 new session (shown as `session: ID (new)` before the first turn, and as \
                 `session_id` in --json)",
            ),
            (
                "mcp",
                "Serve this session over stdio (created if it does not exist); without it, a new \
                 one. Not for --transport http, where each MCP session gets its own Airlock \
                 session or names one in _meta \"airlock/session\"",
            ),
        ];
        let mut command = Self::command().long_version(long_version());
        for (name, help) in session {
            command = command.mut_subcommand(name, |c| c.mut_arg("id", |a| a.help(help)));
        }
        command
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the tools a component exports and what it imports.
    Inspect(inspect::InspectArgs),
    /// Call one tool once and show its result, ops and the new deps.
    Call(call::CallArgs),
    /// Run an agent: a model that calls the tools until it answers.
    Run(run::RunArgs),
    /// Serve the tools to MCP clients (stdio or streamable HTTP), on durable
    /// sessions.
    Mcp(mcp::McpArgs),
    /// Manage the session store: list, show, export, import, fork, remove
    /// and prune sessions.
    #[command(subcommand)]
    Sessions(sessions::SessionsCommand),
    /// Replay the journaled calls of a tool against another version of it
    /// and show what differs (nothing is written).
    Replay(replay::ReplayArgs),
    /// Fetch components named by reference into the local store, check
    /// their signatures, and pin them in airlock.lock.
    Pull(oci::PullArgs),
    /// Publish a component to an OCI registry (the wasm artifact layout).
    Push(oci::PushArgs),
    /// Sign a published component (cosign-compatible, key-based).
    Sign(oci::SignArgs),
    /// Make a key pair to sign components with.
    Keygen(oci::KeygenArgs),
    /// Print a completion script for a shell: `source <(airlock
    /// completions bash)`.
    Completions(CompletionsArgs),
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

pub async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Inspect(args) => inspect::run(args).await,
        Command::Call(args) => call::run(args).await,
        Command::Run(args) => run::run(args).await,
        Command::Mcp(args) => mcp::run(args).await,
        Command::Sessions(command) => sessions::run(command).await,
        Command::Replay(args) => replay::run(args).await,
        Command::Pull(args) => oci::pull(args).await,
        Command::Push(args) => oci::push(args).await,
        Command::Sign(args) => oci::sign(args).await,
        Command::Keygen(args) => oci::keygen(args),
        Command::Completions(args) => {
            let mut command = Cli::command_with_help();
            let mut script = Vec::new();
            clap_complete::generate(args.shell, &mut command, "airlock", &mut script);
            use std::io::Write as _;
            let _ = std::io::stdout().write_all(&script);
            ExitCode::SUCCESS
        }
    }
}

/// `airlock --version`: Airlock's version, the wasmtime it runs on, and
/// the WIT package versions whose components it loads.
fn long_version() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        format!(
            "{}\nwasmtime {}\nWIT airlock:tool@{} (components built against any airlock:tool@0.1.x load)",
            env!("CARGO_PKG_VERSION"),
            airlock::WASMTIME_VERSION,
            airlock::tools::WIT_VERSION
        )
    })
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

    /// A failure that is not the input's fault (exit 1).
    fn internal(message: impl Into<String>) -> Self {
        Self {
            kind: "internal",
            message: message.into(),
            exit: EXIT_INTERNAL,
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
            LoadError::NoTools { .. } => "no_usable_function",
            LoadError::OffersTooMuch { .. } => "offers_too_much",
            LoadError::Selection { .. } => "invalid_config",
            LoadError::PoolShare { .. } => "too_large_for_pool",
            LoadError::UnsafeCache(_) => "unsafe_cache",
            LoadError::CompileLimit { .. } => "compile_limit",
            LoadError::FuelNotMetered { .. } | LoadError::BadLimits { .. } => "invalid_config",
            LoadError::NotPulled { .. } => "not_pulled",
            LoadError::AddressSpace(_) => "address_space",
            _ => return Self::internal(e.to_string()),
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
            kind: e.kind().as_str(),
            message: e.to_string(),
            exit,
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        let exit = match e {
            StoreError::InUse { .. } => EXIT_IN_USE,
            StoreError::NotFound { .. }
            | StoreError::AlreadyExists { .. }
            | StoreError::NotAStore { .. }
            | StoreError::Corrupt { .. } => EXIT_INPUT,
            _ => EXIT_INTERNAL,
        };
        Self {
            kind: e.kind().as_str(),
            message: e.to_string(),
            exit,
        }
    }
}

impl From<SessionError> for Failure {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::Store(e) => e.into(),
            other => Self::input(other.kind().as_str(), other.to_string()),
        }
    }
}

impl From<CallFailure> for Failure {
    /// The call's error, and what the host refused it with why.
    fn from(f: CallFailure) -> Self {
        let mut failure = Failure::from(f.error);
        failure.message = airlock::tools::with_refusals(failure.message, &f.output);
        failure
    }
}

/// The flags every command that runs tools takes: the policy, the
/// session, and the output form.
#[derive(Debug, Args)]
pub struct RunFlags {
    /// The operator's policy: the tools to load, what each may do, the
    /// context rules. Without it, a tool gets nothing.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    registry: RegistryFlags,
    #[command(flatten)]
    session: SessionFlags,
    /// Write the deps at the end to FILE (atomically), without hidden or
    /// secret-looking keys. Unchanged when a call fails.
    #[arg(long, value_name = "FILE")]
    save_deps: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The session a command works on: its starting deps, its id, the store.
#[derive(Debug, Args)]
pub struct SessionFlags {
    /// Starting deps: inline JSON (`{...}`), `-` for standard input, or a
    /// JSON file. Default `{}`.
    /// On an existing session, these keys are laid over its stored deps.
    #[arg(long, value_name = "FILE_OR_JSON")]
    deps: Option<String>,
    /// Work on this session (created if it does not exist). Each command
    /// says what it does without it ([`Cli::command_with_help`]).
    #[arg(long = "session", alias = "session-id", value_name = "ID")]
    id: Option<String>,
    #[command(flatten)]
    store: StoreFlags,
}

/// Which store, and whose sessions in it.
#[derive(Debug, Args)]
pub struct StoreFlags {
    /// The user whose sessions these are. Sessions of one user are never
    /// visible to another; without it, the anonymous bucket (a bucket of
    /// its own).
    #[arg(long, alias = "user-id", value_name = "USER")]
    user: Option<String>,
    /// The session store: a SQLite file (`sqlite:FILE` too, as messages
    /// name it), or a Postgres database that several hosts share
    /// (`postgres://user:password@host:port/db`).
    /// Default `$AIRLOCK_DATA_DIR/sessions.db`, else
    /// `~/.local/share/airlock/sessions.db`.
    #[arg(
        long,
        env = "AIRLOCK_STORE",
        value_name = "FILE_OR_URL",
        hide_env_values = true
    )]
    store: Option<String>,
}

impl StoreFlags {
    /// Opens the store, its commits waiting for the disk by effect
    /// ([`Durability::ByEffect`]) unless `AIRLOCK_STORE_SYNC` says
    /// otherwise.
    async fn open(&self) -> Result<Arc<dyn SessionStore>, Failure> {
        self.open_synced(None).await
    }

    /// [`StoreFlags::open`], its commits waiting for the disk as `sync`
    /// (the policy's `[sessions] sync`) says; `AIRLOCK_STORE_SYNC`, when
    /// set, says it for this process instead.
    async fn open_synced(
        &self,
        sync: Option<Durability>,
    ) -> Result<Arc<dyn SessionStore>, Failure> {
        let durability = match std::env::var("AIRLOCK_STORE_SYNC") {
            Ok(name) => Durability::from_name(&name).ok_or_else(|| {
                Failure::input(
                    "invalid_config",
                    format!(
                        "AIRLOCK_STORE_SYNC is not one of {}",
                        Durability::ALL.map(Durability::name).join(", ")
                    ),
                )
            })?,
            Err(_) => sync.unwrap_or_default(),
        };
        if let Some(url) = self.store.as_deref().filter(|s| is_postgres_url(s)) {
            let store = PostgresStore::connect(url).await?;
            return Ok(Arc::new(store.with_durability(durability)));
        }
        let path = self.sqlite_path()?;
        Ok(Arc::new(SqliteStore::open_with(path, durability)?))
    }

    /// [`StoreFlags::open`] for a command that only reads or removes:
    /// `None` (and nothing made) when the store is a SQLite file that does
    /// not exist yet; the store's name for messages either way.
    async fn open_existing(&self) -> Result<(Option<Arc<dyn SessionStore>>, String), Failure> {
        if !self.store.as_deref().is_some_and(is_postgres_url) {
            let path = self.sqlite_path()?;
            if !path.exists() {
                return Ok((None, format!("sqlite:{}", path.display())));
            }
        }
        let store = self.open().await?;
        let location = store.location();
        Ok((Some(store), location))
    }

    /// [`StoreFlags::open_existing`] for a command that reads sessions:
    /// a store that does not exist yet holds none, and reading makes no
    /// store. It fails, naming the store, with session `named` of `owner`
    /// not found when one is named, else with `nothing` (what the command
    /// has to say when there is no session at all).
    async fn open_to_read(
        &self,
        named: Option<&str>,
        owner: Option<&str>,
        nothing: impl FnOnce(&str) -> Failure,
    ) -> Result<Arc<dyn SessionStore>, Failure> {
        let (store, location) = self.open_existing().await?;
        store.ok_or_else(|| match named {
            Some(id) => not_in_a_new_store(id, owner, &location),
            None => nothing(&location),
        })
    }

    /// The SQLite file the store is: `--store` (a path, or `sqlite:PATH`
    /// as messages name it), or the default.
    fn sqlite_path(&self) -> Result<PathBuf, Failure> {
        Ok(match &self.store {
            Some(store) => {
                let path = airlock::session::sqlite_file(store).to_path_buf();
                if path.as_os_str().is_empty() {
                    return Err(Failure::input(
                        "no_store",
                        format!("--store {store:?} names no file"),
                    ));
                }
                // A directory named by hand must be there: a typo should not
                // quietly make a new tree with an empty store in it. Only the
                // default location is made when missing.
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
                    && !dir.is_dir()
                {
                    let (path, dir_name) = (path.display(), dir.display());
                    let why = if dir.exists() {
                        format!("--store {path}: {dir_name} is not a directory")
                    } else {
                        format!(
                            "--store {path}: the directory {dir_name} does not exist; create it first"
                        )
                    };
                    return Err(Failure::input("store_dir_missing", why));
                }
                path
            }
            None => airlock::session::default_store_path().ok_or_else(|| {
                Failure::input(
                    "no_store",
                    "no data directory is known: set AIRLOCK_DATA_DIR or pass --store FILE",
                )
            })?,
        })
    }

    /// The owner, checked.
    fn owner(&self) -> Result<Option<&str>, Failure> {
        if let Some(user) = &self.user {
            airlock::session::check_user_id(user)
                .map_err(|e| Failure::input("invalid_id", e.to_string()))?;
        }
        Ok(self.user.as_deref())
    }
}

impl SessionFlags {
    /// The starting deps given by `--deps`, if any.
    fn deps(&self) -> Result<Option<serde_json::Map<String, Value>>, Failure> {
        let Some(arg) = self.deps.as_deref() else {
            return Ok(None);
        };
        let ctx = read_deps(arg)?;
        Ok(Some(ctx.deps().clone()))
    }

    /// Checks the flags without opening anything, so that a bad id or bad
    /// deps cost no compile.
    fn check(&self) -> Result<(), Failure> {
        self.deps()?;
        self.store.owner()?;
        if let Some(id) = &self.id {
            airlock::session::check_session_id(id)
                .map_err(|e| Failure::input("invalid_id", e.to_string()))?;
        }
        Ok(())
    }

    /// Opens (or creates) the session in the store: the user, the id, the
    /// starting deps, the lease's length (`AIRLOCK_LEASE_TTL_MS`, default
    /// 30 s), how often it is snapshotted (`AIRLOCK_SNAPSHOT_EVERY`
    /// records, default 32, 0 for never); what it writes leaves out
    /// `host`'s hidden keys.
    async fn open(&self, host: &Host) -> Result<Session, Failure> {
        self.open_kept(host, false, &Retention::default()).await
    }

    /// [`SessionFlags::open`], first pruning what `retention` no longer
    /// keeps (when it has a `ttl`; a failed prune is logged, the session
    /// still opens); a new session is ephemeral when `ephemeral_unless_named`
    /// and no `--session` was given.
    async fn open_kept(
        &self,
        host: &Host,
        ephemeral_unless_named: bool,
        retention: &Retention,
    ) -> Result<Session, Failure> {
        let store = self.store.open_synced(retention.sync).await?;
        enforce_retention(store.as_ref(), retention).await;
        let mut options = self.options()?;
        options.ephemeral = ephemeral_unless_named && self.id.is_none();
        Ok(Session::open(store, options, host.context_rules()).await?)
    }

    /// The options [`SessionFlags::open`] opens with.
    fn options(&self) -> Result<SessionOptions, Failure> {
        let mut options = SessionOptions {
            user_id: self.store.owner()?.map(str::to_owned),
            session_id: self.id.clone(),
            deps: self.deps()?,
            ..SessionOptions::default()
        };
        if let Some(ms) = env_number("AIRLOCK_LEASE_TTL_MS", 1) {
            options.lease_ttl = std::time::Duration::from_millis(ms);
        }
        if let Some(every) = env_number("AIRLOCK_SNAPSHOT_EVERY", 0) {
            options.snapshot_every = every;
        }
        Ok(options)
    }

    /// A context that is not stored: `--deps`, a fresh session id (or the
    /// one given), and the user.
    fn context(&self) -> Result<RunContext, Failure> {
        let mut ctx = read_deps(self.deps.as_deref().unwrap_or("{}"))?;
        if let Some(id) = &self.id {
            ctx = ctx.with_session_id(id.as_str());
        }
        if let Some(user) = self.store.owner()? {
            ctx = ctx.with_user_id(user);
        }
        Ok(ctx)
    }
}

/// Deps as the CLI shows and saves them: hidden (by `host`'s policy) and
/// secret-looking keys removed.
fn shown_deps(ctx: &RunContext, host: &Host) -> Value {
    Value::Object(airlock::journal::secrets::scrub_deps(
        ctx.deps(),
        host.context_rules(),
    ))
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

/// `id` as a session id a command names: one that no session could have
/// (empty, too long, characters ids never hold) is refused as such, not
/// looked for ("no session").
fn checked_session_id(id: &str) -> Result<(), Failure> {
    airlock::session::check_session_id(id).map_err(|e| {
        Failure::input(
            "invalid_session_id",
            format!("{e} ({:?})", airlock::text::truncate(id, 64)),
        )
    })
}

/// Session `id` of `owner` not found in the store at `location`, which
/// does not exist yet.
fn not_in_a_new_store(id: &str, owner: Option<&str>, location: &str) -> Failure {
    let mut failure = Failure::from(StoreError::NotFound {
        session_id: id.to_owned(),
    });
    failure.message = format!(
        "{} ({}) in {location}: the store does not exist yet",
        failure.message,
        whose(owner)
    );
    failure
}

/// Whose a session is, for a message: `of user "ann"`, `with no user`.
fn whose(owner: Option<&str>) -> String {
    owner.map_or("with no user".to_owned(), |u| format!("of user {u:?}"))
}

impl RunFlags {
    /// Refuses, before anything runs, a `--save-deps` that cannot name a
    /// file (a directory): a call that ran is not made to fail after.
    fn check_save_deps(&self) -> Result<(), Failure> {
        match &self.save_deps {
            Some(path) => airlock::fs::names_a_file(path).map_err(|e| save_deps_error(path, e)),
            None => Ok(()),
        }
    }
}

fn save_deps_error(path: &Path, e: impl std::fmt::Display) -> Failure {
    Failure::input("save_deps", format!("--save-deps {}: {e}", path.display()))
}

/// Writes `deps` to `path` as pretty JSON, atomically.
fn save_deps(path: &Path, deps: &Value) -> Result<(), Failure> {
    let mut text = serde_json::to_vec_pretty(deps).map_err(|e| save_deps_error(path, e))?;
    text.push(b'\n');
    airlock::fs::write_atomic(path, &text).map_err(|e| save_deps_error(path, e))
}

/// A future that resolves when the command is asked to stop: Ctrl-C
/// (SIGINT), or SIGTERM, what `docker stop`, systemd and Kubernetes send.
/// Both stop a command the same way. (A container's PID 1 that does not
/// listen for SIGTERM ignores it, and is killed 10 s later.) Both are
/// listened for from this call on, before the future is first polled, so a
/// signal sent as soon as the command says it is ready is not missed. An
/// error: they cannot be listened for.
pub(crate) fn stop_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

/// Prints an error the way every command does: one `error:` line on
/// stderr, plus any lines the message carries, indented so that none can
/// pass for a line of the CLI's own. Control characters are escaped;
/// `error:` is bold red when stderr is a terminal, as clap writes its own.
pub fn print_error(e: &dyn std::fmt::Display) {
    let text = e.to_string();
    let text = terminal::shown(&text).replace('\n', "\n  ");
    write_line(
        &mut std::io::stderr(),
        &format!("{} {text}", terminal::error_label()),
    );
}

/// Writes text to stdout, control characters escaped. The one place the CLI
/// prints results as text.
pub fn print_out(text: &str) {
    write_stdout(&terminal::shown(text));
}

/// Writes `value` to stdout as one line of JSON (exact JSON, with the
/// characters a terminal acts on written as escapes).
pub fn print_json(value: &Value) {
    write_stdout(&terminal::json(&value.to_string()));
}

/// Whether stdout's reader went away (`| head`, a closed pipe): nothing
/// more is written to it.
static STDOUT_CUT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes one line to stdout, unless its reader went away; the first
/// write that fails says so once ([`stdout_cut`]).
fn write_stdout(line: &str) {
    if stdout_is_cut() {
        return;
    }
    use std::io::Write as _;
    let mut out = std::io::stdout();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        stdout_cut();
    }
}

/// Whether stdout was cut.
fn stdout_is_cut() -> bool {
    STDOUT_CUT.load(std::sync::atomic::Ordering::SeqCst)
}

/// Notes that stdout's reader went away: said once on stderr, and
/// nothing more is written to stdout. The command goes on (a run finishes
/// and commits what it does).
fn stdout_cut() {
    if !STDOUT_CUT.swap(true, std::sync::atomic::Ordering::SeqCst) {
        print_note("the output was cut (its reader went away); the command goes on");
    }
}

/// Writes one line (to stderr: whatever becomes of it, the command goes
/// on).
fn write_line(out: &mut dyn std::io::Write, line: &str) {
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// How long a first compile may take before the CLI shows it.
const COMPILE_NOTICE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// How often the shown compile's elapsed time is written again.
const COMPILE_TICK: std::time::Duration = std::time::Duration::from_millis(200);

/// One compilation the CLI may show: done once it finished (the ticker
/// then ends its line).
#[derive(Debug, Default)]
struct CompileNotice {
    done: std::sync::Mutex<bool>,
    ended: std::sync::Condvar,
}

impl CompileNotice {
    /// Waits up to `for_` for the end; whether it came.
    fn wait(&self, for_: std::time::Duration) -> bool {
        let done = self
            .done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (done, _) = self
            .ended
            .wait_timeout_while(done, for_, |done| !*done)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *done
    }

    fn finish(&self) {
        *self
            .done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        self.ended.notify_all();
    }
}

/// Shows `state`'s compile of `shown` on the terminal once it has taken
/// [`COMPILE_NOTICE_AFTER`]: one line whose elapsed time is written again
/// every [`COMPILE_TICK`], ended with the time it took. Nothing on a
/// stderr that is not a terminal (a log or a pipe gets no progress line).
fn show_compile(state: &CompileNotice, shown: &str) {
    use std::io::Write as _;
    let started = std::time::Instant::now();
    if state.wait(COMPILE_NOTICE_AFTER) {
        return;
    }
    let mut err = std::io::stderr();
    loop {
        let done = state.wait(COMPILE_TICK);
        // `shown` is escaped: the one carriage return is this line's own.
        let _ = write!(
            err,
            "\rairlock: compiling {shown} (first use; later runs load it from the cache) {:.1} s",
            started.elapsed().as_secs_f64()
        );
        if done {
            let _ = writeln!(err);
            return;
        }
        let _ = err.flush();
    }
}

/// The policy at `config`, if given.
fn load_policy(config: Option<&Path>) -> Result<Option<Policy>, Failure> {
    config
        .map(Policy::load)
        .transpose()
        .map_err(|e| Failure::input("invalid_config", e.to_string()))
}

/// How long a command's host lives, which decides how a large component
/// missing from the compile cache is compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lifetime {
    /// One command's work (`call`, `run`, `inspect`, `replay`): a large
    /// component is served at once from the baseline compiler's code, its
    /// optimised code compiled into the cache in the background for the
    /// next command ([`airlock::sandbox::SandboxConfig::baseline_first`]):
    /// from [`airlock::sandbox::BASELINE_FIRST_ABOVE`] bytes, or
    /// `AIRLOCK_BASELINE_FIRST` bytes (`off`: never).
    OneShot,
    /// A server (`mcp`): every call it will serve runs on optimised code,
    /// so it waits for it.
    Serving,
}

impl Lifetime {
    /// From what size the host compiles a first use with the baseline
    /// compiler, if it does.
    fn baseline_first(self) -> Option<usize> {
        const ENV: &str = "AIRLOCK_BASELINE_FIRST";
        let default = Some(airlock::sandbox::BASELINE_FIRST_ABOVE);
        if self == Self::Serving {
            return None;
        }
        match std::env::var(ENV).ok().as_deref().map(str::trim) {
            None | Some("") => default,
            Some("off") => None,
            Some(text) => text.parse().map(Some).unwrap_or_else(|_| {
                tracing::warn!("{ENV} is neither `off` nor a size in bytes; using the default");
                default
            }),
        }
    }
}

/// A host builder whose first-time compilations that take more than a
/// moment are announced on stderr (stdout stays clean for `--json`).
fn host_builder(lifetime: Lifetime) -> airlock::HostBuilder {
    use std::sync::{Arc, Mutex};

    // Components load one at a time, so one slot suffices.
    type Shown = (Arc<CompileNotice>, std::thread::JoinHandle<()>);
    let current: Arc<Mutex<Option<Shown>>> = Arc::default();
    let mut builder = Host::builder().baseline_first(lifetime.baseline_first());
    if let Some(compiler) = child_compiler() {
        builder = builder.compiler(compiler);
    }
    builder.on_compile(move |progress| match progress {
        airlock::tools::CompileProgress::Started { path } => {
            if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                return;
            }
            let state = Arc::new(CompileNotice::default());
            let shown = terminal::field(&path.display().to_string()).into_owned();
            let ticker = {
                let state = Arc::clone(&state);
                std::thread::spawn(move || show_compile(&state, &shown))
            };
            if let Ok(mut slot) = current.lock() {
                *slot = Some((state, ticker));
            }
        }
        airlock::tools::CompileProgress::Finished { .. } => {
            let shown = current.lock().ok().and_then(|mut slot| slot.take());
            if let Some((state, ticker)) = shown {
                state.finish();
                // Its line ends before anything else is written.
                let _ = ticker.join();
            }
        }
    })
}

/// Compiling in a bounded child process of this binary, the bounds scaled
/// to each component ([`airlock::sandbox::CompileLimits::for_size`]) unless
/// `AIRLOCK_COMPILE_CPU_MS` or `AIRLOCK_COMPILE_MEMORY_MB` set them.
/// `None` (and compiling in this process) only if this binary's path is
/// unknown.
fn child_compiler() -> Option<airlock::sandbox::Compiler> {
    let exe = std::env::current_exe().ok()?;
    let mut limits = airlock::sandbox::CompileLimits::default();
    if let Some(ms) = env_number("AIRLOCK_COMPILE_CPU_MS", 1) {
        limits.cpu_time = Some(std::time::Duration::from_millis(ms));
    }
    if let Some(mb) = env_number("AIRLOCK_COMPILE_MEMORY_MB", 1) {
        limits.max_memory_bytes = Some(mb.saturating_mul(1 << 20));
    }
    Some(airlock::sandbox::Compiler::Child { exe, limits })
}

/// A progress note on stderr.
fn print_note(text: &str) {
    write_line(
        &mut std::io::stderr(),
        &format!("airlock: {}", terminal::field(text)),
    );
}

/// Builds the host `run` and `mcp` would build from the policy at
/// `config` (every tool it lists, with its grants, limits and names: one
/// validation path, so a policy `run` refuses is refused here too), and
/// loads `component` (a file, or a reference: pulled if the store lacks
/// it) beside them when the policy does not list it: then it gets nothing
/// beyond the default limits. Returns the host, the component, and what a
/// reference resolved to.
async fn load_host(
    component: &ComponentArg,
    config: Option<&Path>,
    registry: &RegistryFlags,
) -> Result<(Host, Arc<LoadedComponent>, Option<Resolved>), Failure> {
    let mut policy = load_policy(config)?;
    let (path, pulled) = oci::resolve_one(component, policy.as_mut(), registry).await?;
    let listed = policy
        .as_ref()
        .is_some_and(|p| p.for_component(&path).is_some());
    if let Some(policy) = policy.as_ref().filter(|p| !listed && !p.tools.is_empty()) {
        // Worth a word only when the policy grants other tools: then a
        // path that does not match is the likely mistake.
        print_note(&format!(
            "{} does not list {component}, so it runs with no grants and the policy's [limits]",
            policy.source.display(),
        ));
    }
    let extra = if listed {
        Vec::new()
    } else {
        vec![ComponentArg::File(path.clone())]
    };
    let host = tools_host(policy, &extra, registry, Lifetime::OneShot)
        .await?
        .host;
    let wanted = path.canonicalize().unwrap_or(path);
    let loaded = host
        .components()
        .iter()
        .find(|c| c.path().canonicalize().is_ok_and(|p| p == wanted))
        .cloned()
        .ok_or_else(|| Failure::input("internal", format!("{component} was not loaded")))?;
    Ok((host, loaded, pulled))
}

/// A host with tools, and the files it was built from (a change to any of
/// them is a reason to build it again), the policy's retention and its
/// `[mcp]` settings.
struct Tools {
    host: Host,
    files: Vec<PathBuf>,
    retention: Retention,
    mcp: airlock::policy::McpSettings,
}

/// The environment variable `name` as a whole number of at least `min`;
/// a value that is not one is logged and ignored (the default applies).
fn env_number(name: &str, min: u64) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    match text.parse::<u64>() {
        Ok(n) if n >= min => Some(n),
        _ => {
            tracing::warn!("{name} is not a whole number of at least {min}; using the default");
            None
        }
    }
}

/// Prunes every owner's sessions past `retention`'s `ttl` (if it has one),
/// logging what it did; a failure is logged, never fatal.
async fn enforce_retention(store: &dyn SessionStore, retention: &Retention) {
    match airlock::session::prune(store, retention, None, None).await {
        Ok(pruned) if !pruned.is_empty() => {
            tracing::info!(count = pruned.len(), store = %store.location(), "pruned old sessions");
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot prune old sessions"),
    }
}

/// A host with the tools of `policy` and the components `extra` (nothing
/// granted), references pulled if the store lacks them. Refuses to build
/// one with no tool at all.
async fn tools_host(
    mut policy: Option<Policy>,
    extra: &[ComponentArg],
    registry: &RegistryFlags,
    lifetime: Lifetime,
) -> Result<Tools, Failure> {
    if policy.as_ref().is_none_or(|p| p.tools.is_empty()) && extra.is_empty() {
        return Err(Failure::input(
            "no_tools",
            "no tools to run: list them in --config FILE or pass --tool TOOL.wasm",
        ));
    }
    let (extra, lock) = oci::resolve_all(policy.as_mut(), extra, registry).await?;
    let builder = host_builder(lifetime);
    let mut host = match &policy {
        Some(policy) => builder.build_with_policy(policy).await?,
        None => builder.build()?,
    };
    for path in &extra {
        host.load(path).await?;
    }
    let mut files = extra;
    files.extend(lock);
    let retention = policy.as_ref().map(|p| p.sessions).unwrap_or_default();
    let mcp = policy.as_ref().map(|p| p.mcp.clone()).unwrap_or_default();
    if let Some(policy) = &policy {
        files.push(policy.source.clone());
        for tool in &policy.tools {
            files.push(tool.path.clone());
            let keys = tool.oci.iter().flat_map(|o| o.keys.iter());
            files.extend(keys.map(|k| k.path.clone()));
        }
    }
    Ok(Tools {
        host,
        files,
        retention,
        mcp,
    })
}

/// `--deps` takes inline JSON (starting with `{` or `[`) or a file path.
fn read_deps(arg: &str) -> Result<RunContext, Failure> {
    let (text, origin) = json_argument(arg, "--deps", "invalid_deps")?;
    RunContext::from_json(&text)
        .map_err(|e: DepsError| Failure::input("invalid_deps", format!("{origin}: {e}")))
}

/// The most bytes a JSON argument read from stdin or a file may have.
const MAX_JSON_ARGUMENT: u64 = 64 << 20;

/// A JSON argument of the command line (`flag`): inline JSON (it starts
/// with `{` or `[`), `-` for standard input, or else a file's path. Its
/// text and where it came from, for messages; one that cannot be read is
/// refused as `kind`, naming the file.
fn json_argument(arg: &str, flag: &str, kind: &'static str) -> Result<(String, String), Failure> {
    use std::io::Read as _;
    if arg.trim_start().starts_with(['{', '[']) {
        return Ok((arg.to_owned(), flag.to_owned()));
    }
    let (origin, reader): (String, Box<dyn std::io::Read>) = if arg == "-" {
        (
            format!("{flag} (standard input)"),
            Box::new(std::io::stdin()),
        )
    } else {
        let origin = format!("{flag} {arg}");
        let file = std::fs::File::open(arg)
            .map_err(|e| Failure::input(kind, format!("{origin}: cannot read: {e}")))?;
        (origin, Box::new(file))
    };
    let mut text = String::new();
    reader
        .take(MAX_JSON_ARGUMENT + 1)
        .read_to_string(&mut text)
        .map_err(|e| Failure::input(kind, format!("{origin}: cannot read: {e}")))?;
    if text.len() as u64 > MAX_JSON_ARGUMENT {
        return Err(Failure::input(
            kind,
            format!("{origin}: more than {} MiB", MAX_JSON_ARGUMENT >> 20),
        ));
    }
    Ok((text, origin))
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
