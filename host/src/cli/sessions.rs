//! `airlock sessions list|show|export|import|rm|prune`: the session store.
//!
//! Every command works within one user's sessions (`--user`, or the
//! anonymous bucket) and names the store it used: on its first line in
//! text, as `store` in `--json`, on stderr for `export` (whose stdout is
//! the document).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use airlock::context::ContextRules;
use airlock::journal::{Item, Role};
use airlock::llm::Message;
use airlock::session::export::{ExportError, ImportError, JournalPages, Spill, write_export};
use airlock::session::import::{Staged, stage_for_user};
use airlock::session::{Listing, SessionStore, StoreError};

use super::{Failure, StoreFlags, print_json, print_note, print_out, report_failure, show_json};

#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// List the user's sessions, most recently updated first.
    List(ListArgs),
    /// Show one session: messages, deps, usage, events.
    Show(IdArgs),
    /// Export one session as versioned JSON (`"version": 3`), on stdout or
    /// to a file.
    Export(ExportArgs),
    /// Import a session from an export file (`-` for stdin), under the user.
    Import(ImportArgs),
    /// Fork a session: make a new one whose history is this one's up to a
    /// record or a call; both go on independently.
    Fork(ForkArgs),
    /// Remove sessions and their journals.
    Rm(RmArgs),
    /// Remove the sessions not updated for a while (never one in use);
    /// ephemeral ones (`airlock run` without `--session`) after a day.
    Prune(PruneArgs),
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Remove sessions last updated longer ago than this (`30d`, `12h`,
    /// `90m`). Default: the policy's `[sessions] ttl`.
    #[arg(long, value_name = "AGE")]
    older_than: Option<String>,
    /// The policy whose `[sessions]` to apply (`ttl`, `ephemeral_ttl`).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Every user's sessions, not only `--user`'s (as a `[sessions] ttl`
    /// does).
    #[arg(long)]
    all_users: bool,
    /// List the sessions it would remove now, and remove none.
    #[arg(long)]
    dry_run: bool,
    /// Remove them even when that is every session it covers (otherwise
    /// asked on a terminal, and refused without one).
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    store: StoreFlags,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    store: StoreFlags,
    /// Show only the N most recently updated sessions (and say how many
    /// more there are). Without it, all of them.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    limit: Option<u32>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct IdArgs {
    /// The session's id.
    id: String,
    #[command(flatten)]
    store: StoreFlags,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    /// The sessions' ids.
    #[arg(required = true, value_name = "ID")]
    ids: Vec<String>,
    #[command(flatten)]
    store: StoreFlags,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct ForkArgs {
    /// The session to fork.
    id: String,
    /// Where its history ends: a record's number (as `sessions show
    /// --json` numbers them, from 1), or a call's id (up to and including
    /// that call).
    #[arg(long, value_name = "RECORD|CALL")]
    at: String,
    /// The new session's id (default: the session's, `-fork-` and 8 random
    /// hex digits).
    #[arg(long = "as", value_name = "ID")]
    as_id: Option<String>,
    /// The policy whose `[context] hidden` keys the fork never stores.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    store: StoreFlags,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The session's id.
    id: String,
    #[command(flatten)]
    store: StoreFlags,
    /// Write the export to FILE (atomically) instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    /// The policy whose `[context] hidden` keys to leave out of the export
    /// (secret-looking keys are always left out).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The export file, or `-` for stdin.
    file: PathBuf,
    /// Import it under this id instead of the one in the file (when the
    /// store already has that one).
    #[arg(long = "as", value_name = "ID")]
    as_id: Option<String>,
    /// The policy whose `[context] hidden` keys are never stored: they are
    /// dropped from the imported deps and journal, as a run under that
    /// policy drops them (secret-looking keys are always dropped).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    store: StoreFlags,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn run(command: SessionsCommand) -> ExitCode {
    let json = match &command {
        SessionsCommand::List(a) => a.json,
        SessionsCommand::Show(a) => a.json,
        SessionsCommand::Rm(a) => a.json,
        SessionsCommand::Import(a) => a.json,
        SessionsCommand::Fork(a) => a.json,
        SessionsCommand::Prune(a) => a.json,
        SessionsCommand::Export(_) => false,
    };
    let result = match command {
        SessionsCommand::List(args) => list(args).await,
        SessionsCommand::Show(args) => show(args).await,
        SessionsCommand::Export(args) => export(args).await,
        SessionsCommand::Import(args) => import(args).await,
        SessionsCommand::Fork(args) => fork(args).await,
        SessionsCommand::Rm(args) => remove(args).await,
        SessionsCommand::Prune(args) => prune(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => report_failure(&failure, json, serde_json::Map::new()),
    }
}

/// The store for a command on session `id` that reads or removes it, and
/// the owner: when the store does not exist yet, nothing is made and the
/// session is not found.
async fn open_for<'a>(
    flags: &'a StoreFlags,
    id: &str,
) -> Result<(Arc<dyn SessionStore>, Option<&'a str>), Failure> {
    super::checked_session_id(id)?;
    let owner = flags.owner()?;
    match flags.open_existing().await? {
        (Some(store), _) => Ok((store, owner)),
        (None, location) => Err(super::not_in_a_new_store(id, owner, &location)),
    }
}

/// A store error, a missing or existing session named with its owner and
/// its store, and what to do about an existing one.
fn located(e: StoreError, owner: Option<&str>, store: &dyn SessionStore) -> Failure {
    located_doing(e, owner, store, "import")
}

/// [`located`], for a command (`verb`) that makes a session and takes
/// `--as`.
fn located_doing(
    e: StoreError,
    owner: Option<&str>,
    store: &dyn SessionStore,
    verb: &str,
) -> Failure {
    let whose = super::whose(owner);
    let (extra, mut failure) = match &e {
        StoreError::NotFound { .. } => (String::new(), Failure::from(e)),
        StoreError::AlreadyExists { session_id } => (
            format!(
                "; {verb} it under another id with --as NEW_ID, or remove this one first \
                 (airlock sessions rm {session_id})"
            ),
            Failure::from(e),
        ),
        _ => return Failure::from(e),
    };
    failure.message = format!(
        "{} ({whose}) in {}{extra}",
        failure.message,
        store.location()
    );
    failure
}

async fn list(args: ListArgs) -> Result<(), Failure> {
    let owner = args.store.owner()?;
    // A store that does not exist yet has no sessions, and is not made.
    let (store, location) = args.store.open_existing().await?;
    let Listing { sessions, total } = match &store {
        Some(store) => {
            store
                .list_recent(owner, args.limit.map_or(u64::MAX, u64::from))
                .await?
        }
        None => Listing {
            sessions: Vec::new(),
            total: 0,
        },
    };
    if args.json {
        print_json(&json!({
            "ok": true,
            "store": location,
            "sessions": sessions,
            "total": total,
        }));
        return Ok(());
    }
    let mut text = format!("store: {location}\n");
    if sessions.is_empty() {
        text.push_str("no sessions");
        print_out(&text);
        return Ok(());
    }
    // A table: the id, when it was last updated, how many records, and
    // what else a reader should know (made for one run; held by a run).
    let rows: Vec<[String; 4]> = sessions
        .iter()
        .map(|s| {
            let mut notes = Vec::new();
            if s.ephemeral {
                notes.push("ephemeral (one run)".to_owned());
            }
            if let Some(until) = s.leased_until_ms {
                notes.push(format!("in use until {}", utc(until)));
            }
            [
                s.session_id.clone(),
                utc(s.updated_at_ms),
                s.records.to_string(),
                notes.join(", "),
            ]
        })
        .collect();
    let header = ["SESSION", "UPDATED", "RECORDS", ""].map(str::to_owned);
    let width = |column: usize| {
        std::iter::once(&header)
            .chain(&rows)
            .map(|row| row[column].chars().count())
            .max()
            .unwrap_or(0)
    };
    let (id, updated, records) = (width(0), width(1), width(2));
    for [a, b, c, d] in std::iter::once(&header).chain(&rows) {
        let line = format!("{a:<id$}  {b:<updated$}  {c:>records$}  {d}");
        text.push_str(line.trim_end());
        text.push('\n');
    }
    let shown = sessions.len() as u64;
    if total > shown {
        let more = total - shown;
        let _ = write!(
            text,
            "… and {more} more ({total} in all; a larger --limit shows them)"
        );
    }
    print_out(text.trim_end());
    Ok(())
}

/// Shows a session, reading its journal once, a page at a time (as
/// export does): the messages and events, which the text lists after the
/// header that needs the whole fold, wait in temporary files.
async fn show(args: IdArgs) -> Result<(), Failure> {
    let (store, owner) = open_for(&args.store, &args.id).await?;
    let store = store.as_ref();
    let rules = ContextRules::default();
    let located = |e: StoreError| located(e, owner, store);
    let failed = |e: ExportError| match e {
        ExportError::Store(e) => located(e),
        other => Failure::input("output_file", other.to_string()),
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        let extra = [
            ("store", Value::String(store.location())),
            ("ok", Value::Bool(true)),
        ];
        // A reader that went away (`| head`) ends the output, not an error.
        return match write_export(store, owner, &args.id, &rules, &extra, &mut out).await {
            Ok(_) => Ok(()),
            Err(ExportError::Write(_)) => {
                super::stdout_cut();
                Ok(())
            }
            Err(e) => Err(failed(e)),
        };
    }
    let mut pages = JournalPages::open(store, owner, &args.id, &rules)
        .await
        .map_err(located)?;
    let spilled = |e: std::io::Error| failed(ExportError::Write(e));
    let mut messages = Spill::new().map_err(spilled)?;
    let mut events = Spill::new().map_err(spilled)?;
    while pages.next().await.map_err(located)?.is_some() {
        let (said, logged) = pages.take_said();
        let show = |line: String| format!("  {}", super::terminal::shown(&line));
        for message in &said {
            messages
                .push_line(&show(describe_message(message)))
                .map_err(spilled)?;
        }
        for event in &logged {
            let line = format!("{} {}", event.id, describe_item(&event.item));
            events.push_line(&show(line)).map_err(spilled)?;
        }
    }
    let (header, folded) = (&pages.header, pages.folded());
    let u = &folded.usage;
    let head = format!(
        "store:    {}\nsession:  {}\nuser:     {}\ncreated:  {}\nupdated:  {}\nusage:    {}\ndeps:     {}\n",
        store.location(),
        header.session_id,
        header.user_id.as_deref().unwrap_or("(anonymous)"),
        utc(header.created_at_ms),
        utc(pages.updated_at_ms),
        super::terminal::describe_usage(u),
        show_json(&Value::Object(folded.deps.clone())),
    );
    // A reader that went away (`| head`) ends the output, not an error.
    let _ = (|| -> std::io::Result<()> {
        use std::io::Write;
        write!(out, "{}\nmessages:\n", super::terminal::shown(&head))?;
        messages.copy_to(&mut out)?;
        writeln!(out, "\nevents:")?;
        events.copy_to(&mut out)?;
        out.flush()
    })();
    Ok(())
}

fn one_line(text: &str) -> String {
    super::terminal::one_line(text, 160)
}

fn describe_message(message: &Message) -> String {
    match message {
        Message::System { content } => format!("system: {}", one_line(content)),
        Message::User { content } => format!("user: {}", one_line(content)),
        Message::Assistant {
            content,
            tool_calls,
        } => {
            // What it said, then the calls it made: `model: Let me count.
            // (calls increment {…})`, or `model: calls increment {…}`.
            let calls: Vec<String> = tool_calls
                .iter()
                .map(|call| format!("{} {}", call.name, one_line(&call.arguments)))
                .collect();
            let calls = calls.join(", ");
            match content.as_deref().filter(|text| !text.trim().is_empty()) {
                Some(text) if calls.is_empty() => format!("model: {}", one_line(text)),
                Some(text) => format!("model: {} (calls {calls})", one_line(text)),
                None => format!("model: calls {calls}"),
            }
        }
        Message::Tool {
            name,
            content,
            is_error,
            ..
        } => format!(
            "tool {name}{}: {}",
            if *is_error { " (error)" } else { "" },
            one_line(content)
        ),
    }
}

fn describe_item(item: &Item) -> String {
    match item {
        Item::RunStarted { model } => format!("run started ({model})"),
        Item::RunEnded {
            outcome,
            iterations,
        } => format!(
            "run ended: {outcome} after {}",
            super::terminal::counted(u64::from(*iterations), "model request")
        ),
        Item::Message { role, content, .. } => {
            let who = match role {
                Role::System => "system",
                Role::User => "user",
                Role::Assistant => "model",
            };
            match content.as_deref().filter(|text| !text.trim().is_empty()) {
                Some(text) => format!("{who}: {}", one_line(text)),
                // A model turn that only called tools: its calls follow.
                None => format!("{who}: (calls only)"),
            }
        }
        Item::FunctionCall { call, by, .. } => {
            let by = by.as_ref().map_or(String::new(), |by| match &by.client {
                Some(client) => format!(" (by {} with {client})", by.user),
                None => format!(" (by {})", by.user),
            });
            format!("call {} {}{by}", call.name, one_line(&call.arguments))
        }
        Item::FunctionCallOutput {
            name,
            status,
            output,
            arguments,
            ..
        } => {
            let edited = arguments.as_deref().map_or(String::new(), |edited| {
                format!(
                    " (with the arguments its approval gave: {})",
                    one_line(edited)
                )
            });
            format!("{name} {}{edited}: {}", status.as_str(), one_line(output))
        }
        Item::ContextUpdate { ops, .. } => format!("ops: {}", super::terminal::op_summary(ops)),
        Item::Error { kind, message } => format!("error ({kind}): {}", one_line(message)),
        _ => "(an item of a later version)".to_owned(),
    }
}

/// The context rules of the policy at `config` (none without one), read
/// before the store is opened: a bad policy costs nothing.
fn context_rules(config: Option<&std::path::Path>) -> Result<ContextRules, Failure> {
    Ok(super::load_policy(config)?
        .map(|policy| policy.context)
        .unwrap_or_default())
}

/// Streams the export (a page of the journal at a time, so a session of
/// any length exports in bounded memory) to stdout, or atomically to
/// `--output` (a temporary file beside it, renamed once whole).
async fn export(args: ExportArgs) -> Result<(), Failure> {
    let rules = context_rules(args.config.as_deref())?;
    let (store, owner) = open_for(&args.store, &args.id).await?;
    let failed = |e: ExportError| match e {
        // Named as `show` names it: whose, and in which store.
        ExportError::Store(e) => located(e, owner, store.as_ref()),
        ExportError::Write(e) => {
            Failure::input("output_file", format!("cannot write the export: {e}"))
        }
        other => Failure::input("output_file", other.to_string()),
    };
    match &args.output {
        Some(path) => {
            let output_error = |e: std::io::Error| {
                Failure::input("output_file", format!("--output {}: {e}", path.display()))
            };
            let file = airlock::fs::Destination::open(path).map_err(output_error)?;
            let mut out = std::io::BufWriter::new(file);
            write_export(store.as_ref(), owner, &args.id, &rules, &[], &mut out)
                .await
                .map_err(|e| match e {
                    ExportError::Write(e) => output_error(e),
                    other => failed(other),
                })?;
            let file = out.into_inner().map_err(|e| output_error(e.into_error()))?;
            file.commit().map_err(output_error)?;
        }
        None => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            match write_export(store.as_ref(), owner, &args.id, &rules, &[], &mut out).await {
                Ok(_) => {}
                // A reader that went away (`| head`) ends the export.
                Err(ExportError::Write(_)) => {
                    super::stdout_cut();
                    return Ok(());
                }
                Err(e) => return Err(failed(e)),
            }
        }
    }
    print_note(&format!("exported {} from {}", args.id, store.location()));
    Ok(())
}

