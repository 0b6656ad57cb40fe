//! Bad input gets a clear, typed error and loses nothing: unknown tools,
//! bad arguments, files that are not components.

use airlock::{CallError, CompileCache, Host, LoadError, RunContext, ToolCall};
use serde_json::json;

use crate::support::{
    HOST_TOOLS, airlock, assert_host_still_serves, cache_dir, call, guest, host, snapshot,
};

#[tokio::test]
async fn unknown_tool_lists_the_available_ones() {
    let host = host().await;
    let mut ctx = RunContext::from_value(json!({"counters": {"x": 1}})).unwrap();
    let before = snapshot(&ctx);
    let err = call(host, &mut ctx, "incremnt", json!({}))
        .await
        .unwrap_err();
    let CallError::UnknownTool { name, available } = &err else {
        panic!("expected unknown_tool, got {err}");
    };
    assert_eq!(name, "incremnt");
    assert_eq!(available, &HOST_TOOLS);
    assert!(
        err.to_string()
            .contains("available: add_note, apply, derive, increment"),
        "{err}"
    );
    assert_eq!(err.kind(), airlock::ErrorKind::UnknownTool);
    assert_host_still_serves(host, &mut ctx, &before).await;
}

#[tokio::test]
async fn arguments_must_be_a_json_object() {
    let host = host().await;
    let mut ctx = RunContext::from_value(json!({"k": [1]})).unwrap();
    let before = snapshot(&ctx);
    for bad in ["{\"name\": ", "not json", "[1, 2]", "\"vowels\"", ""] {
        let err = host
            .call(&mut ctx, &ToolCall::new("increment", bad))
            .await
            .unwrap_err();
        assert!(
            matches!(err.error, CallError::BadArguments(_)),
            "{bad:?}: {err}"
        );
        assert_eq!(err.kind(), airlock::ErrorKind::InvalidArgs);
        assert!(err.output.is_empty(), "the tool never ran");
    }
    assert_host_still_serves(host, &mut ctx, &before).await;
}

