//! `airlock run "prompt"`: an agent run with a model and sandboxed tools.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use airlock::agent::{Agent, AgentOptions, CallReport, Decision, RunError, RunOutcome};
use airlock::journal::{CallStatus, Event, Item, Role};
use airlock::llm::{self, Model, ProviderOptions, ScriptModel};
use airlock::{BoxFuture, ToolCall};

use airlock::context::Usage;
use airlock::policy::TurnPolicy;
use airlock::retention::Retention;
use airlock::sandbox::{Asker, CallEvent, CancelToken, Progress};
use airlock::{Answer, SampleReply};
use airlock::{Host, Session};

use super::terminal::{Desk, Question, one_line, op_summary};
use super::{
    ComponentArg, EXIT_INPUT, EXIT_TOOL_FAILED, Failure, RunFlags, print_error, print_json,
    print_out, report_failure, save_deps, show_json,
};

/// Exit code of a run stopped by Ctrl-C or SIGTERM (128 + SIGINT).
const EXIT_CANCELLED: u8 = 130;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// What to ask the model.
    prompt: String,
    /// Also load this component (a file, or oci://REGISTRY/REPO:TAG), with
    /// nothing granted (repeatable).
    #[arg(long = "tool", value_name = "TOOL.wasm|oci://REF")]
    tools: Vec<ComponentArg>,
    /// The model: openai:MODEL (also vLLM, Ollama, llama.cpp, LM Studio via
    /// OPENAI_BASE_URL) or anthropic:MODEL.
    #[arg(long, value_name = "PROVIDER:MODEL", conflicts_with = "script")]
    model: Option<String>,
    /// Play the model's turns from a script file instead (offline).
    #[arg(long, value_name = "FILE")]
    script: Option<PathBuf>,
    /// The provider's base URL (default: OPENAI_BASE_URL / ANTHROPIC_BASE_URL).
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// Model requests allowed before the run fails (at least 1).
    #[arg(long, value_name = "N", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_iterations: u32,
    /// The most tokens one model reply may hold (at least 1). Anthropic's
    /// default is 4096; OpenAI-compatible servers keep their own unless
    /// this is given. A reply cut at it before its tool calls are whole
    /// fails the run, saying so; none of its calls runs.
    #[arg(long, value_name = "N", conflicts_with = "script",
          value_parser = clap::value_parser!(u32).range(1..))]
    max_tokens: Option<u32>,
    /// A system prompt for the model.
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// Run the calls of a model turn one after another (the policy's
    /// `[turn] parallel = false`). By default they run concurrently, with
    /// the results of running them in order.
    #[arg(long)]
    sequential: bool,
    /// Approve every call of a tool whose policy asks for approval
    /// (`approval = "ask"`) without asking: for scripts and pipes. Without
    /// it and without a terminal, such a call stops the run (exit 2).
    #[arg(long)]
    yes: bool,
    /// Write the item log as JSON lines to FILE, or `-` for stdout (then
    /// progress is not printed).
    #[arg(long, value_name = "FILE")]
    events: Option<String>,
    #[command(flatten)]
    flags: RunFlags,
}