/// Imports an export of any length: read and checked a record at a time
/// ([`stage_for_user`]: a file of another user is refused once its
/// `user_id` is read), then inserted a page at a time in one transaction.
/// Standard input is copied to a temporary file first (the file is read
/// from its start twice: as far as its version, then whole).
async fn import(args: ImportArgs) -> Result<(), Failure> {
    let rules = context_rules(args.config.as_deref())?;
    let owner = args.store.owner()?;
    // A store there is checked before the file is read; one that is not
    // is made only once the file is read whole and found good.
    let (existing, _) = args.store.open_existing().await?;
    if let Some(id) = &args.as_id {
        airlock::session::check_session_id(id)
            .map_err(|e| Failure::input("invalid_session_id", format!("--as: {e}")))?;
    }
    let shown = if args.file.as_os_str() == "-" {
        "standard input".to_owned()
    } else {
        args.file.display().to_string()
    };
    let file = args.file.clone();
    let user = owner.map(str::to_owned);
    let staged = tokio::task::spawn_blocking(move || {
        let input = if file.as_os_str() == "-" {
            tempfile::tempfile().and_then(|mut copy| {
                std::io::copy(&mut std::io::stdin().lock(), &mut copy)?;
                Ok(copy)
            })
        } else {
            std::fs::File::open(&file)
        }
        .map_err(|e| ImportError::Read(e.to_string()))?;
        stage_for_user(input, &rules, user.as_deref())
    })
    .await
    .map_err(|e| Failure::internal(format!("{shown}: {e}")))?;
    let mut staged = staged.map_err(|e| {
        let message = format!("{shown}: {e}");
        match e {
            ImportError::MissingVersion => Failure::input("missing_version", message),
            ImportError::UnsupportedVersion(_) => Failure::input("unsupported_version", message),
            ImportError::Read(_) => Failure::input("file_not_readable", message),
            ImportError::Stage(_) => Failure::internal(message),
            ImportError::WrongUser(user) => Failure::input(
                "wrong_user",
                format!(
                    "{message}; import it with {}",
                    user.map_or("no --user".to_owned(), |u| format!("--user {u:?}")),
                ),
            ),
            _ => Failure::input("invalid_session_file", message),
        }
    })?;
    if let Some(id) = &args.as_id {
        staged.header.session_id = id.clone();
    }
    let store = match existing {
        Some(store) => store,
        None => args.store.open().await?,
    };
    let Staged {
        header,
        updated_at_ms,
        records,
        journal,
        ..
    } = staged;
    store
        .insert(&header, Box::new(journal), updated_at_ms)
        .await
        .map_err(|e| located(e, owner, store.as_ref()))?;
    if args.json {
        print_json(&json!({
            "ok": true,
            "store": store.location(),
            "session_id": header.session_id,
            "records": records,
        }));
    } else {
        print_out(&format!(
            "imported {} ({records} records) into {}",
            header.session_id,
            store.location()
        ));
    }
    Ok(())
}

