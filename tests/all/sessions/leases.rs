//! Sessions: one run at a time: leases, fencing, concurrent opens and appends, owners kept apart.

use super::*;

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
            None,
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
        .append(airlock::session::Append {
            lease: &first.lease,
            records: &[record(1)],
            snapshot: None,
            now_ms: 2_000,
            flush: airlock::journal::Flush::Now,
        })
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
        .append(airlock::session::Append {
            lease: &first.lease,
            records: &[record(2)],
            snapshot: None,
            now_ms: 32_001,
            flush: airlock::journal::Flush::Now,
        })
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
        .append(airlock::session::Append {
            lease: &second.lease,
            records: &[record(2)],
            snapshot: None,
            now_ms: 32_002,
            flush: airlock::journal::Flush::Now,
        })
        .await
        .unwrap();
    let stored = host_a.read(Some("u"), "far").await.unwrap();
    assert_eq!(stored.records, vec![record(1), record(2)]);
    assert_eq!(stored.updated_at_ms, 32_002);
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
                    broken = Some(
                        store
                            .append(airlock::session::Append {
                                lease: &lease,
                                records: &twice,
                                snapshot: None,
                                now_ms: now,
                                flush: airlock::journal::Flush::Now,
                            })
                            .await,
                    );
                }
                let record = note(seq, &format!("b{s} #{seq}"));
                results.push(
                    store
                        .append(airlock::session::Append {
                            lease: &lease,
                            records: &[record],
                            snapshot: None,
                            now_ms: now,
                            flush: airlock::journal::Flush::Now,
                        })
                        .await,
                );
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

/// A lease longer than the store can say (`Duration::MAX`, or
/// `AIRLOCK_LEASE_TTL_MS=18446744073709551615`) opens, commits and is
/// given back: it ends when the store can still say, in some 292 million
/// years. It failed the open with "out of range integral type conversion
/// attempted".
async fn a_lease_longer_than_the_store_can_say_still_opens(backend: Backend) {
    let db = TestStore::new(backend, "long").await;
    let store = db.open().await;
    let mut forever = options(None, "forever");
    forever.lease_ttl = std::time::Duration::MAX;
    forever.deps = Some(json!({"n": 1}).as_object().unwrap().clone());
    stored(&store, forever).await;
    let again = open(&store, options(None, "forever")).await;
    assert_eq!(
        Value::Object(again.context().deps().clone()),
        json!({"n": 1})
    );
    again.close().await.unwrap();

    let out = crate::support::airlock_with_env(
        &[
            "call",
            guest("stateful").to_str().unwrap(),
            "increment",
            r#"{"name":"n"}"#,
            "--session",
            "by-env",
            "--store",
            &db.spec,
        ],
        &[("AIRLOCK_LEASE_TTL_MS", "18446744073709551615")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

crate::on_both_stores!(
    a_lease_longer_than_the_store_can_say_still_opens,
    concurrent_appends_commit_together_and_a_fenced_one_fails_alone,
    a_remote_holders_lease_blocks_until_it_expires,
    users_are_a_hard_partition,
    of_two_concurrent_opens_exactly_one_wins,
    a_lost_lease_commits_nothing_more,
    many_sessions_from_several_processes_stay_intact,
    a_session_removed_and_made_again_is_written_as_the_new_one,
);
