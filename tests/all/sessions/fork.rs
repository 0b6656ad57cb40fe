//! Sessions: forks. A fork's history is its session's up to a record or a
//! call; it resumes from there, and both go on independently; bad input
//! makes nothing; a fork killed at any point is all there or not at all.

use airlock::session::{ForkError, ForkPoint};
use airlock::tools::ToolCall;

use super::*;

/// The agent run of the vowels script on session `trip` of alice, then a
/// fork at the first `increment` call: the fork holds the history up to
/// that call, its deps as they were then, its calls still open answered
/// "interrupted"; then each session takes a call of its own and neither
/// sees the other's.
async fn a_fork_resumes_from_its_point_and_goes_its_own_way(backend: Backend) {
    let db = TestStore::new(backend, "fork").await;
    let store = db.open().await;
    let mut session = open(&store, options(Some("alice"), "trip")).await;
    let agent = Agent::new(Arc::clone(host().await), vowels());
    let answered = agent
        .run_session(&mut session, "Count the vowels of 'elephant'.")
        .await
        .unwrap();
    assert!(answered.answer.contains("3 vowels"));
    session.close().await.unwrap();
    let parent = store.read(Some("alice"), "trip").await.unwrap();

    // At the first increment's call: its output and ops are in, the
    // turn's two other calls are open.
    let first = parent
        .records
        .iter()
        .find_map(|r| match &r.entry.event()?.item {
            Item::FunctionCall { call, .. } if call.name == "increment" => Some(call.id.clone()),
            _ => None,
        })
        .unwrap();
    let rules = ContextRules::default();
    let at = ForkPoint::Call(first.clone());
    let held = Session::fork(
        Arc::clone(&store),
        Some("alice"),
        "trip",
        &at,
        "what-if",
        &rules,
    )
    .await
    .unwrap();
    let forked = store.read(Some("alice"), "what-if").await.unwrap();
    let head = usize::try_from(held).unwrap();
    assert_eq!(forked.records[..head], parent.records[..head]);
    assert_eq!(forked.header.metadata, parent.header.metadata);
    // What follows the fork point: an "interrupted" answer to each call
    // still open there, nothing else.
    let patched: Vec<(String, CallStatus)> = forked.records[head..]
        .iter()
        .filter_map(|r| match &r.entry.event()?.item {
            Item::FunctionCallOutput {
                call_id, status, ..
            } => Some((call_id.clone(), *status)),
            _ => None,
        })
        .collect();
    assert_eq!(patched.len(), forked.records.len() - head);
    assert_eq!(patched.len(), 2, "{patched:?}");
    assert!(patched.iter().all(|(_, s)| *s == CallStatus::Interrupted));
    let then = Folded::fold(&parent.records[..head]).unwrap();
    assert_eq!(then.deps["counters"]["vowels"], 1);

    // Each goes on from where it is.
    let increment = ToolCall {
        id: "more".into(),
        name: "increment".into(),
        arguments: json!({"name": "vowels"}).to_string(),
        retry: 0,
    };
    let mut fork = open(&store, options(Some("alice"), "what-if")).await;
    assert_eq!(fork.context().deps(), &then.deps);
    let done = fork
        .call(host().await, &increment, &CancelToken::new(), None)
        .await
        .unwrap();
    assert_eq!(done.result["value"], 2);
    fork.close().await.unwrap();
    let mut trip = open(&store, options(Some("alice"), "trip")).await;
    assert_eq!(trip.context().deps()["counters"]["vowels"], 3);
    let done = trip
        .call(host().await, &increment, &CancelToken::new(), None)
        .await
        .unwrap();
    assert_eq!(done.result["value"], 4);
    trip.close().await.unwrap();
    let fork = open(&store, options(Some("alice"), "what-if")).await;
    assert_eq!(fork.context().deps()["counters"]["vowels"], 2);
    fork.close().await.unwrap();

    // At a record: its deps as they were after it.
    let at = ForkPoint::Record(2);
    Session::fork(
        Arc::clone(&store),
        Some("alice"),
        "trip",
        &at,
        "early",
        &rules,
    )
    .await
    .unwrap();
    let early = store.read(Some("alice"), "early").await.unwrap();
    assert_eq!(early.records[..2], parent.records[..2]);

    // Bad input makes nothing.
    let listed = || async { store.list(Some("alice")).await.unwrap().len() };
    let before = listed().await;
    let fork_at = |from: &'static str, at: ForkPoint, to: &'static str| {
        let store = Arc::clone(&store);
        let rules = rules.clone();
        async move { Session::fork(store, Some("alice"), from, &at, to, &rules).await }
    };
    let nothing = fork_at("nothing", ForkPoint::Record(1), "x").await;
    assert!(
        matches!(nothing, Err(ForkError::Store(StoreError::NotFound { .. }))),
        "{nothing:?}"
    );
    for at in [0, 10_000] {
        let past = fork_at("trip", ForkPoint::Record(at), "x").await;
        assert!(matches!(past, Err(ForkError::NoRecord { .. })), "{past:?}");
    }
    let call = fork_at("trip", ForkPoint::Call("no-such-call".into()), "x").await;
    assert!(matches!(call, Err(ForkError::NoCall { .. })), "{call:?}");
    let taken = fork_at("trip", ForkPoint::Record(1), "early").await;
    assert!(
        matches!(
            taken,
            Err(ForkError::Store(StoreError::AlreadyExists { .. }))
        ),
        "{taken:?}"
    );
    let bad = fork_at("trip", ForkPoint::Record(1), "no/slash").await;
    assert!(matches!(bad, Err(ForkError::InvalidId(_))), "{bad:?}");
    assert_eq!(listed().await, before);
    // Another user's session is not there to fork.
    let theirs = Session::fork(
        Arc::clone(&store),
        Some("bob"),
        "trip",
        &ForkPoint::Record(1),
        "mine",
        &rules,
    )
    .await;
    assert!(
        matches!(theirs, Err(ForkError::Store(StoreError::NotFound { .. }))),
        "{theirs:?}"
    );
}

