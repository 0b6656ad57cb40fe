//! §15 Group commit: committed calls a second on one host as concurrent
//! sessions grow.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{Bench, component, root};
use crate::scale_out::fresh_postgres_database;
use airlock::context::ContextRules;
use airlock::sandbox::CancelToken;
use airlock::session::MAX_BATCH;
use airlock::session::PostgresStore;
use airlock::session::SessionStore;
use airlock::{Host, Session, SessionOptions, SqliteStore, ToolCall};

/// How the calls are committed.
#[derive(Clone, Copy)]
enum Path {
    /// Today's: a pure unkeyed call is one commit, shared with what other
    /// sessions append meanwhile.
    Grouped,
    /// Before group commit: an intent commit before the call and an output
    /// commit after it (a keyed call keeps this shape), each its own
    /// transaction (a store with `with_max_batch(1)`).
    Old,
}

/// `sessions` new sessions at once, each making `calls` direct
/// `increment` calls one after another; the time per committed call (each
/// acknowledged only once durable). `tag` keeps the session ids apart.
async fn per_call(
    host: &Arc<Host>,
    store: &Arc<dyn SessionStore>,
    tag: &str,
    sessions: usize,
    calls: usize,
    path: Path,
) -> Duration {
    let opened = open_sessions(store, tag, sessions).await;
    let (done, took) = make_calls(host, opened, calls, path).await;
    for session in done {
        session.close().await.unwrap();
    }
    took / (sessions * calls) as u32
}

/// `sessions` new sessions, opened and stored at once, before any clock
/// starts (a new session is stored by its first commit): what is timed is
/// calls, not creating sessions.
async fn open_sessions(store: &Arc<dyn SessionStore>, tag: &str, sessions: usize) -> Vec<Session> {
    let mut opening = tokio::task::JoinSet::new();
    for s in 0..sessions {
        let store = Arc::clone(store);
        let id = format!("{tag}-{sessions}-{s}");
        opening.spawn(async move {
            let mut session = Session::open(
                store,
                SessionOptions {
                    session_id: Some(id),
                    ..SessionOptions::default()
                },
                &ContextRules::default(),
            )
            .await
            .unwrap();
            session
                .set_deps(serde_json::Map::new(), &ContextRules::default())
                .await
                .unwrap();
            session
        });
    }
    opening.join_all().await
}

