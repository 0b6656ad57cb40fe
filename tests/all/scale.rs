//! Scale-out: several `airlock mcp --transport http` hosts share one real
//! store (a Postgres database, or one SQLite file that processes on one
//! machine share, its appends group-committed); a driver spreads the calls
//! of many sessions across them and one host is SIGKILLed mid-run, while
//! batches of its concurrent sessions' commits are being written: from
//! outside, at a third of the calls, or by the host itself at a batch of
//! several appends, once they are written into its transaction
//! and before it commits, or once it committed and before anyone is
//! answered. No acknowledged update is lost, none is applied twice, and
//! every session resumes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use airlock::context::ContextRules;
use airlock::journal::{CallStatus, Folded, Item};
use airlock::session::{Session, SessionOptions};
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::Peer;
use serde_json::{Value, json};

use crate::support::mcp::{HttpServer, http_client, policy, serve_http, serve_http_env};
use crate::support::stores::{Backend, TestStore};

const HOSTS: usize = 3;
const SESSIONS: usize = 16;
const INCREMENTS: u64 = 30;
/// The host that is killed, once a third of the increments are
/// acknowledged.
const VICTIM: usize = 0;

/// How one attempt at a call ended.
enum Attempt {
    /// The tool's result.
    Answered(CallToolResult),
    /// No answer: the connection failed or the answer never came.
    Lost(String),
}