async fn fork(args: ForkArgs) -> Result<(), Failure> {
    use airlock::session::{ForkError, ForkPoint, Session};
    let rules = context_rules(args.config.as_deref())?;
    let at = match args.at.parse::<u64>() {
        Ok(n) => ForkPoint::Record(n),
        Err(_) => ForkPoint::Call(args.at.clone()),
    };
    let to = args.as_id.clone().unwrap_or_else(|| {
        let random = uuid::Uuid::new_v4().simple().to_string();
        format!("{}-fork-{}", args.id, &random[..8])
    });
    let (store, owner) = open_for(&args.store, &args.id).await?;
    let held = Session::fork(Arc::clone(&store), owner, &args.id, &at, &to, &rules)
        .await
        .map_err(|e| match e {
            ForkError::Store(e) => located_doing(e, owner, store.as_ref(), "fork"),
            ForkError::InvalidId(e) => Failure::input("invalid_id", format!("--as: {e}")),
            other => Failure::input("invalid_fork_point", format!("--at: {other}")),
        })?;
    if args.json {
        print_json(&json!({
            "ok": true,
            "store": store.location(),
            "session_id": to,
            "forked_from": args.id,
            "records": held,
        }));
    } else {
        print_out(&format!(
            "forked {} at record {held} as {to} in {}",
            args.id,
            store.location()
        ));
    }
    Ok(())
}

