//! §20 Durable calls by what they can lose: a read-only call (a plain
//! component reading a file its policy grants read-only) over MCP stdio,
//! its session store on disk beside the same on tmpfs, where waiting for
//! the disk costs nothing. Under the default `by-effect` such a call does
//! not wait for the disk; under `every-call` it does; a state change waits
//! under both.

use std::fmt::Write as _;
use std::path::Path;

use crate::harness::{Bench, batch, component, root};
use crate::mcp_round_trip::Minimal;

const READ: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"read-text","arguments":{"path":"/data/note.txt"}}}"#;
const INCREMENT: &str = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"increment","arguments":{"name":"n"}}}"#;

/// Where tmpfs is on Linux.
const TMPFS: &str = "/dev/shm";

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(
        out,
        "## 20. Durable calls by what they can lose\n\n\
         `airlock mcp` over stdio (release build), called by the minimal client of §8 one call \
         at a time: `read-text` of the plain `reach` example on a file its policy grants \
         read-only (`dirs = [{{ mode = \"ro\" }}]`), and `increment` of the stateful example. \
         Each side's session store is a SQLite file on this machine's disk, paired with the same \
         on tmpfs ({TMPFS}), where waiting for the disk costs nothing; batches of 20 calls \
         alternate (31 pairs). Under `[sessions] sync = \"by-effect\"` (the default) the \
         read-only call's record does not wait for the disk; under `\"every-call\"` it does; \
         `increment` changes deps and waits under both.\n"
    )
    .unwrap();
    if !Path::new(TMPFS).is_dir() {
        writeln!(out, "Not measured: no {TMPFS} on this machine.\n").unwrap();
        return;
    }
    let disk = tempfile::tempdir_in(root().join("target")).unwrap();
    let memory = tempfile::tempdir_in(TMPFS).unwrap();
    let policy = disk.path().join("airlock.toml");
    std::fs::create_dir(disk.path().join("data")).unwrap();
    std::fs::write(disk.path().join("data/note.txt"), "a small granted file\n").unwrap();
    std::fs::write(
        &policy,
        format!(
            "[[tool]]\npath = {:?}\ndirs = [{{ host = \"data\", guest = \"/data\", mode = \"ro\" }}]\n\n\
             [[tool]]\npath = {:?}\n",
            component("wasm32-wasip2/release/reach.wasm"),
            component("wasm32-wasip2/release/stateful.wasm"),
        ),
    )
    .unwrap();
    let server = async |dir: &Path, sync: &str| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_airlock"));
        command
            .args(["mcp", "--session", "bench", "--config"])
            .arg(&policy)
            .arg("--store")
            .arg(dir.join(format!("{sync}.db")))
            .env("AIRLOCK_CACHE_DIR", &b.cache)
            .env("AIRLOCK_STORE_SYNC", sync)
            .env_remove("RUST_LOG");
        Minimal::stdio(command).await
    };
    let pairs = if b.quick { 5 } else { 31 };
    let size = if b.quick { 5 } else { 20 };
    let mut rows = String::new();
    for (what, call, sync, target) in [
        (
            "a read-only call, `by-effect`",
            READ,
            "by-effect",
            Some(1.1),
        ),
        ("a read-only call, `every-call`", READ, "every-call", None),
        (
            "a state change (`increment`), `by-effect`",
            INCREMENT,
            "by-effect",
            None,
        ),
    ] {
        let (mut on_disk, mut in_memory) = (
            server(disk.path(), sync).await,
            server(memory.path(), sync).await,
        );
        let measured = b
            .paired(
                &format!("{what}: store on disk / on tmpfs, MCP stdio"),
                pairs,
                async || {
                    batch(size, async || {
                        on_disk.request(call).await;
                    })
                    .await
                },
                async || {
                    batch(size, async || {
                        in_memory.request(call).await;
                    })
                    .await
                },
            )
            .await;
        let (aim, verdict) = match target {
            Some(t) => (format!("≤ {t}×"), measured.at_most(t)),
            None => ("—".to_owned(), ""),
        };
        writeln!(
            rows,
            "{} | {aim} | {verdict} |",
            measured.row(what).trim_end_matches(" |")
        )
        .unwrap();
    }
    writeln!(
        out,
        "| call | store on disk | on tmpfs | ratio | target | |\n|---|---|---|---|---|---|\n{rows}"
    )
    .unwrap();
    writeln!(
        out,
        "What is left between disk and tmpfs for the read-only call is SQLite writing its log \
         to the page cache of a real file system rather than to memory; what `every-call` adds \
         is the disk's flush, which a call that changed nothing and reached nothing no longer \
         waits for (a crash of the process loses none of it; docs/security.md, \"What a crash \
         can lose\").\n"
    )
    .unwrap();
}
