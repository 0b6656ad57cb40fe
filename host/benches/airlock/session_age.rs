//! §14 Sessions that stay fast: what one request naming a session costs
//! when the session is young beside when it holds 100,000 records.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use crate::harness::{Bench, airlock_mcp, batch, component, median, paired, root, serve_http, us};
use airlock::context::ContextRules;
use airlock::journal::{CallStatus, Entry, Event, Item, Record, now_ms};
use airlock::session::{DEFAULT_SNAPSHOT_EVERY, SessionHeader, SessionStore};
use airlock::{Host, Session, SessionOptions, SqliteStore, ToolCall};

/// How many records the old session holds.
const OLD_RECORDS: u64 = 100_000;

/// The snapshot intervals the sweep measures.
const SWEEP: [u64; 5] = [16, 32, 64, 128, 256];

/// Bytes of deps in the session whose snapshots the sweep's write side
/// pays for.
const SWEEP_DEPS_BYTES: usize = 64 * 1024;

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
        Entry::item(Event::numbered(items, "run_bench", at_ms, item))
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
            by: None,
        }));
        entries.push(item(Item::FunctionCallOutput {
            call_id: id.clone(),
            name: "increment".into(),
            status: CallStatus::Completed,
            output: format!(r#"{{"counter":"x","value":{calls}}}"#),
            error_kind: None,
            duration_us: 20,
            arguments: None,
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
        .insert(&header, Box::new(journal(records)), now_ms())
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
        .call_once(host, &call, &airlock::sandbox::CancelToken::new(), None)
        .await
        .unwrap();
    session.close().await.unwrap();
}

/// One MCP `tools/call increment` naming `session` and a call key.
async fn mcp_request(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    session: &str,
    key: usize,
) {
    use rmcp::model::CallToolRequestParams;
    let mut params = CallToolRequestParams::new("increment").with_arguments(
        serde_json::json!({"name": "y"})
            .as_object()
            .unwrap()
            .clone(),
    );
    let meta =
        serde_json::json!({"airlock/session": session, "airlock/call": format!("mcp_{key}")});
    params.meta = Some(meta.as_object().unwrap().clone().into());
    let result = client.call_tool(params).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
}

/// What writing snapshots costs a session's calls: the time per direct
/// `Session::call` (one commit each) on a session with
/// [`SWEEP_DEPS_BYTES`] of deps, snapshotted every `every` records.
async fn calls_with_snapshots(
    host: &Host,
    store: &Arc<dyn SessionStore>,
    id: &str,
    every: u64,
    calls: usize,
) -> std::time::Duration {
    let mut deps = serde_json::Map::new();
    deps.insert(
        "notes".into(),
        serde_json::Value::String("n".repeat(SWEEP_DEPS_BYTES)),
    );
    let mut session = Session::open(
        Arc::clone(store),
        SessionOptions {
            session_id: Some(id.into()),
            snapshot_every: every,
            deps: Some(deps),
            ..SessionOptions::default()
        },
        &ContextRules::default(),
    )
    .await
    .unwrap();
    let call = ToolCall::new("increment", r#"{"name":"z"}"#);
    let cancel = airlock::sandbox::CancelToken::new();
    let started = Instant::now();
    for _ in 0..calls {
        session.call(host, &call, &cancel, None).await.unwrap();
    }
    let took = started.elapsed() / calls as u32;
    session.close().await.unwrap();
    took
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
    // The same requests over MCP: `airlock mcp --transport http` on the
    // same store, each request naming its session in `_meta`.
    let stateful = component("wasm32-wasip2/release/stateful.wasm");
    let (mut server, url) =
        serve_http(airlock_mcp(b, "http", &stateful, dir.path().join("age.db")));
    let client = {
        use rmcp::ServiceExt;
        ().serve(rmcp::transport::StreamableHttpClientTransport::from_uri(
            url,
        ))
        .await
        .unwrap()
    };
    for n in 0..(pairs + 1) * batch_size {
        insert(&store, &format!("mcp_young_{n}"), 10).await;
    }
    let (mut old_key, mut young_n) = (0, 0);
    let over_mcp = b
        .paired(
            "MCP session request: old / young",
            pairs,
            async || {
                batch(batch_size, async || {
                    mcp_request(&client, "old", old_key).await;
                    old_key += 1;
                })
                .await
            },
            async || {
                batch(batch_size, async || {
                    mcp_request(&client, &format!("mcp_young_{young_n}"), 0).await;
                    young_n += 1;
                })
                .await
            },
        )
        .await;
    client.cancel().await.unwrap();
    server.kill().unwrap();
    let _ = server.wait();
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

    // The sweep behind the default interval: what a request on the old
    // session costs beside a young one with a snapshot every N records
    // (its tail is at most N records), and what writing those snapshots
    // costs a session's calls beside never writing one.
    let sweep_pairs = if b.quick { 3 } else { 15 };
    let sweep_calls = if b.quick { 12 } else { 48 };
    let mut sweep = Vec::new();
    for every in SWEEP {
        for n in 0..(sweep_pairs + 1) * batch_size {
            insert(&store, &format!("sweep_{every}_{n}"), 10).await;
        }
        let mut young_n = 0;
        let read = paired(
            sweep_pairs,
            async || {
                batch(batch_size, async || {
                    request(&host, &store, "old", every, old_n).await;
                    old_n += 1;
                })
                .await
            },
            async || {
                batch(batch_size, async || {
                    let id = format!("sweep_{every}_{young_n}");
                    request(&host, &store, &id, every, 0).await;
                    young_n += 1;
                })
                .await
            },
        )
        .await;
        let (mut with, mut without) = (0, 0);
        let write = paired(
            sweep_pairs,
            async || {
                with += 1;
                let id = format!("with_{every}_{with}");
                calls_with_snapshots(&host, &store, &id, every, sweep_calls).await
            },
            async || {
                without += 1;
                let id = format!("without_{every}_{without}");
                calls_with_snapshots(&host, &store, &id, 0, sweep_calls).await
            },
        )
        .await;
        sweep.push((every, read, write));
    }

    writeln!(
        out,
        "| pair | old (~{OLD_RECORDS} records) | young (10 records) | old / young | target ≤ 1.2× |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|---|").unwrap();
    for (name, measured) in [
        (
            "`Session` in the library: lease, load, one keyed call, release",
            &measured,
        ),
        (
            "MCP over streamable HTTP: one `tools/call` naming its session and a call key",
            &over_mcp,
        ),
    ] {
        writeln!(out, "{} {} |", measured.row(name), measured.at_most(1.2)).unwrap();
    }
    writeln!(
        out,
        "\nWithout snapshots (the old session opened with `snapshot_every = 0`, so each request folds all \
         {OLD_RECORDS} records): {} per request.\n",
        us(whole)
    )
    .unwrap();
    writeln!(
        out,
        "**The interval.** Each N below, paired: the library request on the old session beside a young \
         one with a snapshot every N records ({sweep_pairs} pairs), and {sweep_calls} direct calls on a \
         session holding {} KiB of deps with a snapshot every N records beside the same calls with none \
         (what writing snapshots costs). The default is N = {DEFAULT_SNAPSHOT_EVERY}.\n",
        SWEEP_DEPS_BYTES / 1024
    )
    .unwrap();
    writeln!(
        out,
        "| N | old request | old / young | call with snapshots | with / without snapshots |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|---|").unwrap();
    for (every, read, write) in &sweep {
        writeln!(
            out,
            "| {every} | {} | {} | {} | {} |",
            us(read.a()),
            read.cell(),
            us(write.a()),
            write.cell()
        )
        .unwrap();
    }
    writeln!(out).unwrap();
}