/// Removes each session named, in order; stops at the first that cannot
/// be removed (those before it are gone, and said so).
async fn remove(args: RmArgs) -> Result<(), Failure> {
    for id in &args.ids {
        super::checked_session_id(id)?;
    }
    let (store, owner) = open_for(&args.store, &args.ids[0]).await?;
    let mut removed = Vec::new();
    for id in &args.ids {
        if let Err(e) = store.remove(owner, id, airlock::journal::now_ms()).await {
            if !removed.is_empty() && !args.json {
                print_out(&format!(
                    "removed {} from {}",
                    removed.join(", "),
                    store.location()
                ));
            }
            return Err(located(e, owner, store.as_ref()));
        }
        removed.push(id.as_str());
    }
    if args.json {
        print_json(&json!({"ok": true, "store": store.location(), "removed": removed}));
    } else {
        print_out(&format!(
            "removed {} from {}",
            removed.join(", "),
            store.location()
        ));
    }
    Ok(())
}

async fn prune(args: PruneArgs) -> Result<(), Failure> {
    let policy = super::load_policy(args.config.as_deref())?;
    let retention = policy.map(|p| p.sessions).unwrap_or_default();
    let older_than = args
        .older_than
        .as_deref()
        .map(|text| {
            airlock::retention::parse_age(text)
                .map_err(|e| Failure::input("invalid_age", format!("--older-than {text:?}: {e}")))
        })
        .transpose()?;
    if older_than.is_none() && retention.ttl.is_none() {
        return Err(Failure::input(
            "invalid_age",
            "say how old a session must be to go: --older-than 30d, or a [sessions] ttl in --config",
        ));
    }
    let owner = args.store.owner()?;
    // A store that does not exist yet has nothing to prune, and is not
    // made.
    let (store, location) = args.store.open_existing().await?;
    let pruned = match store {
        None => Vec::new(),
        Some(store) => pruned_from(store.as_ref(), &args, &retention, owner, older_than).await?,
    };
    let verb = if args.dry_run {
        "would prune"
    } else {
        "pruned"
    };
    if args.json {
        print_json(&json!({
            "ok": true,
            "store": location,
            "dry_run": args.dry_run,
            "pruned": pruned,
        }));
        return Ok(());
    }
    let mut text = format!(
        "{verb} {} from {location}",
        super::terminal::counted(pruned.len() as u64, "session"),
    );
    for session in &pruned {
        match &session.user_id {
            Some(user) => text.push_str(&format!("\n  {} (user {user})", session.session_id)),
            None => text.push_str(&format!("\n  {}", session.session_id)),
        }
    }
    print_out(&text);
    Ok(())
}

