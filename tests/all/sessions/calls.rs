//! Sessions: calls on a session: journaled as the loop journals them, keyed calls at most once, snapshots, resumes.

use super::*;

async fn unanswered_calls_are_patched_once_with_the_exact_text(backend: Backend) {
    let db = TestStore::new(backend, "s").await;
    let store = db.open().await;
    let dir = &db.dir;
    let model = script(
        dir.path(),
        "spin",
        json!([{"tool_calls": [
            {"id": "c1", "name": "increment", "arguments": {"name": "a"}},
            {"id": "c2", "name": "spin"},
            {"id": "c3", "name": "increment", "arguments": {"name": "b"}}
        ]}]),
    );
    let mut session = open(&store, options(None, "patch")).await;
    let cancel = CancelToken::new();
    let (events, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let agent = Agent::new(Arc::clone(hostile_host().await), model)
        .cancel_token(cancel.clone())
        .events(events);
    let watcher = tokio::spawn(async move {
        // Cancel once the call before the spinning one has ended (every
        // intent was committed with the model's turn).
        while let Some(event) = seen.recv().await {
            if matches!(&event.item, Item::FunctionCallOutput { call_id, .. } if call_id == "c1") {
                cancel.cancel();
            }
        }
    });
    let result = agent.run_session(&mut session, "go").await;
    drop(agent);
    watcher.await.unwrap();
    assert!(matches!(result, Err(RunError::Cancelled)), "{result:?}");
    session.close().await.unwrap();

    let reopened = open(&store, options(None, "patch")).await;
    let tools = tool_messages(&reopened.transcript().messages);
    let told = |i: usize| (tools[i].0.as_str(), tools[i].1.as_str(), tools[i].2);
    assert_eq!(told(0).0, "c1");
    assert_eq!(told(1), ("c2", "Tool call was cancelled.", true));
    assert_eq!(told(2), ("c3", INTERRUPTED_MESSAGE, true));
    assert_eq!(tools.len(), 3);
    assert_eq!(
        INTERRUPTED_MESSAGE,
        "Tool call was interrupted and not executed. Please retry if needed."
    );
    let interrupted = reopened
        .transcript()
        .items
        .iter()
        .filter(|e| {
            matches!(
                &e.item,
                Item::FunctionCallOutput {
                    status: CallStatus::Interrupted,
                    ..
                }
            )
        })
        .count();
    assert_eq!(interrupted, 1);
    assert_eq!(reopened.context().deps()["counters"], json!({"a": 1}));
    reopened.close().await.unwrap();
    // Opening again (and patching again) adds nothing.
    let records = store.read(None, "patch").await.unwrap().records.len();
    let mut third = open(&store, options(None, "patch")).await;
    third.patch_unanswered().await.unwrap();
    third.close().await.unwrap();
    assert_eq!(
        store.read(None, "patch").await.unwrap().records.len(),
        records
    );
}

async fn a_resumed_run_sends_the_model_the_real_history(backend: Backend) {
    use crate::support::model_server::{ModelServer, openai_reply};
    let db = TestStore::new(backend, "s").await;
    let store = db.open().await;
    let mut session = open(&store, options(Some("u"), "resume")).await;
    Agent::new(Arc::clone(host().await), vowels())
        .run_session(&mut session, "Count the vowels of 'elephant'.")
        .await
        .unwrap();
    let first_messages = session.transcript().messages.clone();
    session.close().await.unwrap();

    let server = ModelServer::start().await;
    server
        .push_json(openai_reply(
            None,
            &[("r1", "increment", r#"{"name":"vowels"}"#)],
            5,
            1,
        ))
        .push_json(openai_reply(Some("now 4"), &[], 5, 1));
    let model = crate::support::model_server::openai(&server);
    let mut resumed = open(&store, options(Some("u"), "resume")).await;
    let outcome = Agent::new(Arc::clone(host().await), Arc::new(model))
        .run_session(&mut resumed, "One more.")
        .await
        .unwrap();
    assert_eq!(outcome.answer, "now 4");
    // The same deps carried on: the counter went from 3 to 4.
    assert_eq!(resumed.context().deps()["counters"]["vowels"], 4);
    let seen = server.seen();
    let sent = seen[0].body["messages"].as_array().unwrap();
    // Everything of the first run, then the new prompt.
    assert_eq!(sent.len(), first_messages.len() + 1);
    assert_eq!(sent[0]["content"], "Count the vowels of 'elephant'.");
    assert_eq!(sent.last().unwrap()["content"], "One more.");
    assert_eq!(resumed.context().usage.requests, 6);
    resumed.close().await.unwrap();
}

async fn a_call_outside_the_loop_is_journaled_and_counted(backend: Backend) {
    let db = TestStore::new(backend, "s").await;
    let store = db.open().await;
    let mut session = open(&store, options(None, "direct")).await;
    let probe = airlock::ToolCall::new("read", "{}");
    let seen = session
        .call(host().await, &probe, &CancelToken::new(), None)
        .await
        .unwrap();
    assert_eq!(seen.result["usage"]["tool_calls"], 1);
    session
        .call(
            host().await,
            &airlock::ToolCall::new("increment", r#"{"name":"x"}"#),
            &CancelToken::new(),
            None,
        )
        .await
        .unwrap();
    session.close().await.unwrap();
    let folded = Folded::fold(&store.read(None, "direct").await.unwrap().records).unwrap();
    assert_eq!(folded.deps["counters"]["x"], 1);
    assert_eq!(folded.usage.tool_calls, 2);
    assert_eq!(
        folded.transcript.items.len(),
        5,
        "two intents, two outputs, one update"
    );
}

/// One recorder for both paths: the same calls journal the same records
/// whether the agent loop ran them or direct session calls did (as
/// `airlock call --session` and MCP make), for a call that completes with
/// ops, one whose arguments the host refuses, and one whose ops are
/// rejected. The loop adds only the tool messages its model waits for.
async fn a_call_journals_the_same_through_the_loop_and_a_direct_call(backend: Backend) {
    let db = TestStore::new(backend, "same").await;
    let store = db.open().await;
    let calls = [
        ("c1", "increment", json!({"name": "x"})),
        ("c2", "increment", json!({"name": 5})),
        (
            "c3",
            "apply",
            json!({"ops": [{"op": "append", "key": "counters", "value": 1}]}),
        ),
    ];
    let mut turns: Vec<Value> = calls
        .iter()
        .map(
            |(id, name, args)| json!({"tool_calls": [{"id": id, "name": name, "arguments": args}]}),
        )
        .collect();
    turns.push(json!({"text": "done"}));
    let model = script(db.dir.path(), "same", Value::Array(turns));
    let rules = ContextRules::default();
    let mut looped = Session::open(Arc::clone(&store), options(None, "looped"), &rules)
        .await
        .unwrap();
    Agent::new(Arc::clone(host().await), model)
        .run_session(&mut looped, "go")
        .await
        .unwrap();
    let told = tool_messages(&looped.transcript().messages);
    looped.close().await.unwrap();

    let mut direct = Session::open(Arc::clone(&store), options(None, "direct"), &rules)
        .await
        .unwrap();
    for (id, name, args) in &calls {
        let call = airlock::ToolCall {
            id: (*id).to_owned(),
            name: (*name).to_owned(),
            arguments: args.to_string(),
            retry: 0,
        };
        let _ = direct
            .call(host().await, &call, &CancelToken::new(), None)
            .await;
    }
    direct.close().await.unwrap();

    let looped = store.read(None, "looped").await.unwrap().records;
    let direct = store.read(None, "direct").await.unwrap().records;
    let (looped_calls, direct_calls) = (call_records(&looped), call_records(&direct));
    assert_eq!(
        looped_calls.len(),
        7,
        "three intents, three ends, one update"
    );
    assert_eq!(looped_calls, direct_calls);
    assert!(
        direct_calls[4].contains(r#""error_kind":"invalid_args""#),
        "{}",
        direct_calls[4]
    );
    assert!(
        direct_calls[6].contains(r#""error_kind":"op_rejected""#),
        "{}",
        direct_calls[6]
    );
    // What the model was told is each call's output, word for word.
    let outputs: Vec<Value> = direct_calls
        .iter()
        .map(|text| serde_json::from_str::<Value>(text).unwrap())
        .filter(|item| item["type"] == "function_call_output")
        .collect();
    assert_eq!(told.len(), 3);
    for ((id, content, is_error), output) in told.iter().zip(&outputs) {
        assert_eq!(output["call_id"], id.as_str());
        assert_eq!(output["output"], content.as_str());
        assert_eq!(*is_error, output["status"] != "completed");
    }
}

async fn a_reader_that_goes_away_does_not_stop_the_run(backend: Backend) {
    // `airlock run ... | head -1`: stdout closes early; the run goes on
    // and commits everything.
    let db = TestStore::new(backend, "pipe").await;
    let script = root().join("guest-examples/scripts/vowels.json");
    let config = root().join("guest-examples/airlock.toml");
    let mut child = crate::support::airlock_command(
        &[
            "run",
            "go",
            "--script",
            path(&script),
            "--config",
            path(&config),
            "--store",
            &db.spec,
            "--session",
            "piped",
        ],
        &[],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = stdout_json(&sessions(&db.spec, &["show", "piped", "--json"]));
    assert_eq!(shown["deps"]["counters"]["vowels"], 3);
    assert_eq!(
        shown["items"].as_array().unwrap().last().unwrap()["type"],
        "run_ended"
    );
}

async fn a_resume_reads_the_snapshot_and_its_tail_and_keyed_calls_still_run_once(backend: Backend) {
    let db = TestStore::new(backend, "snap").await;
    let store = db.open().await;
    keyed_increments(&store, "long", 0..12, 4).await;
    let rules = ContextRules::default();
    let opened = |every: u64| {
        Session::open(
            Arc::clone(&store),
            SessionOptions {
                snapshot_every: every,
                ..options(None, "long")
            },
            &rules,
        )
    };

    // Resumed from a snapshot: most items are folded into it, the deps
    // and usage are the whole journal's.
    let mut session = opened(4).await.unwrap();
    let whole = Folded::fold(&store.read(None, "long").await.unwrap().records).unwrap();
    let transcript = session.transcript();
    assert!(transcript.items_folded > 0, "no snapshot was read");
    assert!(transcript.items.len() < whole.transcript.items.len());
    assert_eq!(transcript.next_item(), whole.transcript.items.len() + 1);
    assert_eq!(session.context().deps(), &whole.deps);
    assert_eq!(session.context().deps()["counters"]["x"], 12);
    assert_eq!(session.context().usage, whole.usage);

    // A retry of a call folded into the snapshot is found (by the store's
    // index) and does not run again; a new key runs.
    let again = keyed_increment(&mut session, "k0", "x").await.unwrap();
    assert_eq!(again.result["value"], 1, "k0's own outcome");
    assert_eq!(session.context().deps()["counters"]["x"], 12);
    assert!(matches!(
        keyed_increment(&mut session, "k1", "y").await,
        Err(airlock::agent::SessionCallError::IdReused { .. })
    ));
    keyed_increment(&mut session, "k12", "x").await.unwrap();
    assert_eq!(session.context().deps()["counters"]["x"], 13);
    session.close().await.unwrap();

    // Items stay numbered 1, 2, 3, ... across resumes from snapshots.
    let stored = store.read(None, "long").await.unwrap();
    let whole = Folded::fold(&stored.records).unwrap();
    assert_numbered_in_order(&whole.transcript.items);

    // A damaged snapshot, or one from a newer Airlock: the whole journal
    // is folded instead, to the same state.
    for body in ["garbage".to_owned(), r#"{"version": 99}"#.to_owned()] {
        db.execute(&format!("UPDATE {{p}}snapshots SET body = '{body}'"))
            .await;
        let session = opened(0).await.unwrap();
        assert_eq!(session.transcript().items_folded, 0);
        assert_eq!(session.transcript().items, whole.transcript.items);
        assert_eq!(session.context().deps(), &whole.deps);
        session.close().await.unwrap();
    }
    // A session that is never snapshotted reads every record.
    keyed_increments(&store, "other", 0..2, 4).await;
    db.execute("DELETE FROM {p}snapshots").await;
    let session = opened(0).await.unwrap();
    assert_eq!(session.transcript().items_folded, 0);
    assert_eq!(session.context().deps()["counters"]["x"], 13);
    session.close().await.unwrap();
}

/// A session held open for many calls (as an MCP server holds its own)
/// holds a bounded item log: at most `MAX_HELD_ITEMS` items and its open
/// calls, however many calls it makes. Items are numbered on across the
/// closed calls it let go of, the store keeps every one, and a keyed retry
/// of a call it let go of is found in the store and does not run again.
async fn a_session_held_open_holds_a_bounded_item_log(backend: Backend) {
    use airlock::session::MAX_HELD_ITEMS;
    let db = TestStore::new(backend, "held").await;
    let store = db.open().await;
    let mut session = open(&store, options(None, "held")).await;
    // A keyed increment records three items: the call, its output and its
    // op.
    let calls = MAX_HELD_ITEMS;
    for k in 0..calls {
        keyed_increment(&mut session, &format!("k{k}"), "x")
            .await
            .unwrap();
        let held = session.transcript().items.len();
        assert!(
            held < MAX_HELD_ITEMS + 3,
            "{held} items held after call {k}"
        );
    }
    assert!(session.transcript().items_folded > 0, "nothing let go");
    assert_eq!(session.context().deps()["counters"]["x"], calls);

    let whole = Folded::fold(&store.read(None, "held").await.unwrap().records).unwrap();
    assert_eq!(whole.transcript.items.len(), 3 * calls);
    assert_eq!(session.transcript().next_item(), 3 * calls + 1);
    assert_numbered_in_order(&whole.transcript.items);

    // The first call, let go of long ago: its own outcome, nothing runs.
    let again = keyed_increment(&mut session, "k0", "x").await.unwrap();
    assert_eq!(again.result["value"], 1, "k0's own outcome");
    assert_eq!(session.context().deps()["counters"]["x"], calls);
    assert!(matches!(
        keyed_increment(&mut session, "k1", "y").await,
        Err(airlock::agent::SessionCallError::IdReused { .. })
    ));
    // The next call is numbered on, after every stored item.
    keyed_increment(&mut session, "new", "x").await.unwrap();
    assert_eq!(session.context().deps()["counters"]["x"], calls + 1);
    session.close().await.unwrap();
    let stored = store.read(None, "held").await.unwrap();
    let whole = Folded::fold(&stored.records).unwrap();
    assert_eq!(whole.transcript.items.len(), 3 * calls + 3);
    assert_numbered_in_order(&whole.transcript.items);
    assert_eq!(whole.deps["counters"]["x"], calls + 1);
}

/// A session resumed with at least `snapshot_every` records past its
/// snapshot (here none: written with snapshots off, and its import) gets
/// one with its next commit, though that commit crosses no multiple, so
/// only its first resume folds the whole journal.
async fn a_session_resumed_far_behind_its_snapshot_gets_one_with_its_next_commit(backend: Backend) {
    let db = TestStore::new(backend, "behind").await;
    let store = db.open().await;
    keyed_increments(&store, "bare", 0..12, 0).await;
    let records = store.read(None, "bare").await.unwrap().records.len() as u64;
    let exported = sessions(&db.spec, &["export", "bare"]);
    assert!(exported.status.success(), "{}", stderr(&exported));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bare.json");
    std::fs::write(&file, &exported.stdout).unwrap();
    let imported = sessions(&db.spec, &["import", path(&file), "--as", "imported"]);
    assert!(imported.status.success(), "{}", stderr(&imported));

    let rules = ContextRules::default();
    for id in ["bare", "imported"] {
        // Every `records`: the commit below ends between two multiples.
        let opened = || {
            Session::open(
                Arc::clone(&store),
                SessionOptions {
                    snapshot_every: records,
                    ..options(None, id)
                },
                &rules,
            )
        };
        let mut session = opened().await.unwrap();
        assert_eq!(
            session.transcript().items_folded,
            0,
            "{id}: no snapshot yet"
        );
        keyed_increment(&mut session, "k12", "x").await.unwrap();
        session.close().await.unwrap();
        let after = store.read(None, id).await.unwrap().records.len() as u64;
        assert_eq!(after / records, 1, "{id}: the commit crossed no multiple");

        let session = opened().await.unwrap();
        assert!(
            session.transcript().items_folded > 0,
            "{id}: no snapshot was read"
        );
        assert_eq!(session.context().deps()["counters"]["x"], 13, "{id}");
        let whole = Folded::fold(&store.read(None, id).await.unwrap().records).unwrap();
        assert_eq!(session.context().deps(), &whole.deps, "{id}");
        assert_eq!(session.context().usage, whole.usage, "{id}");
        session.close().await.unwrap();
    }
}

/// A key finds keyed calls only, and only their records are indexed: a
/// [`Session::call`] (or a model's call) with the same id is not the key's
/// earlier call, and its commit wrote no index entry. The marks travel in
/// an export (version 2); a version-1 export, which had none, is imported
/// with every call taken as keyed, as a key then found any call, so a
/// retry of any of its calls still runs nothing.
async fn a_key_finds_keyed_calls_only_here_and_after_an_import(backend: Backend) {
    let db = TestStore::new(backend, "keys").await;
    let store = db.open().await;
    let mut session = open(&store, options(None, "keys")).await;
    let unkeyed = airlock::ToolCall {
        id: "u".into(),
        ..airlock::ToolCall::new("increment", r#"{"name":"x"}"#)
    };
    let first = session
        .call(host().await, &unkeyed, &CancelToken::new(), None)
        .await
        .unwrap();
    assert_eq!(first.result["value"], 1);
    let keyed = keyed_increment(&mut session, "k", "x").await.unwrap();
    assert_eq!(keyed.result["value"], 2);
    session.close().await.unwrap();
    let indexed = |store: Arc<dyn SessionStore>, key: &'static str| async move {
        store
            .call_records(airlock::session::CallKey {
                owner: None,
                session_id: "keys",
                call_id: key,
            })
            .await
            .unwrap()
            .len()
    };
    assert_eq!(indexed(Arc::clone(&store), "u").await, 0, "an unkeyed call");
    // Its intent, its output and its ops.
    assert_eq!(indexed(Arc::clone(&store), "k").await, 3, "a keyed call");

    let stored = store.read(None, "keys").await.unwrap();
    let export = SessionExport::new(&stored, &ContextRules::default()).unwrap();
    let v2 = serde_json::to_value(&export).unwrap();
    let mut v1 = v2.clone();
    v1["version"] = json!(1);
    let mut marks = 0;
    for record in v1["journal"].as_array_mut().unwrap() {
        marks += usize::from(record.as_object_mut().unwrap().remove("keyed").is_some());
    }
    assert_eq!(marks, 3, "the export marks the keyed call's records");
    // Version 2: the key `u` is new and runs; version 1: `u` was a call a
    // key found, and is still.
    for (doc, indexed_u, u_value) in [(v2, 0, 3), (v1, 3, 1)] {
        let version = doc["version"].clone();
        let target = TestStore::new(backend, &format!("keys-v{version}")).await;
        let other = target.open().await;
        let parsed = export_of(&doc.to_string()).unwrap();
        import_into(&other, &parsed).await.unwrap();
        assert_eq!(indexed(Arc::clone(&other), "k").await, 3, "v{version}");
        assert_eq!(
            indexed(Arc::clone(&other), "u").await,
            indexed_u,
            "v{version}"
        );
        let mut session = open(&other, options(None, "keys")).await;
        let again = keyed_increment(&mut session, "k", "x").await.unwrap();
        assert_eq!(again.result["value"], 2, "v{version}: a retry runs nothing");
        let u = keyed_increment(&mut session, "u", "x").await.unwrap();
        assert_eq!(u.result["value"], u_value, "v{version}");
        assert_eq!(session.context().deps()["counters"]["x"], u_value.max(2));
        session.close().await.unwrap();
    }
}

/// A pure call (no effectful grant) is journaled in one commit, intent and
/// output together; an effectful one (a writable directory) and a keyed
/// one commit the intent first. The journal reads the same either way.
async fn a_pure_call_commits_once_and_an_effectful_or_keyed_one_twice(backend: Backend) {
    let db = TestStore::new(backend, "commits").await;
    let store = Arc::new(Counting::new(db.open().await));
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let text = format!(
        "[[tool]]\npath = {:?}\ndirs = [{{ host = \"data\", guest = \"/data\", mode = \"rw\" }}]\n",
        guest("stateful")
    );
    let policy =
        airlock::Policy::parse(&text, &dir.path().join("airlock.toml"), dir.path()).unwrap();
    let effectful = airlock::Host::builder()
        .cache(airlock::CompileCache::in_dir(crate::support::cache_dir()))
        .build_with_policy(&policy)
        .await
        .unwrap();
    let shared: Arc<dyn SessionStore> = store.clone();
    stored(&shared, options(None, "commits")).await;
    let mut session = Session::open(shared, options(None, "commits"), &ContextRules::default())
        .await
        .unwrap();
    let increment = || airlock::ToolCall::new("increment", r#"{"name":"x"}"#);
    let commits = |before: usize| store.appends() - before;

    let before = store.appends();
    session
        .call(host().await, &increment(), &CancelToken::new(), None)
        .await
        .unwrap();
    assert_eq!(commits(before), 1, "a pure call");
    let before = store.appends();
    session
        .call(&effectful, &increment(), &CancelToken::new(), None)
        .await
        .unwrap();
    assert_eq!(commits(before), 2, "an effectful call");
    let before = store.appends();
    session
        .call_once(host().await, &increment(), &CancelToken::new(), None)
        .await
        .unwrap();
    assert_eq!(commits(before), 2, "a keyed call");
    assert_eq!(
        store.deferred(),
        0,
        "each changed deps: on disk before it returns"
    );

    // A call that changed nothing of a tool that can reach nothing need
    // not wait for the disk; a failed one (no op applied) neither; the
    // same call of a tool that may write a directory, or keyed, waits.
    let show = airlock::ToolCall::new("show_state", "{}");
    let bad = airlock::ToolCall::new("increment", r#"{"name": 7}"#);
    let never = CancelToken::new();
    let deferred = |before: usize| store.deferred() - before;
    let (before, was) = (store.appends(), store.deferred());
    let shown = session.call(host().await, &show, &never, None).await;
    assert_eq!(shown.unwrap().result["counters"]["x"], 3);
    assert_eq!(
        (commits(before), deferred(was)),
        (1, 1),
        "a call that changed nothing"
    );
    let (before, was) = (store.appends(), store.deferred());
    assert!(
        session
            .call(host().await, &bad, &never, None)
            .await
            .is_err()
    );
    assert_eq!((commits(before), deferred(was)), (1, 1), "a failed call");
    let (before, was) = (store.appends(), store.deferred());
    session.call(&effectful, &show, &never, None).await.unwrap();
    assert_eq!(
        (commits(before), deferred(was)),
        (2, 0),
        "a tool that may write"
    );
    let (before, was) = (store.appends(), store.deferred());
    session
        .call_once(host().await, &show, &never, None)
        .await
        .unwrap();
    assert_eq!((commits(before), deferred(was)), (2, 0), "a keyed call");
    session.close().await.unwrap();

    // Each call's intent, output and ops are there, in that order.
    let stored = store.read(None, "commits").await.unwrap();
    let folded = Folded::fold(&stored.records).unwrap();
    let kinds: Vec<&str> = folded
        .transcript
        .items
        .iter()
        .map(|e| match &e.item {
            Item::FunctionCall { .. } => "intent",
            Item::FunctionCallOutput { .. } => "output",
            Item::ContextUpdate { .. } => "ops",
            _ => "other",
        })
        .collect();
    let mut expected = ["intent", "output", "ops"].repeat(3);
    expected.extend(["intent", "output"].repeat(4));
    assert_eq!(kinds, expected);
    assert_eq!(folded.deps["counters"]["x"], 3);
}

crate::on_both_stores!(
    a_pure_call_commits_once_and_an_effectful_or_keyed_one_twice,
    a_resume_reads_the_snapshot_and_its_tail_and_keyed_calls_still_run_once,
    a_session_resumed_far_behind_its_snapshot_gets_one_with_its_next_commit,
    a_session_held_open_holds_a_bounded_item_log,
    a_key_finds_keyed_calls_only_here_and_after_an_import,
    unanswered_calls_are_patched_once_with_the_exact_text,
    a_resumed_run_sends_the_model_the_real_history,
    a_call_outside_the_loop_is_journaled_and_counted,
    a_call_journals_the_same_through_the_loop_and_a_direct_call,
    a_reader_that_goes_away_does_not_stop_the_run,
);
