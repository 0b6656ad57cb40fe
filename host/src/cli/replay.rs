//! `airlock replay [SESSION…] --tool NAME=FILE|oci://REF`: what another
//! version of a tool would have done on the sessions the journal holds.
//!
//! Exit codes: 0 every replayed call is the same (or cannot be
//! reproduced: not a difference); 1 a call differs or fails; 2 bad input
//! (an unknown session, a tool with no call in them, a component that does
//! not load or does not offer the tool). Nothing is written to any session.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;

use airlock::Host;
use airlock::agent::replay::ReplaySummary;
use airlock::policy::ToolConfig;

use super::compare::{Selection, chosen, compare, cores};
use super::oci::{ComponentArg, RegistryFlags, resolve_one};
use super::{
    EXIT_TOOL_FAILED, Failure, StoreFlags, load_policy, print_json, print_out, report_failure,
    tools_host,
};

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The sessions whose calls to replay (default: every session of the
    /// user, or of every user with --all-users, within --since).
    #[arg(value_name = "SESSION")]
    sessions: Vec<String>,
    /// The candidate: replay the journaled calls of tool NAME against this
    /// component (a file, or oci://REGISTRY/REPO:TAG). Repeat it for more
    /// tools. It runs with the grants --config gives the tool now.
    #[arg(long = "tool", value_name = "NAME=FILE|oci://REF", required = true)]
    tools: Vec<String>,
    /// Only sessions updated within this long (`7d`, `12h`, `90m`).
    #[arg(long, value_name = "AGE")]
    since: Option<String>,
    /// Every user's sessions, not only --user's.
    #[arg(long)]
    all_users: bool,
    /// The policy the tools run under (their grants, limits, context
    /// rules), as `run` and `mcp` take it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// How many calls run at once (default: the machine's cores; more than
    /// 96 run as 96, the most a replay holds at once).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    parallel: Option<u16>,
    #[command(flatten)]
    store: StoreFlags,
    #[command(flatten)]
    registry: RegistryFlags,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: ReplayArgs) -> ExitCode {
    match replay(&args).await {
        Ok(summary) if summary.different + summary.failed > 0 => ExitCode::from(EXIT_TOOL_FAILED),
        Ok(_) => ExitCode::SUCCESS,
        Err(failure) => report_failure(&failure, args.json, serde_json::Map::new()),
    }
}

async fn replay(args: &ReplayArgs) -> Result<ReplaySummary, Failure> {
    let candidates = args
        .tools
        .iter()
        .map(|text| parse_tool(text))
        .collect::<Result<Vec<_>, _>>()?;
    let host = Arc::new(candidate_host(args, &candidates).await?);
    let tools: BTreeSet<String> = candidates.iter().map(|(name, _)| name.clone()).collect();
    let owner = args.store.owner()?;
    let store = super::compare::store_to_replay(&args.store, &args.sessions, owner).await?;
    let selection = Selection {
        sessions: &args.sessions,
        since: args.since.as_deref(),
        all_users: args.all_users,
    };
    let sessions = chosen(&selection, store.as_ref(), owner).await?;
    let parallel = args.parallel.map_or_else(cores, usize::from);
    let compared = compare(store.as_ref(), &host, &tools, &sessions, parallel).await?;
    if let Some(missing) = tools.iter().find(|t| !compared.seen.contains_key(*t)) {
        let names: Vec<&str> = sessions.iter().map(|(_, id)| id.as_str()).collect();
        let message = match (names.is_empty(), &args.since) {
            (true, Some(since)) => {
                format!(
                    "no call of tool {missing} to compare: no session was updated within {since}"
                )
            }
            (true, None) => {
                format!("no call of tool {missing} to compare: there is no session to replay")
            }
            (false, _) => format!(
                "no call of tool {missing} to compare in the sessions replayed ({})",
                names.join(", ")
            ),
        };
        return Err(Failure::input("no_calls", message));
    }
    if args.json {
        print_json(&compared.json(&store.location()));
    } else {
        print_out(&compared.text(&store.location(), &tools));
    }
    compared.say_what_differs();
    Ok(compared.total)
}

/// `NAME=FILE|oci://REF`.
fn parse_tool(text: &str) -> Result<(String, ComponentArg), Failure> {
    let bad = || {
        Failure::input(
            "invalid_tool",
            format!(
                "--tool {text:?}: say which tool and which component, NAME=FILE or NAME=oci://REF"
            ),
        )
    };
    let (name, component) = text.split_once('=').ok_or_else(bad)?;
    if name.is_empty() || component.is_empty() {
        return Err(bad());
    }
    let component = component
        .parse::<ComponentArg>()
        .map_err(|e| Failure::input("invalid_tool", format!("--tool {text:?}: {e}")))?;
    Ok((name.to_owned(), component))
}

/// A host with each candidate loaded under the policy's entry for the
/// tool it replaces (the grants, limits and names the tool has now), or
/// with nothing granted and the policy's `[limits]` when the policy has no
/// such tool.
async fn candidate_host(
    args: &ReplayArgs,
    candidates: &[(String, ComponentArg)],
) -> Result<Host, Failure> {
    let mut policy = load_policy(args.config.as_deref())?;
    let mut configs: BTreeMap<String, ToolConfig> = BTreeMap::new();
    if let Some(listed) = policy.as_ref().filter(|p| !p.tools.is_empty()) {
        let current = tools_host(
            Some(listed.clone()),
            &[],
            &args.registry,
            super::Lifetime::OneShot,
        )
        .await?
        .host;
        for (name, _) in candidates {
            let Some(component) = current.component_for(name) else {
                continue;
            };
            let path = component.path().canonicalize().ok();
            let entry = listed
                .tools
                .iter()
                .find(|t| t.path.canonicalize().ok() == path);
            if let Some(entry) = entry {
                configs.insert(name.clone(), entry.config.clone());
            }
        }
    }
    let mut host = super::compare::empty_host(policy.as_ref())?;
    // A component named for several of its tools is loaded once (under
    // the first one's entry): its tools, by the file it was read from.
    let mut offering: HashMap<PathBuf, Vec<String>> = HashMap::new();
    for (name, component) in candidates {
        let (path, _) = resolve_one(component, policy.as_mut(), &args.registry).await?;
        let file = path.canonicalize().unwrap_or_else(|_| path.clone());
        let offered = match offering.get(&file) {
            Some(offered) => offered,
            None => {
                let loaded = match configs.get(name) {
                    Some(config) => host.load_with(&path, config.clone()).await?,
                    None => host.load(&path).await?,
                };
                let offered = loaded.tools().iter().map(|t| t.name.clone()).collect();
                offering.entry(file).or_insert(offered)
            }
        };
        if !offered.contains(name) {
            let offered: Vec<&str> = offered.iter().map(String::as_str).collect();
            return Err(Failure::input(
                "unknown_tool",
                format!(
                    "{} does not offer a tool {name} (it offers: {})",
                    path.display(),
                    offered.join(", ")
                ),
            ));
        }
    }
    Ok(host)
}
