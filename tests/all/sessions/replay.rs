//! Sessions: replay. A session's calls run again against the version of
//! a tool that made them reproduce themselves exactly (clocks, random
//! bytes, the whole context view); against a new version, exactly the
//! calls it changes differ; against one that traps, each call fails; and
//! nothing is written.

use std::collections::BTreeSet;

use airlock::agent::replay::{Replay, ReplaySummary, Replayed, Verdict};
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
            Err(airlock::agent::replay::ReplayError::Store(
                StoreError::NotFound { .. }
            ))
        ),
        "{missing:?}"
    );
}

crate::on_both_stores!(a_replay_finds_exactly_the_calls_a_new_version_changes);
