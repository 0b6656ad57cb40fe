//! Durability proven by killing: the real `airlock` binary is SIGKILLed
//! at many points of a scripted run (before, during and after tool calls,
//! one of which spins until its timeout), and each session is then checked
//! and resumed.
//!
//! Kill points are chosen by what the run has printed, never by sleeping:
//! `--events -` prints an event only once it is committed, so after `k`
//! lines the store holds at least those `k` items.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::journal::{CallStatus, Event, Folded, INTERRUPTED_MESSAGE, Item, Snapshot};
use airlock::llm::Message;
use airlock::session::{Holder, LeaseRequest, SessionStore, SqliteStore};
use serde_json::{Value, json};

use crate::support::{airlock_command, guest};

/// The run under test: two turns of calls, one of which spins until its
/// timeout, then an answer.
fn scripted_run(dir: &Path) -> (String, String) {
    let policy = dir.join("airlock.toml");
    std::fs::write(
        &policy,
        format!(
            "[[tool]]\npath = {:?}\n\n[[tool]]\npath = {:?}\nlimits = {{ timeout_ms = 800 }}\n",
            guest("stateful"),
            guest("hostile"),
        ),
    )
    .unwrap();
    let script = dir.join("run.json");
    let inc = |name: &str| json!({"name": "increment", "arguments": {"name": name}});
    std::fs::write(
        &script,
        json!({"turns": [
            {"text": "counting", "tool_calls": [inc("a"), inc("a"), {"name": "spin"}, inc("b")]},
            {"tool_calls": [{"name": "add_note", "arguments": {"text": "noted"}}, inc("c")]},
            {"text": "done"}
        ]})
        .to_string(),
    )
    .unwrap();
    (
        policy.to_str().unwrap().to_owned(),
        script.to_str().unwrap().to_owned(),
    )
}

/// The scripted run and a one-turn script to resume it with, and the
/// store they use.
struct Scenario {
    db: PathBuf,
    policy: String,
    script: String,
    resume: String,
}

impl Scenario {
    fn new(dir: &Path, resume_answer: &str) -> Self {
        let (policy, script) = scripted_run(dir);
        let resume = dir.join("resume.json");
        std::fs::write(
            &resume,
            json!({"turns": [{"text": resume_answer}]}).to_string(),
        )
        .unwrap();
        Self {
            db: dir.join("sessions.db"),
            policy,
            script,
            resume: resume.to_str().unwrap().to_owned(),
        }
    }

    fn args<'a>(&'a self, script: &'a str, id: &'a str) -> [&'a str; 10] {
        [
            "--config",
            &self.policy,
            "--script",
            script,
            "--store",
            self.db.to_str().unwrap(),
            "--session",
            id,
            "--events",
            "-",
        ]
    }

    /// The scripted run on session `id`, its events on stdout.
    fn spawn(&self, id: &str, env: &[(&str, &str)]) -> Child {
        let mut args = vec!["run", "go"];
        args.extend(self.args(&self.script, id));
        airlock_command(&args, env)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("airlock runs")
    }

    /// A run of the resume script on session `id`, to its end.
    fn resume(&self, id: &str, env: &[(&str, &str)]) -> Output {
        let mut args = vec!["run", "next"];
        args.extend(&self.args(&self.resume, id)[..8]);
        args.push("--json");
        airlock_command(&args, env).output().unwrap()
    }

    async fn read(&self, id: &str) -> Folded {
        read(&self.db, id).await
    }
}

/// How many tool messages answer a call with the interrupted text.
fn patched(messages: &[Message]) -> usize {
    messages
        .iter()
        .filter(|m| matches!(m, Message::Tool { content, .. } if content == INTERRUPTED_MESSAGE))
        .count()
}

