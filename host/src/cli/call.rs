//! `airlock call TOOL.wasm NAME [ARGS]`: one call, its result, ops and deps.

use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};

use airlock::agent::SessionCallError;
use airlock::journal::secrets::scrub_ops;
use airlock::sandbox::CancelToken;
use airlock::{CallError, CallOutcome, ContextOp, Host, ToolCall};

use super::terminal::field;
use super::{
    ComponentArg, Failure, RunFlags, load_host, print_json, print_out, report_failure, save_deps,
    show_json, shown_deps,
};

#[derive(Debug, Args)]
pub struct CallArgs {
    /// The tool component: a file (.wasm, or .wat text), or
    /// oci://REGISTRY/REPO:TAG (pulled through airlock.lock).
    #[arg(value_name = "TOOL.wasm|oci://REF")]
    component: ComponentArg,
    /// The tool to call (see `airlock inspect`).
    name: String,
    /// The arguments, a JSON object: inline, `-` for standard input, or a
    /// file's path (`{}` when left out; a required one that is missing is
    /// named by the tool's schema).
    #[arg(value_name = "ARGS", default_value = "{}")]
    args: String,
    /// Approve the call if its tool asks for approval (`approval =
    /// "ask"`): without it, the terminal asks, and with no terminal the
    /// call is refused.
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    flags: RunFlags,
}

pub async fn run(args: CallArgs) -> ExitCode {
    if args.flags.session.store.user.is_some() && args.flags.session.id.is_none() {
        let failure = Failure::input(
            "usage",
            "--user names whose session the call is committed to: pass --session ID too \
             (without --session nothing is stored, for any user)",
        );
        return fail(&args, &failure, None);
    }
    if args.args == "-" && args.flags.session.deps.as_deref() == Some("-") {
        let failure = Failure::input(
            "invalid_args",
            "ARGS and --deps cannot both be read from standard input (-)",
        );
        return fail(&args, &failure, None);
    }
    if let Err(failure) = args.flags.check_save_deps() {
        return fail(&args, &failure, None);
    }
    let mut ctx = match args.flags.session.context() {
        Ok(ctx) => ctx,
        Err(failure) => return fail(&args, &failure, None),
    };
    let loaded = load_host(
        &args.component,
        args.flags.config.as_deref(),
        &args.flags.registry,
    )
    .await;
    let (host, component) = match loaded {
        Ok((host, component, _)) => (host, component),
        Err(failure) => return fail(&args, &failure, None),
    };
    let arguments = match super::json_argument(&args.args, "ARGS", "invalid_args") {
        Ok((text, _)) => text,
        Err(failure) => return fail(&args, &failure, None),
    };
    let call = ToolCall::new(args.name.as_str(), arguments);
    // The policy's other tools are in the host; the call is the named
    // component's.
    if !component.tools().iter().any(|t| t.name == args.name) {
        let mut available: Vec<String> = component.tools().iter().map(|t| t.name.clone()).collect();
        available.sort_unstable();
        let failure = Failure::from(CallError::UnknownTool {
            name: args.name.clone(),
            available,
        });
        let deps = shown_deps(&ctx, &host);
        return finish(&args, &host, Err(failure), deps, None);
    }
    let call = match approved(&args, &component, call) {
        Ok(call) => call,
        Err(failure) => return fail(&args, &failure, None),
    };
    if args.flags.session.id.is_some() {
        return call_in_session(&args, &host, &call).await;
    }
    let result = host
        .call_cancellable(&mut ctx, &call, &terminal_asks())
        .await;
    let deps = shown_deps(&ctx, &host);
    finish(&args, &host, result.map_err(Failure::from), deps, None)
}

/// A call's token, with or without a session: its tool's questions are
/// asked on the terminal ([`super::terminal::asker`]); nothing fires it.
fn terminal_asks() -> CancelToken {
    CancelToken::watched(None, Some(super::terminal::asker(None)), None)
}

/// The stored session a call was committed to: its id and where it lives.
struct Stored {
    session_id: String,
    store: String,
}

/// The call on a stored session: its deps come from the store, and the
/// call is committed there (intent, then output and ops).
async fn call_in_session(args: &CallArgs, host: &Host, call: &ToolCall) -> ExitCode {
    let mut session = match args.flags.session.open(host).await {
        Ok(session) => session,
        Err(failure) => return fail(args, &failure, None),
    };
    let result = session
        .call(host, call, &terminal_asks(), None)
        .await
        .map_err(|e| match e {
            SessionCallError::Call(failure) => Failure::from(*failure),
            SessionCallError::Store(e) => Failure::from(e),
            other => Failure::input("internal", other.to_string()),
        });
    let deps = Value::Object(session.stored_deps(host.context_rules()));
    let stored = Stored {
        session_id: session.id().to_owned(),
        store: session.location().to_owned(),
    };
    let code = finish(args, host, result, deps, Some(&stored));
    if let Err(e) = session.close().await {
        tracing::warn!(error = %e, "cannot release the session");
    }
    code
}

