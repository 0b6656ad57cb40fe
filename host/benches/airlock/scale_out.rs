//! §9 Scale-out: committed calls per second with 1, 2 and 4 hosts on one
//! Postgres, next to SQLite on one host.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::{Bench, airlock_mcp, component, root, serve_http};
use serde_json::json;

/// A fresh database on the Postgres server `make bench` starts
/// (`AIRLOCK_BENCH_POSTGRES`, a URL without a database); its URL.
pub(crate) async fn fresh_postgres_database(server: &str, name: &str) -> String {
    let (client, connection) =
        tokio_postgres::connect(&format!("{server}/postgres"), tokio_postgres::NoTls)
            .await
            .unwrap();
    let driver = tokio::spawn(connection);
    for statement in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name}"),
    ] {
        client.batch_execute(&statement).await.unwrap();
    }
    drop(client);
    let _ = driver.await;
    format!("{server}/{name}")
}

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(out, "## 9. Scale-out: hosts on one store\n").unwrap();
    let Some(server) = std::env::var("AIRLOCK_BENCH_POSTGRES")
        .ok()
        .filter(|s| !s.is_empty())
    else {
        writeln!(
            out,
            "Not measured: no Postgres server (`make bench` starts one; `AIRLOCK_BENCH_POSTGRES`).\n"
        )
        .unwrap();
        return;
    };
    let server = server.trim_end_matches('/').to_owned();
    let dir = tempfile::tempdir_in(root().join("target")).unwrap();
    let stateful = component("wasm32-wasip2/release/stateful.wasm");
    let sessions = 16;
    let per_session = if b.quick { 3 } else { 10 };
    let mut sets = Vec::new();
    for (name, hosts, postgres) in [
        ("SQLite (WAL, `synchronous = FULL`), 1 host", 1, false),
        ("Postgres, 1 host", 1, true),
        ("Postgres, 2 hosts", 2, true),
        ("Postgres, 4 hosts", 4, true),
    ] {
        let store = if postgres {
            fresh_postgres_database(&server, &format!("airlock_bench_{hosts}")).await
        } else {
            dir.path().join("scale.db").display().to_string()
        };
        sets.push((
            name,
            HostSet::start(b, &stateful, &store, hosts, sessions).await,
        ));
    }
    let pairs = if b.quick { 3 } else { 21 };
    let mut rows = Vec::new();
    for (name, set) in &sets[1..] {
        let sqlite = &sets[0].1;
        // SQLite's time over this set's: this set's throughput over SQLite's.
        let measured = b
            .paired(
                &format!("throughput of {name} / SQLite, 1 host"),
                pairs,
                async || sqlite.batch(sessions, per_session).await,
                async || set.batch(sessions, per_session).await,
            )
            .await;
        rows.push((*name, measured));
    }
    for (_, set) in sets {
        set.stop().await;
    }
    writeln!(
        out,
        "Committed tool calls per second: {sessions} sessions at once, {per_session} `increment` calls each \
         a batch, one at a time per session, spread round-robin over `airlock mcp --transport http` hosts \
         (release build) that share the store; each call names its session and a call key in `_meta`, so \
         each is a lease, an intent commit, the call, an output commit and a release. All the host sets run \
         at once and each Postgres set's batches alternate with the SQLite host's ({pairs} pairs). The \
         hosts, the Postgres server (`pg_virtualenv`, fsync on) and the driver all share this machine's \
         cores, so more hosts add capacity only up to what the cores give; on separate machines each host \
         brings its own.\n"
    )
    .unwrap();
    writeln!(
        out,
        "| store and hosts | calls/s | SQLite, 1 host, beside it | throughput vs SQLite (paired) |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|").unwrap();
    let rate = |d: Duration| 1.0 / d.as_secs_f64();
    for (name, measured) in &rows {
        writeln!(
            out,
            "| {name} | {:.0} | {:.0} | {} |",
            rate(measured.b()),
            rate(measured.a()),
            measured.cell()
        )
        .unwrap();
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (one, four) = (rows[0].1.ratio(), rows[2].1.ratio());
    writeln!(
        out,
        "\nPostgres with 4 hosts runs at {:.2}× its 1-host rate on {cores} cores. {}\n",
        four / one,
        if four < one * 1.2 {
            "One host already keeps these cores busy, so more hosts here only share them: \
             read the rows as what sharing one store across hosts costs (the lease moves with \
             every call), not as scaling."
        } else {
            "The extra hosts turned spare cores into throughput."
        }
    )
    .unwrap();
}

/// `airlock mcp --transport http` hosts sharing one store, and a client of
/// each.
struct HostSet {
    children: Vec<std::process::Child>,
    clients: Vec<rmcp::service::RunningService<rmcp::RoleClient, ()>>,
    batches: std::sync::atomic::AtomicUsize,
}

impl HostSet {
    async fn start(b: &Bench, stateful: &Path, store: &str, hosts: usize, sessions: usize) -> Self {
        use rmcp::ServiceExt;
        let mut children = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..hosts {
            let (child, url) = serve_http(airlock_mcp(b, "http", stateful, store));
            children.push(child);
            clients.push(
                ().serve(rmcp::transport::StreamableHttpClientTransport::from_uri(
                    url,
                ))
                .await
                .unwrap(),
            );
        }
        let set = Self {
            children,
            clients,
            batches: std::sync::atomic::AtomicUsize::new(0),
        };
        // Warm-up: every host serves as many sessions at once as a batch
        // will, so its connections to the store are open.
        set.batch(sessions * hosts, 1).await;
        set
    }

    /// `sessions` new sessions at once, `per_session` keyed calls each,
    /// round-robin over the hosts; the time per call.
    async fn batch(&self, sessions: usize, per_session: usize) -> Duration {
        use rmcp::model::CallToolRequestParams;
        let batch = self
            .batches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let peers: Vec<_> = self.clients.iter().map(|c| c.peer().clone()).collect();
        let started = Instant::now();
        let mut drivers = tokio::task::JoinSet::new();
        for s in 0..sessions {
            let peers = peers.clone();
            drivers.spawn(async move {
                for i in 0..per_session {
                    let peer = &peers[(s + i) % peers.len()];
                    let mut params = CallToolRequestParams::new("increment")
                        .with_arguments(json!({"name": "n"}).as_object().unwrap().clone());
                    let meta = json!({"airlock/session": format!("b{batch}-s{s}"), "airlock/call": i.to_string()});
                    params.meta = Some(meta.as_object().unwrap().clone().into());
                    let result = peer.call_tool(params).await.unwrap();
                    assert_ne!(result.is_error, Some(true), "{result:?}");
                }
            });
        }
        while let Some(done) = drivers.join_next().await {
            done.unwrap();
        }
        started.elapsed() / (sessions * per_session) as u32
    }

    async fn stop(self) {
        for client in self.clients {
            client.cancel().await.unwrap();
        }
        for mut child in self.children {
            child.kill().unwrap();
            let _ = child.wait();
        }
    }
}
