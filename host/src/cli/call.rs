//! `airlock call TOOL.wasm NAME ARGS`: one call, its result, ops and deps.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};

use airlock::{CallOutcome, ContextOp, RunContext, ToolCall};

use super::terminal::field;
use super::{
    Failure, RunFlags, load_host, print_json, print_out, report_failure, save_deps, show_json,
};

#[derive(Debug, Args)]
pub struct CallArgs {
    /// The tool component (.wasm, or .wat text).
    component: PathBuf,
    /// The tool to call (see `airlock inspect`).
    name: String,
    /// The arguments, a JSON object.
    args: String,
    #[command(flatten)]
    flags: RunFlags,
}

pub async fn run(args: CallArgs) -> ExitCode {
    let mut ctx = match args.flags.context() {
        Ok(ctx) => ctx,
        Err(failure) => return fail(&args, &failure, None),
    };
    match call(&args, &mut ctx).await {
        Ok(outcome) => {
            if let Some(path) = &args.flags.save_deps
                && let Err(failure) = save_deps(path, &ctx)
            {
                return fail(&args, &failure, Some(&ctx));
            }
            print_success(&args, &outcome, &ctx);
            ExitCode::SUCCESS
        }
        Err(failure) => fail(&args, &failure, Some(&ctx)),
    }
}

async fn call(args: &CallArgs, ctx: &mut RunContext) -> Result<CallOutcome, Failure> {
    let host = load_host(&args.component, args.flags.config.as_deref()).await?;
    let call = ToolCall::new(args.name.as_str(), args.args.as_str());
    Ok(host.call(ctx, &call).await?)
}

fn print_success(args: &CallArgs, outcome: &CallOutcome, ctx: &RunContext) {
    if args.flags.json {
        let doc = json!({
            "ok": true,
            "result": outcome.result,
            "updates": outcome.updates,
            "deps": ctx.deps(),
            "logs": outcome.output.logs,
            "stdout": outcome.output.stdout,
            "stderr": outcome.output.stderr,
            "duration_us": u64::try_from(outcome.duration.as_micros()).unwrap_or(u64::MAX),
        });
        print_json(&doc);
        return;
    }
    let mut text = format!("result: {}\n", show_json(&outcome.result));
    if outcome.updates.is_empty() {
        text.push_str("ops:    none\n");
    }
    for (i, op) in outcome.updates.iter().enumerate() {
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
    text.push_str(&format!(
        "deps:   {}",
        show_json(&Value::Object(ctx.deps().clone()))
    ));
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
fn fail(args: &CallArgs, failure: &Failure, ctx: Option<&RunContext>) -> ExitCode {
    let deps = ctx.map_or(Value::Null, |ctx| Value::Object(ctx.deps().clone()));
    let mut extra = serde_json::Map::new();
    extra.insert("deps".into(), deps);
    report_failure(failure, args.flags.json, extra)
}