/// A fork holds the blobs its records name and none that only later
/// records show: a session that showed two images, forked between them,
/// keeps one; forked after both, two; each reads back whole.
async fn a_fork_holds_only_the_blobs_its_records_name(backend: Backend) {
    let db = TestStore::new(backend, "blobs").await;
    let store = db.open().await;
    let mut host = crate::support::builder().build().unwrap();
    host.load(crate::support::guest("everything"))
        .await
        .unwrap();
    let mut session = open(&store, options(None, "shown")).await;
    for (id, kib) in [("first", 2), ("second", 3)] {
        let call = ToolCall {
            id: id.into(),
            name: "large_image".into(),
            arguments: json!({"kib": kib}).to_string(),
            retry: 0,
        };
        let done = session
            .call(&host, &call, &CancelToken::new(), None)
            .await
            .unwrap();
        assert_eq!(done.result, json!({"kib": kib}));
    }
    session.close().await.unwrap();
    let blobs_of = |session: &str| {
        let sql = match backend {
            Backend::Sqlite => format!(
                "SELECT count(*) FROM blobs b JOIN sessions s ON s.sid = b.sid \
                 WHERE s.session_id = '{session}'"
            ),
            Backend::Postgres => {
                format!("SELECT count(*) FROM airlock_blobs WHERE session_id = '{session}'")
            }
        };
        let db = &db;
        async move { db.scalar(&sql).await }
    };
    assert_eq!(blobs_of("shown").await, 2);
    let rules = ContextRules::default();
    for (at, to, kept) in [
        (ForkPoint::Call("first".into()), "between", 1),
        (ForkPoint::Call("second".into()), "after", 2),
    ] {
        Session::fork(Arc::clone(&store), None, "shown", &at, to, &rules)
            .await
            .unwrap();
        assert_eq!(blobs_of(to).await, kept, "{to}");
        let forked = store.read(None, to).await.unwrap();
        let shown = forked
            .records
            .iter()
            .filter(|r| {
                matches!(
                    r.entry.event().map(|e| &e.item),
                    Some(Item::FunctionCallOutput {
                        status: CallStatus::Completed,
                        ..
                    })
                )
            })
            .count();
        assert_eq!(i64::try_from(shown).unwrap(), kept, "{to}");
    }
    assert_eq!(blobs_of("shown").await, 2);
}

