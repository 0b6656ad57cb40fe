//! Sessions: the stores themselves: migrations, files that are not stores, lock waits.

use super::*;

/// A store written by the Airlock before its journal kept one record per
/// fact (`tests/data/format1`: schema 3 and format-1 records, made by that
/// version's `airlock run --session demo` and `airlock call --session
/// demo`, with that version's export of the session beside it) opens and
/// migrates (schema 5, its records as they were), and exports the same
/// session: the same journal, messages, items, deps, usage and iteration.
/// A run then goes on after it in format 2, and the model's history holds
/// both.
#[test]
fn a_store_written_before_format_2_migrates_and_exports_the_same() {
    use std::os::unix::fs::PermissionsExt;
    let fixture = root().join("tests/data/format1");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("sessions.db");
    std::fs::copy(fixture.join("sessions.db"), &db).unwrap();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600)).unwrap();
    let store = path(&db);
    let export = || {
        let out = sessions(store, &["export", "demo"]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout_json(&out)
    };
    let text = std::fs::read_to_string(fixture.join("demo.export.json")).unwrap();
    let before: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(before["version"], 2);

    let after = export();
    assert_eq!(after["version"], 3);
    for field in [
        "session_id",
        "user_id",
        "created_at_ms",
        "updated_at_ms",
        "metadata",
        "journal",
        "messages",
        "items",
        "deps",
        "usage",
        "iteration",
    ] {
        assert_eq!(after[field], before[field], "{field}");
    }
    let schema: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap();
    assert_eq!(schema, 5);

    // A run after it: format-2 records follow the format-1 ones, and the
    // messages the model is sent are the old ones and the new run's.
    let out = run_vowels(store, "demo", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let again = export();
    let (old, all) = (
        before["journal"].as_array().unwrap(),
        again["journal"].as_array().unwrap(),
    );
    assert_eq!(&all[..old.len()], &old[..]);
    let entries: Vec<&str> = all[old.len()..]
        .iter()
        .map(|record| record["entry"].as_str().unwrap())
        .collect();
    assert!(entries.contains(&"event"), "{entries:?}");
    assert!(
        entries
            .iter()
            .all(|e| ["event", "usage", "deps"].contains(e)),
        "new records say each fact once: {entries:?}"
    );
    let (said, says) = (
        before["messages"].as_array().unwrap(),
        again["messages"].as_array().unwrap(),
    );
    assert_eq!(&says[..said.len()], &said[..]);
    assert_eq!(
        says[said.len()],
        json!({"role": "user", "content": "Count the vowels of 'elephant'."})
    );
    assert_eq!(
        says.len(),
        2 * said.len(),
        "the same run again, told the same way"
    );
    assert_eq!(again["deps"]["counters"], json!({"direct": 1, "vowels": 6}));

    // The document imports elsewhere: its journal folds to what it says.
    let file = dir.path().join("demo.json");
    std::fs::write(&file, again.to_string()).unwrap();
    let other = dir.path().join("other.db");
    let out = sessions(path(&other), &["import", path(&file)]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A store written by an earlier schema (SQLite: 1, 2 and 3; Postgres: 1
/// and 2)
/// is migrated when opened: every session keeps its owner, journal and
/// deps (two users' sessions of the same id stay apart), the calls
/// already journaled are indexed, so a keyed retry of one is still found
/// once a snapshot hides it, and the migrated store takes new calls.
async fn an_earlier_schema_is_migrated_and_its_calls_indexed(backend: Backend) {
    let versions: &[u32] = match backend {
        Backend::Sqlite => &[1, 2, 3],
        Backend::Postgres => &[1, 2],
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

/// A task's mail (what hosts sharing a store tell each other about it)
/// changes only from what it is: a swap from anything else changes
/// nothing, so no host's change is lost to another's. It is kept only
/// for a session that exists, apart per owner, and goes with its session,
/// or with the lease it was posted under when another holder takes the
/// session from one that never released it.
async fn task_mail_changes_only_from_what_it_is_and_goes_with_its_session(backend: Backend) {
    use airlock::session::{CallKey, TaskMail};
    let db = TestStore::new(backend, "mail").await;
    let store = db.open().await;
    keyed_increments(&store, "s", 0..1, 4).await;
    let key = CallKey {
        owner: None,
        session_id: "s",
        call_id: "t1",
    };
    assert_eq!(store.task_mail(key).await.unwrap(), None);
    let asked = TaskMail {
        waiting: Some(r#"{"person-1":{}}"#.into()),
        ..TaskMail::default()
    };
    assert!(store.swap_task_mail(key, None, Some(&asked)).await.unwrap());
    assert!(
        !store.swap_task_mail(key, None, Some(&asked)).await.unwrap(),
        "already there"
    );
    let answered = TaskMail {
        answers: Some(r#"{"person-1":{"action":"decline"}}"#.into()),
        status: Some("2 of 3".into()),
        ..asked.clone()
    };
    assert!(
        !store
            .swap_task_mail(key, Some(&answered), None)
            .await
            .unwrap(),
        "not what it is"
    );
    assert_eq!(store.task_mail(key).await.unwrap(), Some(asked.clone()));
    assert!(
        store
            .swap_task_mail(key, Some(&asked), Some(&answered))
            .await
            .unwrap()
    );
    assert_eq!(store.task_mail(key).await.unwrap(), Some(answered.clone()));

    // Another owner's session of that id does not exist: no mail for it.
    let bob = CallKey {
        owner: Some("bob"),
        ..key
    };
    assert_eq!(store.task_mail(bob).await.unwrap(), None);
    assert!(!store.swap_task_mail(bob, None, Some(&asked)).await.unwrap());
    let elsewhere = CallKey {
        session_id: "nowhere",
        ..key
    };
    assert!(
        !store
            .swap_task_mail(elsewhere, None, Some(&asked))
            .await
            .unwrap()
    );

    assert!(
        store
            .swap_task_mail(key, Some(&answered), None)
            .await
            .unwrap()
    );
    assert_eq!(store.task_mail(key).await.unwrap(), None);

    // Mail is posted under a lease: released, it stays (its tasks end
    // after); taken from a holder that never released it (its lease
    // expired), it goes, those tasks running nowhere now.
    let lease = |holder, now_ms| airlock::session::LeaseRequest {
        user_id: None,
        session_id: "s",
        holder,
        ttl: std::time::Duration::from_secs(30),
        now_ms,
        create: None,
    };
    let (first, second) = (
        airlock::session::Holder::new(),
        airlock::session::Holder::new(),
    );
    let now = airlock::journal::now_ms();
    let held = store.lease(lease(&first, now)).await.unwrap().lease;
    assert!(store.swap_task_mail(key, None, Some(&asked)).await.unwrap());
    store.release(&held).await.unwrap();
    store.lease(lease(&second, now)).await.unwrap();
    assert_eq!(store.task_mail(key).await.unwrap(), Some(asked.clone()));
    let later = now + 60_000;
    store.lease(lease(&first, later)).await.unwrap();
    assert_eq!(store.task_mail(key).await.unwrap(), None);

    assert!(store.swap_task_mail(key, None, Some(&asked)).await.unwrap());
    store.remove(None, "s", later + 60_000).await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM {p}task_mail").await, 0);
}

/// A listing is most recently updated first, on the store (`list_recent`)
/// and in `airlock sessions list --limit N`, which shows N and says how
/// many more the user has (another user's never counted); `--limit 0`
/// is bad input.
async fn a_listing_shows_the_most_recent_and_says_how_many_more(backend: Backend) {
    use airlock::session::SessionHeader;
    let db = TestStore::new(backend, "listed").await;
    let store = db.open().await;
    let now = airlock::journal::now_ms();
    let record = airlock::journal::Record {
        seq: 1,
        at_ms: now,
        entry: airlock::journal::Entry::Deps {
            deps: serde_json::Map::new(),
        },
    };
    // Updated a minute apart, "s0" last; alice's is the most recent.
    let made: [(&str, Option<&str>, u64); 5] = [
        ("s2", None, 3),
        ("s0", None, 1),
        ("theirs", Some("alice"), 0),
        ("s3", None, 4),
        ("s1", None, 2),
    ];
    for (id, user, minutes_ago) in made {
        let header = SessionHeader {
            session_id: id.into(),
            user_id: user.map(str::to_owned),
            created_at_ms: now - 3_600_000,
            metadata: BTreeMap::new(),
            ephemeral: false,
        };
        let at = now - minutes_ago * 60_000;
        store
            .insert(&header, Box::new(vec![record.clone()]), at)
            .await
            .unwrap();
    }
    let ids = |listing: &airlock::session::Listing| -> Vec<String> {
        listing
            .sessions
            .iter()
            .map(|s| s.session_id.clone())
            .collect()
    };
    let two = store.list_recent(None, 2).await.unwrap();
    assert_eq!((ids(&two), two.total), (vec!["s0".into(), "s1".into()], 4));
    let all = store.list_recent(None, 100).await.unwrap();
    assert_eq!((ids(&all).len(), all.total), (4, 4));
    assert_eq!(all.sessions, store.list(None).await.unwrap());
    let four = store.list_recent(None, 4).await.unwrap();
    assert_eq!((ids(&four), four.total), (ids(&all), 4));
    let hers = store.list_recent(Some("alice"), 1).await.unwrap();
    assert_eq!((ids(&hers), hers.total), (vec!["theirs".into()], 1));

    let out = sessions(&db.spec, &["list", "--limit", "2", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let listed = stdout_json(&out);
    let shown: Vec<&str> = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert_eq!((shown, &listed["total"]), (vec!["s0", "s1"], &json!(4)));
    let out = sessions(&db.spec, &["list", "--limit", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    assert!(lines[1].starts_with("SESSION"), "{text}");
    let order: Vec<&str> = lines[2..5]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(order, ["s0", "s1", "s2"], "{text}");
    assert_eq!(
        lines[5],
        "… and 1 more (4 in all; a larger --limit shows them)"
    );
    // Without --limit, all four and no such line.
    let out = sessions(&db.spec, &["list"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 6, "{text}");
    assert!(!text.contains("more"), "{text}");

    let out = sessions(&db.spec, &["list", "--limit", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--limit"), "{}", stderr(&out));
}

crate::on_both_stores!(
    an_earlier_schema_is_migrated_and_its_calls_indexed,
    a_listing_shows_the_most_recent_and_says_how_many_more,
    task_mail_changes_only_from_what_it_is_and_goes_with_its_session,
);
