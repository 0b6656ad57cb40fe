//! Sessions: sessions exported and imported: every field, versions, faults, bounded memory, all or nothing.

use super::*;

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
    assert_eq!(export.version, 3);
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
        (
            Some(json!(4)),
            "unsupported version: 4 (this Airlock reads versions 1 to 3; a newer Airlock wrote this file)",
        ),
        (
            Some(json!(0)),
            "unsupported version: 0 (this Airlock reads versions 1 to 3)",
        ),
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
    // A SQLite store that was not there is not made for a file refused.
    if backend == Backend::Sqlite {
        assert!(!cli.file.exists(), "{}", cli.file.display());
    }
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
    store
        .append(airlock::session::Append {
            lease: &lease,
            records: &records,
            snapshot: None,
            now_ms: now,
            flush: airlock::journal::Flush::Now,
        })
        .await
        .unwrap();
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
        "unsupported version: 7 (this Airlock reads versions 1 to 3; a newer Airlock wrote this file)"
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
        truncate_wal(&db.spec);
        let id = format!("copy-{round}");
        let import = [
            "sessions",
            "import",
            path(&file),
            "--as",
            &id,
            "--store",
            &db.spec,
        ];
        run_killed(&import, reached);
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
    assert!(shown.stdout.starts_with(b"{\"version\": 3,"));
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
    assert!(head.starts_with(b"{\"version\": 3,"), "{head:?}");
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