/// `airlock sessions fork` as a user types it: at a call, under a new id;
/// bad input exits 2 naming what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fork_command_names_what_it_made_and_refuses_bad_input() {
    let db = TestStore::new(Backend::Sqlite, "cli").await;
    let out = run_vowels(&db.spec, "demo", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let store = db.open().await;
    let first = store
        .read(None, "demo")
        .await
        .unwrap()
        .records
        .iter()
        .find_map(|r| match &r.entry.event()?.item {
            Item::FunctionCall { call, .. } => Some(call.id.clone()),
            _ => None,
        })
        .unwrap();
    let out = sessions(&db.spec, &["fork", "demo", "--at", &first, "--as", "other"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.starts_with("forked demo at record "), "{said}");
    assert!(said.contains(" as other in sqlite:"), "{said}");
    let out = sessions(&db.spec, &["fork", "demo", "--at", "3", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let made = stdout_json(&out);
    assert_eq!(made["records"], 3);
    let id = made["session_id"].as_str().unwrap();
    assert!(id.starts_with("demo-fork-"), "{id}");
    let head = store.read(None, "demo").await.unwrap().records.len();
    let numbered = format!("its records are numbered 1 to {head}");
    for (args, needle) in [
        (
            vec!["fork", "nothing", "--at", "1"],
            "no session nothing".to_owned(),
        ),
        (
            vec!["fork", "demo", "--at", "999"],
            format!("session demo has no record 999: {numbered}"),
        ),
        (
            vec!["fork", "demo", "--at", "0"],
            format!("session demo has no record 0: {numbered}"),
        ),
        (
            vec!["fork", "demo", "--at", "nope"],
            "has no call nope".to_owned(),
        ),
        (
            vec!["fork", "demo", "--at", "1", "--as", "other"],
            "fork it under another id with --as".to_owned(),
        ),
    ] {
        let out = sessions(&db.spec, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(&needle), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(store.list(None).await.unwrap().len(), 3);
}

/// A fork of a 16 MiB session SIGKILLed at any point (at once, while its
/// transaction is written, after it) is there whole or not at all, and
/// the session forked is as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_killed_at_any_point_is_whole_or_absent() {
    let db = TestStore::new(Backend::Sqlite, "killed").await;
    filled_behind(&db, "big", 256, 64 << 10).await;
    let store = db.open().await;
    let original = store.read(None, "big").await.unwrap();
    drop(store);
    let wal = std::path::PathBuf::from(format!("{}-wal", db.spec));
    let wal_len = || std::fs::metadata(&wal).map_or(0, |m| m.len());
    type Reached<'a> = Box<dyn Fn() -> bool + 'a>;
    let points: Vec<(&str, Reached)> = vec![
        ("at once", Box::new(|| true)),
        ("writing", Box::new(|| wal_len() > (1 << 20))),
        ("half written", Box::new(|| wal_len() > (8 << 20))),
        ("at its end", Box::new(|| false)),
    ];
    let mut left_nothing = 0;
    for (round, (point, reached)) in points.iter().enumerate() {
        truncate_wal(&db.spec);
        let id = format!("copy-{round}");
        let fork = [
            "sessions", "fork", "big", "--at", "200", "--as", &id, "--store", &db.spec,
        ];
        run_killed(&fork, &|_| reached());
        let store = db.open().await;
        match store.read(None, &id).await {
            Err(StoreError::NotFound { .. }) => left_nothing += 1,
            Ok(copy) => assert_eq!(copy.records[..], original.records[..200], "{point}"),
            Err(e) => panic!("{point}: {e}"),
        }
        assert_eq!(store.read(None, "big").await.unwrap(), original, "{point}");
    }
    assert!(left_nothing >= 1, "no kill landed before the fork's commit");
    let conn = rusqlite::Connection::open(&db.spec).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

crate::on_both_stores!(
    a_fork_resumes_from_its_point_and_goes_its_own_way,
    a_fork_holds_only_the_blobs_its_records_name
);
