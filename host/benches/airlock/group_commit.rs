//! §15 Group commit: committed calls a second on one host as concurrent
//! sessions grow.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use crate::harness::{Bench, component, root};
use crate::scale_out::fresh_postgres_database;
use airlock::context::ContextRules;
use airlock::sandbox::CancelToken;
use airlock::session::PostgresStore;
use airlock::session::SessionStore;
use airlock::{Host, Session, SessionOptions, SqliteStore, ToolCall};

/// `sessions` sessions at once, each making `calls` direct `increment`
/// calls one after another; committed calls a second (each call
/// acknowledged only once durable).
async fn calls_per_second(
    host: &Arc<Host>,
    store: &Arc<dyn SessionStore>,
    sessions: usize,
    calls: usize,
) -> f64 {
    let mut opened = Vec::with_capacity(sessions);
    for s in 0..sessions {
        let session = Session::open(
            Arc::clone(store),
            SessionOptions {
                session_id: Some(format!("g{sessions}-{s}")),
                ..SessionOptions::default()
            },
            &ContextRules::default(),
        )
        .await
        .unwrap();
        opened.push(session);
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for mut session in opened {
        let host = Arc::clone(host);
        tasks.spawn(async move {
            for _ in 0..calls {
                let call = ToolCall::new("increment", r#"{"name":"n"}"#);
                session
                    .call(&host, &call, &CancelToken::new())
                    .await
                    .unwrap();
            }
            session
        });
    }
    let mut done = Vec::with_capacity(sessions);
    while let Some(session) = tasks.join_next().await {
        done.push(session.unwrap());
    }
    let took = started.elapsed();
    for session in done {
        session.close().await.unwrap();
    }
    (sessions * calls) as f64 / took.as_secs_f64()
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
         transaction and its fsync (at most 256 a batch); on Postgres (`make bench`'s throwaway server, \
         fsync on) each append is one statement on a pooled connection, and the server's own WAL \
         flushing groups what arrives together.\n"
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
            let rate = calls_per_second(&host, store, sessions, calls).await;
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
}
