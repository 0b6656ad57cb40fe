//! `airlock inspect TOOL.wasm`: the tools a component exports, the
//! capabilities its imports ask for, and what the policy grants.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};

use airlock::tools::LoadedComponent;

use super::terminal::{block, field, one_line};
use super::{
    ComponentArg, Failure, RegistryFlags, load_host, print_json, print_out, report_failure,
};

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The tool component: a file (.wasm, or .wat text), or
    /// oci://REGISTRY/REPO:TAG (pulled through airlock.lock).
    #[arg(value_name = "TOOL.wasm|oci://REF")]
    component: ComponentArg,
    /// The operator's policy, to show what it grants this component.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    registry: RegistryFlags,
    /// Show each tool's whole description and its parameters' JSON Schema
    /// (without it: each tool's name and the first line of its
    /// description).
    #[arg(long)]
    schemas: bool,
    /// Print one JSON object instead of text (schemas included).
    #[arg(long)]
    json: bool,
}

/// The capability an import asks for, and what the grants (as
/// [`airlock::sandbox::Grants::describe`] put them) give it.
fn capability(import: &str, described: &[(&str, String)]) -> (&'static str, String) {
    let interface = import.split('@').next().unwrap_or(import);
    let listed = |kind: &str| {
        let items: Vec<&str> = described
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, line)| line.as_str())
            .collect();
        if items.is_empty() {
            "nothing granted".to_owned()
        } else {
            format!("granted: {}", items.join(", "))
        }
    };
    match interface {
        "airlock:tool/context" => ("run context", "read-only view, always".into()),
        "airlock:tool/log" => ("log", "captured, bounded".into()),
        "airlock:tool/types" => ("types", "definitions only, nothing to grant".into()),
        "airlock:tool/progress" => ("progress", "reported to the caller, throttled".into()),
        "airlock:tool/show" => ("content", "shown to the caller, bounded and checked".into()),
        "airlock:tool/ask" => (
            "questions",
            "to the person or the model only as the policy allows (ask, sample)".into(),
        ),
        i if i.starts_with("wasi:filesystem/") => ("files", listed("dirs")),
        i if i.starts_with("wasi:http/") => ("outgoing HTTP", listed("http")),
        "wasi:cli/environment" => ("environment variables", listed("env")),
        i if i.starts_with("wasi:sockets/") => ("raw sockets", "never granted".into()),
        i if i.starts_with("wasi:cli/std") || i.starts_with("wasi:cli/terminal") => (
            "stdio",
            "stdin empty; stdout/stderr captured, bounded".into(),
        ),
        i if i.starts_with("wasi:clocks/") => ("clocks", "always".into()),
        i if i.starts_with("wasi:random/") => ("random numbers", "always".into()),
        i if i.starts_with("wasi:io/") => ("streams", "used by the interfaces above".into()),
        "wasi:cli/exit" => ("exit", "ends the call as a failure".into()),
        _ => ("other", "linked by the host".into()),
    }
}

fn grants_json(component: &LoadedComponent) -> Value {
    let grants = component.grants();
    let limits = component.limits();
    json!({
        "dirs": grants.dirs.iter().map(|d| json!({"host": d.host(), "guest": d.guest(), "mode": d.mode()})).collect::<Vec<_>>(),
        "env": grants.env.iter().map(|e| e.name()).collect::<Vec<_>>(),
        "http": grants.http.allowed().iter().map(|p| p.as_str()).collect::<Vec<_>>(),
        "secrets": grants.secrets.iter().map(|s| json!({"env": s.name(), "set": s.is_set(), "header": s.header_name().as_str(), "origins": s.origins().iter().map(|o| o.as_str()).collect::<Vec<_>>()})).collect::<Vec<_>>(),
        "limits": {
            "timeout_ms": u64::try_from(limits.timeout.as_millis()).unwrap_or(u64::MAX),
            "memory_bytes": limits.max_memory_bytes,
            "fuel": limits.fuel,
            "max_result_bytes": limits.max_result_bytes,
            "max_output_bytes": limits.max_output_bytes,
            "max_write_bytes": limits.max_write_bytes,
            "max_ops": limits.ops.max_ops,
            "max_op_bytes": limits.ops.max_op_bytes,
            "max_deps_bytes": limits.ops.max_deps_bytes,
            "max_host_resources": limits.max_host_resources,
            "prepared_instances": limits.prepared_instances,
        },
        "http_bounds": {
            "max_response_bytes": grants.http.max_response_bytes,
            "max_requests": grants.http.max_requests,
            "max_connections": grants.http.max_connections,
        },
        "approval": component.approval(),
        "may_rerun": component.may_rerun(),
        "context": {
            "read": component.access().read.patterns(),
            "write": component.access().write.patterns(),
        },
    })
}