/// What `args` prunes from `store` (or would, with `--dry-run`), asking
/// first when that is every session it covers.
async fn pruned_from(
    store: &dyn SessionStore,
    args: &PruneArgs,
    retention: &airlock::retention::Retention,
    owner: Option<&str>,
    older_than: Option<std::time::Duration>,
) -> Result<Vec<airlock::session::Pruned>, Failure> {
    let scope = (!args.all_users).then_some(owner);
    let planned = airlock::session::would_prune(store, retention, scope, older_than).await?;
    if args.dry_run {
        return Ok(planned);
    }
    if planned.len() > 1 && !args.yes {
        let covered = covered(store, owner, args.all_users).await?;
        if planned.len() == covered {
            confirm_everything(covered)?;
        }
    }
    Ok(airlock::session::prune(store, retention, scope, older_than).await?)
}

/// How many sessions a prune covers: `owner`'s, or every user's.
async fn covered(
    store: &dyn SessionStore,
    owner: Option<&str>,
    all_users: bool,
) -> Result<usize, Failure> {
    let owners = if all_users {
        store.owners().await?
    } else {
        vec![owner.map(str::to_owned)]
    };
    let mut covered = 0;
    for user in owners {
        covered += store.list(user.as_deref()).await?.len();
    }
    Ok(covered)
}

