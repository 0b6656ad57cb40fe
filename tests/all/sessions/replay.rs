//! Sessions: replay. A session's calls run again against the version of
//! a tool that made them reproduce themselves exactly (clocks, random
//! bytes, the whole context view); against a new version, exactly the
//! calls it changes differ; against one that traps, each call fails; and
//! nothing is written.

use std::collections::BTreeSet;

use airlock::agent::replay::{Replay, ReplayError, ReplaySummary, Replayed, Verdict};
use airlock::policy::ToolConfig;
use airlock::tools::ToolCall;

use super::*;
use crate::support::host_with;

/// A host with `stamp` built as `stamp` (one of the three builds) and
/// the context probe.
async fn stamp_host(stamp: &str) -> Arc<airlock::Host> {
    let guests = [
        (stamp, ToolConfig::default()),
        ("context_probe", ToolConfig::default()),
    ];
    Arc::new(host_with(&guests, ContextRules::default()).await)
}

/// Replays `tools` of alice's session `id` against `host`: the summary
/// and every call, in order.
async fn replayed(
    store: &Arc<dyn SessionStore>,
    host: &Arc<airlock::Host>,
    id: &str,
    tools: &[&str],
) -> (ReplaySummary, Vec<Replayed>) {
    let tools: BTreeSet<String> = tools.iter().map(|t| (*t).to_owned()).collect();
    let replay = Replay {
        owner: Some("alice"),
        session_id: id,
        tools: &tools,
        parallel: 2,
    };
    let mut calls = Vec::new();
    let summary = Session::replay(store.as_ref(), host, replay, |call| calls.push(call))
        .await
        .unwrap();
    (summary, calls)
}

/// Makes alice's session `id` of `records` (a journal as JSON, edited by
/// a test).
async fn made_of(store: &Arc<dyn SessionStore>, id: &str, records: Value) {
    let records: Vec<airlock::journal::Record> = serde_json::from_value(records).unwrap();
    let header = airlock::session::SessionHeader {
        session_id: id.into(),
        user_id: Some("alice".into()),
        created_at_ms: 1,
        metadata: Default::default(),
        ephemeral: false,
    };
    let holder = airlock::session::Holder::new();
    let made = store
        .lease(airlock::session::LeaseRequest {
            user_id: Some("alice"),
            session_id: id,
            holder: &holder,
            ttl: std::time::Duration::from_secs(30),
            now_ms: airlock::journal::now_ms(),
            create: Some((&header, &records)),
        })
        .await
        .unwrap();
    store.release(&made.lease).await.unwrap();
}

/// Each replayed call's verdict, by name.
fn verdicts(calls: &[Replayed]) -> Vec<&'static str> {
    calls.iter().map(|c| c.verdict.name()).collect()
}

/// Why `call` cannot be reproduced (it must be so judged).
fn why_not(call: &Replayed) -> &str {
    match &call.verdict {
        Verdict::CannotReproduce { why } => why,
        other => panic!("{other:?}"),
    }
}