/// Every grant in words, one per line, aligned: what the policy gives the
/// component whatever it imports.
fn grant_lines(component: &LoadedComponent, described: &[(&'static str, String)]) -> String {
    let grants = component.grants();
    let mut lines: Vec<(&str, String)> = Vec::new();
    for kind in ["dirs", "env", "http"] {
        let items: Vec<&str> = described
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, line)| line.as_str())
            .collect();
        let shown = if items.is_empty() {
            "none".to_owned()
        } else {
            items.join(", ")
        };
        lines.push((kind, shown));
    }
    if !grants.http.allowed().is_empty() {
        lines.push((
            "http bounds",
            format!(
                "{} response bytes, {} requests, {} connections at once",
                grants.http.max_response_bytes,
                grants.http.max_requests,
                grants.http.max_connections
            ),
        ));
    }
    if grants
        .dirs
        .iter()
        .any(|d| d.mode() == airlock::sandbox::grants::DirMode::Rw)
    {
        lines.push((
            "dirs bounds",
            format!(
                "{} bytes written a call",
                component.limits().max_write_bytes
            ),
        ));
    }
    for (_, line) in described.iter().filter(|(k, _)| *k == "secrets") {
        lines.push(("secret", format!("{line} (never visible to the tool)")));
    }
    lines.push((
        "approval",
        match component.approval() {
            airlock::policy::Approval::Ask => "ask before each call".to_owned(),
            airlock::policy::Approval::Never => "never asked".to_owned(),
        },
    ));
    lines.push((
        "reruns",
        if component.may_rerun() {
            "may run speculatively in a parallel turn".to_owned()
        } else {
            "effectful: never run speculatively".to_owned()
        },
    ));
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    lines
        .iter()
        .map(|(kind, line)| format!("  {kind:width$}  {}\n", field(line)))
        .collect()
}

/// How many fresh instances are made ahead of the component's calls, and
/// if none, why.
fn prepared_line(component: &LoadedComponent) -> String {
    let n = component.limits().prepared_instances;
    if n == 0 {
        "none (prepared_instances = 0)".to_owned()
    } else if !component.grants().is_none() {
        "none (a tool granted files, variables, hosts or secrets is instantiated as its call starts)"
            .to_owned()
    } else {
        format!(
            "{n} fresh instance{} made ahead of calls, each used by one call, while instantiating \
             takes 30 µs or more (a Python tool's does; a Rust, C or JavaScript tool's takes a \
             few µs)",
            if n == 1 { "" } else { "s" }
        )
    }
}