fn finish(
    args: &CallArgs,
    host: &Host,
    result: Result<CallOutcome, Failure>,
    deps: Value,
    stored: Option<&Stored>,
) -> ExitCode {
    match result {
        Ok(outcome) => {
            if let Some(path) = &args.flags.save_deps
                && let Err(failure) = save_deps(path, &deps)
            {
                return fail_stored(args, &failure, Some(deps), stored);
            }
            print_success(args, host, &outcome, deps, stored);
            ExitCode::SUCCESS
        }
        Err(failure) => fail_stored(args, &failure, Some(deps), stored),
    }
}

fn print_success(
    args: &CallArgs,
    host: &Host,
    outcome: &CallOutcome,
    deps: Value,
    stored: Option<&Stored>,
) {
    // Ops as they may be shown: none on hidden or secret-looking keys.
    let updates = scrub_ops(&outcome.updates, host.context_rules());
    if args.flags.json {
        let mut doc = json!({
            "ok": true,
            "result": outcome.result,
            "ops": updates,
            "deps": deps,
            "logs": outcome.output.logs,
            "stdout": outcome.output.stdout,
            "stderr": outcome.output.stderr,
            "refusals": outcome.output.refusals,
            "shown": outcome.output.shown,
            "progress": outcome.output.progress,
            "duration_us": u64::try_from(outcome.duration.as_micros()).unwrap_or(u64::MAX),
        });
        if let (Some(stored), Value::Object(doc)) = (stored, &mut doc) {
            doc.insert("session_id".into(), json!(stored.session_id));
            doc.insert("store".into(), json!(stored.store));
        }
        print_json(&doc);
        return;
    }
    // A text result reads as text, its lines under its first.
    let result = match &outcome.result {
        Value::String(text) if text.contains('\n') => super::terminal::block(text, 8),
        other => show_json(other),
    };
    let mut text = format!("result: {result}\n");
    if updates.is_empty() {
        text.push_str("ops:    none\n");
    }
    for (i, op) in updates.iter().enumerate() {
        let label = if i == 0 { "ops:   " } else { "       " };
        text.push_str(&format!("{label} {}\n", describe_op(op)));
    }
    for record in &outcome.output.logs {
        text.push_str(&format!(
            "log:    [{:?}] {}\n",
            record.level,
            field(&record.message)
        ));
    }
    for (name, stream) in [
        ("stdout", &outcome.output.stdout),
        ("stderr", &outcome.output.stderr),
    ] {
        for line in stream.lines() {
            text.push_str(&format!("{name}: {line}\n"));
        }
    }
    for why in &outcome.output.refusals {
        text.push_str(&format!("refused: {}\n", field(why)));
    }
    for report in &outcome.output.progress {
        let line = super::terminal::progress(report.done, report.total, report.message.as_deref());
        text.push_str(&format!("progress: {line}\n"));
    }
    for shown in &outcome.output.shown {
        text.push_str(&format!("shown:  {}\n", field(&shown.describe())));
    }
    text.push_str(&format!("deps:   {}", show_json(&deps)));
    if let Some(stored) = stored {
        text.push_str(&format!(
            "\nstored: session {} in {}",
            field(&stored.session_id),
            field(&stored.store)
        ));
    }
    print_out(&text);
}

fn describe_op(op: &ContextOp) -> String {
    let key = field(op.key());
    match op {
        ContextOp::Set { value, .. } => format!("set {key} = {value}"),
        ContextOp::Merge { value, .. } => format!("merge {key} <- {value}"),
        ContextOp::Append { value, .. } => format!("append {key} += {value}"),
        ContextOp::Delete { .. } => format!("delete {key}"),
    }
}

/// A failed call, with the deps (unchanged; null if they never parsed).
fn fail(args: &CallArgs, failure: &Failure, deps: Option<Value>) -> ExitCode {
    fail_stored(args, failure, deps, None)
}

/// [`fail`], naming the stored session (in `--json`) when there is one.
fn fail_stored(
    args: &CallArgs,
    failure: &Failure,
    deps: Option<Value>,
    stored: Option<&Stored>,
) -> ExitCode {
    let mut extra = serde_json::Map::new();
    extra.insert("deps".into(), deps.unwrap_or(Value::Null));
    if let Some(stored) = stored {
        extra.insert("session_id".into(), json!(stored.session_id));
        extra.insert("store".into(), json!(stored.store));
    }
    report_failure(failure, args.flags.json, extra)
}

/// The call as approved: unchanged for a tool that asks for no approval
/// or with `--yes`; else as the person on the terminal decides (edited
/// arguments, or rejected: exit 1). With no terminal to ask on, refused.
fn approved(
    args: &CallArgs,
    component: &airlock::tools::LoadedComponent,
    call: ToolCall,
) -> Result<ToolCall, Failure> {
    if component.approval() != airlock::policy::Approval::Ask || args.yes {
        return Ok(call);
    }
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        return Err(super::run::needs_terminal(&call.name, "the call"));
    }
    match super::run::ask(&super::run::approval_question(&call)) {
        airlock::agent::Decision::Approve => Ok(call),
        airlock::agent::Decision::Edit(arguments) => {
            Ok(ToolCall::new(call.name.as_str(), arguments))
        }
        _ => Err(Failure {
            kind: "rejected",
            message: format!(
                "the call of {} was rejected; it did not run",
                field(&call.name)
            ),
            exit: super::EXIT_TOOL_FAILED,
        }),
    }
}
