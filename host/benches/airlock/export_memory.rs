//! §16 Exporting, importing and replaying a session of a gigabyte: the
//! peak resident memory of `airlock sessions export`, `import` and
//! `replay`.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{Bench, component, root, verdict};
use airlock::context::ContextRules;
use airlock::journal::{Entry, now_ms};
use airlock::llm::Message;
use airlock::sandbox::CancelToken;
use airlock::session::Durability;
use airlock::session::{SessionHeader, SessionStore};
use airlock::{Session, SessionOptions, SqliteStore, ToolCall};

/// Bytes of one record's message.
const RECORD_BYTES: usize = 64 << 10;

/// The target: peak resident memory of the export, and of the import, in MiB.
const TARGET_MIB: u64 = 100;

/// The peak resident memory (`VmHWM`) of `pid` so far, in KiB; 0 once it
/// is gone.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(
        out,
        "## 16. Exporting, importing and replaying a session of a gigabyte\n"
    )
    .unwrap();
    let total: u64 = if b.quick { 128 << 20 } else { 1 << 30 };
    let dir = tempfile::tempdir_in(root().join("target")).unwrap();
    let db = dir.path().join("export.db");
    let store: Arc<dyn SessionStore> = Arc::new(SqliteStore::open(&db).unwrap());
    let header = SessionHeader {
        session_id: "big".into(),
        user_id: None,
        created_at_ms: now_ms(),
        metadata: Default::default(),
        ephemeral: false,
    };
    let entry = Entry::Message {
        message: Message::User {
            content: "x".repeat(RECORD_BYTES),
        },
    };
    let count = total / RECORD_BYTES as u64;
    let records: Vec<_> = (1..=count)
        .map(|seq| airlock::journal::Record {
            seq,
            at_ms: now_ms(),
            entry: entry.clone(),
        })
        .collect();
    store
        .insert(&header, Box::new(records), now_ms())
        .await
        .unwrap();
    drop(store);

    let output = dir.path().join("big.json");
    let (took, peak_mib) = peak_of(&["sessions", "export", "big", "--output"], &output, &db);
    let exported = std::fs::metadata(&output).unwrap().len();
    // The export back under another id: read a record at a time, staged
    // in a temporary file, inserted a page at a time in one transaction.
    let (import_took, import_peak_mib) =
        peak_of(&["sessions", "import", "--as", "copy"], &output, &db);
    let copied = SqliteStore::open(&db)
        .unwrap()
        .list(None)
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.session_id == "copy")
        .map_or(0, |s| s.records);
    assert_eq!(copied, count, "the import is the whole session");

    // A session of as many bytes made of real calls: the context probe's
    // `read` of one 64 KiB key name (its arguments, and its result naming
    // the key missing), then replayed whole against the same component.
    let probe = component("wasm32-wasip2/release/context_probe.wasm");
    let calls = count / 2;
    {
        let host = b.host(std::slice::from_ref(&probe)).await;
        let store: Arc<dyn SessionStore> =
            Arc::new(SqliteStore::open_with(&db, Durability::Never).unwrap());
        let options = SessionOptions {
            session_id: Some("calls".into()),
            ..SessionOptions::default()
        };
        let mut session = Session::open(store, options, &ContextRules::default())
            .await
            .unwrap();
        let key = "k".repeat(RECORD_BYTES);
        let read = ToolCall::new("read", serde_json::json!({ "keys": [key] }).to_string());
        for _ in 0..calls {
            session
                .call(&host, &read, &CancelToken::new(), None)
                .await
                .unwrap();
        }
        session.close().await.unwrap();
    }
    let tool = format!("read={}", probe.display());
    let (replay_took, replay_peak_mib) =
        peak_of(&["replay", "calls", "--tool", &tool, "--store"], &db, &db);
    writeln!(
        out,
        "`airlock sessions export` (release build) of one session of {count} records of {} KiB each ({} MiB of messages), \
         from SQLite to a file (the export holds each message twice: in the journal and in the conversation), then `airlock sessions import` of that file \
         into the same store under another id; the peak resident memory of each (`VmHWM`, read every 5 ms while it runs).\n",
        RECORD_BYTES >> 10,
        total >> 20
    )
    .unwrap();
    writeln!(
        out,
        "| command | file | took | peak resident memory | target ≤ {TARGET_MIB} MiB |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|---|").unwrap();
    let gib = exported as f64 / f64::from(1u32 << 30);
    for (command, took, peak_mib) in [
        ("export", took, peak_mib),
        ("import", import_took, import_peak_mib),
    ] {
        writeln!(
            out,
            "| {command} | {gib:.2} GiB | {:.1} s | {peak_mib} MiB | {} |",
            took.as_secs_f64(),
            verdict(peak_mib <= TARGET_MIB)
        )
        .unwrap();
    }
    writeln!(
        out,
        "\n`airlock replay` (release build) of a session of {calls} real calls of the context \
         probe's `read` (each call's arguments and result hold one {} KiB key name: {} MiB of \
         journal), against the component that made them: every call run again and compared, the \
         journal read a page at a time.\n\n\
         | command | calls | took | peak resident memory | target ≤ {TARGET_MIB} MiB |\n\
         |---|---|---|---|---|\n\
         | replay | {calls} | {:.1} s | {replay_peak_mib} MiB | {} |\n",
        RECORD_BYTES >> 10,
        total >> 20,
        replay_took.as_secs_f64(),
        verdict(replay_peak_mib <= TARGET_MIB)
    )
    .unwrap();
}

/// Runs `airlock ARGS FILE --store DB` (release build); how long it took
/// and its peak resident memory in MiB. (An `ARGS` ending in `--store`
/// names the store as `FILE`.)
fn peak_of(args: &[&str], file: &Path, db: &Path) -> (Duration, u64) {
    let started = Instant::now();
    let mut command = Command::new(env!("CARGO_BIN_EXE_airlock"));
    command.args(args).arg(file);
    if args.last() != Some(&"--store") {
        command.arg("--store").arg(db);
    }
    let mut child = command
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // VmHWM is the peak so far: the last reading before the process ends
    // is its peak, short of what it allocates in its last 5 ms.
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        peak = peak.max(peak_kib(child.id()));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(child.wait().unwrap().success(), "airlock {args:?} failed");
    (started.elapsed(), peak / 1024)
}
