//! Sessions: hidden and secret-looking keys never reach a store, the CLI or an export.

use super::*;

async fn hidden_and_secret_looking_keys_never_reach_the_store(backend: Backend) {
    let db = TestStore::new(backend, "secret").await;
    let store = db.open().await;
    let dir = &db.dir;
    let rules = Arc::new(
        ContextRules::new(KeyPatterns::new(&["internal_*"]).unwrap(), BTreeMap::new()).unwrap(),
    );
    let mut host = airlock::Host::builder()
        .cache(airlock::CompileCache::in_dir(crate::support::cache_dir()))
        .context_rules((*rules).clone())
        .build()
        .unwrap();
    host.load(guest("context_probe")).await.unwrap();
    let host = Arc::new(host);
    let ops = json!({"ops": [
        {"op": "set", "key": "github_token", "value": "MARK-op-token"},
        {"op": "merge", "key": "profile", "value": {"name": "ada", "Credentials": {"x": "MARK-op-nested"}}},
        {"op": "append", "key": "log", "value": {"apiKey": "MARK-op-nested", "ok": 1}},
    ]});
    let model = script(
        dir.path(),
        "secrets",
        json!([
            {"tool_calls": [{"name": "apply", "arguments": ops}]},
            {"text": "stored"}
        ]),
    );
    let mut opening = options(None, "secrets");
    // A snapshot with every commit: snapshots are scanned with the rest.
    opening.snapshot_every = 1;
    opening.deps = Some(
        json!({
            "api_key": "MARK-api-key",
            "internal_notes": "MARK-hidden",
            "profile": {"password": "MARK-nested-password", "name": "x"},
        })
        .as_object()
        .unwrap()
        .clone(),
    );
    let mut session = Session::open(Arc::clone(&store), opening, &rules)
        .await
        .unwrap();
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    Agent::new(Arc::clone(&host), model)
        .events(sender)
        .run_session(&mut session, "store it")
        .await
        .unwrap();
    // The live deps keep everything for the embedder.
    let live = Value::Object(session.context().deps().clone()).to_string();
    for marker in DEPS_MARKERS.iter().chain(&OP_MARKERS) {
        assert!(live.contains(marker), "{marker} missing from the live deps");
    }
    // Events carry no secret of deps: no context update holds one.
    let mut updates = 0;
    while let Ok(event) = receiver.try_recv() {
        let text = serde_json::to_string(&event).unwrap();
        assert_no_marker(text.as_bytes(), "an event");
        if matches!(event.item, Item::ContextUpdate { .. }) {
            updates += 1;
            assert_no_op_marker(text.as_bytes(), "a context update");
        }
    }
    assert_eq!(updates, 1);
    // What is stored is the scrubbed fold.
    assert_eq!(
        Value::Object(session.stored_deps(&rules)),
        json!({"profile": {"name": "ada"}, "log": [{"ok": 1}]})
    );
    session.close().await.unwrap();
    let stored = store.read(None, "secrets").await.unwrap();
    assert_eq!(
        Value::Object(Folded::fold(&stored.records).unwrap().deps),
        json!({"profile": {"name": "ada"}, "log": [{"ok": 1}]})
    );
    assert_no_op_marker_in_deps(&stored.records);
    let export = SessionExport::new(&stored, &ContextRules::default()).unwrap();
    assert_no_op_marker_in_deps(&export.journal);
    assert_no_op_marker(
        Value::Object(export.deps.clone()).to_string().as_bytes(),
        "exported deps",
    );
    assert_no_marker(
        serde_json::to_string(&export).unwrap().as_bytes(),
        "the export",
    );
    drop(store);
    assert_no_marker(&db.raw_bytes(), &db.location());
}

async fn the_cli_never_prints_or_saves_secret_keys(backend: Backend) {
    let db = TestStore::new(backend, "cli").await;
    let dir = &db.dir;
    let policy = dir.path().join("airlock.toml");
    std::fs::write(
        &policy,
        format!(
            "[context]\nhidden = [\"internal_*\"]\n[[tool]]\npath = {:?}\n",
            guest("context_probe")
        ),
    )
    .unwrap();
    let ops = json!({"ops": [
        {"op": "set", "key": "github_token", "value": "MARK-op-token"},
        {"op": "set", "key": "profile", "value": {"name": "ada", "Credentials": "MARK-op-nested"}},
    ]});
    let script_file = dir.path().join("s.json");
    std::fs::write(
        &script_file,
        json!({"turns": [{"tool_calls": [{"name": "apply", "arguments": ops}]}, {"text": "ok"}]})
            .to_string(),
    )
    .unwrap();
    let saved = dir.path().join("deps.json");
    let events = dir.path().join("events.jsonl");
    let deps = json!({"api_key": "MARK-api-key", "internal_x": "MARK-hidden", "nested": {"password": "MARK-nested-password"}}).to_string();
    let out = airlock_with_env(
        &[
            "run",
            "go",
            "--config",
            path(&policy),
            "--script",
            path(&script_file),
            "--store",
            &db.spec,
            "--session",
            "cli-secrets",
            "--deps",
            &deps,
            "--json",
            "--save-deps",
            path(&saved),
            "--events",
            path(&events),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout_json(&out)["deps"],
        json!({"nested": {}, "profile": {"name": "ada"}})
    );
    for (what, bytes) in [
        ("stdout", out.stdout.clone()),
        ("stderr", out.stderr.clone()),
        ("--save-deps", std::fs::read(&saved).unwrap()),
        ("--events", std::fs::read(&events).unwrap()),
    ] {
        assert_no_marker(&bytes, what);
    }
    for (what, bytes) in [
        ("--json", out.stdout.clone()),
        ("--save-deps", std::fs::read(&saved).unwrap()),
    ] {
        assert_no_op_marker(&bytes, what);
    }
    let events = std::fs::read_to_string(&events).unwrap();
    let updates: Vec<&str> = events
        .lines()
        .filter(|l| l.contains("\"context_update\""))
        .collect();
    assert_eq!(updates.len(), 1);
    assert_no_op_marker(updates[0].as_bytes(), "--events context_update");
    // `call --session` on the same session: the call's own output too.
    let out = airlock_with_env(
        &[
            "call",
            path(&guest("context_probe")),
            "apply",
            &json!({"ops": [{"op": "set", "key": "db_password", "value": "MARK-op-token"}]})
                .to_string(),
            "--config",
            path(&policy),
            "--store",
            &db.spec,
            "--session",
            "cli-secrets",
            "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["ops"], json!([]));
    assert_no_op_marker(
        stdout_json(&out)["deps"].to_string().as_bytes(),
        "call --json deps",
    );
    for args in [
        &["show", "cli-secrets", "--json"][..],
        &["export", "cli-secrets"],
    ] {
        let out = sessions(&db.spec, args);
        assert!(out.status.success());
        assert_no_marker(&out.stdout, "sessions show/export");
        let doc = stdout_json(&out);
        assert_no_op_marker(doc["deps"].to_string().as_bytes(), "exported deps");
        let journal: Vec<airlock::journal::Record> =
            serde_json::from_value(doc["journal"].clone()).unwrap();
        assert_no_op_marker_in_deps(&journal);
    }
    assert_no_marker(&db.raw_bytes(), &db.location());
}

crate::on_both_stores!(
    hidden_and_secret_looking_keys_never_reach_the_store,
    the_cli_never_prints_or_saves_secret_keys,
);
