//! Durable sessions: the journal in a real SQLite file and in a real
//! Postgres database (one suite, both stores), through the library and the
//! `airlock` binary.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::sync::Arc;

use airlock::agent::{Agent, RunError};
use airlock::context::{ContextRules, KeyPatterns};
use airlock::journal::{CallStatus, Folded, INTERRUPTED_MESSAGE, Item};
use airlock::llm::{Message, ScriptModel};
use airlock::sandbox::CancelToken;
use airlock::session::export::{ImportError, SessionExport};
use airlock::session::{Session, SessionOptions, SessionStore, StoreError};
use serde_json::{Value, json};

use crate::support::stores::{Backend, TestStore};
use crate::support::{airlock_with_env, guest, host, hostile_host, root, tool_messages};

fn options(user: Option<&str>, id: &str) -> SessionOptions {
    SessionOptions {
        user_id: user.map(str::to_owned),
        session_id: Some(id.to_owned()),
        ..SessionOptions::default()
    }
}

/// A session of `store` opened with `options` and the default context
/// rules.
async fn open(store: &Arc<dyn SessionStore>, options: SessionOptions) -> Session {
    Session::open(Arc::clone(store), options, &ContextRules::default())
        .await
        .unwrap()
}

/// Opens `options`' session and closes it, stored: a new session is
/// stored by its first commit (here, its deps).
async fn stored(store: &Arc<dyn SessionStore>, options: SessionOptions) {
    let deps = options.deps.clone().unwrap_or_default();
    let mut session = open(store, options).await;
    session
        .set_deps(deps, &ContextRules::default())
        .await
        .unwrap();
    session.close().await.unwrap();
}

/// A script model from `turns` (written to a file in `dir`).
fn script(dir: &Path, name: &str, turns: Value) -> Arc<ScriptModel> {
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, json!({ "turns": turns }).to_string()).unwrap();
    Arc::new(ScriptModel::load(path).unwrap())
}

fn vowels() -> Arc<ScriptModel> {
    Arc::new(ScriptModel::load(root().join("guest-examples/scripts/vowels.json")).unwrap())
}

fn export_of(text: &str) -> Result<SessionExport, ImportError> {
    SessionExport::parse(text, &ContextRules::default())
}

/// Inserts the session `export` holds into `store`.
async fn import_into(
    store: &Arc<dyn SessionStore>,
    export: &SessionExport,
) -> Result<(), StoreError> {
    store
        .insert(
            &export.header(),
            Box::new(export.journal.clone()),
            export.updated_at_ms,
        )
        .await
}

async fn every_field_round_trips_through_the_store_and_an_export(backend: Backend) {
    let db = TestStore::new(backend, "trip").await;
    let store = db.open().await;
    let mut opening = options(Some("alice"), "trip");
    opening.deps = Some(json!({"start": {"n": 1}}).as_object().unwrap().clone());
    opening.metadata = BTreeMap::from([("tenant".to_owned(), "acme".to_owned())]);
    // No snapshot: opened again, the session folds every record, so its
    // whole item log is there to compare (snapshots compact it to the
    // calls still open; their fold is property-tested in
    // `journal/snapshot.rs`).
    opening.snapshot_every = 0;
    let mut session = Session::open(Arc::clone(&store), opening, &ContextRules::default())
        .await
        .unwrap();
    assert!(session.created());
    let agent = Agent::new(Arc::clone(host().await), vowels());
    let outcome = agent
        .run_session(&mut session, "Count the vowels of 'elephant'.")
        .await;
    assert!(outcome.unwrap().answer.contains("3 vowels"));
    let live = session.context().clone();
    let transcript = session.transcript().clone();
    session.close().await.unwrap();

    // Opened again, it is the same conversation, field by field.
    let again = open(&store, options(Some("alice"), "trip")).await;
    assert!(!again.created());
    assert_eq!(again.context().deps(), live.deps());
    assert_eq!(again.context().deps()["counters"]["vowels"], 3);
    assert_eq!(again.context().usage, live.usage);
    assert_eq!(again.context().usage.tool_calls, 5);
    assert_eq!(again.context().iteration, live.iteration);
    assert_eq!(again.context().metadata(), live.metadata());
    assert_eq!(again.context().user_id(), Some("alice"));
    assert_eq!(again.context().session_id(), "trip");
    assert_eq!(again.transcript(), &transcript);
    again.close().await.unwrap();

    // Export, parse, import into another store: the same session.
    let stored = store.read(Some("alice"), "trip").await.unwrap();
    let export = SessionExport::new(&stored, &ContextRules::default()).unwrap();
    assert_eq!(export.version, 2);
    assert_eq!(&export.deps, live.deps());
    assert_eq!(export.usage, live.usage);
    assert_eq!(export.messages, transcript.messages);
    assert_eq!(export.items, transcript.items);
    assert_eq!(export.metadata["tenant"], "acme");
    assert_eq!(export.created_at_ms, stored.header.created_at_ms);
    assert_eq!(export.updated_at_ms, stored.updated_at_ms);
    let text = serde_json::to_string_pretty(&export).unwrap();
    let parsed = export_of(&text).unwrap();
    assert_eq!(parsed, export);
    let other_db = TestStore::new(backend, "trip-import").await;
    let other = other_db.open().await;
    import_into(&other, &parsed).await.unwrap();
    assert_eq!(other.read(Some("alice"), "trip").await.unwrap(), stored);
    // Importing it twice is refused and changes nothing.
    let twice = import_into(&other, &parsed).await.unwrap_err();
    assert!(matches!(twice, StoreError::AlreadyExists { .. }), "{twice}");
    assert_eq!(other.read(Some("alice"), "trip").await.unwrap(), stored);
}

