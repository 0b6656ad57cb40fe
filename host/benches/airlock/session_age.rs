//! §14 Sessions that stay fast: what one request naming a session costs
//! when the session is young beside when it holds 100,000 records.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::harness::{Bench, batch, component, median, root, us};
use airlock::context::ContextRules;
use airlock::journal::{CallStatus, Entry, Event, Item, Record, now_ms};
use airlock::session::{DEFAULT_SNAPSHOT_EVERY, SessionHeader, SessionStore};
use airlock::{Host, Session, SessionOptions, SqliteStore, ToolCall};

/// How many records the old session holds.
const OLD_RECORDS: u64 = 100_000;

/// A session's journal of `records` records: starting deps, then
/// increments of `x` as a session's direct calls journal them (intent,
/// output, ops).
fn journal(records: u64) -> Vec<Record> {
    let at_ms = now_ms();
    let mut entries = vec![Entry::Deps {
        deps: serde_json::Map::new(),
    }];
    let mut calls = 0u64;
    let mut items = 0usize;
    let mut item = |item: Item| {
        items += 1;
        Entry::Item {
            event: Event::numbered(items, "run_bench", at_ms, item),
        }
    };
    while (entries.len() as u64) < records {
        calls += 1;
        let id = format!("old_{calls}");
        entries.push(item(Item::FunctionCall {
            call: ToolCall {
                id: id.clone(),
                ..ToolCall::new("increment", r#"{"name":"x"}"#)
            },
            iteration: 0,
        }));
        entries.push(item(Item::FunctionCallOutput {
            call_id: id.clone(),
            name: "increment".into(),
            status: CallStatus::Completed,
            output: format!(r#"{{"counter":"x","value":{calls}}}"#),
            error_kind: None,
            duration_us: 20,
            guest: Default::default(),
        }));
        entries.push(item(Item::ContextUpdate {
            call_id: id,
            ops: vec![airlock::context::ContextOp::Set {
                key: "counters".into(),
                value: serde_json::json!({"x": calls}),
            }],
        }));
    }
    entries.truncate(records as usize);
    entries
        .into_iter()
        .zip(1..)
        .map(|(entry, seq)| Record { seq, at_ms, entry })
        .collect()
}

async fn insert(store: &Arc<dyn SessionStore>, id: &str, records: u64) {
    let header = SessionHeader {
        session_id: id.into(),
        user_id: None,
        created_at_ms: now_ms(),
        metadata: Default::default(),
        ephemeral: false,
    };
    store
        .insert(&header, &journal(records), now_ms())
        .await
        .unwrap();
}

/// What an MCP request naming its session does: lease and load the
/// session, one keyed call, release.
async fn request(host: &Host, store: &Arc<dyn SessionStore>, id: &str, every: u64, n: usize) {
    let mut session = Session::open(
        Arc::clone(store),
        SessionOptions {
            session_id: Some(id.into()),
            snapshot_every: every,
            ..SessionOptions::default()
        },
        &ContextRules::default(),
    )
    .await
    .unwrap();
    let call = ToolCall {
        id: format!("req_{n}"),
        ..ToolCall::new("increment", r#"{"name":"y"}"#)
    };
    session
        .call_once(host, &call, &airlock::sandbox::CancelToken::new())
        .await
        .unwrap();
    session.close().await.unwrap();
}

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(out, "## 14. Sessions that stay fast: young and old\n").unwrap();
    writeln!(
        out,
        "One request naming a session, as `airlock mcp` serves it for a client that names its session \
         (and as `airlock call --session` does): lease and load the session, one keyed `increment` \
         (intent, then output and ops: two commits), release; SQLite, `synchronous = FULL`. **Old**: a \
         session of about {OLD_RECORDS} records (a third of them earlier calls), snapshotted every \
         {DEFAULT_SNAPSHOT_EVERY} records (the default), so a request reads the newest snapshot and at \
         most {DEFAULT_SNAPSHOT_EVERY} records after it; **young**: sessions of 10 records, a fresh one \
         per request.\n"
    )
    .unwrap();
    let host = b
        .host(&[component("wasm32-wasip2/release/stateful.wasm")])
        .await;
    let dir = tempfile::tempdir_in(root().join("target")).unwrap();
    let store: Arc<dyn SessionStore> =
        Arc::new(SqliteStore::open(dir.path().join("age.db")).unwrap());
    // Two records short of a multiple of the snapshot interval: the first
    // request's commits cross it and write the old session's snapshot.
    let crossing = OLD_RECORDS / DEFAULT_SNAPSHOT_EVERY * DEFAULT_SNAPSHOT_EVERY;
    insert(&store, "old", crossing - 2).await;
    request(&host, &store, "old", DEFAULT_SNAPSHOT_EVERY, 0).await;

    let pairs = if b.quick { 5 } else { 45 };
    let batch_size = if b.quick { 2 } else { 5 };
    for n in 0..pairs * batch_size {
        insert(&store, &format!("young_{n}"), 10).await;
    }
    let (mut old_n, mut young_n) = (1, 0);
    let measured = b
        .paired(
            "session request: old / young",
            pairs,
            async || {
                batch(batch_size, async || {
                    request(&host, &store, "old", DEFAULT_SNAPSHOT_EVERY, old_n).await;
                    old_n += 1;
                })
                .await
            },
            async || {
                batch(batch_size, async || {
                    let id = format!("young_{young_n}");
                    request(&host, &store, &id, DEFAULT_SNAPSHOT_EVERY, 0).await;
                    young_n += 1;
                })
                .await
            },
        )
        .await;
    if !b.reporting() {
        return;
    }
    // The same old session without snapshots: every request folds all of
    // its records (what every request did before snapshots).
    insert(&store, "unsnapshotted", OLD_RECORDS).await;
    let mut n = 0;
    let whole = median(if b.quick { 2 } else { 5 }, async || {
        n += 1;
        request(&host, &store, "unsnapshotted", 0, n).await;
    })
    .await;
    writeln!(
        out,
        "| pair | old (~{OLD_RECORDS} records) | young (10 records) | old / young | target ≤ 1.2× |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|---|").unwrap();
    writeln!(
        out,
        "{} {} |\n",
        measured.row("lease, load, one keyed call, release"),
        measured.at_most(1.2)
    )
    .unwrap();
    writeln!(
        out,
        "Without snapshots (the old session opened with `snapshot_every = 0`, so each request folds all \
         {OLD_RECORDS} records): {} per request.\n",
        us(whole)
    )
    .unwrap();
}