pub async fn run(args: RunArgs) -> ExitCode {
    let json = args.flags.json;
    if let Err(failure) = args.flags.check_save_deps() {
        return report_failure(&failure, json, serde_json::Map::new());
    }
    // Questions for the person (approvals, a tool's questions) wait for
    // the progress printed before them: the watch below asks them.
    let (desk, mut questions) = mpsc::unbounded_channel::<Question>();
    let (host, model, asker, mut turn, retention) = match prepare(&args, &desk).await {
        Ok(ready) => ready,
        Err(failure) => return report_failure(&failure, json, serde_json::Map::new()),
    };
    let opened = args.flags.session.open_kept(&host, true, &retention);
    let mut session = match opened.await {
        Ok(session) => session,
        Err(failure) => return report_failure(&failure, json, serde_json::Map::new()),
    };
    // What the session had used before this run: the run's own usage is
    // what it adds.
    let before = session.context().usage;
    let mut events_file = match open_events(args.events.as_deref()) {
        Ok(file) => file,
        Err(failure) => return report_failure(&failure, false, serde_json::Map::new()),
    };

    let cancel = CancelToken::new();
    let on_signal = cancel.clone();
    if let Ok(stopped) = super::stop_signal() {
        tokio::spawn(async move {
            stopped.await;
            on_signal.cancel();
        });
    }

    let progress = !json && args.events.as_deref() != Some("-");
    if progress {
        print_out(&format!(
            "model: {}; tools: {}",
            model.name(),
            host.tool_names().join(", ")
        ));
        let state = if session.created() {
            "new".to_owned()
        } else {
            format!("resumed, {} messages", session.transcript().messages.len())
        };
        print_out(&format!(
            "session: {} ({state}) in {}",
            session.id(),
            session.location()
        ));
    }
    if args.sequential {
        turn.parallel = false;
    }
    let options = AgentOptions {
        max_iterations: args.max_iterations,
        system_prompt: args.system.clone(),
        turn,
        ..AgentOptions::default()
    };
    let (sender, mut receiver) = mpsc::unbounded_channel();
    let (reporter, mut reports) = mpsc::unbounded_channel();
    let approver = Arc::new(CliApprover::new(args.yes, cancel.clone(), desk));
    let run = async {
        let agent = Agent::new(Arc::clone(&host), model)
            .options(options)
            .approver(Arc::clone(&approver) as Arc<dyn airlock::agent::Approver>)
            .asker(asker)
            .events(sender)
            .call_events(reporter)
            .cancel_token(cancel.clone());
        agent.run_session(&mut session, &args.prompt).await
    };
    let watch = async {
        loop {
            // Items first: a call's intent is committed (and sent) before
            // it runs, so its reports follow it. Its output is sent after
            // every report it made: those still waiting are shown first.
            let event = tokio::select! {
                biased;
                event = receiver.recv() => match event {
                    Some(event) => event,
                    None => break,
                },
                Some(report) = reports.recv() => {
                    show_report(&report, events_file.as_mut(), progress);
                    continue;
                }
                // Asked once every line due before it is out; the progress
                // waits for the answer.
                Some(question) = questions.recv() => {
                    let _ = tokio::task::spawn_blocking(question).await;
                    continue;
                }
            };
            if matches!(event.item, Item::FunctionCallOutput { .. }) {
                while let Ok(report) = reports.try_recv() {
                    show_report(&report, events_file.as_mut(), progress);
                }
            }
            if let Some(log) = events_file.as_mut() {
                log.line(&serde_json::to_string(&event).unwrap_or_default());
            }
            if progress {
                show_progress(&event);
            }
        }
    };
    let (result, ()) = tokio::join!(run, watch);

    let deps = Value::Object(session.stored_deps(host.context_rules()));
    if let Some(path) = &args.flags.save_deps
        && let Err(failure) = save_deps(path, &deps)
    {
        print_error(&failure.message);
    }
    let code = match approver.refused() {
        // The run stopped at a call it could not ask about: say so and
        // which flag to use, once.
        Some(tool) => report_failure(
            &needs_terminal(&tool, "every call"),
            args.flags.json,
            serde_json::Map::new(),
        ),
        None => finish(&args, &session, &before, deps, result),
    };
    if let Err(e) = session.close().await {
        tracing::warn!(error = %e, "cannot release the session");
    }
    code
}