/// One `tools/call` of `increment` on `session`, keyed so that a retry
/// runs at most once. Abandoned (as a load balancer whose health check
/// failed would) once `down` says the host is gone.
async fn attempt(
    client: &Peer<RoleClient>,
    session: &str,
    key: &str,
    mut down: tokio::sync::watch::Receiver<bool>,
) -> Attempt {
    let mut params = CallToolRequestParams::new("increment").with_arguments(
        json!({"name": "n"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    );
    let meta = json!({"airlock/session": session, "airlock/call": key});
    params.meta = meta.as_object().cloned().map(Into::into);
    let answer = tokio::time::timeout(Duration::from_secs(60), client.call_tool(params));
    tokio::select! {
        answer = answer => match answer {
            Ok(Ok(result)) => Attempt::Answered(result),
            Ok(Err(e)) => Attempt::Lost(e.to_string()),
            Err(_) => Attempt::Lost("no answer in 60 s".into()),
        },
        () = async {
            if down.wait_for(|down| *down).await.is_err() {
                std::future::pending::<()>().await;
            }
        } => Attempt::Lost("the host was killed".into()),
    }
}

fn text(result: &CallToolResult) -> String {
    serde_json::to_value(&result.content).unwrap_or(Value::Null)[0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// What the driver saw.
#[derive(Default)]
struct Tally {
    acknowledged: AtomicUsize,
    /// Attempts that got no answer, per host.
    lost: [AtomicUsize; HOSTS],
    /// Attempts answered "session is in use" (a dead host's lease).
    busy: AtomicUsize,
}

/// How the victim dies.
#[derive(Debug, Clone, Copy)]
enum Kill {
    /// SIGKILL from the driver once a third of the calls are acknowledged.
    FromOutside,
    /// SIGKILL from the host itself, at the point of a batch's commit that
    /// `AIRLOCK_TEST_KILL_AT_COMMIT` names.
    InCommit(&'static str),
}

async fn hosts_on_one_store_lose_no_update_when_one_is_killed(backend: Backend) {
    one_host_killed(backend, Kill::FromOutside).await;
}

/// The victim dies with the appends of its third batch of several written
/// into the transaction, none committed: none was acknowledged, so every
/// one is retried elsewhere and runs once.
async fn a_host_killed_before_a_batch_commits_loses_no_update(backend: Backend) {
    one_host_killed(backend, Kill::InCommit("before:3")).await;
}

/// The victim dies with its third batch of several committed and no
/// appender answered: the retries elsewhere find the committed calls and
/// return their results without running them again.
async fn a_host_killed_after_a_batch_commits_loses_no_update(backend: Backend) {
    one_host_killed(backend, Kill::InCommit("after:3")).await;
}

async fn one_host_killed(backend: Backend, how: Kill) {
    assert!(
        matches!(how, Kill::FromOutside) || cfg!(feature = "test-hooks"),
        "a kill inside a commit needs the hook: cargo test --features test-hooks (make test)"
    );
    let started = Instant::now();
    let db = TestStore::new(backend, "scale").await;
    let config = policy(db.dir.path());
    let mut servers: Vec<HttpServer> = Vec::new();
    let mut clients = Vec::new();
    for host in 0..HOSTS {
        let server = match how {
            Kill::InCommit(point) if host == VICTIM => serve_http_env(
                &["--config", &config, "--store", &db.spec],
                &[("AIRLOCK_TEST_KILL_AT_COMMIT", point)],
            ),
            _ => serve_http(&config, &db.spec),
        };
        clients.push(http_client(&server.url).await);
        servers.push(server);
    }
    let peers: Arc<Vec<Peer<RoleClient>>> =
        Arc::new(clients.iter().map(|c| c.peer().clone()).collect());
    let dead: Arc<[AtomicBool; HOSTS]> = Arc::new(Default::default());
    // Whether each host is down, as a health check would tell.
    let (kill, down) = tokio::sync::watch::channel(false);
    let (_never, up) = tokio::sync::watch::channel(false);
    let tally = Arc::new(Tally::default());
    let third = Arc::new(tokio::sync::Notify::new());

    let mut drivers = tokio::task::JoinSet::new();
    for s in 0..SESSIONS {
        {
            let (peers, dead, tally, third) = (
                Arc::clone(&peers),
                Arc::clone(&dead),
                Arc::clone(&tally),
                Arc::clone(&third),
            );
            let (down, up) = (down.clone(), up.clone());
            drivers.spawn(async move {
                let session = format!("scale-{s}");
                for i in 0..INCREMENTS {
                    let key = format!("{session}-call-{i}");
                    // Spread over the hosts; after a failure, the next one.
                    let mut host = (s + i as usize) % HOSTS;
                    let value = loop {
                        if dead[host].load(Ordering::SeqCst) {
                            host = (host + 1) % HOSTS;
                            continue;
                        }
                        let health = if host == VICTIM { &down } else { &up };
                        match attempt(&peers[host], &session, &key, health.clone()).await {
                            Attempt::Answered(result) if result.is_error != Some(true) => {
                                break result.structured_content.unwrap_or_default()["value"]
                                    .clone();
                            }
                            Attempt::Answered(result) => {
                                let said = text(&result);
                                assert!(
                                    said.contains("session is in use"),
                                    "{session} call {i} on host {host}: {said}"
                                );
                                tally.busy.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            Attempt::Lost(why) => {
                                tally.lost[host].fetch_add(1, Ordering::SeqCst);
                                assert_eq!(host, VICTIM, "a live host failed: {why}");
                                dead[host].store(true, Ordering::SeqCst);
                            }
                        }
                    };
                    // Calls of a session are sequential and each applies
                    // once: the i-th acknowledged increment says i + 1,
                    // whether it ran now or was answered from the journal.
                    assert_eq!(value, json!(i + 1), "{session} call {i}");
                    let done = tally.acknowledged.fetch_add(1, Ordering::SeqCst) + 1;
                    if done == SESSIONS * INCREMENTS as usize / 3 {
                        third.notify_one();
                    }
                }
            });
        }
    }

    // Until a third is acknowledged, or the victim killed itself; a driver
    // that fails fails the test.
    {
        let victim_died = async {
            loop {
                if matches!(how, Kill::InCommit(_)) && servers[VICTIM].exited() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::pin!(victim_died);
        loop {
            tokio::select! {
                () = third.notified(), if matches!(how, Kill::FromOutside) => break,
                () = &mut victim_died => break,
                done = drivers.join_next() => match done {
                    Some(done) => done.unwrap(),
                    None => panic!("every call was answered before the victim died ({how:?})"),
                },
            }
        }
    }
    let killed_after = tally.acknowledged.load(Ordering::SeqCst);
    servers[VICTIM].kill();
    kill.send_replace(true);
    let all_done = async {
        while let Some(done) = drivers.join_next().await {
            done.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(240), all_done)
        .await
        .expect("the drivers finish in bounded time");
    let acknowledged = tally.acknowledged.load(Ordering::SeqCst);
    assert_eq!(acknowledged, SESSIONS * INCREMENTS as usize);
    let lost = tally.lost[VICTIM].load(Ordering::SeqCst);
    assert!(lost >= 1, "host {VICTIM} was killed while calls went to it");

    // The store: each session's counter is its acknowledged increments;
    // no call completed twice; every session folds and resumes.
    let store = db.open().await;
    let mut interrupted = 0;
    for s in 0..SESSIONS {
        let session = format!("scale-{s}");
        let stored = store.read(None, &session).await.unwrap();
        let folded = Folded::fold(&stored.records).unwrap();
        assert_eq!(folded.deps["counters"]["n"], json!(INCREMENTS), "{session}");
        let mut completed = std::collections::BTreeMap::<String, usize>::new();
        for event in &folded.transcript.items {
            if let Item::FunctionCallOutput {
                call_id, status, ..
            } = &event.item
            {
                match status {
                    CallStatus::Completed => *completed.entry(call_id.clone()).or_default() += 1,
                    CallStatus::Interrupted => interrupted += 1,
                    other => panic!("{session} {call_id}: {other:?}"),
                }
            }
        }
        assert_eq!(completed.len(), INCREMENTS as usize, "{session}");
        assert!(
            completed.values().all(|&n| n == 1),
            "{session}: {completed:?}"
        );

        let options = SessionOptions {
            session_id: Some(session.clone()),
            ..SessionOptions::default()
        };
        let resumed = Session::open(Arc::clone(&store), options, &ContextRules::default())
            .await
            .unwrap();
        assert_eq!(resumed.context().deps()["counters"]["n"], json!(INCREMENTS));
        resumed.close().await.unwrap();
    }
    // A surviving host serves the next call of a session the dead one had.
    let survivor = (VICTIM + 1) % HOSTS;
    match attempt(&peers[survivor], "scale-0", "after-the-kill", up.clone()).await {
        Attempt::Answered(result) => {
            assert_eq!(
                result.structured_content.unwrap_or_default()["value"],
                json!(INCREMENTS + 1)
            );
        }
        Attempt::Lost(why) => panic!("{why}"),
    }

    drop(servers);
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "scale: {HOSTS} hosts on one {backend:?} store, {SESSIONS} sessions x {INCREMENTS} increments: \
             {acknowledged} acknowledged, each counter = its acknowledged increments; host {VICTIM} \
             SIGKILLed ({how:?}) after {killed_after}; {lost} attempts lost with it and retried elsewhere, \
             {} answered 'in use', {interrupted} interrupted calls patched; {:.1} s",
            tally.busy.load(Ordering::SeqCst),
            started.elapsed().as_secs_f64()
        );
    }
}

crate::on_both_stores!(
    hosts_on_one_store_lose_no_update_when_one_is_killed,
    a_host_killed_before_a_batch_commits_loses_no_update,
    a_host_killed_after_a_batch_commits_loses_no_update,
);