/// Asks before a prune removes every session it covers; with no terminal
/// to ask on, refuses.
fn confirm_everything(count: usize) -> Result<(), Failure> {
    let refused = || {
        Failure::input(
            "confirm",
            format!(
                "this would remove every session it covers ({count}): pass --yes to do so, or \
                 --dry-run to list them"
            ),
        )
    };
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        return Err(refused());
    }
    {
        use std::io::Write as _;
        let mut err = std::io::stderr();
        let _ = write!(err, "remove all {count} sessions? [y/N]: ");
        let _ = err.flush();
    }
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    if super::terminal::says_yes(&line) {
        Ok(())
    } else {
        Err(refused())
    }
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC`.
fn utc(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(
            || format!("{ms} ms"),
            |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        )
}

#[cfg(test)]
mod tests {
    /// The help names the export version this build writes.
    #[test]
    fn the_export_help_names_the_version_written() {
        use clap::CommandFactory;
        let mut command = super::super::Cli::command();
        let sessions = command.find_subcommand_mut("sessions").unwrap();
        let help = sessions.render_help().to_string();
        let version = format!(
            "(`\"version\": {}`)",
            airlock::session::export::EXPORT_VERSION
        );
        assert!(help.contains(&version), "{help}");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(super::utc(1_763_900_000_000), "2025-11-23 12:13:20 UTC");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }
}
