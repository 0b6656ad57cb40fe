//! §19 Replay: a session's calls run again (`Session::replay`) beside the
//! same calls made fresh, and replay's scaling from one core to two.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{Bench, Paired, Pinned, component, root};
use airlock::agent::replay::Replay;
use airlock::context::ContextRules;
use airlock::session::{Durability, SessionStore};
use airlock::{Host, RunContext, Session, SessionOptions, SqliteStore, ToolCall};

/// Session `id` of `store`, opened (made if new).
async fn opened(store: &Arc<dyn SessionStore>, id: &str) -> Session {
    let options = SessionOptions {
        session_id: Some(id.to_owned()),
        ..SessionOptions::default()
    };
    Session::open(Arc::clone(store), options, &ContextRules::default())
        .await
        .unwrap()
}

/// `calls` calls of `increment` made on `session`, each journaled (as
/// `airlock call --session` makes them).
async fn increments(session: &mut Session, host: &Host, calls: usize) {
    let call = ToolCall::new("increment", r#"{"name":"n"}"#);
    let cancel = airlock::sandbox::CancelToken::new();
    for _ in 0..calls {
        session.call(host, &call, &cancel, None).await.unwrap();
    }
}

/// A session `id` in `store` holding `calls` journaled calls of
/// `increment` (left as it is if `store` has it).
async fn made(store: &Arc<dyn SessionStore>, host: &Host, id: &str, calls: usize) {
    let sessions = store.list(None).await.unwrap();
    if sessions.iter().any(|s| s.session_id == id) {
        return;
    }
    let mut session = opened(store, id).await;
    increments(&mut session, host, calls).await;
    session.close().await.unwrap();
}

/// Per call (of `calls`): session `id` replayed, its calls of `tools`
/// run `parallel` at once (with no tool, the journal read and folded
/// alone).
async fn replayed(
    store: &Arc<dyn SessionStore>,
    host: &Arc<Host>,
    id: &str,
    tools: &[&str],
    parallel: usize,
    calls: usize,
) -> Duration {
    let tools: BTreeSet<String> = tools.iter().map(|t| (*t).to_owned()).collect();
    let replay = Replay {
        owner: None,
        session_id: id,
        tools: &tools,
        parallel,
    };
    let started = Instant::now();
    let summary = Session::replay(store.as_ref(), host, replay, |_| {})
        .await
        .unwrap();
    assert_eq!(summary.different + summary.failed, 0);
    started.elapsed() / calls as u32
}

/// Per call: `calls` fresh calls of `increment`, from `tasks` tasks at
/// once (with two, what two cores give calls that need no journal).
async fn fresh(host: &Arc<Host>, tasks: usize, calls: usize) -> Duration {
    let took = at_once(tasks, |_| {
        let host = Arc::clone(host);
        async move {
            let mut ctx = RunContext::default();
            let call = ToolCall::new("increment", r#"{"name":"n"}"#);
            for _ in 0..calls / tasks {
                host.call(&mut ctx, &call).await.unwrap();
            }
        }
    })
    .await;
    took / calls as u32
}

/// The time `tasks` tasks take, each `task(i)` spawned at once and all
/// awaited.
async fn at_once<F>(tasks: usize, task: impl Fn(usize) -> F) -> Duration
where
    F: Future<Output = ()> + Send + 'static,
{
    let started = Instant::now();
    let spawned: Vec<_> = (0..tasks).map(|i| tokio::spawn(task(i))).collect();
    for spawned in spawned {
        spawned.await.unwrap();
    }
    started.elapsed()
}

/// Per call: `calls` calls of `increment` made as the replayed session's
/// were (each on a session, journaled in `store`), on two new sessions at
/// once: the original calls' rate on two cores. The sessions are removed
/// after; only the calls are timed.
async fn original(store: &Arc<dyn SessionStore>, host: &Arc<Host>, calls: usize) -> Duration {
    let ids = ["original-0", "original-1"];
    let mut sessions = Vec::new();
    for id in ids {
        sessions.push(opened(store, id).await);
    }
    let started = Instant::now();
    let tasks: Vec<_> = sessions
        .into_iter()
        .map(|mut session| {
            let host = Arc::clone(host);
            tokio::spawn(async move {
                increments(&mut session, &host, calls / 2).await;
                session
            })
        })
        .collect();
    let mut sessions = Vec::new();
    for task in tasks {
        sessions.push(task.await.unwrap());
    }
    let elapsed = started.elapsed() / calls as u32;
    for session in sessions {
        session.close().await.unwrap();
    }
    for id in ids {
        store
            .remove(None, id, airlock::journal::now_ms())
            .await
            .unwrap();
    }
    elapsed
}

/// A runtime whose threads (its `cores` workers, and the blocking threads
/// they start, the store's among them) run only on the first `cores`
/// cores. Made once for all of a pairing's runs and warmed first, so what
/// is timed on it is calls, as in a replay of many sessions, not threads
/// that just started (on a runtime made for each run, the two-core side's
/// first calls left the second core idle a third of the time).
struct OnCores(Option<tokio::runtime::Runtime>);

impl OnCores {
    fn new(cores: usize) -> Self {
        // Pinned on a thread of its own: the workers it starts keep its
        // cores; the bench's thread keeps its own.
        let runtime = std::thread::spawn(move || {
            let _pinned = Pinned::to_first(cores);
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(cores)
                .enable_all()
                .build()
                .unwrap()
        })
        .join()
        .unwrap();
        Self(Some(runtime))
    }

    /// What `work` returns, run on this runtime (the threads it starts
    /// keep its cores).
    async fn run<T, F>(&self, work: F) -> T
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let runtime = self.0.as_ref().expect("running until dropped");
        runtime.spawn(work).await.unwrap()
    }
}

impl Drop for OnCores {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Per call: session `id` replayed, `cores` calls at once, on `on`
/// (`cores` cores).
async fn replayed_on(
    on: &OnCores,
    store: &Arc<dyn SessionStore>,
    host: &Arc<Host>,
    id: &str,
    cores: usize,
    calls: usize,
) -> Duration {
    let (store, host, id) = (Arc::clone(store), Arc::clone(host), id.to_owned());
    on.run(async move { replayed(&store, &host, &id, &["increment"], cores, calls).await })
        .await
}

/// Per call: `calls` bare calls from `cores` tasks on `on` (`cores`
/// cores): what the machine gives calls that share nothing.
async fn fresh_on(on: &OnCores, host: &Arc<Host>, cores: usize, calls: usize) -> Duration {
    let host = Arc::clone(host);
    on.run(async move { fresh(&host, cores, calls).await })
        .await
}

/// The time `rounds` rounds of arithmetic on one register take, from
/// `cores` tasks on `on` (`cores` cores): what the machine gives work that
/// touches no memory and shares nothing, not even an allocator.
async fn spin_on(on: &OnCores, cores: usize, rounds: u64) -> Duration {
    on.run(at_once(cores, move |task| async move {
        // xorshift64: a dependent chain the compiler cannot fold.
        let mut x = std::hint::black_box(0x9E37_79B9_7F4A_7C15_u64 ^ task as u64);
        for _ in 0..rounds / cores as u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        std::hint::black_box(x);
    }))
    .await
}

/// As [`spin_on`], on four registers at once: independent chains, which
/// keep more of a core's execution units busy, as compiled code does.
async fn chains_on(on: &OnCores, cores: usize, rounds: u64) -> Duration {
    on.run(at_once(cores, move |task| async move {
        let (mut a, mut b, mut c, mut d) = std::hint::black_box((task as u64, 2_u64, 3_u64, 4_u64));
        for i in 0..rounds / cores as u64 {
            a = a.wrapping_mul(3).wrapping_add(i);
            b = b.wrapping_mul(5) ^ i;
            c = c.rotate_left(3) ^ i;
            d = d.wrapping_add(i) ^ (d >> 3);
        }
        std::hint::black_box(a ^ b ^ c ^ d);
    }))
    .await
}

/// How many short sessions the many-session replay reads, and the calls
/// each holds: what `airlock replay --since 7d` finds after a week of
/// short runs.
const SHORT_SESSIONS: usize = 400;
const SHORT_CALLS: usize = 25;

/// `SHORT_SESSIONS` sessions of `SHORT_CALLS` calls of `increment` in a
/// store of their own at `db` (made unless it holds them).
async fn short_sessions(db: &std::path::Path, host: &Host, sessions: usize) {
    let store: Arc<dyn SessionStore> =
        Arc::new(SqliteStore::open_with(db, Durability::Never).unwrap());
    for n in 0..sessions {
        made(&store, host, &format!("short-{n}"), SHORT_CALLS).await;
    }
}

/// Per call (of `calls`): `airlock replay` (the release binary, as run by
/// hand) over every session in `db`, against `wasm`, `cores` calls at once,
/// the process confined to the first `cores` cores. Includes the
/// process's start and the component's load from the compile cache.
fn replay_command(
    db: &std::path::Path,
    wasm: &std::path::Path,
    cores: usize,
    calls: usize,
) -> Duration {
    let (db, wasm) = (db.to_owned(), wasm.to_owned());
    // A child inherits the thread's cores.
    std::thread::spawn(move || {
        let _pinned = Pinned::to_first(cores);
        let started = Instant::now();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_airlock"))
            .arg("replay")
            .arg("--store")
            .arg(&db)
            .arg("--tool")
            .arg(format!("increment={}", wasm.display()))
            .args(["--parallel", &cores.to_string()])
            .output()
            .unwrap();
        let took = started.elapsed();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        took / calls as u32
    })
    .join()
    .unwrap()
}

/// One pair of `measure(cores)`: on one core and on two, one core first
/// when `first`.
async fn one_then_two(paired: &mut Paired, first: bool, measure: impl AsyncFn(usize) -> Duration) {
    paired.push_pair(first, measure(1), measure(2)).await;
}

/// Rounds of `spin` that take one core about as long as `took`, a
/// run of the replay on one core.
async fn spin_rounds(
    on: &OnCores,
    spin: impl AsyncFn(&OnCores, usize, u64) -> Duration,
    took: Duration,
) -> u64 {
    let probe = 10_000_000;
    let probed = spin(on, 1, probe).await;
    let rounds = took.as_secs_f64() / probed.as_secs_f64().max(1e-9) * probe as f64;
    rounds.clamp(1.0, 1e11) as u64
}

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(
        out,
        "## 19. Replay\n\n\
         A session of journaled `increment` calls (made one at a time on the session, SQLite, \
         nothing synced) replayed whole by `Session::replay` against the component that made them \
         (each call rebuilt from the journal read a page at a time, its view and tape played back, \
         its result and ops compared), two calls at once. Paired with the original calls' rate: as \
         many calls made as the session's were (each on a session, journaled in the same store), \
         on two sessions at once; and, for what the journal costs, with as many bare `Host::call`s \
         (no session, no journal) from two tasks at once. Scaling: the Rust replay on one core (its \
         runtime's threads, its store's among them, confined to it; one call at a time) paired with \
         the same on two cores (two at once), and bare `Host::call`s measured the same way (one task \
         on one core, two on two) for what the cores give calls that share nothing; each side's \
         runtime made once and warmed before its runs are timed, as one replaying many sessions is, \
         and its host made on it (so the host's own threads, the one its calls' stores are dropped \
         on among them, keep the side's cores too). \
         On 2 cores.\n"
    )
    .unwrap();
    let dir = tempfile::tempdir_in(root().join("target")).unwrap();
    let store: Arc<dyn SessionStore> =
        Arc::new(SqliteStore::open_with(dir.path().join("replay.db"), Durability::Never).unwrap());
    let pairs = if b.quick { 3 } else { 15 };
    let mut rows = String::new();
    let mut scaling = None;
    for (language, file, calls) in [
        (
            "Rust",
            "wasm32-wasip2/release/stateful.wasm",
            if b.quick { 100 } else { 400 },
        ),
        (
            "Python",
            "python-stateful.wasm",
            if b.quick { 20 } else { 100 },
        ),
    ] {
        let host = Arc::new(b.host(&[component(file)]).await);
        let id = language.to_lowercase();
        made(&store, &host, &id, calls).await;
        let mut passes = Vec::new();
        for _ in 0..5 {
            passes.push(replayed(&store, &host, &id, &[], 1, calls).await);
        }
        passes.sort();
        let pass = passes[passes.len() / 2];
        let versus = b
            .paired(
                &format!("{language} original vs replayed, 2 at once"),
                pairs,
                async || original(&store, &host, calls).await,
                async || replayed(&store, &host, &id, &["increment"], 2, calls).await,
            )
            .await;
        let bare = b
            .paired(
                &format!("{language} fresh vs replayed, 2 at once"),
                pairs,
                async || fresh(&host, 2, calls).await,
                async || replayed(&store, &host, &id, &["increment"], 2, calls).await,
            )
            .await;
        writeln!(
            rows,
            "| {language} ({calls} calls) | {} | {} | {} | {} | ≥ 0.9× | {} | {} | {} |",
            crate::harness::us(versus.b()),
            crate::harness::us(pass),
            crate::harness::us(versus.a()),
            versus.cell(),
            versus.at_least(0.9),
            crate::harness::us(bare.a()),
            bare.cell(),
        )
        .unwrap();
        if language == "Rust" {
            let (one, two) = (OnCores::new(1), OnCores::new(2));
            // Each side calls a host of its own, made on its runtime: the
            // threads a host starts (the one its calls' stores are dropped
            // on among them) then keep the side's cores. (Made outside,
            // the host's threads gave the one-core side part of a second.)
            let prepared = airlock::Limits::default().prepared_instances;
            let mut hosts = Vec::new();
            // Runs of a few tens of milliseconds spread with what else the
            // machine does: these are four times as long.
            let (id, calls) = ("rust-scaling", calls * 4);
            made(&store, &host, id, calls).await;
            for (on, cores) in [(&one, 1), (&two, 2)] {
                let host = Arc::new(on.run(b.loading(&[component(file)], prepared)).await);
                replayed_on(on, &store, &host, id, cores, calls).await;
                fresh_on(on, &host, cores, calls).await;
                hosts.push(host);
            }
            // Side `n` (1 or 2): its runtime, on `n` cores, and its host.
            let sides = [(&one, &hosts[0]), (&two, &hosts[1])];
            // The arithmetic as long as a one-core replay run.
            let one_core = replayed_on(&one, &store, &hosts[0], id, 1, calls).await;
            let run = one_core * calls as u32;
            let rounds = spin_rounds(&one, spin_on, run).await;
            let chained = spin_rounds(&one, chains_on, run).await;
            // Many short sessions, replayed by the command (once first,
            // so that its component is in the compile cache).
            let short = dir.path().join("short.db");
            let sessions = if b.quick { 40 } else { SHORT_SESSIONS };
            short_sessions(&short, &host, sessions).await;
            let wasm = component(file);
            let short_calls = sessions * SHORT_CALLS;
            replay_command(&short, &wasm, 1, short_calls);
            // A round is one pair of each, the order turning each round:
            // what the machine gives two cores changes from minute to
            // minute, so the controls are measured in the same seconds as
            // the replay, not in a stretch of their own.
            let mut measured: [Paired; 5] = Default::default();
            for round in 0..pairs.div_ceil(b.passes) {
                let first = round % 2 == 0;
                let [replay, bare, spin, chains, many] = &mut measured;
                one_then_two(replay, first, async |n| {
                    let (on, host) = sides[n - 1];
                    replayed_on(on, &store, host, id, n, calls).await
                })
                .await;
                one_then_two(bare, first, async |n| {
                    let (on, host) = sides[n - 1];
                    fresh_on(on, host, n, calls).await
                })
                .await;
                one_then_two(spin, first, async |n| {
                    spin_on(sides[n - 1].0, n, rounds).await
                })
                .await;
                one_then_two(chains, first, async |n| {
                    chains_on(sides[n - 1].0, n, chained).await
                })
                .await;
                one_then_two(many, first, async |n| {
                    replay_command(&short, &wasm, n, short_calls)
                })
                .await;
            }
            let [replay, bare, spin, chains, many] = measured;
            let replay = b.keep("Rust replay 1 → 2 cores", replay);
            let bare = b.keep("Rust bare calls 1 → 2 cores", bare);
            let spin = b.keep("arithmetic alone 1 → 2 cores", spin);
            let chains = b.keep("arithmetic on four registers 1 → 2 cores", chains);
            let many = b.keep("airlock replay, many short sessions, 1 → 2 cores", many);
            scaling = Some((replay, bare, spin, chains, calls, (many, sessions)));
        }
    }
    writeln!(
        out,
        "| tool | replayed, per call | of it, reading the journal | original, per call | replay's rate beside the original calls' | target | | bare `Host::call`, per call | replay's rate beside bare calls' |\n\
         |---|---|---|---|---|---|---|---|---|\n{rows}"
    )
    .unwrap();
    if let Some((replay, bare, spin, chains, calls, (many, sessions))) = scaling {
        writeln!(
            out,
            "Rust replay of a session of {calls} calls, one core (one call at a time) → two (two at once): \
             throughput {} — target at least 1.8×: {}. \
             For what these two cores give calls that share nothing, bare `Host::call`s measured the same way \
             (one task on one core → two tasks on two): {}; and for what they give work that \
             touches no memory and shares nothing (a register's arithmetic, as long as a one-core \
             replay run, one thread → two): {}; {} on four registers at once (independent \
             chains, which keep more of a core busy, as compiled code does). \
             `airlock replay` over {sessions} sessions of {SHORT_CALLS} calls each (the command \
             as run by hand, its process confined to one core with `--parallel 1` → two cores \
             with `--parallel 2`, its start included; it reads and folds several sessions at \
             once): {} — target at least 1.8×: {}. Each round takes one pair of each, so all \
             five are measured in the same seconds.\n",
            replay.cell(),
            replay.at_least(1.8),
            bare.cell(),
            spin.cell(),
            chains.cell(),
            many.cell(),
            many.at_least(1.8),
        )
        .unwrap();
    }
}