/// Reads `count` event lines from the child, then kills it with SIGKILL.
/// Returns the events seen (fewer if the run ended first).
fn kill_after(mut child: Child, count: usize) -> Vec<Event> {
    let stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if !line.starts_with('{') {
            // The run's own summary after the events.
            break;
        }
        seen.push(serde_json::from_str::<Event>(&line).unwrap());
        if seen.len() == count {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    seen
}

/// What the committed items say deps must be, worked out from the tools'
/// own results (not from the ops): each counter at its highest reported
/// value, the notes in order.
fn expected_deps(items: &[Event]) -> Value {
    let mut counters = BTreeMap::new();
    let mut notes = Vec::new();
    for event in items {
        if let Item::FunctionCallOutput {
            name,
            status: CallStatus::Completed,
            output,
            ..
        } = &event.item
        {
            let result: Value = serde_json::from_str(output).unwrap();
            match name.as_str() {
                "increment" => {
                    counters.insert(
                        result["counter"].as_str().unwrap().to_owned(),
                        result["value"].clone(),
                    );
                }
                "add_note" => notes.push(result["added"].clone()),
                _ => {}
            }
        }
    }
    let mut deps = serde_json::Map::new();
    if !counters.is_empty() {
        deps.insert("counters".into(), json!(counters));
    }
    if !notes.is_empty() {
        deps.insert("notes".into(), Value::Array(notes));
    }
    Value::Object(deps)
}

/// Sorted keys, so deps compare whatever order the ops created them in.
fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<_, _> = map.iter().map(|(k, v)| (k.clone(), sorted(v))).collect();
            json!(sorted)
        }
        other => other.clone(),
    }
}

/// Calls the model asked for that no tool message answers.
fn unanswered(messages: &[Message]) -> Vec<String> {
    let mut open = Vec::new();
    for message in messages {
        match message {
            Message::Assistant { tool_calls, .. } => {
                open.extend(tool_calls.iter().map(|c| c.id.clone()));
            }
            Message::Tool { call_id, .. } => {
                let at = open
                    .iter()
                    .position(|id| id == call_id)
                    .expect("answers an open call");
                open.remove(at);
            }
            _ => {}
        }
    }
    open
}

fn integrity(db: &Path) {
    let conn = rusqlite::Connection::open(db).unwrap();
    let result: String = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(result, "ok");
}

/// The session as a lease reads it: its newest snapshot (if any) and the
/// records after it, folded; the snapshot's closed calls filled back in
/// from the whole journal so that it compares with [`read`]'s fold. And
/// whether it had a snapshot.
async fn resumed(db: &Path, id: &str) -> (Folded, bool) {
    let store = SqliteStore::open(db).unwrap();
    let holder = Holder::new();
    let leased = store
        .lease(LeaseRequest {
            user_id: None,
            session_id: id,
            holder: &holder,
            ttl: Duration::from_secs(30),
            now_ms: airlock::journal::now_ms(),
            create: None,
        })
        .await
        .unwrap();
    store.release(&leased.lease).await.unwrap();
    let session = leased.session;
    let Some(snapshot) = session.snapshot else {
        return (Folded::fold(&session.records).unwrap(), false);
    };
    let snapshot = Snapshot::decode(snapshot.seq, &snapshot.body).unwrap();
    let seq = snapshot.seq;
    let mut folded = Folded::resume(snapshot, &session.records).unwrap();
    let whole = read(db, id).await;
    let folded_items = usize::try_from(folded.transcript.items_folded).unwrap();
    assert_eq!(
        whole.transcript.items.len(),
        folded_items + folded.transcript.items.len(),
        "the snapshot at record {seq} miscounts the items it folded"
    );
    folded.transcript.items = whole.transcript.items.clone();
    folded.transcript.items_folded = 0;
    (folded, true)
}

async fn read(db: &Path, id: &str) -> Folded {
    let store = SqliteStore::open(db).expect("the store opens cleanly after a kill");
    let stored = store.read(None, id).await.unwrap();
    Folded::fold(&stored.records).expect("the journal folds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_any_point_loses_no_committed_turn() {
    kill_at_every_event(&[("AIRLOCK_SNAPSHOT_EVERY", "0")]).await;
}

/// The same kills while snapshots are written every 3 records (so some
/// kills land just before, some just after a commit that carries one),
/// and every resume starts from a snapshot and its tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_snapshots_are_written_loses_no_committed_turn() {
    kill_at_every_event(&[("AIRLOCK_SNAPSHOT_EVERY", "3")]).await;
}