async fn unknown_missing_and_malformed_versions_import_nothing(backend: Backend) {
    let db = TestStore::new(backend, "s").await;
    let store = db.open().await;
    let dir = &db.dir;
    stored(&store, options(None, "v")).await;
    let stored = store.read(None, "v").await.unwrap();
    let good = serde_json::to_value(SessionExport::new(&stored, &ContextRules::default()).unwrap())
        .unwrap();

    let with_version = |version: Option<Value>| {
        let mut doc = good.clone();
        match version {
            Some(v) => doc["version"] = v,
            None => {
                doc.as_object_mut().unwrap().remove("version");
            }
        }
        doc.to_string()
    };
    for (version, expected) in [
        (None, "missing or invalid version field"),
        (Some(json!("1")), "missing or invalid version field"),
        (Some(json!(-1)), "missing or invalid version field"),
        (Some(json!(1.5)), "missing or invalid version field"),
        (Some(json!(null)), "missing or invalid version field"),
        (Some(json!(3)), "unsupported version: 3"),
        (Some(json!(0)), "unsupported version: 0"),
    ] {
        let error = export_of(&with_version(version.clone())).unwrap_err();
        assert_eq!(error.to_string(), expected, "version {version:?}");
    }
    // A journal edited apart from its fold is refused, not half believed.
    let mut edited = good.clone();
    edited["deps"] = json!({"forged": true});
    let error = export_of(&edited.to_string()).unwrap_err();
    assert!(error.to_string().contains("`deps`"), "{error}");
    assert!(export_of("[]").is_err());
    assert!(export_of("not json").is_err());

    // Through the binary: a clear error, exit 2, nothing imported.
    let cli = TestStore::new(backend, "versions-cli").await;
    let file = dir.path().join("v2.json");
    std::fs::write(&file, with_version(Some(json!(7)))).unwrap();
    let out = sessions(&cli.spec, &["import", path(&file)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unsupported version: 7"),
        "{}",
        stderr(&out)
    );
    std::fs::write(&file, with_version(None)).unwrap();
    let out = sessions(&cli.spec, &["import", path(&file)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("missing or invalid version field"));
    let listed = stdout_json(&sessions(&cli.spec, &["list", "--json"]));
    assert_eq!(listed["sessions"], json!([]));
}

/// The export of a session whose journal holds a context update setting an
/// object of two keys, and a message, as JSON.
async fn export_with_an_update(store: &Arc<dyn SessionStore>, id: &str) -> Value {
    use airlock::context::ContextOp;
    use airlock::journal::{Entry, Event, Record};
    let holder = airlock::session::Holder::new();
    let lease = create_leased(store, id, &holder, json!({})).await;
    let now = airlock::journal::now_ms();
    let update = Entry::item(Event {
        id: "item_1".into(),
        run_id: "run_1".into(),
        at_ms: now,
        item: Item::ContextUpdate {
            call_id: "call_1".into(),
            ops: vec![ContextOp::Set {
                key: "pair".into(),
                value: json!({"a": 1, "b": 2}),
            }],
        },
    });
    let message = Entry::Message {
        message: Message::User {
            content: "hi".into(),
        },
    };
    let records = [update, message]
        .into_iter()
        .zip(2..)
        .map(|(entry, seq)| Record {
            seq,
            at_ms: now,
            entry,
        })
        .collect::<Vec<_>>();
    store.append(&lease, &records, None, now).await.unwrap();
    store.release(&lease).await.unwrap();
    let stored = store.read(None, id).await.unwrap();
    serde_json::to_value(SessionExport::new(&stored, &ContextRules::default()).unwrap()).unwrap()
}

/// The value of the first op of the context update an export lists in
/// its `items`.
fn listed_op_value(doc: &mut Value) -> &mut Value {
    let items = doc["items"].as_array_mut().unwrap();
    let item = items.iter_mut().find(|i| i.get("ops").is_some()).unwrap();
    &mut item["ops"][0]["value"]
}

/// An export is read field by field as it comes (an import holds no more
/// than a record of it): its fields in any order, an object's keys in any
/// order, and each fault named: a field twice, unknown or missing, records
/// out of order, a listed message or item that is not the journal's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_reads_in_any_order_and_names_each_fault() {
    let db = TestStore::new(Backend::Sqlite, "order").await;
    let store = db.open().await;
    let good = export_with_an_update(&store, "order").await;
    let expected = export_of(&good.to_string()).unwrap();
    assert_eq!(expected.journal.len(), 3);
    assert_eq!(expected.deps["pair"], json!({"a": 1, "b": 2}));

    // The fields backwards: the version last, the journal before the
    // fields it must fold to.
    let backwards: serde_json::Map<String, Value> = good
        .as_object()
        .unwrap()
        .iter()
        .rev()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(
        backwards.keys().next_back().map(String::as_str),
        Some("version")
    );
    let mut later = backwards.clone();
    later.insert("version".into(), json!(7));
    later.insert("journal".into(), json!("not a journal of version 1"));
    assert_eq!(
        export_of(&Value::Object(later).to_string())
            .unwrap_err()
            .to_string(),
        "unsupported version: 7"
    );
    assert_eq!(
        export_of(&Value::Object(backwards).to_string()).unwrap(),
        expected
    );
    // The listed item's object with its keys the other way round: the
    // same value as the journal's.
    let mut turned = good.clone();
    let value = listed_op_value(&mut turned);
    assert_eq!(*value, json!({"a": 1, "b": 2}));
    *value = json!({"b": 2, "a": 1});
    assert_eq!(export_of(&turned.to_string()).unwrap(), expected);

    let fault = |doc: String| export_of(&doc).unwrap_err().to_string();
    let text = good.to_string();
    let twice = fault(text.replacen('{', "{\"deps\": {}, ", 1));
    assert!(twice.contains("duplicate field `deps`"), "{twice}");
    let twice = fault(text.replacen('{', "{\"journal\": [], ", 1));
    assert!(twice.contains("duplicate field `journal`"), "{twice}");
    let mut extra = good.clone();
    extra["extra"] = json!(1);
    let unknown = fault(extra.to_string());
    assert!(unknown.contains("unknown field `extra`"), "{unknown}");
    for field in ["session_id", "usage", "journal", "messages", "items"] {
        let mut doc = good.clone();
        doc.as_object_mut().unwrap().remove(field);
        let missing = fault(doc.to_string());
        assert!(
            missing.contains(&format!("missing field `{field}`")),
            "{missing}"
        );
    }
    let mut swapped = good.clone();
    swapped["journal"].as_array_mut().unwrap().swap(1, 2);
    assert_eq!(
        fault(swapped.to_string()),
        "inconsistent session file: journal record 3: out of order: expected record 2"
    );
    let mut edited = good.clone();
    edited["messages"][0]["content"] = json!("edited");
    assert_eq!(
        fault(edited.to_string()),
        "inconsistent session file: `messages` is not what the journal says"
    );
    let mut longer = good.clone();
    let first = longer["messages"][0].clone();
    longer["messages"].as_array_mut().unwrap().push(first);
    assert!(fault(longer.to_string()).contains("`messages`"));
    let mut changed = good.clone();
    *listed_op_value(&mut changed) = json!({"a": 1, "b": 3});
    assert_eq!(
        fault(changed.to_string()),
        "inconsistent session file: `items` is not what the journal says"
    );
    assert!(fault(format!("{text} x")).starts_with("invalid session file: trailing characters"));
}

/// The ids of the anonymous bucket's sessions in `store`, sorted.
async fn session_ids(store: &Arc<dyn SessionStore>) -> Vec<String> {
    let mut ids: Vec<String> = store
        .list(None)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    ids.sort_unstable();
    ids
}

/// Records for an insert that give `pages` and then fail.
struct FailingAfter(Vec<Vec<airlock::journal::Record>>);

impl airlock::session::RecordPages for FailingAfter {
    fn next_page(&mut self) -> Result<Option<Vec<airlock::journal::Record>>, StoreError> {
        if self.0.is_empty() {
            return Err(StoreError::Backend {
                location: "the test's records".into(),
                message: "the disk went away".into(),
            });
        }
        Ok(Some(self.0.remove(0)))
    }
}

/// An import whose records fail after some are in inserts nothing: not
/// the session, not its first records; the same id imports after.
async fn an_import_that_fails_midway_inserts_nothing(backend: Backend) {
    let db = TestStore::new(backend, "midway").await;
    let store = db.open().await;
    fill(&store, "whole", 40, 10, 40).await;
    let whole = store.read(None, "whole").await.unwrap();
    let mut header = whole.header.clone();
    header.session_id = "copy".into();
    let pages: Vec<Vec<_>> = whole.records.chunks(16).map(<[_]>::to_vec).collect();
    let failed = store
        .insert(
            &header,
            Box::new(FailingAfter(pages[..2].to_vec())),
            whole.updated_at_ms,
        )
        .await
        .unwrap_err();
    assert!(
        failed.to_string().contains("the disk went away"),
        "{failed}"
    );
    let gone = store.read(None, "copy").await.unwrap_err();
    assert!(matches!(gone, StoreError::NotFound { .. }), "{gone}");
    assert_eq!(session_ids(&store).await, ["whole"]);

    store
        .insert(&header, Box::new(FailingAfter(pages)), whole.updated_at_ms)
        .await
        .unwrap_err();
    store
        .insert(
            &header,
            Box::new(whole.records.clone()),
            whole.updated_at_ms,
        )
        .await
        .unwrap();
    let copy = store.read(None, "copy").await.unwrap();
    assert_eq!(copy.records, whole.records);
    assert_eq!(copy.updated_at_ms, whole.updated_at_ms);
    let summary = store.list(None).await.unwrap();
    let copied = summary.iter().find(|s| s.session_id == "copy").unwrap();
    assert_eq!(copied.records, 41);
}

async fn users_are_a_hard_partition(backend: Backend) {
    let db = TestStore::new(backend, "s").await;
    let store = db.open().await;
    let dir = &db.dir;
    let mut opening = options(Some("alice"), "shared-name");
    opening.deps = Some(json!({"owner": "alice"}).as_object().unwrap().clone());
    stored(&store, opening).await;
    let mut anonymous = options(None, "anon-only");
    anonymous.deps = Some(json!({"owner": "nobody"}).as_object().unwrap().clone());
    stored(&store, anonymous).await;

    for outsider in [Some("bob"), None, Some("Alice"), Some("alice ")] {
        if outsider.is_some() {
            assert!(
                store.list(outsider).await.unwrap().is_empty(),
                "{outsider:?}"
            );
        }
        let read = store.read(outsider, "shared-name").await.unwrap_err();
        assert!(
            matches!(read, StoreError::NotFound { .. }),
            "{outsider:?}: {read}"
        );
        let removed = store
            .remove(outsider, "shared-name", airlock::journal::now_ms())
            .await;
        assert!(matches!(removed, Err(StoreError::NotFound { .. })));
        // Opening the same id is a session of the outsider's own, empty.
        let own = open(&store, options(outsider, "shared-name")).await;
        assert!(own.created(), "{outsider:?} resumed alice's session");
        assert!(own.context().deps().is_empty());
        assert!(own.transcript().messages.is_empty());
        own.close().await.unwrap();
        // It committed nothing, so it was never stored.
        let read = store.read(outsider, "shared-name").await.unwrap_err();
        assert!(matches!(read, StoreError::NotFound { .. }), "{read}");
    }
    // The anonymous bucket is its own: alice cannot see its session.
    let alice = store.list(Some("alice")).await.unwrap();
    assert_eq!(alice.len(), 1);
    assert_eq!(alice[0].session_id, "shared-name");
    assert!(matches!(
        store.read(Some("alice"), "anon-only").await,
        Err(StoreError::NotFound { .. })
    ));
    let anon = store.list(None).await.unwrap();
    assert_eq!(anon.len(), 1);
    assert_eq!(anon[0].session_id, "anon-only");
    // Alice's session is untouched by all of that.
    let kept = store.read(Some("alice"), "shared-name").await.unwrap();
    assert_eq!(Folded::fold(&kept.records).unwrap().deps["owner"], "alice");

    // The binary: show, export, rm, import across users are refused.
    for args in [
        &["show", "shared-name", "--user", "bob"][..],
        &["export", "shared-name", "--user", "bob"],
        &["rm", "shared-name", "--user", "bob"],
        &["show", "shared-name"],
    ] {
        let out = sessions(&db.spec, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains("no session shared-name"), "{args:?}");
    }
    let exported = sessions(&db.spec, &["export", "shared-name", "--user", "alice"]);
    assert!(exported.status.success());
    let file = dir.path().join("alice.json");
    std::fs::write(&file, &exported.stdout).unwrap();
    let other = TestStore::new(backend, "partition-import").await;
    // An import refused with exit 2, saying `said`; what it said.
    let refused = |file: &std::path::Path, flags: &[&str], said: &str| {
        let mut args = vec!["import", path(file)];
        args.extend(flags);
        let out = sessions(&other.spec, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(said), "{args:?}: {}", stderr(&out));
        stderr(&out)
    };
    refused(&file, &["--user", "bob"], "import it with --user \"alice\"");
    // Refused as soon as its `user_id` is read: a copy whose journal is
    // cut short is still the wrong user's for bob, and only alice reads
    // as far as the cut. A bad `--as` is refused before the file is read.
    let text = std::str::from_utf8(&exported.stdout).unwrap();
    let cut = dir.path().join("alice-cut.json");
    let journal = text.find("\"journal\"").unwrap();
    std::fs::write(&cut, &text[..journal + 20]).unwrap();
    refused(
        &cut,
        &["--user", "bob"],
        "the session belongs to user \"alice\"; import it with --user \"alice\"",
    );
    refused(&cut, &["--user", "alice"], "invalid session file");
    let said = refused(&cut, &["--user", "alice", "--as", "no spaces"], "--as: ");
    assert!(!said.contains("invalid session file"), "{said}");
    let out = sessions(&other.spec, &["import", path(&file), "--user", "alice"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(&other.location()), "{said}");
    if let Some(password) = other.password() {
        assert!(!said.contains(password), "the password was printed: {said}");
    }
}

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
        // Cancel once the spin call's intent is committed.
        while let Some(event) = seen.recv().await {
            if matches!(&event.item, Item::FunctionCall { call, .. } if call.id == "c2") {
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

async fn of_two_concurrent_opens_exactly_one_wins(backend: Backend) {
    let db = TestStore::new(backend, "race").await;
    stored(&db.open().await, options(None, "race")).await;
    for round in 0..10 {
        // Two stores (two connections, as two processes would have).
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let attempt = |store: Arc<dyn SessionStore>| {
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                Session::open(store, options(None, "race"), &ContextRules::default()).await
            })
        };
        let a = attempt(db.open().await);
        let b = attempt(db.open().await);
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        let (winner, loser) = match (a, b) {
            (Ok(s), Err(e)) | (Err(e), Ok(s)) => (s, e),
            (a, b) => panic!("round {round}: {a:?} / {b:?}"),
        };
        assert!(
            loser.to_string().starts_with("session is in use"),
            "{loser}"
        );
        assert_eq!(loser.kind(), airlock::ErrorKind::SessionInUse);
        winner.close().await.unwrap();
    }
    // Two openers of a new id: both open (nothing is stored yet); of their
    // first commits, exactly one creates the session, and the other is
    // refused having written nothing.
    for round in 0..5 {
        let id = format!("new-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let attempt = |store: Arc<dyn SessionStore>, name: &'static str| {
            let (barrier, id) = (Arc::clone(&barrier), id.clone());
            tokio::spawn(async move {
                let mut session =
                    Session::open(store, options(None, &id), &ContextRules::default())
                        .await
                        .unwrap();
                assert!(session.created());
                barrier.wait().await;
                let deps = json!({"by": name}).as_object().unwrap().clone();
                let result = session.set_deps(deps, &ContextRules::default()).await;
                session.close().await.unwrap();
                (name, result)
            })
        };
        let a = attempt(db.open().await, "a");
        let b = attempt(db.open().await, "b");
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        let (winner, loser) = match (a, b) {
            ((w, Ok(())), (_, Err(e))) | ((_, Err(e)), (w, Ok(()))) => (w, e),
            (a, b) => panic!("round {round}: {a:?} / {b:?}"),
        };
        // In use while the winner holds it, or already there once it let go.
        assert!(
            matches!(
                loser,
                StoreError::AlreadyExists { .. } | StoreError::InUse { .. }
            ),
            "{loser}"
        );
        let store = db.open().await;
        let kept = store.read(None, &id).await.unwrap();
        let folded = Folded::fold(&kept.records).unwrap();
        assert_eq!(folded.deps["by"], winner, "round {round}");
        assert_eq!(
            kept.records.len(),
            2,
            "round {round}: the loser wrote nothing"
        );
    }
}

async fn a_lost_lease_commits_nothing_more(backend: Backend) {
    let db = TestStore::new(backend, "s").await;
    let store = db.open().await;
    stored(&store, options(None, "fence")).await;
    let mut short = options(None, "fence");
    short.lease_ttl = std::time::Duration::from_millis(1);
    let mut stale = Session::open(Arc::clone(&store), short, &ContextRules::default())
        .await
        .unwrap();
    // The heartbeat cannot keep a 1 ms lease; another opener takes it over
    // as soon as it has expired.
    let taker = loop {
        match Session::open(
            Arc::clone(&store),
            options(None, "fence"),
            &ContextRules::default(),
        )
        .await
        {
            Ok(session) => break session,
            Err(e) => assert_eq!(e.kind(), airlock::ErrorKind::SessionInUse),
        }
    };
    let before = store.read(None, "fence").await.unwrap();
    let stale_write = stale
        .call(
            host().await,
            &airlock::ToolCall::new("increment", r#"{"name":"stale"}"#),
            &CancelToken::new(),
        )
        .await
        .unwrap_err();
    assert!(
        stale_write.to_string().contains("lost the lease"),
        "{stale_write}"
    );
    assert_eq!(store.read(None, "fence").await.unwrap(), before);
    taker.close().await.unwrap();
    stale.close().await.unwrap();
}

async fn a_call_outside_the_loop_is_journaled_and_counted(backend: Backend) {
    let db = TestStore::new(backend, "s").await;
    let store = db.open().await;
    let mut session = open(&store, options(None, "direct")).await;
    let probe = airlock::ToolCall::new("read", "{}");
    let seen = session
        .call(host().await, &probe, &CancelToken::new())
        .await
        .unwrap();
    assert_eq!(seen.result["usage"]["tool_calls"], 1);
    session
        .call(
            host().await,
            &airlock::ToolCall::new("increment", r#"{"name":"x"}"#),
            &CancelToken::new(),
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

/// A call's records, as JSON text, with what differs between any two runs
/// (item ids and numbers, run ids, times, durations) blanked: the rest
/// must match byte for byte.
fn call_records(records: &[airlock::journal::Record]) -> Vec<String> {
    records
        .iter()
        .filter_map(|record| match &record.entry {
            airlock::journal::Entry::Item { event, .. }
                if matches!(
                    event.item,
                    Item::FunctionCall { .. }
                        | Item::FunctionCallOutput { .. }
                        | Item::ContextUpdate { .. }
                ) =>
            {
                let mut value = serde_json::to_value(event).unwrap();
                for volatile in ["id", "run_id", "at_ms", "duration_us", "iteration"] {
                    if let Some(field) = value.get_mut(volatile) {
                        *field = Value::Null;
                    }
                }
                Some(value.to_string())
            }
            _ => None,
        })
        .collect()
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
        let _ = direct.call(host().await, &call, &CancelToken::new()).await;
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
        direct_calls[4].contains(r#""error_kind":"bad_arguments""#),
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

/// A host on another machine that stops renewing: its lease blocks others
/// until it expires (nothing on this machine can prove it dead), then
/// another host takes the session and the first can commit nothing more.
/// Time is the store's `now_ms`, so nothing here waits.
async fn a_remote_holders_lease_blocks_until_it_expires(backend: Backend) {
    use airlock::session::{LeaseRequest, SessionHeader};
    let db = TestStore::new(backend, "remote").await;
    let (host_a, host_b) = (db.open().await, db.open().await);
    let header = SessionHeader {
        session_id: "far".into(),
        user_id: Some("u".into()),
        created_at_ms: 1_000,
        metadata: BTreeMap::new(),
        ephemeral: false,
    };
    let ttl = std::time::Duration::from_millis(30_000);
    let remote: airlock::session::Holder =
        "boot=another-machine;pidns=pid:[1];pid=1;start=1;lease=x"
            .parse()
            .unwrap();
    let request = |holder, now_ms| LeaseRequest {
        user_id: Some("u"),
        session_id: "far",
        holder,
        ttl,
        now_ms,
        create: Some((&header, &[])),
    };
    let first = host_a.lease(request(&remote, 1_000)).await.unwrap();
    assert!(first.created);
    let record = |seq| airlock::journal::Record {
        seq,
        at_ms: 1_000,
        entry: airlock::journal::Entry::Message {
            message: Message::User {
                content: format!("message {seq}"),
            },
        },
    };
    host_a
        .append(&first.lease, &[record(1)], None, 2_000)
        .await
        .unwrap();
    // Within its ttl (counted from its last commit), the lease holds.
    let local = airlock::session::Holder::new();
    let refused = host_b.lease(request(&local, 31_999)).await.unwrap_err();
    match &refused {
        StoreError::InUse { expires_in_ms, .. } => assert_eq!(*expires_in_ms, 1),
        other => panic!("{other}"),
    }
    // Once expired, another host takes it, with the journal intact.
    let second = host_b.lease(request(&local, 32_000)).await.unwrap();
    assert!(!second.created);
    assert_eq!(second.lease.token, first.lease.token + 1);
    assert_eq!(second.session.records, vec![record(1)]);
    // The first holder comes back: its append and renewal are refused.
    let late = host_a
        .append(&first.lease, &[record(2)], None, 32_001)
        .await;
    assert!(
        matches!(late, Err(StoreError::LeaseLost { .. })),
        "{late:?}"
    );
    let renewed = host_a.renew(&first.lease, 32_001).await;
    assert!(matches!(renewed, Err(StoreError::LeaseLost { .. })));
    host_a.release(&first.lease).await.unwrap();
    // The new holder appends on from the same head.
    host_b
        .append(&second.lease, &[record(2)], None, 32_002)
        .await
        .unwrap();
    let stored = host_a.read(Some("u"), "far").await.unwrap();
    assert_eq!(stored.records, vec![record(1), record(2)]);
    assert_eq!(stored.updated_at_ms, 32_002);
}

/// Secrets given in deps: never in a store's files or the CLI's output.
const DEPS_MARKERS: [&str; 3] = ["MARK-api-key", "MARK-hidden", "MARK-nested-password"];

/// Secrets a tool's ops put in deps. The model wrote them in the call's
/// arguments (that is how the probe tool gets them), so the conversation
/// holds them; no deps snapshot, op or deps output may.
const OP_MARKERS: [&str; 2] = ["MARK-op-token", "MARK-op-nested"];

/// Asserts that no deps in `records` (snapshots and ops) holds a marker.
fn assert_no_op_marker_in_deps(records: &[airlock::journal::Record]) {
    for record in records {
        let text = match &record.entry {
            airlock::journal::Entry::Deps { deps } => Value::Object(deps.clone()).to_string(),
            airlock::journal::Entry::Item { event, .. }
                if matches!(event.item, Item::ContextUpdate { .. }) =>
            {
                serde_json::to_string(event).unwrap()
            }
            _ => continue,
        };
        for marker in OP_MARKERS.iter().chain(&DEPS_MARKERS) {
            assert!(
                !text.contains(marker),
                "{marker} reached record {}",
                record.seq
            );
        }
    }
}

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
    assert_eq!(stdout_json(&out)["updates"], json!([]));
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

fn assert_no_marker(bytes: &[u8], what: &str) {
    let text = String::from_utf8_lossy(bytes);
    for marker in DEPS_MARKERS {
        assert!(!text.contains(marker), "{marker} reached {what}");
    }
}

fn assert_no_op_marker(bytes: &[u8], what: &str) {
    let text = String::from_utf8_lossy(bytes);
    for marker in OP_MARKERS {
        assert!(!text.contains(marker), "{marker} reached {what}");
    }
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// `airlock sessions ARGS --store STORE`.
fn sessions(store: &str, args: &[&str]) -> Output {
    let mut all: Vec<&str> = vec!["sessions"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--store", store]);
    airlock_with_env(&all, &[])
}

/// `airlock run` on the vowels script and the example tools, on session
/// `id` in `store` (a file or a URL).
fn run_vowels(store: &str, id: &str, extra: &[&str]) -> Output {
    let script = root().join("guest-examples/scripts/vowels.json");
    let config = root().join("guest-examples/airlock.toml");
    let mut args = vec![
        "run",
        "Count the vowels of 'elephant'.",
        "--script",
        path(&script),
        "--config",
        path(&config),
        "--store",
        store,
        "--session",
        id,
        "--json",
    ];
    args.extend_from_slice(extra);
    airlock_with_env(&args, &[])
}

/// An import under a policy stores none of the keys it hides, as a run
/// under it would not (issue 60.9): the deps, the journal's ops and every
/// byte of the store. Without the policy the same file keeps them, and an
/// export under the policy leaves them out.
async fn an_import_drops_the_keys_its_policy_hides(backend: Backend) {
    const MARK: &str = "MARK-hidden-by-policy";
    let db = TestStore::new(backend, "import-from").await;
    let dir = &db.dir;
    let policy = dir.path().join("hiding.toml");
    std::fs::write(&policy, "[context]\nhidden = [\"internal_*\"]\n").unwrap();
    // The key only in deps (a call's arguments are the caller's text,
    // journaled as they are).
    let ops = json!({"ops": [{"op": "set", "key": "kept", "value": 1}]});
    let out = airlock_with_env(
        &[
            "call",
            path(&guest("context_probe")),
            "apply",
            &ops.to_string(),
            "--deps",
            &json!({"internal_notes": MARK}).to_string(),
            "--store",
            &db.spec,
            "--session",
            "hides",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let file = dir.path().join("hides.json");
    let out = sessions(&db.spec, &["export", "hides", "-o", path(&file)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&file).unwrap().contains(MARK));

    let hiding = TestStore::new(backend, "import-hiding").await;
    let out = sessions(
        &hiding.spec,
        &["import", path(&file), "--config", path(&policy)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = stdout_json(&sessions(&hiding.spec, &["show", "hides", "--json"]));
    assert_eq!(shown["deps"], json!({"kept": 1}));
    assert!(
        !hiding
            .raw_bytes()
            .windows(MARK.len())
            .any(|w| w == MARK.as_bytes())
    );
    let out = sessions(&db.spec, &["export", "hides", "--config", path(&policy)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains(MARK));
    assert_eq!(stdout_json(&out)["deps"], json!({"kept": 1}));

    // The control: without the policy, the key is the file's to keep.
    let plain = TestStore::new(backend, "import-plain").await;
    let out = sessions(&plain.spec, &["import", path(&file)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = stdout_json(&sessions(&plain.spec, &["show", "hides", "--json"]));
    assert_eq!(shown["deps"]["internal_notes"], json!(MARK));

    // A policy that does not load imports nothing, naming the file.
    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, "[context]\nhidden = 7\n").unwrap();
    let empty = TestStore::new(backend, "import-broken").await;
    let out = sessions(
        &empty.spec,
        &["import", path(&file), "--config", path(&broken)],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("broken.toml"), "{}", stderr(&out));
    let listed = stdout_json(&sessions(&empty.spec, &["list", "--json"]));
    assert_eq!(listed["sessions"], json!([]));
}

async fn many_sessions_from_several_processes_stay_intact(backend: Backend) {
    let store = TestStore::new(backend, "many").await;
    let db = store.spec.as_str();
    std::thread::scope(|scope| {
        let runs: Vec<_> = (0..6)
            .map(|i| scope.spawn(move || run_vowels(db, &format!("proc-{i}"), &[])))
            .collect();
        for run in runs {
            let out = run.join().unwrap();
            assert!(
                out.status.success(),
                "{}{}",
                stderr(&out),
                String::from_utf8_lossy(&out.stdout)
            );
        }
    });
    // Each again, resumed: the history and deps carry on.
    std::thread::scope(|scope| {
        for i in 0..6 {
            scope.spawn(move || {
                let out = run_vowels(db, &format!("proc-{i}"), &[]);
                assert!(out.status.success(), "{}", stderr(&out));
                assert_eq!(stdout_json(&out)["deps"]["counters"]["vowels"], 6);
            });
        }
    });
    let listed = stdout_json(&sessions(db, &["list", "--json"]));
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 6);
    for i in 0..6 {
        let shown = stdout_json(&sessions(db, &["show", &format!("proc-{i}"), "--json"]));
        assert_eq!(shown["deps"]["counters"]["vowels"], 6);
        assert_eq!(shown["usage"]["tool_calls"], 10);
        assert_eq!(shown["usage"]["total_tokens"], 2 * (2163 + 124));
        let runs = shown["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["type"] == "run_ended")
            .count();
        assert_eq!(runs, 2);
    }
    let out = sessions(db, &["rm", "proc-0"]);
    assert!(out.status.success());
    let listed = stdout_json(&sessions(db, &["list", "--json"]));
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 5);
    assert_eq!(listed["store"], store.location());
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

/// Keyed increments of `x` (ids `k<n>` for each `n` of `keys`) on the
/// anonymous session `id`, snapshotted every `every` records, then closed.
async fn keyed_increments(
    store: &Arc<dyn SessionStore>,
    id: &str,
    keys: std::ops::Range<usize>,
    every: u64,
) {
    keyed_increments_of(store, None, id, keys, every).await;
}

/// One keyed increment of counter `name` with call id `id`.
async fn keyed_increment(
    session: &mut Session,
    id: &str,
    name: &str,
) -> Result<airlock::CallOutcome, airlock::agent::SessionCallError> {
    let call = airlock::ToolCall {
        id: id.into(),
        ..airlock::ToolCall::new("increment", json!({ "name": name }).to_string())
    };
    session
        .call_once(host().await, &call, &CancelToken::new())
        .await
}

/// [`keyed_increments`] on `user`'s session `id`.
async fn keyed_increments_of(
    store: &Arc<dyn SessionStore>,
    user: Option<&str>,
    id: &str,
    keys: std::ops::Range<usize>,
    every: u64,
) {
    let mut session = Session::open(
        Arc::clone(store),
        SessionOptions {
            snapshot_every: every,
            ..options(user, id)
        },
        &ContextRules::default(),
    )
    .await
    .unwrap();
    for k in keys {
        let call = airlock::ToolCall {
            id: format!("k{k}"),
            ..airlock::ToolCall::new("increment", r#"{"name":"x"}"#)
        };
        session
            .call_once(host().await, &call, &CancelToken::new())
            .await
            .unwrap();
    }
    session.close().await.unwrap();
}

/// Asserts that `items` are numbered `item_1`, `item_2`, ... in order.
fn assert_numbered_in_order(items: &[airlock::journal::Event]) {
    let ids: Vec<&str> = items.iter().map(|e| e.id.as_str()).collect();
    let expected: Vec<String> = (1..=ids.len()).map(|n| format!("item_{n}")).collect();
    assert_eq!(ids, expected);
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
        .call(host().await, &unkeyed, &CancelToken::new())
        .await
        .unwrap();
    assert_eq!(first.result["value"], 1);
    let keyed = keyed_increment(&mut session, "k", "x").await.unwrap();
    assert_eq!(keyed.result["value"], 2);
    session.close().await.unwrap();
    let indexed = |store: Arc<dyn SessionStore>, key: &'static str| async move {
        store.call_records(None, "keys", key).await.unwrap().len()
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

/// What each schema before this one looked like, as the Airlock of its
/// day wrote it, rebuilt from the current tables with the same rows (less
/// the keyed calls' marks, which that Airlock did not write): the SQL that
/// turns a store into one of `version`.
fn downgrade_to(backend: Backend, version: u32) -> &'static str {
    match (backend, version) {
        // Schema 1: sessions and records keyed by owner and id, no call
        // index, no snapshots.
        (Backend::Sqlite, 1) => {
            "CREATE TABLE sessions_v1 (
                owner TEXT NOT NULL, session_id TEXT NOT NULL, created_at_ms INTEGER NOT NULL,
                updated_at_ms INTEGER NOT NULL, metadata TEXT NOT NULL, head INTEGER NOT NULL,
                lease_holder TEXT, lease_token INTEGER NOT NULL, lease_expires_ms INTEGER NOT NULL,
                PRIMARY KEY (owner, session_id)) WITHOUT ROWID;
             INSERT INTO sessions_v1 SELECT owner, session_id, created_at_ms, updated_at_ms,
                metadata, head, lease_holder, lease_token, lease_expires_ms FROM sessions;
             CREATE TABLE records_v1 (
                owner TEXT NOT NULL, session_id TEXT NOT NULL, seq INTEGER NOT NULL,
                at_ms INTEGER NOT NULL, entry TEXT NOT NULL,
                PRIMARY KEY (owner, session_id, seq)) WITHOUT ROWID;
             INSERT INTO records_v1 SELECT s.owner, s.session_id, r.seq, r.at_ms, r.entry
                FROM records r JOIN sessions s USING (sid);
             DROP TABLE records; DROP TABLE snapshots; DROP TABLE sessions;
             ALTER TABLE sessions_v1 RENAME TO sessions; ALTER TABLE records_v1 RENAME TO records;
             UPDATE records SET entry = replace(entry, ',\"keyed\":true', '');
             PRAGMA user_version = 1;"
        }
        // Schema 2: schema 1 with the call id (indexed), the ephemeral
        // flag and snapshots, all keyed by owner and id.
        (Backend::Sqlite, 2) => {
            "CREATE TABLE sessions_v2 (
                owner TEXT NOT NULL, session_id TEXT NOT NULL, created_at_ms INTEGER NOT NULL,
                updated_at_ms INTEGER NOT NULL, metadata TEXT NOT NULL, head INTEGER NOT NULL,
                lease_holder TEXT, lease_token INTEGER NOT NULL, lease_expires_ms INTEGER NOT NULL,
                ephemeral INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (owner, session_id)) WITHOUT ROWID;
             INSERT INTO sessions_v2 SELECT owner, session_id, created_at_ms, updated_at_ms,
                metadata, head, lease_holder, lease_token, lease_expires_ms, ephemeral FROM sessions;
             CREATE TABLE records_v2 (
                owner TEXT NOT NULL, session_id TEXT NOT NULL, seq INTEGER NOT NULL,
                at_ms INTEGER NOT NULL, entry TEXT NOT NULL, call_id TEXT,
                PRIMARY KEY (owner, session_id, seq)) WITHOUT ROWID;
             INSERT INTO records_v2 SELECT s.owner, s.session_id, r.seq, r.at_ms, r.entry, r.call_id
                FROM records r JOIN sessions s USING (sid);
             CREATE TABLE snapshots_v2 (
                owner TEXT NOT NULL, session_id TEXT NOT NULL, seq INTEGER NOT NULL,
                body TEXT NOT NULL, PRIMARY KEY (owner, session_id)) WITHOUT ROWID;
             INSERT INTO snapshots_v2 SELECT s.owner, s.session_id, n.seq, n.body
                FROM snapshots n JOIN sessions s USING (sid);
             DROP TABLE records; DROP TABLE snapshots; DROP TABLE sessions;
             ALTER TABLE sessions_v2 RENAME TO sessions; ALTER TABLE records_v2 RENAME TO records;
             ALTER TABLE snapshots_v2 RENAME TO snapshots;
             UPDATE records SET entry = replace(entry, ',\"keyed\":true', '');
             CREATE INDEX records_by_call ON records (owner, session_id, call_id);
             PRAGMA user_version = 2;"
        }
        (Backend::Postgres, 1) => {
            "ALTER TABLE airlock_records DROP COLUMN call_id; DROP TABLE airlock_snapshots;
             UPDATE airlock_records SET entry = replace(entry, ',\"keyed\":true', '');
             ALTER TABLE airlock_sessions DROP COLUMN ephemeral;
             UPDATE airlock_schema SET version = 1;"
        }
        _ => unreachable!("no schema {version} on {backend:?}"),
    }
}

/// A store written by an earlier schema (SQLite: 1 and 2; Postgres: 1)
/// is migrated when opened: every session keeps its owner, journal and
/// deps (two users' sessions of the same id stay apart), the calls
/// already journaled are indexed, so a keyed retry of one is still found
/// once a snapshot hides it, and the migrated store takes new calls.
async fn an_earlier_schema_is_migrated_and_its_calls_indexed(backend: Backend) {
    let versions: &[u32] = match backend {
        Backend::Sqlite => &[1, 2],
        Backend::Postgres => &[1],
    };
    for &version in versions {
        let db = TestStore::new(backend, &format!("migrate{version}")).await;
        {
            let store = db.open().await;
            keyed_increments(&store, "old", 0..3, 4).await;
            keyed_increments_of(&store, Some("bob"), "old", 0..5, 4).await;
        }
        let before = {
            let store = db.open().await;
            let anonymous = store.read(None, "old").await.unwrap().records;
            let bob = store.read(Some("bob"), "old").await.unwrap().records;
            (anonymous, bob)
        };
        db.execute(downgrade_to(backend, version)).await;

        let store = db.open().await;
        let after = (
            store.read(None, "old").await.unwrap().records,
            store.read(Some("bob"), "old").await.unwrap().records,
        );
        // Stored without marks, as that Airlock wrote them: read back
        // marked, since the migration indexed every call (all keyed here).
        assert_eq!(
            serde_json::to_value(&after).unwrap(),
            serde_json::to_value(&before).unwrap(),
            "schema {version}: every record kept, each under its own owner"
        );
        // More calls, so that a snapshot now covers k0..k2.
        keyed_increments(&store, "old", 3..6, 2).await;
        let mut session = open(&store, options(None, "old")).await;
        assert!(session.transcript().items_folded > 0);
        let again = keyed_increment(&mut session, "k0", "x").await.unwrap();
        assert_eq!(again.result["value"], 1, "schema {version}");
        assert_eq!(session.context().deps()["counters"]["x"], 6);
        session.close().await.unwrap();
        let bob = open(&store, options(Some("bob"), "old")).await;
        assert_eq!(bob.context().deps()["counters"]["x"], 5, "schema {version}");
        bob.close().await.unwrap();
    }
}

/// A file that is not a session store Airlock can use is refused with
/// exit 2, naming the file and why, and is left as it was.
#[test]
fn a_file_that_is_not_a_store_is_refused_naming_it_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let make = |name: &str, build: &dyn Fn(&Path)| {
        let path = dir.path().join(name);
        build(&path);
        path
    };
    let random = make("random.db", &|p| {
        std::fs::write(
            p,
            (0..20_000u32)
                .map(|i| (i * 7919 % 251) as u8)
                .collect::<Vec<_>>(),
        )
        .unwrap()
    });
    let text = make("notes.txt", &|p| {
        std::fs::write(p, "shopping list\n").unwrap()
    });
    let foreign = make("other.db", &|p| {
        let conn = rusqlite::Connection::open(p).unwrap();
        conn.execute_batch("CREATE TABLE sessions (a); CREATE TABLE notes (b);")
            .unwrap();
    });
    let newer = make("newer.db", &|p| {
        let conn = rusqlite::Connection::open(p).unwrap();
        conn.execute_batch("PRAGMA user_version = 99;").unwrap();
    });
    for (path, why) in [
        (&random, "not a SQLite database"),
        (&text, "not a SQLite database"),
        (
            &foreign,
            "a database of another program (its tables: notes, sessions)",
        ),
        (&newer, "written by a newer Airlock (schema 99"),
    ] {
        let before = std::fs::read(path).unwrap();
        for args in [vec!["list", "--json"], vec!["show", "s", "--json"]] {
            let out = sessions(path.to_str().unwrap(), &args);
            assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
            let doc = stdout_json(&out);
            assert_eq!(doc["error"]["kind"], "invalid_store", "{doc}");
            let message = doc["error"]["message"].as_str().unwrap();
            assert!(message.contains(path.to_str().unwrap()), "{message}");
            assert!(message.contains(why), "{message}");
        }
        assert_eq!(
            std::fs::read(path).unwrap(),
            before,
            "{} was changed",
            path.display()
        );
    }
    // A call on one does not run the tool.
    let out = airlock_with_env(
        &[
            "call",
            guest("stateful").to_str().unwrap(),
            "increment",
            r#"{"name":"a"}"#,
            "--session",
            "s",
            "--store",
            foreign.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["error"]["kind"], "invalid_store");
}

/// Processes creating the store together: opening switches the new file
/// to WAL, a write SQLite does not wait for (it fails at once with
/// "database is locked" while another connection holds the write lock).
/// Here another connection holds it while the store opens; the open waits
/// its turn and the store works. The lock is let go only once the open is
/// seen waiting for it: its thread asleep in SQLite's busy handler (the
/// kernel's `wchan` for the thread), so the test cannot pass without the
/// open having met the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_opened_while_another_process_writes_the_new_file_waits_its_turn() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("together.db");
    let other = write_locked(&db);
    let path = db.clone();
    let (thread_id, opener) = std::sync::mpsc::channel();
    let opening = std::thread::spawn(move || {
        // `/proc/thread-self` is `PID/task/TID`.
        let me = std::fs::read_link("/proc/thread-self").unwrap();
        thread_id.send(me.file_name().unwrap().to_owned()).unwrap();
        airlock::session::SqliteStore::open(path)
    });
    let wchan = std::path::Path::new("/proc/self/task")
        .join(opener.recv().unwrap())
        .join("wchan");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !std::fs::read_to_string(&wchan).is_ok_and(|w| w.contains("nanosleep")) {
        assert!(
            !opening.is_finished(),
            "the open ended without waiting for the lock"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the open never waited for the lock"
        );
        std::thread::yield_now();
    }
    other.execute_batch("COMMIT").unwrap();
    let store: Arc<dyn SessionStore> = Arc::new(
        opening
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("the open waits for the other writer: {e}")),
    );
    stored(&store, options(None, "after")).await;
    let listed = store.list(None).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].session_id, "after");
}

/// A write that waits out the busy timeout (another connection holding
/// the store's write lock all that time) fails saying so, and changes
/// nothing; the same write works once the lock is let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_waits_out_another_writers_lock_fails_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("held.db");
    let store: Arc<dyn SessionStore> = Arc::new(airlock::session::SqliteStore::open(&db).unwrap());
    stored(&store, options(None, "kept")).await;
    let other = write_locked(&db);
    let out = sessions(path(&db), &["rm", "kept", "--json"]);
    assert!(!out.status.success());
    let message = stdout_json(&out)["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains(path(&db)), "{message}");
    assert!(
        message.contains(
            "database is locked: another connection held its write lock for more than 10 s"
        ),
        "{message}"
    );
    other.execute_batch("COMMIT").unwrap();
    assert_eq!(store.list(None).await.unwrap().len(), 1);
    let out = sessions(path(&db), &["rm", "kept"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(store.list(None).await.unwrap().is_empty());
}

/// Another connection to the SQLite file `db`, holding its write lock
/// (`BEGIN IMMEDIATE`) until it commits.
fn write_locked(db: &Path) -> rusqlite::Connection {
    let other = rusqlite::Connection::open(db).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    other
}

/// The real store, counting the commits made through it.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn SessionStore>,
    appends: std::sync::atomic::AtomicUsize,
}

impl Counting {
    fn appends(&self) -> usize {
        self.appends.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl SessionStore for Counting {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn lease<'a>(
        &'a self,
        request: airlock::session::LeaseRequest<'a>,
    ) -> airlock::BoxFuture<'a, Result<airlock::session::Leased, StoreError>> {
        self.inner.lease(request)
    }
    fn append<'a>(
        &'a self,
        lease: &'a airlock::session::Lease,
        records: &'a [airlock::journal::Record],
        snapshot: Option<&'a airlock::session::StoredSnapshot>,
        now_ms: u64,
    ) -> airlock::BoxFuture<'a, Result<(), StoreError>> {
        self.appends
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.append(lease, records, snapshot, now_ms)
    }
    fn call_records<'a>(
        &'a self,
        owner: Option<&'a str>,
        session_id: &'a str,
        call_id: &'a str,
    ) -> airlock::BoxFuture<'a, Result<Vec<airlock::journal::Record>, StoreError>> {
        self.inner.call_records(owner, session_id, call_id)
    }
    fn renew<'a>(
        &'a self,
        lease: &'a airlock::session::Lease,
        now_ms: u64,
    ) -> airlock::BoxFuture<'a, Result<(), StoreError>> {
        self.inner.renew(lease, now_ms)
    }
    fn release<'a>(
        &'a self,
        lease: &'a airlock::session::Lease,
    ) -> airlock::BoxFuture<'a, Result<(), StoreError>> {
        self.inner.release(lease)
    }
    fn read<'a>(
        &'a self,
        owner: Option<&'a str>,
        session_id: &'a str,
    ) -> airlock::BoxFuture<'a, Result<airlock::session::StoredSession, StoreError>> {
        self.inner.read(owner, session_id)
    }
    fn read_page<'a>(
        &'a self,
        owner: Option<&'a str>,
        session_id: &'a str,
        after: u64,
        limit: u64,
    ) -> airlock::BoxFuture<'a, Result<airlock::session::StoredSession, StoreError>> {
        self.inner.read_page(owner, session_id, after, limit)
    }
    fn list<'a>(
        &'a self,
        owner: Option<&'a str>,
    ) -> airlock::BoxFuture<'a, Result<Vec<airlock::session::SessionSummary>, StoreError>> {
        self.inner.list(owner)
    }
    fn insert<'a>(
        &'a self,
        header: &'a airlock::session::SessionHeader,
        records: Box<dyn airlock::session::RecordPages>,
        updated_at_ms: u64,
    ) -> airlock::BoxFuture<'a, Result<(), StoreError>> {
        self.inner.insert(header, records, updated_at_ms)
    }
    fn remove<'a>(
        &'a self,
        owner: Option<&'a str>,
        session_id: &'a str,
        now_ms: u64,
    ) -> airlock::BoxFuture<'a, Result<(), StoreError>> {
        self.inner.remove(owner, session_id, now_ms)
    }
    fn prune<'a>(
        &'a self,
        request: airlock::session::PruneRequest<'a>,
    ) -> airlock::BoxFuture<'a, Result<Vec<airlock::session::Pruned>, StoreError>> {
        self.inner.prune(request)
    }
}