/// Loads the policy and tools, and the model; the policy's `[turn]` and
/// `[sessions]`.
async fn prepare(
    args: &RunArgs,
    desk: &mpsc::UnboundedSender<Question>,
) -> Result<(Arc<Host>, Arc<dyn Model>, Asker, TurnPolicy, Retention), Failure> {
    args.flags.session.check()?;
    let policy = super::load_policy(args.flags.config.as_deref())?;
    let turn = policy.as_ref().map(|p| p.turn).unwrap_or_default();
    let tools = super::tools_host(
        policy,
        &args.tools,
        &args.flags.registry,
        super::Lifetime::OneShot,
    )
    .await?;
    let (host, retention) = (tools.host, tools.retention);

    let mut asker = super::terminal::asker(Some(desk.clone()));
    let model: Arc<dyn Model> = match (&args.script, &args.model) {
        (Some(script), _) => {
            let script = Arc::new(
                ScriptModel::load(script)
                    .map_err(|e| Failure::input("invalid_script", e.to_string()))?,
            );
            // A script answers its tools' questions itself.
            let answers = Arc::clone(&script);
            asker = Arc::new(move |_asked| {
                let answer = answers.answer();
                Box::pin(async move { answer })
            });
            script
        }
        (None, Some(spec)) => {
            let options = ProviderOptions {
                base_url: args.base_url.clone(),
                max_tokens: args.max_tokens,
                ..ProviderOptions::default()
            };
            Arc::from(
                llm::from_spec(spec, options)
                    .map_err(|e| Failure::input("invalid_model", e.to_string()))?,
            )
        }
        (None, None) => {
            return Err(Failure::input(
                "no_model",
                "no model: pass --model openai:MODEL, --model anthropic:MODEL, or --script FILE",
            ));
        }
    };
    Ok((Arc::new(host), model, asker, turn, retention))
}

fn open_events(target: Option<&str>) -> Result<Option<EventLog>, Failure> {
    let sink: Box<dyn Write + Send> = match target {
        None => return Ok(None),
        Some("-") => Box::new(std::io::stdout()),
        Some(path) => std::fs::File::create(path)
            .map(|f| Box::new(std::io::BufWriter::new(f)) as Box<dyn Write + Send>)
            .map_err(|e| Failure::input("events_file", format!("--events {path}: {e}")))?,
    };
    Ok(Some(EventLog {
        sink,
        to_stdout: target == Some("-"),
        cut: false,
    }))
}

/// Where `--events` goes. Once a write fails (a closed pipe, a full
/// disk), nothing more is written to it, and that is said once on stderr;
/// the run goes on and commits.
struct EventLog {
    sink: Box<dyn Write + Send>,
    /// Whether it is stdout (`--events -`), whose cut the rest of the
    /// output shares.
    to_stdout: bool,
    cut: bool,
}

impl EventLog {
    /// Writes one line of JSON.
    fn line(&mut self, json: &str) {
        if self.cut || (self.to_stdout && super::stdout_is_cut()) {
            return;
        }
        let written =
            writeln!(self.sink, "{}", super::terminal::json(json)).and_then(|()| self.sink.flush());
        if let Err(e) = written {
            self.cut = true;
            if self.to_stdout {
                super::stdout_cut();
            } else {
                super::print_note(&format!(
                    "the event log was cut ({e}); nothing more is written to it, and the run goes on"
                ));
            }
        }
    }
}

/// A call's progress report as it happens: a line on the terminal, and a
/// `{"progress": …}` line in the event log (not journaled: the call's
/// log records are, with its output).
fn show_report(report: &CallReport, log: Option<&mut EventLog>, progress: bool) {
    let CallEvent::Progress(reported) = &report.event else {
        return;
    };
    let Progress {
        done,
        total,
        message,
    } = reported.as_ref();
    if let Some(log) = log {
        let line = json!({"progress": {
            "call_id": report.call_id,
            "tool": report.tool,
            "done": done,
            "total": total,
            "message": message,
        }});
        log.line(&line.to_string());
    }
    if progress {
        print_out(&format!(
            "         {} progress: {}",
            super::terminal::field(&report.tool),
            super::terminal::progress(*done, *total, message.as_deref())
        ));
    }
}