/// What calls show (images, sounds, binary resources) is kept once per
/// session however many records hold it: the same 64 KiB image shown by
/// five calls (two of them keyed) is one blob, the records hold only its
/// digest, and every read gives the whole image back: a resume, a keyed
/// retry, an export; an import into another store keeps it once again.
async fn shown_bytes_are_kept_once_per_session_and_exported_whole(backend: Backend) {
    use airlock::spec::Shown;
    use airlock::tools::ToolCall;
    let db = TestStore::new(backend, "blobs").await;
    let store = db.open().await;
    let mut host = crate::support::builder().build().unwrap();
    host.load(guest("everything")).await.unwrap();
    let mut session = open(&store, options(Some("ann"), "pics")).await;
    let call = |id: &str, kib: u32| ToolCall {
        id: id.to_owned(),
        name: "large_image".into(),
        arguments: json!({"kib": kib}).to_string(),
        retry: 0,
    };
    let cancel = CancelToken::new();
    let mut shown = Vec::new();
    for id in ["a", "b", "c"] {
        let done = session
            .call(&host, &call(id, 64), &cancel, None)
            .await
            .unwrap();
        shown.push(done.output.shown);
    }
    for id in ["k1", "k2"] {
        let done = session
            .call_once(&host, &call(id, 64), &cancel, None)
            .await
            .unwrap();
        shown.push(done.output.shown);
    }
    // And one other image.
    session
        .call(&host, &call("d", 8), &cancel, None)
        .await
        .unwrap();
    let image = shown[0].clone();
    assert!(shown.iter().all(|s| *s == image));
    let Shown::Image { data, .. } = &image[0] else {
        panic!("{image:?}")
    };
    assert!(data.len() > 64 * 1024, "{}", data.len());
    session.close().await.unwrap();

    let (count, bytes, records) = blob_counts(&db).await;
    assert_eq!(count, 2, "the 64 KiB image and the 8 KiB one");
    assert_eq!(
        bytes as usize,
        data.len() + base64_len(8 * 1024),
        "each image once"
    );
    assert!(records < 16 * 1024, "records hold digests only: {records}");

    // Resumed, the session's items hold the whole image.
    let again = open(&store, options(Some("ann"), "pics")).await;
    let outputs: Vec<&Vec<Shown>> = again
        .transcript()
        .items
        .iter()
        .filter_map(|e| match &e.item {
            Item::FunctionCallOutput { guest, .. } => Some(&guest.shown),
            _ => None,
        })
        .collect();
    assert_eq!(outputs.len(), 6);
    assert!(outputs[..5].iter().all(|s| **s == image));
    again.close().await.unwrap();
    // A keyed retry gets the committed image back without running.
    let mut again = open(&store, options(Some("ann"), "pics")).await;
    let retried = again
        .call_once(&host, &call("k1", 64), &cancel, None)
        .await
        .unwrap();
    assert_eq!(retried.output.shown, image);
    again.close().await.unwrap();

    // The export carries the bytes themselves; an import keeps them once.
    let stored = store.read(Some("ann"), "pics").await.unwrap();
    let export = SessionExport::new(&stored, &ContextRules::default()).unwrap();
    let text = serde_json::to_string(&export).unwrap();
    assert!(!text.contains("sha256:"));
    assert!(text.matches(data.as_str()).count() >= 5);
    let other_db = TestStore::new(backend, "blobs-import").await;
    let other = other_db.open().await;
    import_into(&other, &export_of(&text).unwrap())
        .await
        .unwrap();
    assert_eq!(other.read(Some("ann"), "pics").await.unwrap(), stored);
    let (count, bytes, _) = blob_counts(&other_db).await;
    assert_eq!(
        (count, bytes as usize),
        (2, data.len() + base64_len(8 * 1024))
    );
    // A file whose shown bytes read as a blob's name (not base64) would
    // name a blob on the way back: refused, nothing inserted.
    let forged = text.replace(data.as_str(), &format!("sha256:{}", "0".repeat(64)));
    let refused = match export_of(&forged) {
        Ok(mut parsed) => {
            parsed.session_id = "forged".into();
            import_into(&other, &parsed).await.unwrap_err().to_string()
        }
        Err(e) => e.to_string(),
    };
    assert!(refused.contains("not base64"), "{refused}");
    assert!(matches!(
        other.read(Some("ann"), "forged").await,
        Err(StoreError::NotFound { .. })
    ));

    // An agent run whose calls show the same image: its snapshots (every
    // 4 records here) name it too, and a resume from one gives the model
    // the whole image back.
    let script = db.dir.path().join("shows.json");
    let show = json!({"name": "large_image", "arguments": {"kib": 64}});
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [show, show]},
            {"tool_calls": [show, show]},
            {"text": "shown"}
        ]})
        .to_string(),
    )
    .unwrap();
    let model = Arc::new(ScriptModel::load(&script).unwrap());
    let mut opening = options(Some("ann"), "run");
    opening.snapshot_every = 4;
    let mut run = Session::open(Arc::clone(&store), opening, &ContextRules::default())
        .await
        .unwrap();
    let agent = Agent::new(Arc::new(host), model);
    agent.run_session(&mut run, "Show it.").await.unwrap();
    run.close().await.unwrap();
    let (count, _, _) = blob_counts(&db).await;
    assert_eq!(count, 3, "the run's session keeps its image once");
    let snapshot = db
        .scalar("SELECT CAST(max(length(body)) AS BIGINT) FROM {p}snapshots")
        .await;
    assert!(
        snapshot < 16 * 1024,
        "the snapshot names the image: {snapshot}"
    );
    let resumed = open(&store, options(Some("ann"), "run")).await;
    let told: Vec<&Vec<Shown>> = resumed
        .transcript()
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool { shown, .. } => Some(shown),
            _ => None,
        })
        .collect();
    assert_eq!(told.len(), 4);
    assert!(told.iter().all(|s| **s == image));
    resumed.close().await.unwrap();

    // A session removed takes its blobs with it.
    store.remove(Some("ann"), "pics", u64::MAX).await.unwrap();
    assert_eq!(blob_counts(&db).await.0, 1, "the run's");
}

/// How many blobs `db` keeps, their bytes, and the bytes of its records.
async fn blob_counts(db: &TestStore) -> (i64, i64, i64) {
    let count = db.scalar("SELECT count(*) FROM {p}blobs").await;
    let bytes = db
        .scalar("SELECT CAST(coalesce(sum(length(data)), 0) AS BIGINT) FROM {p}blobs")
        .await;
    let records = db
        .scalar("SELECT CAST(coalesce(sum(length(entry)), 0) AS BIGINT) FROM {p}records")
        .await;
    (count, bytes, records)
}

/// The length of `bytes` bytes in base64 (padded).
fn base64_len(bytes: usize) -> usize {
    bytes.div_ceil(3) * 4
}

crate::on_both_stores!(
    shown_bytes_are_kept_once_per_session_and_exported_whole,
    the_streamed_export_is_the_whole_sessions_export,
    every_field_round_trips_through_the_store_and_an_export,
    unknown_missing_and_malformed_versions_import_nothing,
    an_import_that_fails_midway_inserts_nothing,
    an_import_drops_the_keys_its_policy_hides,
);
