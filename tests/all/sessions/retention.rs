//! Sessions: pruning by age and by kind, never a leased session.

use super::*;

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

    // A SQLite store that does not exist yet has nothing to prune, and
    // pruning it makes none.
    let missing = db.dir.path().join("none.db");
    let missing = missing.to_str().unwrap();
    let out = sessions(
        missing,
        &["prune", "--older-than", "30d", "--all-users", "--json"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["pruned"], json!([]));
    assert_eq!(stdout_json(&out)["store"], format!("sqlite:{missing}"));
    assert!(!std::path::Path::new(missing).exists());

    // A policy's [sessions] ttl is what a prune without --older-than uses.
    let policy = db.dir.path().join("airlock.toml");
    std::fs::write(
        &policy,
        "[sessions]\nttl = \"1h\"\nephemeral_ttl = \"1m\"\n",
    )
    .unwrap();
    // It would remove every session left: --dry-run lists them and
    // removes none; without --yes (and no terminal) it is refused.
    let prune = |extra: &[&str]| {
        let mut args = vec!["prune", "--config", policy.to_str().unwrap(), "--json"];
        args.extend_from_slice(extra);
        sessions(&db.spec, &args)
    };
    let out = prune(&["--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout_json(&out)["dry_run"], true);
    assert_eq!(stdout_json(&out)["pruned"].as_array().unwrap().len(), 2);
    let out = prune(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stdout_json(&out)["error"]["kind"], "confirm");
    assert_eq!(
        session_ids(&store).await.len(),
        2,
        "a refused prune removed sessions"
    );
    let out = prune(&["--yes"]);
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

crate::on_both_stores!(pruning_removes_old_and_ephemeral_sessions_never_a_leased_one,);
