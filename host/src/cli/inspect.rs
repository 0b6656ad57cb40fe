//! `airlock inspect TOOL.wasm`: the tools a component exports and the
//! capabilities its imports ask for.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::json;

use super::{Failure, load_host, print_error, print_out, show_json};

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The tool component (.wasm, or .wat text).
    component: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// What an import lets a tool do, if granted.
fn capability(import: &str) -> &'static str {
    let interface = import.split('@').next().unwrap_or(import);
    match interface {
        "airlock:tool/context" => "read the run context (always available, read-only)",
        "airlock:tool/log" => "write log records (always available, bounded)",
        i if i.starts_with("wasi:filesystem/") => "files (none unless a directory is granted)",
        i if i.starts_with("wasi:sockets/") => "raw sockets (never granted)",
        i if i.starts_with("wasi:http/") => "outgoing HTTP (none unless hosts are granted)",
        "wasi:cli/environment" => "environment variables (none unless granted)",
        i if i.starts_with("wasi:cli/std") || i.starts_with("wasi:cli/terminal") => {
            "stdio (stdin empty; stdout/stderr captured, bounded)"
        }
        i if i.starts_with("wasi:clocks/") => "clocks",
        i if i.starts_with("wasi:random/") => "random numbers",
        i if i.starts_with("wasi:io/") => "streams (used by the interfaces above)",
        "wasi:cli/exit" => "exit (ends the call as a failure)",
        _ => "other",
    }
}

pub async fn run(args: InspectArgs) -> ExitCode {
    let host = match load_host(&args.component).await {
        Ok(host) => host,
        Err(failure) => return fail(&args, &failure),
    };
    let Some(component) = host.components().first() else {
        return fail(
            &args,
            &Failure::input("internal", "no component was loaded"),
        );
    };
    let imports = component.imports();
    if args.json {
        let doc = json!({
            "path": component.path(),
            "tools": component.tools(),
            "imports": imports.iter().map(|i| json!({"name": i, "capability": capability(i)})).collect::<Vec<_>>(),
        });
        print_out(&doc.to_string());
        return ExitCode::SUCCESS;
    }
    let mut text = format!("{}\n\ntools:\n", component.path().display());
    for spec in component.tools() {
        text.push_str(&format!("  {}  {}\n", spec.name, spec.description));
        text.push_str(&format!(
            "    parameters: {}\n",
            show_json(&spec.parameters)
        ));
    }
    text.push_str(
        "\nimports (what the tool asks for; this host grants nothing beyond the defaults):\n",
    );
    let width = imports.iter().map(String::len).max().unwrap_or(0);
    for import in &imports {
        text.push_str(&format!("  {import:width$}  {}\n", capability(import)));
    }
    print_out(text.trim_end());
    ExitCode::SUCCESS
}

fn fail(args: &InspectArgs, failure: &Failure) -> ExitCode {
    if args.json {
        print_out(&json!({"ok": false, "error": failure.to_json()}).to_string());
    } else {
        print_error(&failure.message);
    }
    ExitCode::from(failure.exit)
}