/// One readable line per model turn and per tool call.
fn show_progress(event: &Event) {
    let line = match &event.item {
        Item::Message {
            role: Role::Assistant,
            content: Some(text),
            iteration,
            ..
        } => format!("[turn {iteration}] model: {}", one_line(text, 200)),
        Item::FunctionCall {
            call, iteration, ..
        } => format!(
            "[turn {iteration}] call {} {}",
            call.name,
            one_line(&call.arguments, 120)
        ),
        Item::FunctionCallOutput {
            name,
            status,
            output,
            duration_us,
            guest,
            ..
        } => {
            let status = match status {
                CallStatus::Completed => "ok",
                CallStatus::Failed => "failed",
                CallStatus::Rejected => "rejected",
                CallStatus::Cancelled => "cancelled",
                CallStatus::Interrupted => "interrupted",
            };
            // What the call asked and showed, a line each, before its end.
            for asked in &guest.asked {
                print_out(&super::terminal::field(&format!(
                    "         asked: {} -> {}",
                    one_line(&asked.message, 120),
                    one_line(&answer_text(&asked.answer), 120)
                )));
            }
            for sampled in &guest.sampled {
                let reply = match &sampled.reply {
                    SampleReply::Answered { text, .. } => text.clone(),
                    SampleReply::Refused { why } => format!("refused: {why}"),
                    _ => "?".to_owned(),
                };
                print_out(&super::terminal::field(&format!(
                    "         asked the model -> {}",
                    one_line(&reply, 120)
                )));
            }
            for shown in &guest.shown {
                print_out(&super::terminal::field(&format!(
                    "         shown: {}",
                    shown.describe()
                )));
            }
            format!(
                "         {name} {status} in {:.1} ms: {}",
                *duration_us as f64 / 1000.0,
                one_line(output, 160)
            )
        }
        Item::ContextUpdate { ops, .. } => format!("         ops: {}", op_summary(ops)),
        // The prompt; the run's failure (said once, at the end); and items
        // added by later versions.
        _ => return,
    };
    // Each event is one line, whatever newlines the model or tool put in it.
    print_out(&super::terminal::field(&line));
}

/// How a person answered, in a few words: `accept {"name":"Ann"}`.
fn answer_text(answer: &Answer) -> String {
    match answer {
        Answer::Accept { content } => format!("accept {content}"),
        Answer::Decline => "decline".to_owned(),
        Answer::Cancel => "cancel".to_owned(),
        Answer::Unavailable { why } => format!("unavailable: {why}"),
        _ => "?".to_owned(),
    }
}