/// A pure call (no effectful grant) is journaled in one commit, intent and
/// output together; an effectful one (a writable directory) and a keyed
/// one commit the intent first. The journal reads the same either way.
async fn a_pure_call_commits_once_and_an_effectful_or_keyed_one_twice(backend: Backend) {
    let db = TestStore::new(backend, "commits").await;
    let store = Arc::new(Counting {
        inner: db.open().await,
        appends: Default::default(),
    });
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
        .call(host().await, &increment(), &CancelToken::new())
        .await
        .unwrap();
    assert_eq!(commits(before), 1, "a pure call");
    let before = store.appends();
    session
        .call(&effectful, &increment(), &CancelToken::new())
        .await
        .unwrap();
    assert_eq!(commits(before), 2, "an effectful call");
    let before = store.appends();
    session
        .call_once(host().await, &increment(), &CancelToken::new())
        .await
        .unwrap();
    assert_eq!(commits(before), 2, "a keyed call");
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
    assert_eq!(kinds, ["intent", "output", "ops"].repeat(3));
    assert_eq!(folded.deps["counters"]["x"], 3);
}

/// Retention: old sessions go, recent ones and leased ones stay, ephemeral
/// ones go after a day; `--user` scopes a prune, `--all-users` does not;
/// `airlock run` without `--session` makes an ephemeral session.
async fn pruning_removes_old_and_ephemeral_sessions_never_a_leased_one(backend: Backend) {
    use airlock::session::{Holder, LeaseRequest, SessionHeader};
    let db = TestStore::new(backend, "prune").await;
    let store = db.open().await;
    let now = airlock::journal::now_ms();
    let day = 24 * 3600 * 1000;
    let record = airlock::journal::Record {
        seq: 1,
        at_ms: now,
        entry: airlock::journal::Entry::Deps {
            deps: serde_json::Map::new(),
        },
    };
    for (id, user, age, ephemeral) in [
        ("old", None, 40 * day, false),
        ("recent", None, day / 24, false),
        ("old-ephemeral", None, 2 * day, true),
        ("fresh-ephemeral", None, day / 24, true),
        ("old-leased", None, 40 * day, false),
        ("theirs", Some("u2"), 40 * day, false),
    ] {
        let header = SessionHeader {
            session_id: id.into(),
            user_id: user.map(str::to_owned),
            created_at_ms: now - age,
            metadata: BTreeMap::new(),
            ephemeral,
        };
        store
            .insert(&header, Box::new(vec![record.clone()]), now - age)
            .await
            .unwrap();
    }
    let holder = Holder::new();
    let leased = store
        .lease(LeaseRequest {
            user_id: None,
            session_id: "old-leased",
            holder: &holder,
            ttl: std::time::Duration::from_secs(60),
            now_ms: now,
            create: None,
        })
        .await
        .unwrap();

    let retention = airlock::retention::Retention::default();
    let pruned = airlock::session::prune(
        store.as_ref(),
        &retention,
        Some(None),
        Some(std::time::Duration::from_secs(30 * 24 * 3600)),
    )
    .await
    .unwrap();
    let mut gone: Vec<&str> = pruned.iter().map(|p| p.session_id.as_str()).collect();
    gone.sort_unstable();
    assert_eq!(gone, ["old", "old-ephemeral"]);
    assert_eq!(
        session_ids(&store).await,
        ["fresh-ephemeral", "old-leased", "recent"]
    );
    assert!(store.read(None, "old").await.is_err());
    store.release(&leased.lease).await.unwrap();

    // The CLI: one user's by default, everyone's with --all-users; the
    // released session goes now.
    let out = sessions(&db.spec, &["prune", "--older-than", "30d", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout_json(&out)["pruned"],
        json!([{"user_id": null, "session_id": "old-leased"}])
    );
    let out = sessions(
        &db.spec,
        &["prune", "--older-than", "30d", "--all-users", "--json"],
    );
    assert_eq!(
        stdout_json(&out)["pruned"],
        json!([{"user_id": "u2", "session_id": "theirs"}])
    );
    let out = sessions(&db.spec, &["prune", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stdout_json(&out)["error"]["kind"], "invalid_age");
    let out = sessions(&db.spec, &["prune", "--older-than", "soon", "--json"]);
    assert_eq!(out.status.code(), Some(2));

    // A policy's [sessions] ttl is what a prune without --older-than uses.
    let policy = db.dir.path().join("airlock.toml");
    std::fs::write(
        &policy,
        "[sessions]\nttl = \"1h\"\nephemeral_ttl = \"1m\"\n",
    )
    .unwrap();
    let out = sessions(
        &db.spec,
        &["prune", "--config", policy.to_str().unwrap(), "--json"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let pruned = stdout_json(&out)["pruned"].clone();
    let mut gone: Vec<&str> = pruned
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["session_id"].as_str().unwrap())
        .collect();
    gone.sort_unstable();
    assert_eq!(gone, ["fresh-ephemeral", "recent"]);

    // `airlock run` without --session: ephemeral; with one: not.
    assert!(run_vowels(&db.spec, "named", &[]).status.success());
    let out = airlock_with_env(
        &[
            "run",
            "--tool",
            guest("stateful").to_str().unwrap(),
            "--script",
            root()
                .join("guest-examples/scripts/vowels.json")
                .to_str()
                .unwrap(),
            "--store",
            &db.spec,
            "--json",
            "count",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let unnamed = stdout_json(&out)["session_id"].as_str().unwrap().to_owned();
    let listed = stdout_json(&sessions(&db.spec, &["list", "--json"]));
    for session in listed["sessions"].as_array().unwrap() {
        let ephemeral = session.get("ephemeral") == Some(&json!(true));
        assert_eq!(
            ephemeral,
            session["session_id"] == unnamed.as_str(),
            "{session}"
        );
    }
}

/// Creates session `id` (its first record: `deps`) leased to `holder`; the
/// lease.
async fn create_leased(
    store: &Arc<dyn SessionStore>,
    id: &str,
    holder: &airlock::session::Holder,
    deps: Value,
) -> airlock::session::Lease {
    use airlock::journal::{Entry, Record};
    let now = airlock::journal::now_ms();
    let header = airlock::session::SessionHeader {
        session_id: id.into(),
        user_id: None,
        created_at_ms: now,
        metadata: BTreeMap::new(),
        ephemeral: false,
    };
    let first = [Record {
        seq: 1,
        at_ms: now,
        entry: Entry::Deps {
            deps: deps.as_object().cloned().unwrap_or_default(),
        },
    }];
    store
        .lease(airlock::session::LeaseRequest {
            user_id: None,
            session_id: id,
            holder,
            ttl: std::time::Duration::from_secs(600),
            now_ms: now,
            create: Some((&header, &first)),
        })
        .await
        .unwrap()
        .lease
}

/// Appends of many sessions at once (on SQLite, committed in shared
/// batches): each lands exactly once and in order; one whose lease was
/// taken over fails alone, writing nothing, and the others stand; so does
/// one that fails half-way (two records with one number).
async fn concurrent_appends_commit_together_and_a_fenced_one_fails_alone(backend: Backend) {
    use airlock::journal::{Entry, Record};
    use airlock::session::{Holder, LeaseRequest};
    let db = TestStore::new(backend, "batch").await;
    let store = db.open().await;
    let now = airlock::journal::now_ms();
    let holder = Holder::new();
    let mut leases = Vec::new();
    for s in 0..32 {
        leases.push(create_leased(&store, &format!("b{s}"), &holder, json!({})).await);
    }
    // Session b7's lease is taken over by another holder.
    let usurper = Holder::new();
    store.release(&leases[7]).await.unwrap();
    let taken = store
        .lease(LeaseRequest {
            user_id: None,
            session_id: "b7",
            holder: &usurper,
            ttl: std::time::Duration::from_secs(60),
            now_ms: now,
            create: None,
        })
        .await
        .unwrap();
    let note = move |seq: u64, text: &str| Record {
        seq,
        at_ms: now,
        entry: Entry::Message {
            message: Message::User {
                content: text.to_owned(),
            },
        },
    };
    // Every session appends records 2..=11, one at a time, all sessions
    // at once.
    let mut tasks = tokio::task::JoinSet::new();
    for (s, lease) in leases.into_iter().enumerate() {
        let store = Arc::clone(&store);
        tasks.spawn(async move {
            let mut results = Vec::new();
            let mut broken = None;
            for seq in 2..=11 {
                if s == 9 && seq == 5 {
                    let twice = [note(seq, "broken"), note(seq, "broken")];
                    broken = Some(store.append(&lease, &twice, None, now).await);
                }
                let record = note(seq, &format!("b{s} #{seq}"));
                results.push(store.append(&lease, &[record], None, now).await);
            }
            if let Some(broken) = broken {
                assert!(
                    matches!(broken, Err(StoreError::Backend { .. })),
                    "{broken:?}"
                );
            }
            (s, results)
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (s, results) = done.unwrap();
        if s == 7 {
            assert!(
                results
                    .iter()
                    .all(|r| matches!(r, Err(StoreError::LeaseLost { .. }))),
                "{results:?}"
            );
        } else {
            assert!(results.iter().all(Result::is_ok), "b{s}: {results:?}");
        }
    }
    for s in 0..32 {
        let stored = store.read(None, &format!("b{s}")).await.unwrap();
        let seqs: Vec<u64> = stored.records.iter().map(|r| r.seq).collect();
        if s == 7 {
            assert_eq!(seqs, [1], "the fenced holder wrote nothing");
        } else {
            assert_eq!(seqs, (1..=11).collect::<Vec<_>>(), "b{s}");
            let texts = serde_json::to_string(&stored.records).unwrap();
            assert!(!texts.contains("broken"), "b{s}: {texts}");
        }
    }
    store.release(&taken.lease).await.unwrap();
}

/// A session removed and made again under the same id is a new session:
/// its appends land in the new one (a committer that remembered where the
/// first one was looks again) and nothing of the first comes back.
async fn a_session_removed_and_made_again_is_written_as_the_new_one(backend: Backend) {
    use airlock::journal::Entry;
    let db = TestStore::new(backend, "again").await;
    let store = db.open().await;
    // Opens the session, commits each of `values` as its deps (a new
    // session's first commit creates it, the next is an append to it),
    // closes it; says whether it was new.
    async fn commit_deps(store: &Arc<dyn SessionStore>, values: [u64; 2]) -> bool {
        let mut session = open(store, options(None, "again")).await;
        let created = session.created();
        for n in values {
            let deps = json!({ "n": n }).as_object().unwrap().clone();
            session
                .set_deps(deps, &ContextRules::default())
                .await
                .unwrap();
        }
        session.close().await.unwrap();
        created
    }
    commit_deps(&store, [0, 1]).await;
    store
        .remove(None, "again", airlock::journal::now_ms())
        .await
        .unwrap();
    assert!(commit_deps(&store, [2, 3]).await);

    let again = store.read(None, "again").await.unwrap();
    let written: Vec<(u64, Value)> = again
        .records
        .iter()
        .map(|r| match &r.entry {
            Entry::Deps { deps } => (r.seq, Value::Object(deps.clone())),
            other => panic!("unexpected record {other:?}"),
        })
        .collect();
    // Its own first record (the empty deps it was opened with), then its
    // two commits; nothing of the first session.
    assert_eq!(
        written,
        [(1, json!({})), (2, json!({"n": 2})), (3, json!({"n": 3}))]
    );
    let resumed = open(&store, options(None, "again")).await;
    assert_eq!(
        Value::Object(resumed.context().deps().clone()),
        json!({"n": 3})
    );
    resumed.close().await.unwrap();
}

crate::on_both_stores!(
    the_streamed_export_is_the_whole_sessions_export,
    concurrent_appends_commit_together_and_a_fenced_one_fails_alone,
    pruning_removes_old_and_ephemeral_sessions_never_a_leased_one,
    a_pure_call_commits_once_and_an_effectful_or_keyed_one_twice,
    an_earlier_schema_is_migrated_and_its_calls_indexed,
    a_resume_reads_the_snapshot_and_its_tail_and_keyed_calls_still_run_once,
    a_session_resumed_far_behind_its_snapshot_gets_one_with_its_next_commit,
    a_session_held_open_holds_a_bounded_item_log,
    a_key_finds_keyed_calls_only_here_and_after_an_import,
    a_remote_holders_lease_blocks_until_it_expires,
    every_field_round_trips_through_the_store_and_an_export,
    unknown_missing_and_malformed_versions_import_nothing,
    an_import_that_fails_midway_inserts_nothing,
    users_are_a_hard_partition,
    unanswered_calls_are_patched_once_with_the_exact_text,
    a_resumed_run_sends_the_model_the_real_history,
    of_two_concurrent_opens_exactly_one_wins,
    a_lost_lease_commits_nothing_more,
    a_call_outside_the_loop_is_journaled_and_counted,
    a_call_journals_the_same_through_the_loop_and_a_direct_call,
    hidden_and_secret_looking_keys_never_reach_the_store,
    the_cli_never_prints_or_saves_secret_keys,
    an_import_drops_the_keys_its_policy_hides,
    many_sessions_from_several_processes_stay_intact,
    a_reader_that_goes_away_does_not_stop_the_run,
    a_session_removed_and_made_again_is_written_as_the_new_one,
);

/// Appends `count` user messages of `size` bytes each to session `id`
/// (created), `per_commit` a commit; the store's records.
async fn fill(store: &Arc<dyn SessionStore>, id: &str, count: u64, size: usize, per_commit: u64) {
    use airlock::journal::{Entry, Record};
    let now = airlock::journal::now_ms();
    let holder = airlock::session::Holder::new();
    let lease = create_leased(store, id, &holder, json!({"counters": {"n": 1}})).await;
    let text = "x".repeat(size);
    let mut seq = 1;
    while seq <= count {
        let batch: Vec<Record> = (seq + 1..=(seq + per_commit).min(count + 1))
            .map(|s| Record {
                seq: s,
                at_ms: now,
                entry: Entry::Message {
                    message: Message::User {
                        content: format!("{s}:{text}"),
                    },
                },
            })
            .collect();
        seq += batch.len() as u64;
        store.append(&lease, &batch, None, now).await.unwrap();
    }
    store.release(&lease).await.unwrap();
}

/// The streamed export (the CLI's) is the same document the library
/// builds from the whole session.
async fn the_streamed_export_is_the_whole_sessions_export(backend: Backend) {
    let db = TestStore::new(backend, "stream").await;
    let store = db.open().await;
    // More records than a page, and the vowels run's items and messages.
    fill(&store, "streamed", 300, 100, 7).await;
    assert!(run_vowels(&db.spec, "streamed", &[]).status.success());
    let out = sessions(&db.spec, &["export", "streamed"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let streamed = export_of(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let stored = store.read(None, "streamed").await.unwrap();
    let whole = SessionExport::new(&stored, &ContextRules::default()).unwrap();
    assert_eq!(streamed, whole);
    assert_eq!(streamed.journal.len(), stored.records.len());
}

/// SQLite session `id`: made through the store (its deps, then a short
/// message), then `count - 1` messages of `size` bytes as records 3, 4,
/// ..., `count + 1`, written behind the store's back in one transaction (a
/// debug build is slow to serialize hundreds of megabytes).
async fn filled_behind(db: &TestStore, id: &str, count: u64, size: usize) {
    let store = db.open().await;
    fill(&store, id, 1, 1, 1).await;
    drop(store);
    let entry = serde_json::to_string(&airlock::journal::Entry::Message {
        message: Message::User {
            content: "x".repeat(size),
        },
    })
    .unwrap();
    let mut conn = rusqlite::Connection::open(&db.spec).unwrap();
    let tx = conn.transaction().unwrap();
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO records (sid, seq, at_ms, entry)
                 SELECT sid, ?1, 0, ?2 FROM sessions WHERE owner = '' AND session_id = ?3",
            )
            .unwrap();
        for seq in 3..=count + 1 {
            insert.execute(rusqlite::params![seq, entry, id]).unwrap();
        }
    }
    tx.execute(
        "UPDATE sessions SET head = ?1 WHERE owner = '' AND session_id = ?2",
        rusqlite::params![count + 1, id],
    )
    .unwrap();
    tx.commit().unwrap();
}

/// An import SIGKILLed at points spread over its run (at once, while it
/// reads the file, while it commits) leaves all of the session or none of
/// it, and the store whole: its other session unchanged, the file passing
/// SQLite's integrity check, and the same import succeeding after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_killed_at_any_point_leaves_all_or_nothing() {
    let db = TestStore::new(Backend::Sqlite, "killed").await;
    filled_behind(&db, "big", 256, 64 << 10).await;
    let file = db.dir.path().join("big.json");
    let out = sessions(&db.spec, &["export", "big", "--output", path(&file)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let size = std::fs::metadata(&file).unwrap().len();
    let store = db.open().await;
    let original = store.read(None, "big").await.unwrap();
    drop(store);
    let wal = std::path::PathBuf::from(format!("{}-wal", db.spec));
    let wal_len = || std::fs::metadata(&wal).map_or(0, |m| m.len());

    // Each point: what must have happened before the kill. The import
    // reads the file (as far as its version, then all of it, staging the
    // journal in a temporary file), then reads the staged journal back
    // into one transaction.
    type Reached<'a> = Box<dyn Fn(u32) -> bool + 'a>;
    let read = |pid: u32| -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/io"))
            .ok()
            .and_then(|io| {
                io.lines()
                    .find_map(|l| l.strip_prefix("rchar: ")?.parse().ok())
            })
            .unwrap_or(0)
    };
    let points: Vec<(&str, Reached)> = vec![
        ("at once", Box::new(|_| true)),
        ("reading the file", Box::new(|pid| read(pid) > size / 2)),
        ("inserting", Box::new(|pid| read(pid) > size * 3 / 2)),
        // The store's page cache (32 MiB) holds this whole session, so
        // its pages reach the log as the transaction commits.
        ("committing", Box::new(|_| wal_len() > (1 << 20))),
        ("half committed", Box::new(|_| wal_len() > size / 2)),
    ];
    let mut left_nothing = 0;
    for (round, (point, reached)) in points.iter().enumerate() {
        // A fresh log each round, so its growth is this import's.
        {
            let conn = rusqlite::Connection::open(&db.spec).unwrap();
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .unwrap();
        }
        let id = format!("copy-{round}");
        let mut child = crate::support::airlock_command(
            &[
                "sessions",
                "import",
                path(&file),
                "--as",
                &id,
                "--store",
                &db.spec,
            ],
            &[],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
        let pid = child.id();
        while child.try_wait().unwrap().is_none() && !reached(pid) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let _ = child.kill();
        child.wait().unwrap();
        let store = db.open().await;
        match store.read(None, &id).await {
            Err(StoreError::NotFound { .. }) => left_nothing += 1,
            // Killed after its commit (and before it exited): whole.
            Ok(copy) => assert_eq!(copy.records, original.records, "{point}"),
            Err(e) => panic!("{point}: {e}"),
        }
        assert_eq!(store.read(None, "big").await.unwrap(), original, "{point}");
    }
    assert!(
        left_nothing >= 3,
        "only {left_nothing} kills landed mid-import"
    );
    let conn = rusqlite::Connection::open(&db.spec).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    drop(conn);
    let out = sessions(&db.spec, &["import", path(&file), "--as", "whole"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let store = db.open().await;
    assert_eq!(
        store.read(None, "whole").await.unwrap().records,
        original.records
    );
}

/// A session of 128 MiB exports, is shown (as JSON and as text), and its
/// export imports, with the binary's data segment capped at 64 MiB
/// (RLIMIT_DATA, which counts the heap): none of them holds the session
/// whole (the control below: 128 MiB does not fit under the cap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_session_exports_and_imports_in_bounded_memory() {
    const SIZE: usize = 64 << 10;
    const COUNT: u64 = 2 * 1024;
    const CAP: u64 = 64 << 20;
    let db = TestStore::new(Backend::Sqlite, "big").await;
    filled_behind(&db, "big", COUNT, SIZE).await;
    let output = db.dir.path().join("big.json");
    let airlock = env!("CARGO_BIN_EXE_airlock");
    let capped = |args: &[&str]| {
        std::process::Command::new("prlimit")
            .arg(format!("--data={CAP}"))
            .arg(airlock)
            .args(args)
            .args(["--store", &db.spec])
            .output()
            .expect("prlimit (util-linux) runs")
    };
    let out = capped(&[
        "sessions",
        "export",
        "big",
        "--output",
        output.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let bytes = std::fs::metadata(&output).unwrap().len();
    assert!(bytes > (128 << 20), "{bytes} bytes exported");
    // The cap is real: a process that holds 128 MiB fails under it.
    let control = std::process::Command::new("prlimit")
        .arg(format!("--data={CAP}"))
        .args(["python3", "-c", "b = bytearray(128 << 20)"])
        .output()
        .expect("prlimit and python3 run");
    assert!(!control.status.success(), "128 MiB fit under the cap");
    // Imported under the same cap: read a record at a time, inserted a
    // page at a time. The copy is the session, record for record.
    let imported = capped(&[
        "sessions",
        "import",
        output.to_str().unwrap(),
        "--as",
        "big-copy",
    ]);
    assert!(imported.status.success(), "{}", stderr(&imported));
    {
        let store = db.open().await;
        let original = store.read(None, "big").await.unwrap();
        let copy = store.read(None, "big-copy").await.unwrap();
        assert_eq!(copy.records.len() as u64, COUNT + 1);
        assert_eq!(copy.records, original.records);
        assert_eq!(copy.updated_at_ms, original.updated_at_ms);
    }
    let shown = capped(&["sessions", "show", "big", "--json"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    assert!(shown.stdout.len() > (128 << 20), "{}", shown.stdout.len());
    assert!(shown.stdout.starts_with(b"{\"version\": 2,"));
    let end = String::from_utf8_lossy(&shown.stdout[shown.stdout.len() - 400..]).into_owned();
    assert!(end.contains("\"deps\": {\"counters\":{\"n\":1}}"), "{end}");
    assert!(end.trim_end().ends_with("\"ok\": true\n}"), "{end}");
    let text = capped(&["sessions", "show", "big"]);
    assert!(text.status.success(), "{}", stderr(&text));
    let text = String::from_utf8_lossy(&text.stdout);
    assert_eq!(
        text.matches("\n  user: ").count() as u64,
        COUNT,
        "one line a message"
    );
    assert!(
        text.contains("deps:     {\"counters\":{\"n\":1}}"),
        "{}",
        &text[..400]
    );
    // Its ends are the document's: the version first, deps last.
    use std::io::{Read, Seek};
    let mut file = std::fs::File::open(&output).unwrap();
    let mut head = [0u8; 16];
    file.read_exact(&mut head).unwrap();
    assert!(head.starts_with(b"{\"version\": 2,"), "{head:?}");
    file.seek(std::io::SeekFrom::End(-400)).unwrap();
    let mut tail = String::new();
    file.read_to_string(&mut tail).unwrap();
    assert!(
        tail.contains("\"deps\": {\"counters\":{\"n\":1}}"),
        "{tail}"
    );
    assert!(tail.contains("\"iteration\": 0"), "{tail}");
    assert!(tail.trim_end().ends_with('}'), "{tail}");
}