/// Kills the scripted run after each of its events in turn, then checks
/// and resumes each session (with `env`).
async fn kill_at_every_event(env: &[(&str, &str)]) {
    let dir = tempfile::tempdir().unwrap();
    let run = Scenario::new(dir.path(), "resumed");

    // A whole run first: how many events there are to kill between.
    let full = kill_after(run.spawn("whole", env), usize::MAX);
    let total = full.len();
    assert!(matches!(full.last().unwrap().item, Item::RunEnded { .. }));
    assert!(total >= 22, "{total} events");

    let mut kills = 0;
    let mut interrupted_mid_call = 0;
    let mut snapshots = 0;
    // Kill after every event but the last: before, during and after each
    // call (after the output of the call before it, the spin call runs).
    for count in 1..total {
        let id = format!("crash-{count}");
        let seen = kill_after(run.spawn(&id, env), count);
        assert_eq!(seen.len(), count);
        kills += 1;
        integrity(&run.db);

        let before = run.read(&id).await;
        let items = &before.transcript.items;
        assert!(items.len() >= count, "kill {count}: committed items lost");
        assert_eq!(&items[..count], &seen[..], "kill {count}: items differ");
        assert_eq!(
            sorted(&Value::Object(before.deps.clone())),
            sorted(&expected_deps(items)),
            "kill {count}: deps are not the fold of the committed calls"
        );
        let open = unanswered(&before.transcript.messages);
        let mid_call = items
            .iter()
            .any(|e| matches!(&e.item, Item::FunctionCall { call, .. } if open.contains(&call.id)));
        interrupted_mid_call += usize::from(mid_call);

        // Resume at once: the dead holder's lease does not block it.
        let out = run.resume(&id, env);
        assert!(
            out.status.success(),
            "kill {count}: resume failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let after = run.read(&id).await;
        assert!(
            unanswered(&after.transcript.messages).is_empty(),
            "kill {count}"
        );
        assert_eq!(
            patched(&after.transcript.messages),
            open.len(),
            "kill {count}: one patch per open call"
        );
        assert_eq!(
            sorted(&Value::Object(after.deps.clone())),
            sorted(&Value::Object(before.deps.clone()))
        );
        assert_eq!(&after.transcript.items[..items.len()], &items[..]);
        assert_eq!(
            after
                .transcript
                .items
                .iter()
                .map(|e| e.id.clone())
                .collect::<Vec<_>>(),
            (1..=after.transcript.items.len())
                .map(|n| format!("item_{n}"))
                .collect::<Vec<_>>(),
            "kill {count}: items are numbered 1, 2, 3, ... without gaps or repeats"
        );
        // Once more: nothing is patched twice.
        assert!(run.resume(&id, env).status.success());
        let last = run.read(&id).await;
        assert_eq!(
            patched(&last.transcript.messages),
            open.len(),
            "kill {count}: patched twice"
        );
        // What a lease reads (the snapshot and its tail) folds to what the
        // whole journal folds to.
        let (leased, from_snapshot) = resumed(&run.db, &id).await;
        assert_eq!(leased, last, "kill {count}");
        snapshots += usize::from(from_snapshot);
    }
    assert_eq!(
        snapshots > 0,
        env.contains(&("AIRLOCK_SNAPSHOT_EVERY", "3")),
        "{snapshots} sessions resumed from a snapshot"
    );
    assert!(kills >= 20, "{kills} kills");
    assert!(
        interrupted_mid_call >= 3,
        "{interrupted_mid_call} kills mid-call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_blocks_until_its_lease_expires_and_then_cannot_commit() {
    use rustix::process::{Pid, Signal, kill_process};
    let dir = tempfile::tempdir().unwrap();
    let run = Scenario::new(dir.path(), "took over");
    let ttl = [("AIRLOCK_LEASE_TTL_MS", "1000")];

    let mut holder = run.spawn("stalled", &ttl);
    let stdout = holder.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    // Wait for the output of the call before the spin call (the second of
    // the turn; every intent was committed with the turn), then freeze the
    // process while it spins: between commits.
    let mut outputs = 0;
    while outputs < 2 {
        let line = lines.next().expect("the run prints events").unwrap();
        outputs += usize::from(line.contains("\"function_call_output\""));
    }
    let pid = Pid::from_raw(i32::try_from(holder.id()).unwrap()).unwrap();
    kill_process(pid, Signal::STOP).unwrap();
    let before = run.read("stalled").await;

    // While the lease is current: refused, exit 4, nothing changed.
    let first = run.resume("stalled", &ttl);
    if first.status.code() == Some(4) {
        let error: Value = serde_json::from_slice(&first.stdout).unwrap();
        assert_eq!(error["error"]["kind"], "session_in_use");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("session is in use")
        );
        assert_eq!(run.read("stalled").await, before);
    }
    // Past its expiry (1 s without renewal), the session is taken over.
    let deadline = Instant::now() + Duration::from_secs(30);
    let taken = loop {
        let out = run.resume("stalled", &ttl);
        if out.status.success() {
            break out;
        }
        assert_eq!(
            out.status.code(),
            Some(4),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(Instant::now() < deadline, "the lease never expired");
        std::thread::sleep(Duration::from_millis(100));
    };
    let taken: Value = serde_json::from_slice(&taken.stdout).unwrap();
    assert_eq!(taken["answer"], "took over");
    let after_takeover = run.read("stalled").await;

    // The old holder wakes up: its spin call times out, and its commit is
    // refused (fenced); the store keeps the new run's state.
    kill_process(pid, Signal::CONT).unwrap();
    let out = holder.wait_with_output().unwrap();
    drop(lines);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lost the lease"), "{stderr}");
    assert_eq!(run.read("stalled").await, after_takeover);
    let store: Arc<dyn SessionStore> = Arc::new(SqliteStore::open(&run.db).unwrap());
    assert!(store.list(None).await.unwrap()[0].leased_until_ms.is_none());
    integrity(&run.db);
}

/// The test hooks are the tests' only: an `airlock` built without the
/// `test-hooks` feature (what `make demo` and every release build) holds
/// neither variable's name (the kill at a commit, the HTTP server's header
/// limit), so nothing an operator sets can make it kill itself or change
/// the limit. `make test` names such a build in `AIRLOCK_SHIPPED_BIN`; the
/// tests' own binary, built with the feature, holds both (the control).
#[test]
fn a_build_without_test_hooks_has_no_kill_hook() {
    const HOOKS: [&str; 2] = ["AIRLOCK_TEST_KILL_AT_COMMIT", "AIRLOCK_TEST_HEADER_READ_MS"];
    let holds = |binary: &Path, hook: &str| {
        std::process::Command::new("grep")
            .args(["-q", "-a", "-F", hook])
            .arg(binary)
            .status()
            .expect("grep runs")
            .success()
    };
    let tests_binary = Path::new(env!("CARGO_BIN_EXE_airlock"));
    let shipped = match std::env::var_os("AIRLOCK_SHIPPED_BIN") {
        Some(path) => PathBuf::from(path),
        None if !cfg!(feature = "test-hooks") => tests_binary.to_path_buf(),
        None => panic!(
            "set AIRLOCK_SHIPPED_BIN to an airlock built without --features test-hooks (make test does)"
        ),
    };
    assert!(shipped.is_file(), "{} is not a file", shipped.display());
    for hook in HOOKS {
        assert!(!holds(&shipped, hook), "{} reads {hook}", shipped.display());
        if cfg!(feature = "test-hooks") {
            assert!(holds(tests_binary, hook), "the tests' binary has no {hook}");
        }
    }
}

/// A run whose tool asks its person (answered by the script) and the
/// model (the script's samples), twice.
struct Asking {
    db: PathBuf,
    policy: String,
    script: String,
    resume: String,
}

impl Asking {
    fn new(dir: &Path) -> Self {
        let policy = dir.join("airlock.toml");
        std::fs::write(
            &policy,
            format!(
                "[[tool]]\npath = {:?}\nask = true\nsample = {{ max_tokens = 50 }}\n",
                guest("everything")
            ),
        )
        .unwrap();
        let script = dir.join("run.json");
        let greet = json!({"name": "greet"});
        std::fs::write(
            &script,
            json!({
                "turns": [
                    {"text": "greeting", "tool_calls": [greet, greet]},
                    {"tool_calls": [greet]},
                    {"text": "done"}
                ],
                "answers": [
                    {"action": "accept", "content": {"name": "Ann"}},
                    {"action": "accept", "content": {"name": "Bob"}},
                    {"action": "accept", "content": {"name": "Cy"}}
                ],
                "samples": [
                    {"text": "Hello, Ann!", "usage": {"input_tokens": 7, "output_tokens": 3}},
                    {"text": "Hi, Bob!", "usage": {"input_tokens": 7, "output_tokens": 3}},
                    {"text": "Hey, Cy!", "usage": {"input_tokens": 7, "output_tokens": 3}}
                ]
            })
            .to_string(),
        )
        .unwrap();
        // The resume asks nothing: it has no calls, no answers and no
        // samples to give.
        let resume = dir.join("resume.json");
        std::fs::write(&resume, json!({"turns": [{"text": "resumed"}]}).to_string()).unwrap();
        let path = |p: PathBuf| p.to_str().unwrap().to_owned();
        Self {
            db: dir.join("sessions.db"),
            policy: path(policy),
            script: path(script),
            resume: path(resume),
        }
    }

    fn command(&self, script: &str, id: &str, last: &str) -> std::process::Command {
        airlock_command(
            &[
                "run",
                "go",
                "--config",
                &self.policy,
                "--script",
                script,
                "--store",
                self.db.to_str().unwrap(),
                "--session",
                id,
                last,
            ],
            &[],
        )
    }
}

/// What the committed greetings say deps must be, from the calls' own
/// results, each checked to have been answered by the script (never
/// `unavailable`: nothing was asked where nobody could answer).
fn greetings(items: &[Event]) -> Value {
    let mut greetings = Vec::new();
    for event in items {
        if let Item::FunctionCallOutput {
            status: CallStatus::Completed,
            output,
            guest,
            ..
        } = &event.item
        {
            assert_eq!(guest.asked.len(), 1, "{output}");
            assert!(
                matches!(guest.asked[0].answer, airlock::Answer::Accept { .. }),
                "{output}"
            );
            assert!(
                matches!(
                    guest.sampled[0].reply,
                    airlock::SampleReply::Answered { .. }
                ),
                "{output}"
            );
            greetings.push(serde_json::from_str::<Value>(output).unwrap());
        }
    }
    if greetings.is_empty() {
        json!({})
    } else {
        json!({ "greetings": greetings })
    }
}

/// A tool that asks its person and the model in `airlock run` gets the
/// script's answers and the run's model's replies, counted in the run's
/// usage and journaled with the call; SIGKILLed after any event and
/// resumed, the session keeps every committed answer, asks nothing again,
/// and its deps are the fold of the committed calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_asks_its_person_and_model_is_killed_and_resumed_without_asking_again() {
    let dir = tempfile::tempdir().unwrap();
    let run = Asking::new(dir.path());
    let out = run
        .command(&run.script, "whole", "--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        said["deps"]["greetings"],
        json!([
            {"name": "Ann", "greeting": "Hello, Ann!"},
            {"name": "Bob", "greeting": "Hi, Bob!"},
            {"name": "Cy", "greeting": "Hey, Cy!"}
        ]),
        "{said}"
    );
    // Three turns and three samples; the samples' tokens with the turns'.
    assert_eq!(said["usage"]["requests"], 6, "{said}");
    assert_eq!(said["usage"]["input_tokens"], 21, "{said}");
    assert_eq!(said["usage"]["output_tokens"], 9, "{said}");
    let whole = read(&run.db, "whole").await;
    assert_eq!(whole.usage.requests, 6);

    let spawn = |id: &str| {
        run.command(&run.script, id, "--events")
            .arg("-")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let total = kill_after(spawn("count"), usize::MAX).len();
    assert!(total >= 12, "{total} events");
    for count in 1..total {
        let id = format!("asked-{count}");
        let seen = kill_after(spawn(&id), count);
        assert_eq!(seen.len(), count);
        integrity(&run.db);
        let before = read(&run.db, &id).await;
        let items = &before.transcript.items;
        assert_eq!(&items[..count], &seen[..], "kill {count}: items differ");
        assert_eq!(
            Value::Object(before.deps.clone()),
            greetings(items),
            "kill {count}: deps are not the fold of the committed calls"
        );
        let out = run.command(&run.resume, &id, "--json").output().unwrap();
        assert!(
            out.status.success(),
            "kill {count}: resume failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let after = read(&run.db, &id).await;
        assert_eq!(&after.transcript.items[..items.len()], &items[..]);
        assert_eq!(after.deps, before.deps, "kill {count}");
        // Nothing after the kill asked anyone anything.
        assert!(
            after.transcript.items[items.len()..]
                .iter()
                .all(|e| !matches!(
                    &e.item,
                    Item::FunctionCallOutput { guest, .. } if !guest.asked.is_empty()
                )),
            "kill {count}: asked again after resuming"
        );
    }
}