/// Each of `opened` makes `calls` direct `increment` calls one after
/// another, all sessions at once; the sessions back, and how long the
/// calls took.
async fn make_calls(
    host: &Arc<Host>,
    opened: Vec<Session>,
    calls: usize,
    path: Path,
) -> (Vec<Session>, Duration) {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for mut session in opened {
        let host = Arc::clone(host);
        tasks.spawn(async move {
            for i in 0..calls {
                let cancel = CancelToken::new();
                match path {
                    Path::Grouped => {
                        let call = ToolCall::new("increment", r#"{"name":"n"}"#);
                        session.call(&host, &call, &cancel, None).await.unwrap();
                    }
                    Path::Old => {
                        let call = ToolCall {
                            id: format!("c{i}"),
                            ..ToolCall::new("increment", r#"{"name":"n"}"#)
                        };
                        session
                            .call_once(&host, &call, &cancel, None)
                            .await
                            .unwrap();
                    }
                }
            }
            session
        });
    }
    let done = tasks.join_all().await;
    (done, started.elapsed())
}

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(
        out,
        "## 15. Group commit: calls a second as sessions grow\n"
    )
    .unwrap();
    writeln!(
        out,
        "Committed `Session::call`s a second on one host (one process; SQLite: one file, WAL, \
         `synchronous = FULL`; each call is acknowledged only once it is on disk): N sessions at once, \
         each making its calls one after another. A pure call (no effectful grant) is one commit; on \
         SQLite the appends of concurrent sessions that wait while a commit is on disk share the next \
         transaction and its fsync (at most {MAX_BATCH} a batch); on Postgres (`make bench`'s throwaway server, \
         fsync on) they share the next statement and its transaction (two batches under way at once).\n"
    )
    .unwrap();
    let host = Arc::new(
        b.host(&[component("wasm32-wasip2/release/stateful.wasm")])
            .await,
    );
    let dir = tempfile::tempdir_in(root().join("target")).unwrap();
    let mut stores: Vec<(&str, Arc<dyn SessionStore>)> = vec![(
        "SQLite",
        Arc::new(SqliteStore::open(dir.path().join("group.db")).unwrap()),
    )];
    // Against the path before group commit, paired batch for batch: 16
    // sessions making two commits a call, each commit its own transaction
    // and fsync, beside 256 sessions on today's path.
    let old: Arc<dyn SessionStore> = Arc::new(
        SqliteStore::open(dir.path().join("old.db"))
            .unwrap()
            .with_max_batch(1),
    );
    let pairs = if b.quick { 3 } else { 11 };
    let (mut old_runs, mut new_runs) = (0, 0);
    let measured = b
        .paired(
            "group commit: 256 sessions today / 16 sessions before",
            pairs,
            async || {
                old_runs += 1;
                per_call(&host, &old, &format!("o{old_runs}"), 16, 32, Path::Old).await
            },
            async || {
                new_runs += 1;
                let tag = format!("n{new_runs}");
                per_call(&host, &stores[0].1, &tag, 256, 8, Path::Grouped).await
            },
        )
        .await;
    if !b.reporting() {
        return;
    }
    if let Some(server) = std::env::var("AIRLOCK_BENCH_POSTGRES")
        .ok()
        .filter(|s| !s.is_empty())
    {
        let url =
            fresh_postgres_database(server.trim_end_matches('/'), "airlock_bench_group").await;
        stores.push((
            "Postgres (one host, a pool of 16 connections)",
            Arc::new(PostgresStore::connect(&url).await.unwrap()),
        ));
    }
    let total = if b.quick { 512 } else { 4096 };
    writeln!(
        out,
        "| store | sessions at once | calls each | committed calls/s |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|").unwrap();
    let mut rates = Vec::new();
    for (name, store) in &stores {
        for sessions in [1usize, 16, 256] {
            let calls = (total / sessions).max(4);
            let rate = 1.0
                / per_call(&host, store, "g", sessions, calls, Path::Grouped)
                    .await
                    .as_secs_f64();
            rates.push(rate);
            writeln!(out, "| {name} | {sessions} | {calls} | {rate:.0} |").unwrap();
        }
    }
    writeln!(
        out,
        "\nOn SQLite, 256 sessions commit {:.1}× as many calls a second as 16 and {:.1}× as many as one.\n",
        rates[2] / rates[1],
        rates[2] / rates[0]
    )
    .unwrap();

    // The same sessions held open as they age, round after round (an MCP
    // server holds its session for its whole life).
    let (held, per_round) = (256usize, 16usize);
    let rounds = if b.quick { 4 } else { 30 };
    let mut opened = open_sessions(&stores[0].1, "aging", held).await;
    let mut aging = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let (back, took) = make_calls(&host, opened, per_round, Path::Grouped).await;
        opened = back;
        aging.push((held * per_round) as f64 / took.as_secs_f64());
    }
    for session in opened {
        session.close().await.unwrap();
    }
    let span = (rounds / 4).max(1);
    let mean = |rates: &[f64]| rates.iter().sum::<f64>() / rates.len() as f64;
    let (young, old) = (mean(&aging[..span]), mean(&aging[rounds - span..]));
    writeln!(
        out,
        "As they age (SQLite): {held} sessions held open, each making {per_round} calls a round, \
         {rounds} rounds. The first {span} rounds (up to {} calls a session): {young:.0} calls/s; the \
         last {span} (from {} calls a session on): {old:.0} calls/s, {:.2}× the first (1.00× is flat; \
         docs/performance.md, \"Not met yet\", says what is left).\n",
        span * per_round,
        (rounds - span) * per_round,
        old / young
    )
    .unwrap();

    let rate = |d: Duration| 1.0 / d.as_secs_f64();
    writeln!(
        out,
        "Beside the path before group commit ({pairs} pairs, SQLite, `synchronous = FULL`): 16 sessions \
         whose calls each commit an intent and then an output, every commit its own transaction and \
         fsync (`SqliteStore::with_max_batch(1)`, keyed calls), beside 256 sessions on today's path. \
         On SQLite a batch's cost is the pages it dirties: records are kept in the order they \
         were appended (schema 3), so a batch of 256 sessions fills the table's last pages instead of \
         a page per session, and the log is checkpointed every 16 MiB, so the pages every batch \
         rewrites are copied into the file once for many batches.\n"
    )
    .unwrap();
    writeln!(
        out,
        "| before: 16 sessions | today: 256 sessions | today / before | target ≥ 10× |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|").unwrap();
    writeln!(
        out,
        "| {:.0} calls/s | {:.0} calls/s | {} | {} |\n",
        rate(measured.a()),
        rate(measured.b()),
        measured.cell(),
        measured.at_least(10.0)
    )
    .unwrap();
}