async fn load_error(bytes: &[u8], name: &str) -> LoadError {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    let mut host = Host::builder()
        .cache(CompileCache::in_dir(cache_dir()))
        .max_concurrent_calls(4)
        .build()
        .unwrap();
    let err = host.load(&path).await.unwrap_err();
    assert!(
        err.to_string().contains(name),
        "the error names the file: {err}"
    );
    // The host is still usable after a failed load.
    host.load(guest("stateful")).await.unwrap();
    let mut ctx = RunContext::default();
    host.call(&mut ctx, &ToolCall::new("increment", r#"{"name":"a"}"#))
        .await
        .unwrap();
    err
}

#[tokio::test]
async fn files_that_are_not_components_are_refused_clearly() {
    let err = load_error(b"hello, I am a text file", "notes.txt").await;
    assert!(matches!(err, LoadError::NotWasm { .. }), "{err}");

    // A core module (wasm32-wasip1 output, say) is not a component.
    let err = load_error(b"\0asm\x01\0\0\0", "core.wasm").await;
    assert!(matches!(err, LoadError::CoreModule { .. }), "{err}");
    assert!(err.to_string().contains("wasm32-wasip2"), "{err}");
    // So is one written as text, after its comments.
    let text = b";; a core module\n(; block ;)\n  (module (func (export \"f\")))";
    let err = load_error(text, "core.wat").await;
    assert!(matches!(err, LoadError::CoreModule { .. }), "{err}");

    let err = load_error(
        b"\0asm\x0d\0\x01\0garbage that is not a section",
        "broken.wasm",
    )
    .await;
    assert!(matches!(err, LoadError::Invalid { .. }), "{err}");

    let err = load_error(b"(component", "truncated.wat").await;
    assert!(matches!(err, LoadError::Invalid { .. }), "{err}");

    // A valid component that offers no tool.
    let err = load_error(b"(component)", "empty.wat").await;
    assert!(matches!(err, LoadError::NoTools { .. }), "{err}");

    // One that imports what this host does not provide: named.
    let err = load_error(
        b"(component (import \"acme:missing/thing\" (func)))",
        "imports.wat",
    )
    .await;
    assert!(matches!(err, LoadError::Incompatible { .. }), "{err}");
    assert!(err.to_string().contains("acme:missing/thing"), "{err}");
}

/// `airlock ARGS`, which must end within a minute (a command that reads
/// without end fails the test).
fn airlock_within_a_minute(args: &[&str]) -> std::process::Output {
    let mut child = crate::support::airlock_command(args, &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("airlock {args:?} did not end");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// A file named where a component, a policy, a model script or a TLS
/// certificate belongs that never ends (`/dev/zero`), or a sparse file of terabytes, is
/// refused, naming it, having read at most the bound (1 GiB for a
/// component, 16 MiB for the rest): `/dev/zero` as a component took the
/// process past 9 GB in 7 s. A directory is refused as such. A pipe that
/// ends, as `--config <(command)` gives, is read as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_that_never_end_or_are_too_large_are_refused_within_their_bound() {
    let dir = tempfile::tempdir().unwrap();
    let sparse = dir.path().join("huge.wasm");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(2 << 40)
        .unwrap();
    let sparse = sparse.to_str().unwrap();
    let endless = "more than the 1073741824 bytes this reads";
    let too_large = "2199023255552 bytes, more than the 1073741824 bytes this reads";
    let mut host = Host::builder()
        .cache(CompileCache::in_dir(cache_dir()))
        .build()
        .unwrap();
    let directory = dir.path().to_str().unwrap();
    for (path, says) in [
        ("/dev/zero", endless),
        (sparse, too_large),
        (directory, "Is a directory"),
    ] {
        let err = host.load(path).await.unwrap_err();
        assert!(matches!(err, LoadError::Read { .. }), "{err}");
        let said = err.to_string();
        assert!(
            said.starts_with(&format!("{path}: cannot read: ")),
            "{said}"
        );
        assert!(said.contains(says), "{said}");
    }
    assert!(host.tool_names().is_empty());

    let stateful = guest("stateful");
    let stateful = stateful.to_str().unwrap();
    let args = r#"{"name":"n"}"#;
    let settings = "more than the 16777216 bytes this reads";
    for (command, path, says) in [
        (vec!["inspect", "/dev/zero"], "/dev/zero", endless),
        (vec!["inspect", sparse], sparse, too_large),
        (
            vec!["call", stateful, "increment", args, "--config", "/dev/zero"],
            "/dev/zero",
            settings,
        ),
        (
            vec!["run", "hello", "--tool", stateful, "--script", "/dev/zero"],
            "/dev/zero",
            settings,
        ),
        (
            vec![
                "mcp",
                "--transport",
                "http",
                "--listen",
                "127.0.0.1:0",
                "--tool",
                stateful,
                "--tls-cert",
                "/dev/zero",
                "--tls-key",
                "/dev/zero",
            ],
            "/dev/zero",
            settings,
        ),
    ] {
        let out = airlock_within_a_minute(&command);
        assert_eq!(out.status.code(), Some(2), "{command:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains(&format!("{path}: cannot read: ")),
            "{command:?}: {said}"
        );
        assert!(said.contains(says), "{command:?}: {said}");
    }

    // A policy through a pipe that ends.
    let pipe = dir.path().join("policy.toml");
    crate::support::named_pipe(&pipe);
    let policy = format!("[[tool]]\npath = {stateful:?}\n");
    let writer = {
        let pipe = pipe.clone();
        std::thread::spawn(move || std::fs::write(pipe, policy).unwrap())
    };
    let pipe = pipe.to_str().unwrap();
    let out = airlock_within_a_minute(&["call", stateful, "increment", args, "--config", pipe]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    writer.join().unwrap();
}

/// A session store is a file: one that names a pipe or a directory is
/// refused as bad input (exit 2), naming the store and what it is, and
/// nothing is made beside it. SQLite given one failed with "disk I/O
/// error" (exit 3) after writing its journal next to it (as root,
/// `--store /dev/zero` made `/dev/zero-journal`). A link to a store is
/// a store.
#[test]
fn a_store_that_is_not_a_file_is_refused_and_nothing_is_made_beside_it() {
    use airlock::session::{SqliteStore, StoreError};
    let dir = tempfile::tempdir().unwrap();
    let pipe = dir.path().join("pipe.db");
    crate::support::named_pipe(&pipe);
    let folder = dir.path().join("folder.db");
    std::fs::create_dir(&folder).unwrap();
    let stateful = guest("stateful");
    let increment = [
        "call",
        stateful.to_str().unwrap(),
        "increment",
        r#"{"name":"n"}"#,
        "--session",
        "s",
    ];
    for (store, kind) in [(&pipe, "a named pipe"), (&folder, "a directory")] {
        let err = SqliteStore::open(store).unwrap_err();
        assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
        let named = store.to_str().unwrap();
        for command in [
            vec!["sessions", "list", "--store", named],
            [&increment[..], &["--store", named]].concat(),
        ] {
            let out = airlock_within_a_minute(&command);
            assert_eq!(out.status.code(), Some(2), "{command:?}");
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(
                said.contains(&format!(
                    "sqlite:{named}: not a session store this Airlock can use: it is {kind}, \
                     not a file"
                )),
                "{command:?}: {said}"
            );
        }
    }
    let mut left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, ["folder.db", "pipe.db"]);
    assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 0);

    // A symbolic link to a store opens the store it names.
    let real = dir.path().join("real.db");
    let link = dir.path().join("link.db");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let out = airlock(&[&increment[..], &["--store", link.to_str().unwrap()]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(real.is_file() && link.is_symlink());

    // A file where the store's directory should be is the name's fault
    // too, whether the store is named or the default one.
    let in_the_way = dir.path().join("in-the-way");
    std::fs::write(&in_the_way, "").unwrap();
    let under = in_the_way.join("sessions.db");
    let err = SqliteStore::open(&under).unwrap_err();
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
    let out = airlock(&["sessions", "list", "--store", under.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("{} is not a directory", in_the_way.display())),
        "{said}"
    );
    let out = crate::support::airlock_with_env(
        &increment,
        &[("AIRLOCK_DATA_DIR", in_the_way.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("cannot create {}", in_the_way.display())),
        "{said}"
    );
    assert!(in_the_way.is_file());
}

#[tokio::test]
async fn missing_file_names_the_path() {
    let mut host = Host::builder()
        .cache(CompileCache::in_dir(cache_dir()))
        .max_concurrent_calls(4)
        .build()
        .unwrap();
    let err = host.load("/nonexistent/tool.wasm").await.unwrap_err();
    assert!(matches!(err, LoadError::Read { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("/nonexistent/tool.wasm: cannot read"),
        "{err}"
    );
}

#[tokio::test]
async fn the_same_tool_name_cannot_be_loaded_twice() {
    let mut host = Host::builder()
        .cache(CompileCache::in_dir(cache_dir()))
        .max_concurrent_calls(4)
        .build()
        .unwrap();
    host.load(guest("stateful")).await.unwrap();
    let err = host.load(guest("stateful")).await.unwrap_err();
    assert!(matches!(err, LoadError::DuplicateTool { .. }), "{err}");
    assert_eq!(host.tool_names(), ["add_note", "increment", "show_state"]);
}