/// The imports by capability, in the order first asked for: what each
/// capability gets, once, then the interfaces that ask for it.
fn import_lines(imports: &[String], described: &[(&'static str, String)]) -> String {
    let mut groups: Vec<(&str, String, Vec<&str>)> = Vec::new();
    for import in imports {
        let (capability, granted) = capability(import, described);
        match groups
            .iter_mut()
            .find(|(c, g, _)| *c == capability && *g == granted)
        {
            Some((_, _, names)) => names.push(import),
            None => groups.push((capability, granted, vec![import])),
        }
    }
    let mut text = String::new();
    for (capability, granted, names) in groups {
        text.push_str(&format!("  {capability}: {granted}\n"));
        // The interfaces, as many to a line as fit in 100 columns.
        let mut line = String::from("   ");
        for name in names {
            if line.len() > 3 && line.len() + name.len() + 2 > 100 {
                text.push_str(line.trim_end_matches(','));
                text.push('\n');
                line = String::from("   ");
            }
            line.push_str(&format!(" {},", field(name)));
        }
        text.push_str(line.trim_end_matches(','));
        text.push('\n');
    }
    text
}

pub async fn run(args: InspectArgs) -> ExitCode {
    let (_host, component, pulled) =
        match load_host(&args.component, args.config.as_deref(), &args.registry).await {
            Ok(loaded) => loaded,
            Err(failure) => return fail(&args, &failure),
        };
    let component = &*component;
    let described = component.grants().describe();
    let imports = component.imports();
    let oci = pulled.as_ref().map(super::oci::describe);
    if args.json {
        let tools: Vec<Value> = component
            .tools()
            .iter()
            .map(|spec| {
                let mut tool = json!(spec);
                if let Some(source) = component.source_of(&spec.name) {
                    tool["source"] = json!(source);
                }
                tool
            })
            .collect();
        let doc = json!({
            "path": component.path(),
            "kind": if component.is_plain() { "plain" } else { "airlock" },
            "oci": oci.as_ref().map(|(_, doc)| doc),
            "tools": tools,
            "skipped": component.skipped(),
            "resources": component.offers().0,
            "prompts": component.offers().1,
            "withheld": component.withheld(),
            "imports": imports.iter().map(|i| {
                let (capability, granted) = capability(i, &described);
                json!({"name": i, "capability": capability, "granted": granted})
            }).collect::<Vec<_>>(),
            "grants": grants_json(component),
        });
        print_json(&doc);
        return ExitCode::SUCCESS;
    }
    let heading = if component.is_plain() {
        "tools (a plain component: each exported function is a tool, with no context view and no ops):"
    } else {
        "tools:"
    };
    let mut text = match &oci {
        Some((described, _)) => format!("{described}  file:      {}\n", component.path().display()),
        None => format!("{}\n", component.path().display()),
    };
    text.push_str(&format!("\n{heading}\n"));
    let width = component
        .tools()
        .iter()
        .map(|spec| field(&spec.name).chars().count())
        .max()
        .unwrap_or(0);
    for spec in component.tools() {
        if !args.schemas {
            // A name and the first line of what it does, aligned.
            let first = spec.description.lines().next().unwrap_or_default();
            let line = format!("  {:width$}  {}", field(&spec.name), one_line(first, 100));
            text.push_str(line.trim_end());
            text.push('\n');
            continue;
        }
        text.push_str(&format!(
            "  {}  {}\n",
            field(&spec.name),
            block(&spec.description, 4)
        ));
        if let Some(source) = component
            .source_of(&spec.name)
            .filter(|source| *source != spec.name)
        {
            text.push_str(&format!("    function:   {}\n", field(&source)));
        }
        // Every schema pretty, however short, its lines under its first.
        let parameters = serde_json::to_string_pretty(&spec.parameters)
            .unwrap_or_else(|_| spec.parameters.to_string())
            .replace('\n', "\n                ");
        text.push_str(&format!("    parameters: {parameters}\n"));
    }
    if !args.schemas && !component.tools().is_empty() {
        text.push_str("  (whole descriptions and parameter schemas: --schemas, or --json)\n");
    }
    if !component.skipped().is_empty() {
        text.push_str("\nnot offered as tools:\n");
        let rows = component.skipped().iter().map(|skipped| {
            let reason = field(&skipped.reason).into_owned();
            (field(&skipped.function).into_owned(), reason)
        });
        aligned(&mut text, rows);
    }
    let (resources, prompts) = component.offers();
    if !resources.is_empty() {
        text.push_str("\nresources (for an MCP client):\n");
        let rows = resources.iter().map(|spec| {
            let about = spec.description.as_deref().unwrap_or(&spec.name);
            (field(&spec.uri).into_owned(), about.to_owned())
        });
        aligned(&mut text, rows);
    }
    if !component.withheld().is_empty() {
        text.push_str("\nresources not offered:\n");
        let rows = component.withheld().iter().map(|withheld| {
            let reason = field(&withheld.reason).into_owned();
            (field(&withheld.uri).into_owned(), reason)
        });
        aligned(&mut text, rows);
    }
    if !prompts.is_empty() {
        text.push_str("\nprompts (for an MCP client):\n");
        let rows = prompts.iter().map(|spec| {
            let arguments: Vec<String> = spec
                .arguments
                .iter()
                .map(|a| {
                    if a.required {
                        a.name.clone()
                    } else {
                        format!("[{}]", a.name)
                    }
                })
                .collect();
            let named = format!("{}({})", field(&spec.name), field(&arguments.join(", ")));
            (named, spec.description.clone().unwrap_or_default())
        });
        aligned(&mut text, rows);
    }
    text.push_str("\nimports (what the tool asks for, and what it gets):\n");
    text.push_str(&import_lines(&imports, &described));
    text.push_str("\ngrants:\n");
    text.push_str(&grant_lines(component, &described));
    text.push_str(&format!("\nlimits: {}\n", component.limits().describe()));
    text.push_str(&format!("prepared: {}\n", prepared_line(component)));
    let patterns = |list: &[String]| {
        if list.is_empty() {
            "(nothing)".to_owned()
        } else {
            list.join(", ")
        }
    };
    if component.is_plain() {
        text.push_str("context: none (a plain component gets no view of deps and returns no ops)");
    } else {
        text.push_str(&format!(
            "context: read {}; write {}",
            patterns(component.access().read.patterns()),
            patterns(component.access().write.patterns()),
        ));
    }
    print_out(&text);
    ExitCode::SUCCESS
}

fn fail(args: &InspectArgs, failure: &Failure) -> ExitCode {
    report_failure(failure, args.json, serde_json::Map::new())
}

/// `rows` as lines of `text`: each first column padded to the longest (at
/// most 40 characters), then the second, its own lines under its first.
/// Both are shown as given: escape what needs it first.
fn aligned(text: &mut String, rows: impl Iterator<Item = (String, String)>) {
    let rows: Vec<(String, String)> = rows.collect();
    let width = rows
        .iter()
        .map(|(first, _)| first.chars().count())
        .max()
        .unwrap_or(0)
        .min(40);
    for (first, second) in rows {
        let line = format!("  {first:width$}  {}", block(&second, width + 4));
        text.push_str(line.trim_end());
        text.push('\n');
    }
}