fn finish(
    args: &RunArgs,
    session: &Session,
    before: &Usage,
    deps: Value,
    result: Result<RunOutcome, RunError>,
) -> ExitCode {
    let ctx = session.context();
    // This run's usage; the session's totals too when it had earlier runs.
    let run_usage = ctx.usage.since(before);
    let usage = json!(run_usage);
    let session_usage = json!(ctx.usage);
    let totals = if *before == Usage::default() {
        String::new()
    } else {
        format!(
            "\nsession usage, every run: {}",
            super::terminal::describe_usage(&ctx.usage)
        )
    };
    match result {
        Ok(outcome) => {
            if args.flags.json {
                print_json(&json!({
                    "ok": true,
                    "answer": outcome.answer,
                    "deps": deps,
                    "usage": usage,
                    "session_usage": session_usage,
                    "iterations": outcome.iterations,
                    "session_id": outcome.session_id,
                    "run_id": outcome.run_id,
                    "store": session.location(),
                }));
            } else {
                print_out(&format!(
                    "\nanswer: {}\ndeps:   {}\nusage:  {}{totals}",
                    outcome.answer,
                    show_json(&deps),
                    super::terminal::describe_usage(&run_usage),
                ));
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            // A script that cannot be played is the command's bad input
            // (exit 2), not a model that failed.
            let kind = match &error {
                RunError::Model(airlock::llm::ModelError::Script { .. }) => "invalid_script",
                other => other.kind().as_str(),
            };
            if args.flags.json {
                print_json(&json!({
                    "ok": false,
                    "error": {"kind": kind, "message": error.to_string()},
                    "deps": deps,
                    "usage": usage,
                    "session_usage": session_usage,
                    "iterations": ctx.iteration,
                    "session_id": ctx.session_id(),
                    "run_id": ctx.run_id(),
                    "store": session.location(),
                }));
            } else {
                print_error(&format!("run failed ({kind}): {error}"));
                print_out(&format!("deps:   {}", show_json(&deps)));
            }
            match error {
                RunError::Cancelled => ExitCode::from(EXIT_CANCELLED),
                RunError::Model(airlock::llm::ModelError::Script { .. }) => {
                    ExitCode::from(EXIT_INPUT)
                }
                RunError::Store(e) => super::Failure::from(e).exit.into(),
                _ => ExitCode::from(EXIT_TOOL_FAILED),
            }
        }
    }
}

/// Decides about calls that need approval: approves them all (`--yes`);
/// asks on the terminal (approve, reject, or edit the arguments; end of
/// input rejects); or, with no terminal to ask on, rejects the call and
/// stops the run, remembering the tool so the command can say which flag
/// to use.
struct CliApprover {
    yes: bool,
    terminal: bool,
    cancel: CancelToken,
    refused: std::sync::Mutex<Option<String>>,
    /// Where the questions are asked, in turn with the progress.
    desk: Desk,
}

impl CliApprover {
    fn new(yes: bool, cancel: CancelToken, desk: mpsc::UnboundedSender<Question>) -> Self {
        Self {
            yes,
            terminal: std::io::IsTerminal::is_terminal(&std::io::stdin()),
            cancel,
            refused: std::sync::Mutex::new(None),
            desk: Some(desk),
        }
    }

    /// The tool whose call stopped the run for want of a terminal.
    fn refused(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl airlock::agent::Approver for CliApprover {
    fn decide<'a>(&'a self, call: &'a ToolCall) -> BoxFuture<'a, Decision> {
        if self.yes {
            return Box::pin(async { Decision::Approve });
        }
        if !self.terminal {
            self.refused
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get_or_insert_with(|| call.name.clone());
            self.cancel.cancel();
            return Box::pin(async { Decision::Reject });
        }
        let question = approval_question(call);
        Box::pin(super::terminal::ask_at(
            &self.desk,
            move || ask(&question),
            Decision::Reject,
        ))
    }
}

/// A call of `tool` needs approval and there is no terminal to ask on:
/// the failure says which flag approves (`what` it approves).
pub(super) fn needs_terminal(tool: &str, what: &str) -> Failure {
    Failure::input(
        "approval_needs_terminal",
        format!(
            "tool {} needs approval (approval = \"ask\") and there is no terminal to ask on: \
             pass --yes to approve {what}, or run it on a terminal",
            super::terminal::field(tool)
        ),
    )
}

/// What the terminal asks before `call` runs.
pub(super) fn approval_question(call: &ToolCall) -> String {
    format!(
        "approve {} {}? [y]es / [n]o / [e]dit: ",
        super::terminal::field(&call.name),
        super::terminal::field(&call.arguments)
    )
}

/// Asks `question` on the terminal: yes, no (also the end of input), or
/// edit (then the new arguments), in either case. Anything else is asked
/// again, saying what it takes; so are new arguments that are not a JSON
/// object (an empty line rejects the call).
pub(super) fn ask(question: &str) -> Decision {
    let mut err = std::io::stderr();
    let mut read = |prompt: &str| -> Option<String> {
        let _ = write!(err, "{prompt}");
        let _ = err.flush();
        let mut line = String::new();
        match std::io::stdin().read_line(&mut line) {
            Ok(0) | Err(_) => {
                // End of input is "no"; end the prompt's line.
                let _ = writeln!(err);
                None
            }
            Ok(_) => Some(line.trim().to_owned()),
        }
    };
    let again = |said: &str| {
        let _ = writeln!(std::io::stderr(), "  {said}; try again");
    };
    loop {
        let Some(answer) = read(question) else {
            return Decision::Reject;
        };
        match answer.to_ascii_lowercase().as_str() {
            "y" | "yes" => return Decision::Approve,
            "n" | "no" => return Decision::Reject,
            "e" | "edit" => loop {
                let Some(arguments) = read("new arguments (JSON object; empty rejects): ") else {
                    return Decision::Reject;
                };
                if arguments.is_empty() {
                    return Decision::Reject;
                }
                match serde_json::from_str::<serde_json::Value>(&arguments) {
                    Ok(serde_json::Value::Object(_)) => return Decision::Edit(arguments),
                    Ok(_) => again("the arguments must be a JSON object"),
                    Err(_) => again("that is not JSON"),
                }
            },
            _ => again("answer y (yes), n (no) or e (edit)"),
        }
    }
}