/// An agent run on alice's session `stamps` (metadata `team = red`):
/// stamps made in parallel, a `read` of the whole view that fails on its
/// arguments and one that then sees its retry count, iteration, usage,
/// ids and metadata, a stamp in a later turn; then a direct call. Replayed
/// against v1: every call the same. Against v2 (labels trimmed and
/// lowercased): exactly the two calls whose label changes, with what
/// changed. Against the broken build: every stamp failed with its trap.
/// The journal is the same record for record after all of it.
async fn a_replay_finds_exactly_the_calls_a_new_version_changes(backend: Backend) {
    let db = TestStore::new(backend, "replay").await;
    let store = db.open().await;
    let v1 = stamp_host("stamp").await;
    let dir = tempfile::tempdir().unwrap();
    let read = json!({"keys": ["stamps"], "metadata": ["team"]});
    let model = script(
        dir.path(),
        "stamps",
        json!([
            {"tool_calls": [
                {"name": "stamp", "arguments": {"label": "alpha"}},
                {"name": "stamp", "arguments": {"label": "Beta"}},
                {"name": "read", "arguments": read}
            ]},
            {"tool_calls": [{"name": "read", "arguments": {"keys": 5}}]},
            {"tool_calls": [{"name": "read", "arguments": read}]},
            {"tool_calls": [{"name": "stamp", "arguments": {"label": " gamma"}}]},
            {"text": "stamped"}
        ]),
    );
    let mut opening = options(Some("alice"), "stamps");
    opening.metadata = BTreeMap::from([("team".to_owned(), "red".to_owned())]);
    let mut session = open(&store, opening).await;
    let agent = Agent::new(Arc::clone(&v1), model);
    agent.run_session(&mut session, "Stamp.").await.unwrap();
    let direct = ToolCall::new("stamp", json!({"label": "delta"}).to_string());
    session
        .call(&v1, &direct, &CancelToken::new(), None)
        .await
        .unwrap();
    session.close().await.unwrap();
    let journal = store.read(Some("alice"), "stamps").await.unwrap().records;
    // The calls read real time and random bytes, and the view's ids and
    // counts: their results hold them.
    let read_result = journal
        .iter()
        .filter_map(|r| match &r.entry.event()?.item {
            Item::FunctionCallOutput {
                name,
                status: CallStatus::Completed,
                output,
                ..
            } if name == "read" => Some(serde_json::from_str::<Value>(output).unwrap()),
            _ => None,
        })
        .next_back()
        .unwrap();
    assert_eq!(read_result["retry"], 1, "{read_result}");
    assert_eq!(read_result["iteration"], 3, "{read_result}");

    let (summary, calls) = replayed(&store, &v1, "stamps", &["stamp", "read"]).await;
    let verdicts: Vec<(&str, &str)> = calls
        .iter()
        .map(|c| (c.tool.as_str(), c.verdict.name()))
        .collect();
    assert_eq!(
        verdicts,
        [
            ("stamp", "same"),
            ("stamp", "same"),
            ("read", "same"),
            ("read", "same"),
            ("read", "same"),
            ("stamp", "same"),
            ("stamp", "same"),
        ]
    );
    assert_eq!(summary.same, 7);

    let v2 = stamp_host("stamp_v2").await;
    let (summary, calls) = replayed(&store, &v2, "stamps", &["stamp"]).await;
    assert_eq!((summary.same, summary.different, summary.failed), (2, 2, 0));
    let differing: Vec<(Value, Value, Value)> = calls
        .iter()
        .filter_map(|c| match &c.verdict {
            Verdict::Different { recorded, replayed } => Some((
                c.arguments["label"].clone(),
                recorded.result["stamp"]["label"].clone(),
                replayed.result["stamp"]["label"].clone(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        differing,
        [
            (json!("Beta"), json!("Beta"), json!("beta")),
            (json!(" gamma"), json!(" gamma"), json!("gamma")),
        ]
    );
    // Only the label differs: the id and time are the recorded ones.
    for call in &calls {
        if let Verdict::Different { recorded, replayed } = &call.verdict {
            assert_eq!(
                recorded.result["stamp"]["id"],
                replayed.result["stamp"]["id"]
            );
            assert_eq!(
                recorded.result["stamp"]["at_ms"],
                replayed.result["stamp"]["at_ms"]
            );
            assert_eq!(recorded.ops.len(), 1);
            assert_ne!(recorded.ops, replayed.ops);
        }
    }

    let broken = stamp_host("stamp_broken").await;
    let (summary, calls) = replayed(&store, &broken, "stamps", &["stamp"]).await;
    assert_eq!((summary.same, summary.failed), (0, 4));
    for call in &calls {
        let Verdict::Failed { error, .. } = &call.verdict else {
            panic!("{call:?}");
        };
        assert!(error.contains("unreachable"), "{error}");
    }

    assert_eq!(
        store.read(Some("alice"), "stamps").await.unwrap().records,
        journal
    );
    // And the host still serves.
    let mut ctx = airlock::RunContext::default();
    v1.call(&mut ctx, &direct).await.unwrap();

    // A session nobody has.
    let tools = BTreeSet::from(["stamp".to_owned()]);
    let replay = Replay {
        owner: Some("alice"),
        session_id: "nothing",
        tools: &tools,
        parallel: 1,
    };
    let missing = Session::replay(store.as_ref(), &v1, replay, |_| {}).await;
    assert!(
        matches!(
            missing,
            Err(ReplayError::Store(StoreError::NotFound { .. }))
        ),
        "{missing:?}"
    );
}

/// A call whose approval edited its arguments ran with the edited ones:
/// they are kept with its output, so a replay runs it with them. The same build reproduces it; a new one's diff is of the
/// call as it ran.
async fn a_call_edited_at_its_approval_replays_with_the_arguments_it_ran_with(backend: Backend) {
    use airlock::agent::Decision;
    let db = TestStore::new(backend, "edited").await;
    let store = db.open().await;
    let config = ToolConfig {
        approval: airlock::policy::Approval::Ask,
        ..ToolConfig::default()
    };
    let asking = Arc::new(host_with(&[("stamp", config)], ContextRules::default()).await);
    let dir = tempfile::tempdir().unwrap();
    let model = script(
        dir.path(),
        "edited",
        json!([
            {"tool_calls": [{"name": "stamp", "arguments": {"label": "Typo"}}]},
            {"text": "stamped"}
        ]),
    );
    let mut session = open(&store, options(Some("alice"), "edited")).await;
    let approver = |_: &airlock::ToolCall| Decision::Edit(json!({"label": "Fixed"}).to_string());
    Agent::new(asking, model)
        .approver(Arc::new(approver))
        .run_session(&mut session, "Stamp.")
        .await
        .unwrap();
    session.close().await.unwrap();
    let journal = store.read(Some("alice"), "edited").await.unwrap().records;
    let ran_with: Vec<Option<String>> = journal
        .iter()
        .filter_map(|r| match &r.entry.event()?.item {
            Item::FunctionCallOutput { arguments, .. } => Some(arguments.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ran_with, [Some(r#"{"label":"Fixed"}"#.to_owned())]);

    let (summary, calls) = replayed(&store, &stamp_host("stamp").await, "edited", &["stamp"]).await;
    assert_eq!((summary.same, summary.different), (1, 0), "{calls:?}");
    assert_eq!(calls[0].arguments, json!({"label": "Fixed"}));
    let (summary, calls) =
        replayed(&store, &stamp_host("stamp_v2").await, "edited", &["stamp"]).await;
    assert_eq!((summary.same, summary.different), (0, 1), "{calls:?}");
    let Verdict::Different { recorded, replayed } = &calls[0].verdict else {
        panic!("{calls:?}");
    };
    assert_eq!(recorded.result["stamp"]["label"], "Fixed");
    assert_eq!(replayed.result["stamp"]["label"], "fixed");
    let after = store.read(Some("alice"), "edited").await.unwrap().records;
    assert_eq!(after.len(), journal.len(), "nothing written");
}

crate::on_both_stores!(
    a_replay_finds_exactly_the_calls_a_new_version_changes,
    a_call_edited_at_its_approval_replays_with_the_arguments_it_ran_with
);

/// `airlock replay` on sessions `airlock call` made with the Rust, Python
/// and JavaScript examples: the same builds reproduce every call (exit 0);
/// v2 is reported with the call's place and what changed (exit 1, in text
/// and `--json`); the broken build fails each call with its trap; bad
/// input exits 2 naming what is wrong. Nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_command_reports_what_differs_and_refuses_bad_input() {
    use crate::support::{airlock, built, guest};
    let db = TestStore::new(Backend::Sqlite, "cli").await;
    let path = |p: std::path::PathBuf| p.display().to_string();
    let (v1, v2, broken) = (
        path(guest("stamp")),
        path(guest("stamp_v2")),
        path(guest("stamp_broken")),
    );
    let (python, js) = (path(built("python-stateful")), path(built("js-stateful")));
    let call = |component: &str, tool: &str, args: Value, session: &str| {
        let args = args.to_string();
        let out = airlock(&[
            "call",
            component,
            tool,
            &args,
            "--session",
            session,
            "--store",
            &db.spec,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    };
    for label in ["alpha", "Beta", "x"] {
        call(&v1, "stamp", json!({"label": label}), "s1");
    }
    call(&python, "increment", json!({"name": "a"}), "s1");
    call(&js, "increment", json!({"name": "a"}), "s2");
    let store = db.open().await;
    let journal = store.read(None, "s1").await.unwrap().records;
    let replay = |args: &[&str]| {
        let mut all = vec!["replay", "--store", db.spec.as_str()];
        all.extend_from_slice(args);
        airlock(&all)
    };

    let stamp_v1 = format!("stamp={v1}");
    let out = replay(&[
        "s1",
        "--tool",
        &stamp_v1,
        "--tool",
        &format!("increment={python}"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.starts_with("replayed 4 calls of increment, stamp in 1 session of sqlite:"),
        "{said}"
    );
    assert!(
        said.contains(": 4 same, 0 different, 0 failed, 0 cannot be reproduced"),
        "{said}"
    );
    let out = replay(&["s2", "--tool", &format!("increment={js}"), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["summary"]["same"], 1);

    // Every session of the user: s2, which has no call of stamp, is
    // counted apart.
    let out = replay(&["--tool", &format!("stamp={v2}")]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.starts_with("replayed 3 calls of stamp in 1 session of sqlite:"),
        "{said}"
    );
    assert!(
        said.contains(
            "2 same, 1 different, 0 failed, 0 cannot be reproduced (1 more session had no \
             call of stamp)\n"
        ),
        "{said}"
    );
    assert!(said.contains("\ndifferent  s1 record "), "{said}");
    assert!(
        said.contains(r#"result.stamp.label: "Beta" → "beta""#),
        "{said}"
    );
    assert!(
        said.contains(r#"ops[0].value.label: "Beta" → "beta""#),
        "{said}"
    );
    let out = replay(&["s1", "--tool", &format!("stamp={v2}"), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let report = stdout_json(&out);
    assert_eq!(report["ok"], false);
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{report}");
    assert_eq!(calls[0]["verdict"], "different");
    assert_eq!(calls[0]["arguments"], json!({"label": "Beta"}));
    assert_eq!(calls[0]["replayed"]["result"]["stamp"]["label"], "beta");
    let seq = calls[0]["seq"].as_u64().unwrap();
    let at = journal.iter().find(|r| r.seq == seq).unwrap();
    assert!(matches!(
        &at.entry.event().unwrap().item,
        Item::FunctionCallOutput { name, .. } if name == "stamp"
    ));

    let out = replay(&["s1", "--tool", &format!("stamp={broken}")]);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains("0 same, 0 different, 3 failed"), "{said}");
    assert_eq!(said.matches("unreachable").count(), 3, "{said}");

    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, "not a component").unwrap();
    let stateful = path(guest("stateful"));
    for (args, needle) in [
        (
            vec!["nothing".to_owned(), "--tool".into(), stamp_v1.clone()],
            "no session nothing".to_owned(),
        ),
        (
            vec!["s1".into(), "--tool".into(), format!("add_note={stateful}")],
            "no call of tool add_note".into(),
        ),
        (
            vec![
                "s1".into(),
                "--tool".into(),
                format!("stamp={}", junk.display()),
            ],
            junk.display().to_string(),
        ),
        (
            vec!["s1".into(), "--tool".into(), format!("stamp={stateful}")],
            "does not offer a tool stamp".into(),
        ),
        (
            vec!["s1".into(), "--tool".into(), "stamp".into()],
            "NAME=FILE".into(),
        ),
        (
            vec![
                "s1".into(),
                "--tool".into(),
                stamp_v1.clone(),
                "--parallel".into(),
                "0".into(),
            ],
            "--parallel".into(),
        ),
        (
            vec![
                "--tool".into(),
                stamp_v1.clone(),
                "--since".into(),
                "0d".into(),
            ],
            "no call of tool stamp to compare: no session was updated within 0d".into(),
        ),
        (
            vec!["s1".into(), "a/b".into(), "--tool".into(), stamp_v1.clone()],
            "invalid session id: only ASCII letters, digits and _ - . : @ are allowed (\"a/b\")"
                .into(),
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = replay(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(&needle), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(store.read(None, "s1").await.unwrap().records, journal);
    assert_eq!(store.list(None).await.unwrap().len(), 2);

    // A store that does not exist holds no session, and replaying makes
    // none: a session named in it is not found, and without names there
    // is nothing to replay.
    let empty = tempfile::tempdir().unwrap();
    let missing = empty.path().join("none.db");
    let missing = missing.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["replay", "s1", "--tool", &stamp_v1, "--store", missing],
            format!(
                "no session s1 (with no user) in sqlite:{missing}: the store does not exist yet"
            ),
        ),
        (
            vec!["replay", "--tool", &stamp_v1, "--store", missing],
            format!("there is no session to replay: the store sqlite:{missing} does not exist yet"),
        ),
    ] {
        let out = airlock(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(&needle), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);

    // A session named twice is replayed once.
    let out = replay(&["s1", "s1", "--tool", &stamp_v1, "--parallel", "65535"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.starts_with("replayed 3 calls of stamp in 1 session of sqlite:"),
        "{said}"
    );

    // Two tools of one component, each named with the same file: it is
    // loaded once, and both tools' calls replay.
    call(&python, "increment", json!({"name": "a"}), "s3");
    call(&python, "add_note", json!({"text": "n"}), "s3");
    let out = replay(&[
        "s3",
        "--tool",
        &format!("increment={python}"),
        "--tool",
        &format!("add_note={python}"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.starts_with("replayed 2 calls of add_note, increment in 1 session of sqlite:")
            && said.contains(": 2 same, 0 different"),
        "{said}"
    );

    // A candidate runs under the policy: a tool it lists with a fuel
    // bound replays on a host that meters fuel; one it does not list gets
    // its `[limits]`, a tightened one failing each call.
    let policy = dir.path().join("airlock.toml");
    let write = |text: String| std::fs::write(&policy, text).unwrap();
    write(format!(
        "[[tool]]\npath = {v1:?}\nlimits = {{ fuel = 100000000 }}\n"
    ));
    let config = path(policy.clone());
    let out = replay(&["s1", "--tool", &stamp_v1, "--config", &config]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    write("[limits]\nmax_result_bytes = 8\n".to_owned());
    let out = replay(&["s1", "--tool", &stamp_v1, "--config", &config]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains("0 same, 0 different, 3 failed"), "{said}");
    assert_eq!(said.matches("the limit is 8").count(), 3, "{said}");
}

/// Many sessions replayed at once (`--parallel` above 1 replays several
/// together) report exactly what one at a time reports: the same calls,
/// in the sessions' order and each session's journal order, the same
/// summaries. The sessions are of different lengths (2 to 12 calls), so
/// that sessions replayed together end out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_replayed_together_report_as_one_at_a_time() {
    use crate::support::{airlock, guest};
    let db = TestStore::new(Backend::Sqlite, "many").await;
    let (v1, v2) = (
        guest("stamp").display().to_string(),
        guest("stamp_v2").display().to_string(),
    );
    let sessions = 6;
    for s in 0..sessions {
        let session = format!("s{s}");
        // v2 writes a label in lower case: each upper-case label differs.
        for c in 0..(2 * (sessions - s)) {
            let label = if c % 2 == 0 {
                format!("L{s}-{c}")
            } else {
                format!("x{c}")
            };
            let args = json!({ "label": label }).to_string();
            let out = airlock(&[
                "call",
                &v1,
                "stamp",
                &args,
                "--session",
                &session,
                "--store",
                &db.spec,
            ]);
            assert!(out.status.success(), "{}", stderr(&out));
        }
    }
    let tool = format!("stamp={v2}");
    let report = |parallel: &str| {
        let out = airlock(&[
            "replay",
            "--store",
            &db.spec,
            "--tool",
            &tool,
            "--parallel",
            parallel,
            "--json",
        ]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        stdout_json(&out)
    };
    let alone = report("1");
    let calls = alone["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 21, "{alone}");
    assert_eq!(alone["summary"]["different"], 21);
    assert_eq!(alone["summary"]["same"], 21);
    // Grouped by session, in the order the sessions are listed, and each
    // session's calls in its journal's order.
    let listed: Vec<&Value> = alone["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["session_id"])
        .collect();
    assert_eq!(listed.len(), sessions);
    let places: Vec<(usize, u64)> = calls
        .iter()
        .map(|c| {
            let at = listed.iter().position(|s| **s == c["session_id"]).unwrap();
            (at, c["seq"].as_u64().unwrap())
        })
        .collect();
    let mut sorted = places.clone();
    sorted.sort();
    assert_eq!(places, sorted, "{alone}");
    for parallel in ["2", "4", "96"] {
        assert_eq!(report(parallel), alone, "--parallel {parallel}");
    }
}

/// A tool granted environment variables whose policy says `record = true`
/// keeps with each call the values it was given (an unset one as unset;
/// one whose name looks secret not at all), and a replay gives it those, whatever the host's are now: its calls
/// reproduce themselves after the operator changed the variable. Without
/// `record`, a replay reads the variables as they are now, and a changed
/// one is a difference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_environment_is_recorded_replays_with_it() {
    use crate::support::{airlock_with_env, guest};
    const VAR: &str = "AIRLOCK_TEST_REPLAYED_ZONE";
    let db = TestStore::new(Backend::Sqlite, "env").await;
    let hostile = guest("hostile").display().to_string();
    let policy = |name: &str, record: bool| {
        let path = db.dir.path().join(name);
        std::fs::write(
            &path,
            format!(
                "[[tool]]\npath = {hostile:?}\nenv = [{VAR:?}, \"AIRLOCK_TEST_TOKEN\"]\n\
                 record = {record}\n"
            ),
        )
        .unwrap();
        path.display().to_string()
    };
    let (recorded, unrecorded) = (policy("recorded.toml", true), policy("plain.toml", false));
    let args = json!({"name": VAR}).to_string();
    let call = |config: &str, session: &str, zone: Option<&str>| {
        let mut env = vec![("AIRLOCK_TEST_TOKEN", "t0p-s3cret")];
        env.extend(zone.map(|zone| (VAR, zone)));
        let out = airlock_with_env(
            &[
                "call",
                &hostile,
                "read_env",
                &args,
                "--config",
                config,
                "--session",
                session,
                "--store",
                &db.spec,
                "--json",
            ],
            &env,
        );
        assert!(out.status.success(), "{}", stderr(&out));
        stdout_json(&out)["result"]["value"].clone()
    };
    assert_eq!(
        call(&recorded, "kept", Some("Europe/Paris")),
        json!("Europe/Paris")
    );
    assert_eq!(call(&recorded, "kept", None), Value::Null);
    assert_eq!(
        call(&unrecorded, "now", Some("Europe/Paris")),
        json!("Europe/Paris")
    );

    let store = db.open().await;
    let journal = serde_json::to_value(store.read(None, "kept").await.unwrap().records).unwrap();
    let tapes: Vec<Value> = journal
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r.pointer("/event/type") == Some(&json!("function_call_output")))
        .map(|r| r.pointer("/event/tape/env").cloned().unwrap_or(Value::Null))
        .collect();
    // A variable whose name looks secret is given, never journaled.
    assert_eq!(tapes, [json!({VAR: "Europe/Paris"}), json!({VAR: null})]);
    assert!(!journal.to_string().contains("t0p-s3cret"));

    let replay = |session: &str, config: &str| {
        let tool = format!("read_env={hostile}");
        airlock_with_env(
            &[
                "replay", session, "--tool", &tool, "--config", config, "--store", &db.spec,
            ],
            &[(VAR, "UTC")],
        )
    };
    let out = replay("kept", &recorded);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains(": 2 same, 0 different"), "{said}");
    let out = replay("now", &unrecorded);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.contains(r#"result.value: "Europe/Paris" → "UTC""#),
        "{said}"
    );
}

/// A replay changes nothing outside the sandbox: a call that fetched over
/// HTTP (with a secret) and one that read a granted directory are
/// replayed as "cannot be reproduced", saying why; the server hears no
/// second request; the host serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_call_sends_no_request_and_gets_no_directory() {
    use crate::support::loopback::Loopback;
    use airlock::sandbox::grants::{
        DirGrant, DirMode, HostPattern, HttpGrant, SecretConfig, SecretGrant,
    };

    let server = Loopback::start().await;
    let origin = server.url("");
    let mut fetcher = ToolConfig::default();
    fetcher.grants.http = HttpGrant::new(vec![HostPattern::parse(&origin).unwrap()]);
    let mut secret = SecretConfig::new("TEST_TOKEN", vec![origin.clone()]);
    secret.cleartext_loopback = true;
    fetcher.grants.secrets = vec![SecretGrant::with_value(secret, "never-replayed").unwrap()];
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("a.txt"), "from the file").unwrap();
    let mut reader = ToolConfig::default();
    reader.grants.dirs = vec![DirGrant::new(data.path(), "/data", DirMode::Ro).unwrap()];
    let guests = [("http_fetch", fetcher), ("reach", reader)];
    let host = Arc::new(host_with(&guests, ContextRules::default()).await);

    let db = TestStore::new(Backend::Sqlite, "effects").await;
    let store = db.open().await;
    let mut session = open(&store, options(Some("alice"), "effects")).await;
    let fetch = ToolCall::new("fetch", json!({"url": server.url("/hello")}).to_string());
    let read = ToolCall::new("read-text", json!({"path": "/data/a.txt"}).to_string());
    for call in [&fetch, &read] {
        session
            .call(&host, call, &CancelToken::new(), None)
            .await
            .unwrap();
    }
    session.close().await.unwrap();
    assert_eq!(server.requests().len(), 1);

    let (summary, calls) = replayed(&store, &host, "effects", &["fetch", "read-text"]).await;
    assert_eq!(summary.cannot_reproduce, 2, "{calls:?}");
    let whys: Vec<String> = calls
        .iter()
        .map(|c| match &c.verdict {
            Verdict::CannotReproduce { why } => why.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        whys,
        [
            "sends HTTP requests, which are not recorded",
            "reads its granted directories, whose files are not recorded"
        ]
    );
    assert_eq!(server.requests().len(), 1, "a replay sent a request");
    let mut ctx = airlock::RunContext::default();
    let again = host.call(&mut ctx, &read).await.unwrap();
    assert_eq!(again.result, json!("from the file"));
}

/// A fetcher whose policy says `record = true`: its responses go into its
/// calls' tapes (the secret it sent never does, and one the server echoed
/// is redacted), so its calls replay with the server stopped; a response
/// past the tape's bound makes its call one that cannot be reproduced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_http_is_recorded_replays_offline_against_a_stopped_server() {
    use crate::support::loopback::Loopback;
    use airlock::sandbox::grants::{HostPattern, HttpGrant, SecretConfig, SecretGrant};
    const SECRET: &str = "recorded-never-this";

    let server = Loopback::start().await;
    let origin = server.url("");
    let mut fetcher = ToolConfig::default();
    fetcher.grants.http = HttpGrant::new(vec![HostPattern::parse(&origin).unwrap()]);
    fetcher.grants.record = true;
    let mut secret = SecretConfig::new("TEST_TOKEN", vec![origin.clone()]);
    secret.cleartext_loopback = true;
    fetcher.grants.secrets = vec![SecretGrant::with_value(secret, SECRET).unwrap()];
    let host = Arc::new(host_with(&[("http_fetch", fetcher)], ContextRules::default()).await);

    let db = TestStore::new(Backend::Sqlite, "recorded").await;
    let store = db.open().await;
    let mut session = open(&store, options(Some("alice"), "fetches")).await;
    let mut results = Vec::new();
    let calls = [
        json!({"url": server.url("/hello")}),
        json!({"url": server.url("/echo")}),
        json!({"url": server.url("/big")}),
        // A server that reads the whole body before it answers (one that
        // answers first may close before the tool has written it).
        json!({"url": server.url("/body"), "body": "the body sent"}),
    ];
    for args in &calls {
        let fetch = ToolCall::new("fetch", args.to_string());
        let done = session
            .call(&host, &fetch, &CancelToken::new(), None)
            .await
            .unwrap();
        results.push(done.result);
    }
    session.close().await.unwrap();
    assert_eq!(results[0]["body"], "hello from loopback");
    assert_eq!(results[3]["body"], "the body sent");
    assert!(
        results[1]["body"].as_str().unwrap().contains("[redacted]"),
        "{}",
        results[1]
    );
    let sent = server.requests().len();
    drop(server);

    let journal = store.read(Some("alice"), "fetches").await.unwrap().records;
    let text = serde_json::to_string(&journal).unwrap();
    assert!(!text.contains(SECRET), "the secret is in the journal");
    let tapes: Vec<usize> = journal
        .iter()
        .filter_map(|r| match &r.entry.event()?.item {
            Item::FunctionCallOutput { guest, .. } => {
                Some(guest.tape.as_ref().map_or(0, |t| t.http.len()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(tapes, [1, 1, 0, 1]);
    // The POST's tape holds the digest of the body the tool sent.
    let sha = |text: &str| {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(text.as_bytes()))
    };
    let digests: Vec<Value> = serde_json::to_value(&journal)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r.pointer("/event/tape/http/0"))
        .map(|exchange| json!([exchange["method"], exchange["request_sha256"]]))
        .collect();
    assert_eq!(digests.len(), 3, "{digests:?}");
    // A GET sent no body: nothing to compare but its method and URL.
    assert_eq!(digests[0], json!(["GET", null]));
    assert_eq!(digests[2], json!(["POST", sha("the body sent")]));

    let (summary, calls) = replayed(&store, &host, "fetches", &["fetch"]).await;
    assert_eq!(
        verdicts(&calls),
        ["same", "same", "cannot_reproduce", "same"],
        "{calls:?}"
    );
    let why = why_not(&calls[2]);
    assert!(
        why.contains("more than 1048576 bytes of HTTP responses"),
        "{why}"
    );
    assert_eq!(summary.same, 3);
    assert_eq!(sent, 4);

    // A journal whose POST was recorded with another body: the replayed
    // call's request is not the recorded one, so it is not answered from
    // the tape, and the call cannot be reproduced.
    let mut other = serde_json::to_value(&journal).unwrap();
    for record in other.as_array_mut().unwrap() {
        if let Some(exchange) = record.pointer_mut("/event/tape/http/0")
            && exchange["method"] == "POST"
        {
            exchange["request_sha256"] = json!(sha("another body"));
        }
    }
    made_of(&store, "other-body", other).await;
    let (_, calls) = replayed(&store, &host, "other-body", &["fetch"]).await;
    assert_eq!(
        verdicts(&calls),
        ["same", "same", "cannot_reproduce", "cannot_reproduce"],
        "{calls:?}"
    );
    let why = why_not(&calls[3]);
    assert!(
        why.contains("sends a request whose body differs from its recorded call's (POST "),
        "{why}"
    );
}

/// A reader whose policy says `record = true`, granted a `rw` directory:
/// what each call finds there is recorded as it first finds it (a file it
/// reads, with its bytes; one it only measures, by its size; a listing; a
/// file it writes, as absent), so its calls replay the same with the
/// directory emptied, and the replay's writes land in no directory of the
/// host's. A file past the tape's bound, and a journal whose tape names
/// another path than the call touches, make calls that cannot be
/// reproduced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_files_are_recorded_replays_with_its_directory_emptied() {
    use airlock::sandbox::grants::{DirGrant, DirMode};

    let data = tempfile::tempdir().unwrap();
    let at = |name: &str| data.path().join(name);
    std::fs::write(at("a.txt"), "from the file").unwrap();
    std::fs::create_dir(at("sub")).unwrap();
    std::fs::write(at("sub/b.txt"), "b").unwrap();
    std::fs::write(at("big.txt"), "x".repeat(3 << 19)).unwrap();
    let mut reader = ToolConfig::default();
    reader.grants.dirs = vec![DirGrant::new(data.path(), "/data", DirMode::Rw).unwrap()];
    reader.grants.record = true;
    reader.limits.max_result_bytes = 4 << 20;
    let host = Arc::new(host_with(&[("reach", reader)], ContextRules::default()).await);

    let db = TestStore::new(Backend::Sqlite, "files").await;
    let store = db.open().await;
    let mut session = open(&store, options(Some("alice"), "files")).await;
    let calls = [
        ("read-text", json!({"path": "/data/a.txt"})),
        ("list-dir", json!({"path": "/data"})),
        ("file-size", json!({"path": "/data/big.txt"})),
        (
            "write-text",
            json!({"path": "/data/out.txt", "text": "made"}),
        ),
        ("read-text", json!({"path": "/data/out.txt"})),
        ("read-text", json!({"path": "/data/sub/../sub/b.txt"})),
        ("read-text", json!({"path": "/data/big.txt"})),
    ];
    let mut results = Vec::new();
    for (tool, args) in &calls {
        let call = ToolCall::new(*tool, args.to_string());
        let done = session
            .call(&host, &call, &CancelToken::new(), None)
            .await
            .unwrap();
        results.push(done.result);
    }
    session.close().await.unwrap();
    assert_eq!(results[0], json!("from the file"));
    let mut listed: Vec<String> = serde_json::from_value(results[1].clone()).unwrap();
    listed.sort();
    assert_eq!(listed, ["a.txt", "big.txt", "sub"]);
    assert_eq!(results[2], json!(3 << 19));
    assert_eq!(results[4], json!("made"));
    assert_eq!(results[5], json!("b"));

    // What the tapes hold: the file read with its bytes, the one measured
    // by its size alone, the written one as absent before the call.
    let journal =
        serde_json::to_value(store.read(Some("alice"), "files").await.unwrap().records).unwrap();
    let tapes: Vec<&Value> = journal
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r.pointer("/event/type") == Some(&json!("function_call_output")))
        .map(|r| r.pointer("/event/tape").unwrap_or(&Value::Null))
        .collect();
    assert_eq!(tapes.len(), calls.len());
    let seen = |tape: &Value, path: &str| -> Value {
        tape["files"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|f| f["path"] == path)
            .cloned()
            .unwrap_or(Value::Null)
    };
    let a = seen(tapes[0], "a.txt");
    assert_eq!(
        (a["dir"].clone(), a["kind"].clone()),
        (json!("/data"), json!("file"))
    );
    assert_eq!(a["body"], json!("ZnJvbSB0aGUgZmlsZQ=="));
    let big = seen(tapes[2], "big.txt");
    assert_eq!(
        (big["size"].clone(), big.get("body")),
        (json!(3 << 19), None)
    );
    assert_eq!(seen(tapes[3], "out.txt")["kind"], "absent");
    assert_eq!(seen(tapes[5], "sub/b.txt")["kind"], "file");
    let listing = &tapes[1]["listings"][0];
    assert_eq!(
        (listing["path"].clone(), listing["ended"].clone()),
        (json!(""), json!(true))
    );

    // The directory emptied: every call but the one past the bound replays
    // the same from its tape, and the replay's write is not in it.
    for entry in std::fs::read_dir(data.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            std::fs::remove_dir_all(path).unwrap();
        } else {
            std::fs::remove_file(path).unwrap();
        }
    }
    let (summary, replays) = replayed(
        &store,
        &host,
        "files",
        &["read-text", "list-dir", "file-size", "write-text"],
    )
    .await;
    assert_eq!(
        verdicts(&replays),
        [
            "same",
            "same",
            "same",
            "same",
            "same",
            "same",
            "cannot_reproduce"
        ],
        "{replays:?}"
    );
    assert_eq!(summary.same, 6);
    let why = why_not(&replays[6]);
    assert!(
        why.contains("more than 1048576 bytes of HTTP responses and files"),
        "{why}"
    );
    assert_eq!(
        std::fs::read_dir(data.path()).unwrap().count(),
        0,
        "a replay wrote here"
    );

    // A journal whose tape found another file than the call reads: the
    // call touches a path its recording does not have.
    let mut other = journal.clone();
    for record in other.as_array_mut().unwrap() {
        if let Some(path) = record.pointer_mut("/event/tape/files/0/path")
            && path == "a.txt"
        {
            *path = json!("elsewhere.txt");
        }
    }
    made_of(&store, "other-file", other).await;
    let (_, replays) = replayed(&store, &host, "other-file", &["read-text"]).await;
    assert_eq!(
        verdicts(&replays),
        ["cannot_reproduce", "same", "same", "cannot_reproduce"],
        "{replays:?}"
    );
    assert_eq!(
        why_not(&replays[0]),
        "touches /data/a.txt, which its recorded call did not"
    );

    // The host serves on, from the real directory.
    let mut ctx = airlock::RunContext::default();
    std::fs::write(at("a.txt"), "now").unwrap();
    let read = ToolCall::new("read-text", json!({"path": "/data/a.txt"}).to_string());
    assert_eq!(
        host.call(&mut ctx, &read).await.unwrap().result,
        json!("now")
    );
}

/// A journal of many pages (100 calls of `increment`, four records each,
/// where a page is 128) replays whole: every call once, in the journal's
/// order, each the same as it was, so each saw the count its call saw (a
/// view folded across pages, each page read while the one before runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_of_many_pages_replays_whole_and_in_order() {
    let db = TestStore::new(Backend::Sqlite, "pages").await;
    let store = db.open().await;
    let mut session = open(&store, options(Some("alice"), "pages")).await;
    let increment = ToolCall::new("increment", r#"{"name":"n"}"#);
    for _ in 0..100 {
        session
            .call(host().await, &increment, &CancelToken::new(), None)
            .await
            .unwrap();
    }
    session.close().await.unwrap();
    let records = store.read(Some("alice"), "pages").await.unwrap().records;
    assert!(records.len() > 3 * 128, "{} records", records.len());

    let (summary, calls) = replayed(&store, host().await, "pages", &["increment"]).await;
    assert_eq!(summary.same, 100, "{summary:?}");
    assert_eq!(calls.len(), 100);
    assert!(calls.iter().all(|c| c.verdict == Verdict::Same));
    assert!(
        calls.windows(2).all(|pair| pair[0].seq < pair[1].seq),
        "not in the journal's order"
    );

    // Asked to run more calls at once than a replay ever holds, it runs
    // as many as it holds (not a worker per number asked for) and gives
    // the same verdicts.
    let tools = BTreeSet::from(["increment".to_owned()]);
    let replay = Replay {
        owner: Some("alice"),
        session_id: "pages",
        tools: &tools,
        parallel: usize::MAX,
    };
    let mut again = Vec::new();
    let summary = Session::replay(store.as_ref(), host().await, replay, |call| {
        again.push(call)
    })
    .await
    .unwrap();
    assert_eq!(summary.same, 100, "{summary:?}");
    assert_eq!(again, calls);

    // A record pages deep that does not fold (an op on the empty key)
    // ends the replay with an error naming it, though the
    // reader has read pages past it: the replay returns, it does not
    // wait for the reader.
    let mut journal = serde_json::to_value(&records).unwrap();
    let damaged = journal
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .skip(128)
        .find(|r| r["event"]["type"] == "context_update")
        .unwrap();
    damaged["event"]["ops"] = json!([{"op": "set", "key": "", "value": 1}]);
    let seq = damaged["seq"].as_u64().unwrap();
    made_of(&store, "damaged", journal).await;
    let replay = Replay {
        session_id: "damaged",
        ..replay
    };
    let mut reported = Vec::new();
    let failed = Session::replay(store.as_ref(), host().await, replay, |call| {
        reported.push(call.seq)
    })
    .await;
    match failed {
        Err(ReplayError::Damaged {
            session_id,
            seq: at,
            problem,
        }) => {
            assert_eq!((session_id.as_str(), at), ("damaged", seq));
            assert!(problem.contains("the key is empty"), "{problem}");
        }
        other => panic!("{other:?}"),
    }
    assert!(reported.iter().all(|&at| at < seq), "{reported:?}");

    // A page with fewer records than asked for is the journal's last, so
    // a journal that ends exactly at a page's end (128, 256 records) is
    // read on to the empty page after it, and one that ends a record
    // before or after is read no further: each replays every call it
    // holds whole, and ends.
    for cut in [127, 128, 129, 255, 256, 257] {
        let id = format!("cut-{cut}");
        made_of(&store, &id, serde_json::to_value(&records[..cut]).unwrap()).await;
        let last = records[cut - 1].seq;
        let replaying = replayed(&store, host().await, &id, &["increment"]);
        let (_, cut_calls) = tokio::time::timeout(std::time::Duration::from_secs(60), replaying)
            .await
            .unwrap_or_else(|_| panic!("the replay of {id} did not end"));
        // A call whose output is the journal's last record lost its ops
        // to the cut; the calls before it are whole.
        let whole: Vec<_> = cut_calls.iter().filter(|c| c.seq < last).collect();
        let expected: Vec<_> = calls.iter().filter(|c| c.seq < last).collect();
        assert_eq!(whole.len(), expected.len(), "{id}");
        for (got, want) in whole.iter().zip(&expected) {
            assert_eq!((got.seq, &got.verdict), (want.seq, &want.verdict), "{id}");
        }
        // After them, at most the call cut after its output and the one
        // cut before it.
        assert!(cut_calls.len() <= expected.len() + 2, "{id}: {cut_calls:?}");
    }
}
