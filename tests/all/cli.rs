//! The `airlock` binary: output formats, exit codes, one-line errors.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{Value, json};

use crate::support::PROMPT;
use crate::support::{airlock, airlock_with_env, guest, root};

fn stdout_json(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {text}"))
}

/// Asserts that the command was refused (exit 2) saying `needle`.
fn refused(out: &Output, needle: &str) {
    assert_eq!(out.status.code(), Some(2), "{}", stderr(out));
    assert!(stderr(out).contains(needle), "{}", stderr(out));
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

#[test]
fn call_json_prints_the_result_ops_and_new_deps() {
    let stateful = guest("stateful");
    let out = airlock(&[
        "call",
        path(&stateful),
        "increment",
        r#"{"name":"vowels"}"#,
        "--deps",
        r#"{"counters":{"vowels":2},"other":true}"#,
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc = stdout_json(&out);
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["result"], json!({"counter": "vowels", "value": 3}));
    assert_eq!(
        doc["ops"],
        json!([{"op": "set", "key": "counters", "value": {"vowels": 3}}])
    );
    assert_eq!(
        doc["deps"],
        json!({"counters": {"vowels": 3}, "other": true})
    );
}

/// `out` is an `unknown_tool` failure (exit 2, as JSON) whose message
/// names `listed` among the tools there are; its document.
fn assert_unknown_tool(out: &Output, listed: &str) -> Value {
    assert_eq!(out.status.code(), Some(2), "{}", stderr(out));
    let doc = stdout_json(out);
    assert_eq!(doc["error"]["kind"], "unknown_tool");
    let message = doc["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(listed), "{doc}");
    doc
}

#[test]
fn call_json_failure_keeps_deps_and_exits_non_zero() {
    let stateful = guest("stateful");
    let deps = r#"{"notes":"a string"}"#;
    let out = airlock(&[
        "call",
        path(&stateful),
        "add_note",
        r#"{"text":"x"}"#,
        "--deps",
        deps,
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let doc = stdout_json(&out);
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["error"]["kind"], "op_rejected");
    assert!(doc["error"]["message"].as_str().unwrap().contains("notes"));
    assert_eq!(doc["deps"], json!({"notes": "a string"}));

    let out = airlock(&[
        "call",
        path(&stateful),
        "nope",
        "{}",
        "--deps",
        deps,
        "--json",
    ]);
    let doc = assert_unknown_tool(&out, "increment");
    assert_eq!(doc["deps"], json!({"notes": "a string"}));
}

/// A file a command writes (`sessions export --output`, `--save-deps`)
/// goes where a symbolic link points (the file it names replaced whole,
/// the link kept), and into a pipe as it is: `--output /dev/stdout` once
/// replaced this machine's `/dev/stdout` link with a regular file, and a
/// named pipe was swapped for one.
#[test]
fn outputs_go_where_links_point_and_into_pipes_never_over_them() {
    use std::os::unix::fs::FileTypeExt as _;
    let stateful = guest("stateful");
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    std::fs::create_dir(dir.path().join("real")).unwrap();
    let link = |name: &str| {
        let link = dir.path().join(format!("{name}-link.json"));
        std::os::unix::fs::symlink(format!("real/{name}.json"), &link).unwrap();
        link
    };
    let (deps_link, export_link) = (link("deps"), link("export"));
    let out = airlock(&[
        "call",
        path(&stateful),
        "increment",
        r#"{"name":"n"}"#,
        "--session",
        "demo",
        "--store",
        path(&store),
        "--save-deps",
        path(&deps_link),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let export = |to: &Path| {
        airlock(&[
            "sessions",
            "export",
            "demo",
            "--store",
            path(&store),
            "--output",
            path(to),
        ])
    };
    let out = export(&export_link);
    assert!(out.status.success(), "{}", stderr(&out));
    for (link, name) in [(&deps_link, "deps"), (&export_link, "export")] {
        let kind = std::fs::symlink_metadata(link).unwrap().file_type();
        assert!(kind.is_symlink(), "{name}: the link was replaced");
    }
    let read = |name: &str| -> Value {
        let text = std::fs::read_to_string(dir.path().join("real").join(name)).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    assert_eq!(read("deps.json"), json!({"counters": {"n": 1}}));
    assert_eq!(read("export.json")["session_id"], "demo");

    let pipe = dir.path().join("pipe");
    crate::support::named_pipe(&pipe);
    let reader = {
        let pipe = pipe.clone();
        std::thread::spawn(move || std::fs::read_to_string(pipe).unwrap())
    };
    let out = export(&pipe);
    assert!(out.status.success(), "{}", stderr(&out));
    // Checked first: a reader of a pipe replaced would wait for good.
    let kind = std::fs::symlink_metadata(&pipe).unwrap().file_type();
    assert!(kind.is_fifo(), "the pipe was replaced");
    let heard: Value = serde_json::from_str(&reader.join().unwrap()).unwrap();
    assert_eq!(heard["session_id"], "demo");
}

#[test]
fn call_text_output_and_save_deps_carry_state_between_calls() {
    let stateful = guest("stateful");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    std::fs::write(&state, "{}").unwrap();
    for _ in 0..3 {
        let out = airlock(&[
            "call",
            path(&stateful),
            "increment",
            r#"{"name":"vowels"}"#,
            "--deps",
            path(&state),
            "--save-deps",
            path(&state),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = airlock(&[
        "call",
        path(&stateful),
        "show_state",
        "{}",
        "--deps",
        path(&state),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(r#"result: {"counters":{"vowels":3},"notes":[]}"#),
        "{text}"
    );
    assert!(text.contains("ops:    none"), "{text}");
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(saved, json!({"counters": {"vowels": 3}}));

    // A directory is refused before the call runs: its session is not
    // even made.
    let db = dir.path().join("s.db");
    for target in [
        format!("{}/", dir.path().display()),
        path(dir.path()).to_owned(),
    ] {
        let out = airlock(&[
            "call",
            path(&stateful),
            "increment",
            r#"{"name":"vowels"}"#,
            "--session",
            "d",
            "--store",
            path(&db),
            "--save-deps",
            &target,
        ]);
        assert_input_error(&out, "names a directory, not a file");
        assert!(stderr(&out).contains(&format!("--save-deps {target}")));
    }
    assert!(!db.exists(), "nothing ran");
}

/// Arguments default to `{}` (issue 31.4): a tool that takes none is
/// called without them, and a required one left out is named by the
/// tool's schema.
#[test]
fn call_without_arguments_passes_an_empty_object() {
    let stateful = guest("stateful");
    let out = airlock(&["call", path(&stateful), "show_state", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout_json(&out)["result"],
        json!({"counters": {}, "notes": []})
    );
    let out = airlock(&["call", path(&stateful), "increment"]);
    assert_input_error(&out, "\"name\" is a required property");
}

/// A process that may map only so much (`RLIMIT_AS`, `ulimit -v`) gets an
/// instance pool that fits beside 2 GiB for the rest of it, says so, and
/// serves its call, the pool mapping what the host reckons it does; one
/// that may not map a pool of even one call is told what the limit is and
/// what to raise it to, and runs nothing.
#[test]
fn a_pool_is_fitted_to_the_address_space_the_process_may_map() {
    use std::io::BufRead;
    const GIB: u64 = 1 << 30;
    let stateful = guest("stateful");
    // `airlock ARGS` as a process that may map `gib` GiB: the limit set by
    // the shell that then becomes the binary.
    let limited = |gib: u64, args: &[&str]| {
        let mut shell = std::process::Command::new("sh");
        shell
            .args(["-c", r#"ulimit -v "$1" && shift && exec "$@""#, "sh"])
            .arg((gib * GIB / 1024).to_string());
        crate::support::airlock_through(shell, args, &[])
    };
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    let call = [
        "call",
        path(&stateful),
        "increment",
        r#"{"name": "n"}"#,
        "--session",
        "s",
        "--store",
        path(&store),
        "--json",
    ];
    // Refused: nothing runs, nothing is stored.
    let out = limited(8, &call).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let error = &stdout_json(&out)["error"];
    assert_eq!(error["kind"], "address_space");
    let said = error["message"].as_str().unwrap();
    assert!(
        said.contains("this process may map 8.0 GiB (RLIMIT_AS, `ulimit -v`)")
            && said.contains("raise the limit to at least 18.2 GiB"),
        "{said}"
    );
    assert!(!store.exists(), "nothing ran, nothing stored");
    // `airlock call` has two engines (the baseline compiler's for a first
    // use): 16.2 GiB a call, so 40 GiB less 2 holds two calls.
    let out = limited(40, &call).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout_json(&out)["result"],
        json!({"counter": "n", "value": 1})
    );
    let said = stderr(&out);
    assert!(
        said.contains("the instance pool holds fewer calls at once")
            && said.contains("calls=2")
            && said.contains("wanted=1000")
            && said.contains("40.0 GiB"),
        "{said}"
    );
    // The pool maps what `reserved_per_call` says it does (wasmtime's own
    // defaults among it): a server (one engine) under the same limit holds
    // four calls, and maps their reservation and less than the headroom
    // beside it.
    let mut server = limited(
        40,
        &[
            "mcp",
            "--transport",
            "stdio",
            "--tool",
            path(&stateful),
            "--store",
            path(&store),
        ],
    )
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let said: Vec<String> = std::io::BufReader::new(server.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .take_while(|line| !line.contains("serving"))
        .collect();
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.id()));
    let _ = server.kill();
    let _ = server.wait();
    let mapped: u64 = status
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("VmSize:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmSize")
        * 1024;
    assert!(said.concat().contains("calls=4"), "{said:?}");
    let pool = 4 * airlock::sandbox::reserved_per_call(&Default::default());
    assert!(
        (pool..pool + airlock::sandbox::ADDRESS_SPACE_HEADROOM).contains(&mapped),
        "mapped {mapped} bytes, the pool {pool}"
    );
}

/// `RUST_LOG=debug` is Airlock's debug output, not wasmtime's internals;
/// a filter that names its targets is taken as written (issue 31.17).
#[test]
fn a_bare_log_level_is_airlocks_own() {
    let stateful = guest("stateful");
    let targets = |filter: &str| {
        let out = crate::support::airlock_with_env(
            &["call", path(&stateful), "show_state"],
            &[("RUST_LOG", filter)],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        stderr(&out)
    };
    let debug = targets("debug");
    assert!(debug.contains("airlock::"), "{debug}");
    assert!(!debug.contains("wasmtime"), "{debug}");
    let wasmtime = targets("wasmtime=debug");
    assert!(wasmtime.contains("wasmtime::"), "{wasmtime}");
    assert!(!wasmtime.contains("airlock::"), "{wasmtime}");
}

/// A policy that does not list the component: nothing said when it lists
/// no tool at all; one plain line when it lists others (issue 31.14).
#[test]
fn an_unlisted_component_is_noted_only_when_the_policy_lists_others() {
    let stateful = guest("stateful");
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    let out = airlock(&[
        "call",
        path(&stateful),
        "show_state",
        "--config",
        path(&empty),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");

    let other = dir.path().join("other.toml");
    let hostile = guest("hostile");
    std::fs::write(&other, format!("[[tool]]\npath = {:?}\n", path(&hostile))).unwrap();
    let out = airlock(&[
        "call",
        path(&stateful),
        "show_state",
        "--config",
        path(&other),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("airlock: "), "{err}");
    assert!(
        err.contains("does not list") && !err.contains("WARN"),
        "{err}"
    );
}

/// A call on a stored session says which session in which store, in text
/// and in `--json`, failed or not (issue 31.2).
#[test]
fn call_on_a_session_names_the_session_and_its_store() {
    let stateful = guest("stateful");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("named.db");
    let call = |args: &str, json: bool| {
        let mut all = vec![
            "call",
            path(&stateful),
            "add_note",
            args,
            "--session",
            "named",
        ];
        all.extend(["--store", path(&db)]);
        if json {
            all.push("--json");
        }
        airlock(&all)
    };
    let out = call(r#"{"text":"x"}"#, false);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.ends_with(&format!(
            "stored: session named in sqlite:{}\n",
            db.display()
        )),
        "{text}"
    );
    let out = call(r#"{"text":"y"}"#, true);
    let doc = stdout_json(&out);
    assert_eq!(doc["session_id"], "named");
    assert_eq!(doc["store"], format!("sqlite:{}", db.display()));
    let out = call(r#"{"text":7}"#, true);
    assert!(!out.status.success());
    let doc = stdout_json(&out);
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["session_id"], "named");
    // The store as the last line named it is a store to give back, and
    // it is the same one: both notes are there.
    let named = format!("sqlite:{}", db.display());
    let shown = airlock(&["sessions", "show", "named", "--store", &named, "--json"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    assert_eq!(stdout_json(&shown)["deps"]["notes"], json!(["x", "y"]));
    let out = airlock(&["sessions", "list", "--store", "sqlite:"]);
    assert_input_error(&out, r#"--store "sqlite:" names no file"#);
}

/// A second run on a session prints its own usage, and the session's
/// totals on a line of their own (issue 31.6).
#[test]
fn a_resumed_run_prints_its_own_usage_and_the_sessions_total() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    let run = |json: bool| {
        let mut args = vec!["--session", "u", "--store", path(&db)];
        if json {
            args.push("--json");
        }
        run_demo(&args)
    };
    let first = run(false);
    assert!(first.status.success(), "{}", stderr(&first));
    let text = String::from_utf8_lossy(&first.stdout).into_owned();
    assert!(
        text.ends_with("usage:  4 requests, 5 tool calls, 2163 input + 124 output tokens\n"),
        "{text}"
    );
    let second = run(false);
    let text = String::from_utf8_lossy(&second.stdout).into_owned();
    assert!(
        text.ends_with(
            "usage:  4 requests, 5 tool calls, 2163 input + 124 output tokens\n\
             session usage, every run: 8 requests, 10 tool calls, 4326 input + 248 output tokens\n"
        ),
        "{text}"
    );
    let third = stdout_json(&run(true));
    assert_eq!(third["usage"]["requests"], 4);
    assert_eq!(third["session_usage"]["requests"], 12);
}

/// A missing session is named with its user and store; an import that
/// collides says how out, and `--as` is that way (issue 31.13).
#[test]
fn session_errors_name_the_user_and_store_and_an_import_can_take_another_id() {
    let stateful = guest("stateful");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("named.db");
    let store = format!("sqlite:{}", db.display());
    let with_store = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--store", path(&db)]);
        airlock(&all)
    };
    let out = with_store(&["sessions", "show", "demo", "--user", "bob"]);
    assert_input_error(
        &out,
        &format!("no session demo (of user \"bob\") in {store}"),
    );

    let out = with_store(&[
        "call",
        path(&stateful),
        "add_note",
        r#"{"text":"x"}"#,
        "--session",
        "demo",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // An id no session could have is refused as such, and `rm` removes
    // none of the sessions it names then.
    for args in [
        vec!["sessions", "show", ""],
        vec!["sessions", "export", "a/b"],
        vec!["sessions", "fork", "a b", "--at", "1"],
        vec!["sessions", "rm", "demo", "a/b"],
    ] {
        let out = with_store(&args);
        assert_input_error(&out, "invalid session id: ");
        let bad = args[2..]
            .iter()
            .find(|a| a.is_empty() || a.contains(['/', ' ']));
        assert!(
            stderr(&out).contains(&format!("{:?}", bad.unwrap())),
            "{}",
            stderr(&out)
        );
    }
    let out = with_store(&["sessions", "show", "demo"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let file = dir.path().join("demo.json");
    let out = with_store(&["sessions", "export", "demo", "--output", path(&file)]);
    assert!(out.status.success(), "{}", stderr(&out));
    for into in [
        format!("{}/", dir.path().display()),
        format!("{}/.", dir.path().display()),
    ] {
        let out = with_store(&["sessions", "export", "demo", "--output", &into]);
        assert_input_error(
            &out,
            &format!("--output {into}: names a directory, not a file"),
        );
    }
    let out = with_store(&["sessions", "import", path(&file)]);
    assert_input_error(&out, "--as NEW_ID");
    assert!(stderr(&out).contains(&format!(
        "session demo already exists (with no user) in {store}"
    )));
    let out = with_store(&["sessions", "import", path(&file), "--as", "copy", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let imported = stdout_json(&out);
    assert_eq!(imported["session_id"], "copy");
    let listed = stdout_json(&with_store(&["sessions", "list", "--json"]));
    let records = |id: &str| {
        listed["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["session_id"] == id)
            .map(|s| s["records"].clone())
    };
    assert_eq!(records("copy"), records("demo"));
    assert_eq!(Some(imported["records"].clone()), records("demo"));
    let out = with_store(&["sessions", "show", "copy", "--json"]);
    assert_eq!(stdout_json(&out)["deps"], json!({"notes": ["x"]}));

    // From standard input (`-`), and a broken document there named as `-`.
    let piped = |input: std::fs::File, id: &str| {
        crate::support::airlock_command(
            &["sessions", "import", "-", "--as", id, "--store", path(&db)],
            &[],
        )
        .stdin(input)
        .output()
        .unwrap()
    };
    let out = piped(std::fs::File::open(&file).unwrap(), "piped");
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.starts_with("imported piped ("), "{said}");
    let out = with_store(&["sessions", "show", "piped", "--json"]);
    assert_eq!(stdout_json(&out)["deps"], json!({"notes": ["x"]}));
    let broken = dir.path().join("broken.json");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&broken, &text[..text.len() / 2]).unwrap();
    let out = piped(std::fs::File::open(&broken).unwrap(), "broken");
    assert_input_error(
        &out,
        "standard input: invalid session file: EOF while parsing",
    );
    let out = with_store(&["sessions", "show", "broken"]);
    assert!(!out.status.success());
}

/// A store in a directory that does not exist is an error, not a new
/// tree (issue 31.1); the default location is made when missing.
#[test]
fn a_store_in_a_missing_directory_is_refused() {
    let stateful = guest("stateful");
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/dir/s.db");
    let out = airlock(&[
        "call",
        path(&stateful),
        "show_state",
        "--session",
        "s",
        "--store",
        path(&missing),
    ]);
    assert_input_error(&out, "does not exist; create it first");
    assert!(!dir.path().join("no").exists(), "nothing was created");
    let out = airlock(&["sessions", "list", "--store", path(&missing)]);
    assert_input_error(&out, "--store");

    let data = dir.path().join("fresh-data");
    let out = crate::support::airlock_with_env(
        &["call", path(&stateful), "show_state", "--session", "s"],
        &[("AIRLOCK_DATA_DIR", path(&data))],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(data.join("sessions.db").is_file());
}

/// In `dir`, a policy whose stateful tool asks for approval, and a script
/// whose first turn makes `calls` (JSON) and whose second answers.
fn asking(dir: &Path, calls: &str) -> (PathBuf, PathBuf) {
    let policy = dir.join("ask.toml");
    let tool = format!(
        "[[tool]]\npath = {:?}\napproval = \"ask\"\n",
        path(&guest("stateful"))
    );
    std::fs::write(&policy, tool).unwrap();
    let script = dir.join("script.json");
    let turns = format!(r#"{{"turns": [{{"tool_calls": {calls}}}, {{"text": "done"}}]}}"#);
    std::fs::write(&script, turns).unwrap();
    (policy, script)
}

/// A call that needs approval with no terminal to ask on stops the run
/// with exit 2 naming the flag; `--yes` approves it (issue 31.7).
#[test]
fn approval_without_a_terminal_needs_yes() {
    let stateful = guest("stateful");
    let dir = tempfile::tempdir().unwrap();
    let (policy, script) = asking(
        dir.path(),
        r#"[{"name": "increment", "arguments": {"name": "a"}}]"#,
    );
    let db = dir.path().join("ask.db");
    // With no terminal: standard input is not one.
    let without_terminal = |args: Vec<&str>, extra: &[&str]| {
        let mut args = args;
        args.extend_from_slice(extra);
        crate::support::airlock_command(&args, &[])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let run = |extra: &[&str]| {
        let args = vec!["run", "--config", path(&policy), "--script", path(&script)];
        let mut args = args;
        args.extend(["--store", path(&db), "go"]);
        without_terminal(args, extra)
    };
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("tool increment needs approval") && err.contains("--yes"),
        "{err}"
    );
    assert_eq!(err.matches("error:").count(), 1, "{err}");

    // `call` asks too, rather than run the tool unasked.
    let call = |extra: &[&str]| {
        let args = vec!["call", path(&stateful), "increment", r#"{"name":"a"}"#];
        let mut args = args;
        args.extend(["--config", path(&policy)]);
        without_terminal(args, extra)
    };
    refused(&call(&[]), "needs approval (approval = \"ask\")");
    let out = call(&["--yes", "--json"]);
    assert_eq!(stdout_json(&out)["result"]["value"], 1, "{}", stderr(&out));

    let out = run(&["--yes", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc = stdout_json(&out);
    assert_eq!(doc["answer"], "done");
    assert_eq!(doc["deps"], json!({"counters": {"a": 1}}));
}

/// `inspect` shows every grant the policy gives, imported or not, and its
/// parameters aligned (issue 31.16).
#[test]
fn inspect_shows_every_grant_aligned() {
    let fetch = guest("http_fetch");
    let config = root().join("guest-examples/airlock.toml");
    let out = airlock(&[
        "inspect",
        path(&fetch),
        "--config",
        path(&config),
        "--schemas",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in [
        "  dirs         /examples <- ",
        "  env          TZ\n",
        "  http         https://api.github.com, http://localhost:8080\n",
        "  http bounds  1048576 response bytes, 100 requests, 8 connections at once\n",
        "  approval     ask before each call\n",
        "  reruns       effectful: never run speculatively\n",
        "context: read (nothing); write (nothing)",
        "prepared: none (a tool granted files, variables, hosts or secrets",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
    // The schema's lines continue under `parameters: `.
    assert!(
        text.contains("    parameters: {\n                  \"properties\""),
        "{text}"
    );
    let out = airlock(&["inspect", path(&fetch), "--config", path(&config), "--json"]);
    let grants = &stdout_json(&out)["grants"];
    assert_eq!(grants["approval"], "ask");
    assert_eq!(grants["http_bounds"]["max_response_bytes"], 1048576);
    assert_eq!(grants["limits"]["max_write_bytes"], 128 << 20);
    // A writable directory shows what a call may write into it.
    assert!(!text.contains("dirs bounds"), "{text}");
    let writable = tempfile::tempdir().unwrap();
    let policy = writable.path().join("airlock.toml");
    std::fs::write(
        &policy,
        format!(
            "[[tool]]\npath = {:?}\ndirs = [{{ host = \".\", guest = \"/w\", mode = \"rw\" }}]\n\
             limits = {{ max_write_bytes = 65536 }}\n",
            fetch
        ),
    )
    .unwrap();
    let out = airlock(&["inspect", path(&fetch), "--config", path(&policy)]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("  dirs bounds  65536 bytes written a call\n"),
        "{text}"
    );
}

/// `--session`'s help is each command's own (issue 31.15).
#[test]
fn each_command_explains_its_own_session_flag() {
    let help = |command: &str| {
        let out = airlock(&[command, "--help"]);
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (call, run, mcp) = (help("call"), help("run"), help("mcp"));
    assert!(call.contains("Without it, nothing is stored"), "{call}");
    assert!(
        run.contains("Without it, the run starts a new session"),
        "{run}"
    );
    assert!(mcp.contains("Not for --transport http"), "{mcp}");
    for text in [&call, &run, &mcp] {
        assert!(!text.contains("`call` only"), "{text}");
    }
}

/// One clear `error:` line naming what is wrong, and exit code 2.
fn assert_input_error(out: &Output, needle: &str) {
    assert_eq!(out.status.code(), Some(2), "stderr: {}", stderr(out));
    let err = stderr(out);
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn input_errors_are_one_clear_line() {
    let stateful = guest("stateful");
    let s = path(&stateful);
    let dir = tempfile::tempdir().unwrap();
    let text_file = dir.path().join("readme.wasm");
    std::fs::write(&text_file, "not wasm").unwrap();

    assert_input_error(
        &airlock(&["call", "/no/such/tool.wasm", "x", "{}"]),
        "/no/such/tool.wasm: cannot read",
    );
    assert_input_error(
        &airlock(&["call", path(&text_file), "x", "{}"]),
        "readme.wasm: not a WebAssembly file",
    );
    assert_input_error(
        &airlock(&["call", s, "incremnt", "{}"]),
        "unknown tool \"incremnt\"; available: add_note, increment, show_state",
    );
    assert_input_error(
        &airlock(&["call", s, "increment", "{name: vowels}"]),
        "arguments are not valid JSON",
    );
    assert_input_error(
        &airlock(&["call", s, "increment", "{}", "--deps", "[1,2]"]),
        "must be a JSON object",
    );
    assert_input_error(
        &airlock(&["call", s, "increment", "{}", "--deps", "{oops"]),
        "--deps: deps are not valid JSON",
    );
    assert_input_error(
        &airlock(&["call", s, "increment", "{}", "--deps", "/no/deps.json"]),
        "--deps /no/deps.json: cannot read",
    );
}

#[test]
fn inspect_lists_tools_and_imports() {
    let stateful = guest("stateful");
    let out = airlock(&["inspect", path(&stateful), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc = stdout_json(&out);
    let names: Vec<&str> = doc["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["increment", "add_note", "show_state"]);
    assert_eq!(doc["tools"][0]["parameters"]["required"], json!(["name"]));
    let imports: Vec<&str> = doc["imports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert!(
        imports
            .iter()
            .any(|i| i.starts_with("airlock:tool/context")),
        "{imports:?}"
    );

    let out = airlock(&["inspect", path(&stateful)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("increment   Add 1 to the counter"), "{text}");
    assert!(text.contains("airlock:tool/context@0.1.2"), "{text}");
}

/// `airlock run` of the demo: the stateful tool, the vowels script, the
/// demo prompt, and `extra` flags.
fn run_demo(extra: &[&str]) -> Output {
    demo_command(extra).output().unwrap()
}

/// [`run_demo`]'s command, not yet run (its output to be redirected).
fn demo_command(extra: &[&str]) -> std::process::Command {
    let stateful = guest("stateful");
    let demo = root().join("guest-examples/scripts/vowels.json");
    let mut args = vec!["run", "--tool", path(&stateful), "--script", path(&demo)];
    args.extend_from_slice(extra);
    args.push(PROMPT);
    crate::support::airlock_command(&args, &[])
}

#[test]
fn run_json_and_events_end_as_the_demo_says() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let out = run_demo(&["--events", path(&events), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], true);
    assert!(doc["answer"].as_str().unwrap().contains("3 vowels"));
    assert_eq!(
        doc["deps"],
        json!({"counters": {"vowels": 3}, "notes": ["Vowels in 'elephant': e, e, a"]})
    );
    assert_eq!(
        doc["usage"],
        json!({"requests": 4, "tool_calls": 5, "input_tokens": 2163, "output_tokens": 124, "total_tokens": 2287})
    );
    assert_eq!(doc["iterations"], 4);
    assert!(doc["session_id"].as_str().unwrap().starts_with("sess_"));
    assert!(doc["run_id"].as_str().unwrap().starts_with("run_"));

    let lines: Vec<Value> = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let types: Vec<&str> = lines.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.iter().filter(|t| **t == "function_call").count(), 5);
    assert_eq!(types.iter().filter(|t| **t == "context_update").count(), 4);
    assert_eq!(types[0], "run_started");
    assert_eq!(types[1], "message");
    assert_eq!(types.last(), Some(&"run_ended"));
    assert!(lines.iter().all(|e| e["run_id"] == doc["run_id"]));
    assert_eq!(lines[0]["id"], "item_1");
}

#[test]
fn run_shows_each_turn_call_and_op_as_it_happens() {
    let out = run_demo(&[]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("[turn 1] call increment {\"name\":\"vowels\"}"),
        "{text}"
    );
    assert!(text.contains("ops: set counters"), "{text}");
    assert!(
        text.contains("deps:   {\"counters\":{\"vowels\":3}"),
        "{text}"
    );
    assert!(text.contains("usage:  4 requests, 5 tool calls"), "{text}");
}

#[test]
fn run_input_errors_exit_2_naming_what_is_missing() {
    let stateful = guest("stateful");
    let s = stateful.to_str().unwrap();
    let out = airlock(&["run", "--tool", s, "hello"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no model"));

    let out = airlock(&["run", "--script", "x.json", "hello"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no tools"));

    let out = airlock(&["run", "--tool", s, "--model", "nonsense", "hello"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PROVIDER:MODEL"));

    // OpenAI's API without a key: said before any request (issue 31.9).
    let out = airlock(&["run", "--tool", s, "--model", "openai:gpt-4o-mini", "hello"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("set OPENAI_API_KEY"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = airlock(&[
        "run",
        "--tool",
        s,
        "--script",
        "/no/such/script.json",
        "hello",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/script.json"));

    // A base URL no request can go to: said before the run starts, a user
    // name and password in it left out, and no session made.
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("sessions.db");
    for (model, url) in [
        ("openai:gpt-4o-mini", "localhost:8080/v1"),
        ("anthropic:claude", "ftp://ann:hunter2@models.example/"),
        ("openai:gpt-4o-mini", "ann:hunter2@localhost:8080"),
    ] {
        let out = airlock_with_env(
            &[
                "run",
                "--tool",
                s,
                "--model",
                model,
                "--base-url",
                url,
                "--store",
                path(&store),
                "hello",
            ],
            &[("OPENAI_API_KEY", "k"), ("ANTHROPIC_API_KEY", "k")],
        );
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{url}: {said}");
        assert!(
            said.contains("is not an http:// or https:// URL with a host"),
            "{url}: {said}"
        );
        assert!(!said.contains("hunter2"), "{said}");
    }
    assert!(!store.exists(), "a session was made");
}

/// What a terminal would act on: ESC, BEL, CR, the C1 CSI, a bidi override.
fn has_control_sequences(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    text.chars()
        .any(|c| matches!(c, '\x1b' | '\x07' | '\r' | '\u{9b}' | '\u{202e}'))
}

/// Issue 12 item 5: guest text reaches the terminal escaped, on every
/// channel and in every command; no line of it passes for one of the CLI's
/// own; `--json` stays exact JSON holding the exact text.
#[test]
fn guest_control_characters_never_reach_the_terminal() {
    let hostile = guest("hostile");
    let h = path(&hostile);
    let nasty = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\u{9b}31m\u{202e}\rforged";

    let out = airlock(&["call", h, "terminal_escapes", "{}"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!has_control_sequences(&out.stdout), "{:?}", out.stdout);
    let text = String::from_utf8_lossy(&out.stdout);
    for forged in ["result: forged", "derps: forged", "ops: forged"] {
        assert!(
            !text.lines().any(|l| l.starts_with(forged)),
            "{forged}: {text}"
        );
    }
    assert!(text.contains("\\u{1b}]52;c;cHduZWQ=\\u{7}"), "{text}");

    let out = airlock(&["call", h, "terminal_escapes", r#"{"fail":"yes"}"#]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!has_control_sequences(&out.stderr), "{:?}", out.stderr);
    let err = stderr(&out);
    assert_eq!(
        err.lines().filter(|l| l.starts_with("error:")).count(),
        1,
        "{err}"
    );

    let out = airlock(&["call", h, "terminal_escapes", "{}", "--json"]);
    assert!(!has_control_sequences(&out.stdout), "{:?}", out.stdout);
    let doc = stdout_json(&out);
    assert_eq!(doc["result"]["text"], nasty);
    assert!(doc["stdout"].as_str().unwrap().contains(nasty));
    assert!(doc["logs"][0]["message"].as_str().unwrap().contains(nasty));

    let out = airlock(&["inspect", h]);
    assert!(!has_control_sequences(&out.stdout), "{:?}", out.stdout);

    // The agent loop's progress lines and event log.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [{"name": "terminal_escapes", "arguments": {}}]},
            {"text": "done"}
        ]})
        .to_string(),
    )
    .unwrap();
    let events = dir.path().join("events.jsonl");
    let out = airlock(&[
        "run",
        "--tool",
        h,
        "--script",
        path(&script),
        "--events",
        path(&events),
        "go",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!has_control_sequences(&out.stdout), "{:?}", out.stdout);
    let log = std::fs::read(&events).unwrap();
    assert!(!has_control_sequences(&log));
    let text = String::from_utf8_lossy(&log);
    assert!(
        text.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .any(|event| event.to_string().contains("\\u001b]52")),
        "the event log keeps the exact text: {text}"
    );
}

/// A run that fails is told once, on stderr, with its kind; one that fails
/// before anything is journaled leaves no session, while one whose prompt
/// was journaled keeps it, to be resumed (issue 31.3).
/// SIGTERM, what `docker stop`, systemd and Kubernetes send, stops a
/// command as Ctrl-C does: a run's tool in flight is stopped, the run ends
/// cancelled (exit 130), its session saved with the call journaled as
/// cancelled (not left open, to be found interrupted); an HTTP server
/// ends (exit 0).
#[test]
fn sigterm_stops_a_run_and_a_server_as_ctrl_c_does() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    let events = dir.path().join("events.jsonl");
    let script = dir.path().join("sleep.json");
    std::fs::write(
        &script,
        r#"{"turns": [{"tool_calls": [{"name": "sleep", "arguments": {}}]}, {"text": "slept"}]}"#,
    )
    .unwrap();
    // A call that sleeps for an hour, its time limit longer.
    let policy = dir.path().join("airlock.toml");
    std::fs::write(
        &policy,
        format!(
            "[[tool]]\npath = {:?}\nlimits = {{ timeout_ms = 3600000 }}\n",
            guest("hostile")
        ),
    )
    .unwrap();
    let run = crate::support::airlock_command(
        &[
            "run",
            "sleep a while",
            "--script",
            path(&script),
            "--config",
            path(&policy),
            "--session",
            "sleepy",
            "--store",
            path(&store),
            "--events",
            path(&events),
        ],
        &[],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // Once the model's turn, and so the call's intent, is journaled.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !std::fs::read_to_string(&events)
        .unwrap_or_default()
        .contains(r#""type":"function_call""#)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the call never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    crate::support::signal(run.id(), libc::SIGTERM);
    let ended = run.wait_with_output().unwrap();
    assert_eq!(ended.status.code(), Some(130), "{}", stderr(&ended));
    let shown = airlock(&[
        "sessions",
        "show",
        "sleepy",
        "--json",
        "--store",
        path(&store),
    ]);
    let text = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(text.contains(r#""status":"cancelled""#), "{text}");
    assert!(!text.contains("interrupted"), "{text}");

    let mut server =
        crate::support::mcp::serve_http(path(&policy), path(&dir.path().join("served.db")));
    crate::support::signal(server.pid(), libc::SIGTERM);
    let status = server.ended_within(std::time::Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{status}");
}

#[test]
fn a_failed_run_says_so_once_and_stores_only_what_it_journaled() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, r#"{"turns": []}"#).unwrap();
    let stateful = guest("stateful");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "hi",
            "--script",
            path(&empty),
            "--tool",
            path(&stateful),
            "--store",
            path(&store),
        ];
        args.extend_from_slice(extra);
        airlock(&args)
    };
    let listed = || {
        let out = airlock(&["sessions", "list", "--json", "--store", path(&store)]);
        stdout_json(&out)["sessions"].as_array().unwrap().len()
    };

    // Fails before its prompt is journaled: nothing stored.
    let out = run(&["--events", path(&dir.path().join("missing/events.jsonl"))]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).matches("error:").count(),
        1,
        "{}",
        stderr(&out)
    );
    assert_eq!(listed(), 0, "a run that journaled nothing left a session");

    // Fails at the model, its prompt journaled: said once, kept.
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(2));
    let (said, shown) = (
        stderr(&out),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    );
    assert_eq!(said.matches("error:").count(), 1, "{said}");
    assert!(
        said.contains("error: run failed (invalid_script): script"),
        "{said}"
    );
    assert!(!shown.contains("run failed"), "said twice: {shown}");
    // Aligned as a run that answers aligns them.
    assert!(shown.contains("deps:   {}"), "{shown}");
    assert_eq!(listed(), 1);
}

/// `inspect` and `call` build the host `run` builds from a policy, so a
/// policy `run` refuses (two tools named alike) is refused by each, with
/// the same message (issue 31.8); and a tool of another component of the
/// policy is not the named component's.
#[test]
fn inspect_call_and_run_refuse_the_same_policy() {
    let dir = tempfile::tempdir().unwrap();
    let stateful = guest("stateful");
    let copy = dir.path().join("stateful-copy.wasm");
    std::fs::copy(&stateful, &copy).unwrap();
    let policy = dir.path().join("airlock.toml");
    std::fs::write(
        &policy,
        format!("[[tool]]\npath = {stateful:?}\n\n[[tool]]\npath = {copy:?}\n"),
    )
    .unwrap();
    let script = root().join("guest-examples/scripts/vowels.json");
    let said: Vec<String> = [
        airlock(&["inspect", path(&stateful), "--config", path(&policy)]),
        airlock(&[
            "call",
            path(&stateful),
            "increment",
            "--config",
            path(&policy),
        ]),
        airlock(&[
            "run",
            "hi",
            "--script",
            path(&script),
            "--config",
            path(&policy),
        ]),
    ]
    .iter()
    .map(|out| {
        assert_eq!(out.status.code(), Some(2), "{}", stderr(out));
        stderr(out)
    })
    .collect();
    for text in &said {
        assert!(
            text.contains("tool \"increment\" is defined twice"),
            "{text}"
        );
    }

    let examples = root().join("guest-examples/airlock.toml");
    let out = airlock(&[
        "call",
        path(&stateful),
        "fetch",
        "--config",
        path(&examples),
        "--json",
    ]);
    assert_unknown_tool(&out, "add_note");
}

/// `airlock --help` (long) and the reference list every exit code and every
/// environment variable the host reads (found in its source, less the ones
/// it sets for itself); value names are the same words everywhere
/// (issue 31.15).
#[test]
fn long_help_and_readme_list_exit_codes_and_every_variable() {
    let help = String::from_utf8_lossy(&airlock(&["--help"]).stdout).into_owned();
    let short = String::from_utf8_lossy(&airlock(&["-h"]).stdout).into_owned();
    let readme = std::fs::read_to_string(root().join("docs/reference.md")).unwrap();
    for code in ["0", "1", "2", "3", "4", "130"] {
        assert!(
            help.contains(&format!("\n  {code} ")),
            "exit {code} in --help"
        );
        assert!(
            readme.contains(&format!("| `{code}` |")),
            "exit {code} in docs/reference.md"
        );
    }
    assert!(!short.contains("Exit codes"), "-h stays short");
    // Set by Airlock for itself (a compiling child), by its tests (a kill,
    // the HTTP header limit, both only in a test build), or read
    // by its unit tests.
    let internal = [
        "AIRLOCK_BLESS",
        "AIRLOCK_COMPILE_CHILD",
        "AIRLOCK_COMPILE_FILL",
        "AIRLOCK_COMPILE_MEMORY",
        "AIRLOCK_COMPILE_CPU_SECS",
        "AIRLOCK_TEST_KILL_AT_COMMIT",
        "AIRLOCK_TEST_HEADER_READ_MS",
    ];
    let mut read = std::collections::BTreeSet::new();
    let mut dirs = vec![root().join("host/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for piece in text.split('"').skip(1).step_by(2) {
                let named = ["AIRLOCK_", "OPENAI_", "ANTHROPIC_"]
                    .iter()
                    .any(|p| piece.starts_with(p));
                if named
                    && piece.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    && !internal.contains(&piece)
                {
                    read.insert(piece.to_owned());
                }
            }
        }
    }
    read.insert("RUST_LOG".into());
    assert!(read.len() >= 15, "{read:?}");
    for name in &read {
        assert!(help.contains(name.as_str()), "{name} in --help");
        assert!(
            readme.contains(&format!("`{name}`")),
            "{name} in docs/reference.md"
        );
    }
    // One word per kind of value, whatever the command.
    let mut names = std::collections::BTreeSet::new();
    for command in [
        &["inspect"][..],
        &["call"],
        &["run"],
        &["mcp"],
        &["pull"],
        &["push"],
        &["sign"],
        &["keygen"],
        &["sessions", "list"],
        &["sessions", "show"],
        &["sessions", "export"],
        &["sessions", "import"],
        &["sessions", "prune"],
    ] {
        let mut args = command.to_vec();
        args.push("--help");
        let text = String::from_utf8_lossy(&airlock(&args).stdout).into_owned();
        for part in text.split('<').skip(1) {
            if let Some(name) = part.split('>').next() {
                names.insert(name.to_owned());
            }
        }
    }
    for odd in ["KEY", "MAX_ITERATIONS", "SYSTEM", "PATH", "DIRECTORY"] {
        assert!(!names.contains(odd), "<{odd}> in a --help: {names:?}");
    }
}

/// `airlock call` shows what a tool reported while it ran: its progress
/// reports, in order, in the text and in `--json`.
#[test]
fn call_shows_a_tools_progress() {
    let everything = guest("everything");
    let path = everything.to_str().unwrap();
    let out = airlock(&["call", path, "test_tool_with_progress", "{}", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let done: Vec<f64> = doc["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["done"].as_f64().unwrap())
        .collect();
    assert_eq!(done, [0.0, 50.0, 100.0], "{doc}");
    let out = airlock(&["call", path, "test_tool_with_progress", "{}"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("progress: 50 of 100: 50 of 100"), "{text}");
}

/// `airlock run` shows a call's progress reports as they happen: lines of
/// their own in the event log (not items: no id), after the call's intent
/// and before its output, and on the terminal.
#[test]
fn run_shows_a_calls_progress_as_it_happens() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("sketch.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [{"name": "sketch", "arguments": {"steps": 3}}]},
            {"text": "drawn"}
        ]})
        .to_string(),
    )
    .unwrap();
    let everything = guest("everything");
    let store = dir.path().join("s.db");
    let args = |events: bool| {
        let mut args = vec![
            "run",
            "draw",
            "--tool",
            everything.to_str().unwrap(),
            "--script",
            script.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ];
        if events {
            args.extend(["--events", "-"]);
        }
        args
    };
    let out = airlock(&args(true));
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let at = |pick: &dyn Fn(&serde_json::Value) -> bool| lines.iter().position(pick).unwrap();
    let intent = at(&|l| l["type"] == "function_call");
    let output = at(&|l| l["type"] == "function_call_output");
    let reports: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].get("progress").is_some())
        .collect();
    assert_eq!(reports.len(), 3, "{lines:?}");
    assert!(
        reports.iter().all(|&i| intent < i && i < output),
        "{lines:?}"
    );
    let last = &lines[reports[2]]["progress"];
    assert_eq!(last["call_id"], lines[intent]["call_id"]);
    assert_eq!(
        (
            last["done"].as_f64(),
            last["total"].as_f64(),
            last["message"].as_str()
        ),
        (Some(3.0), Some(3.0), Some("stroke 3 of 3"))
    );
    assert!(lines[reports[0]].get("id").is_none(), "not an item");
    let out = airlock(&args(false));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("sketch progress: 2 of 3: stroke 2 of 3\n"),
        "{text}"
    );
}

/// ARGS, like `--deps`, is inline JSON, `-` for standard input, or a
/// file; an unreadable one is refused naming the file, and the two cannot
/// both come from standard input.
#[test]
fn arguments_come_inline_from_a_file_or_from_standard_input() {
    let dir = tempfile::tempdir().unwrap();
    let stateful = guest("stateful");
    let file = dir.path().join("args.json");
    std::fs::write(&file, r#"{"name": "from_file"}"#).unwrap();
    let out = airlock(&["call", path(&stateful), "increment", path(&file), "--json"]);
    assert_eq!(stdout_json(&out)["result"]["counter"], "from_file");

    let piped = |args: &[&str], input: &str| {
        let input_file = dir.path().join("input.json");
        std::fs::write(&input_file, input).unwrap();
        crate::support::airlock_command(args, &[])
            .stdin(std::fs::File::open(&input_file).unwrap())
            .output()
            .unwrap()
    };
    let out = piped(
        &["call", path(&stateful), "increment", "-", "--json"],
        r#"{"name": "from_stdin"}"#,
    );
    assert_eq!(stdout_json(&out)["result"]["counter"], "from_stdin");
    let out = piped(
        &[
            "call",
            path(&stateful),
            "increment",
            r#"{"name":"n"}"#,
            "--deps",
            "-",
            "--json",
        ],
        r#"{"counters": {"n": 41}}"#,
    );
    assert_eq!(stdout_json(&out)["result"]["value"], 42);

    let out = piped(
        &["call", path(&stateful), "increment", "-", "--deps", "-"],
        "{}",
    );
    refused(&out, "cannot both be read from standard input");
    let missing = dir.path().join("missing.json");
    let out = airlock(&["call", path(&stateful), "increment", path(&missing)]);
    refused(&out, &format!("ARGS {}: cannot read", missing.display()));
}

/// A reader that went away (`| head`, here a pipe closed before anything
/// is written) ends the output quietly: said once on stderr, no warning
/// per event, and the run goes on to commit all of it. An export to a
/// closed pipe ends the same way.
#[test]
fn a_closed_output_is_said_once_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cut.db");
    let closed = |mut command: std::process::Command| {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        command.stdout(writer).output().unwrap()
    };
    let out = closed(demo_command(&[
        "--session",
        "cut",
        "--store",
        path(&db),
        "--events",
        "-",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = stderr(&out);
    assert_eq!(said.matches("the output was cut").count(), 1, "{said}");
    assert!(!said.contains("WARN"), "{said}");
    let shown = airlock(&["sessions", "show", "cut", "--store", path(&db), "--json"]);
    assert_eq!(
        stdout_json(&shown)["deps"]["counters"],
        json!({"vowels": 3})
    );

    let store = |args: &[&str]| {
        let mut args = args.to_vec();
        args.extend(["--store", path(&db)]);
        crate::support::airlock_command(&args, &[])
    };
    for (what, command) in [
        (
            "run",
            demo_command(&["--session", "cut2", "--store", path(&db)]),
        ),
        ("export", store(&["sessions", "export", "cut"])),
        ("show", store(&["sessions", "show", "cut", "--json"])),
    ] {
        let out = closed(command);
        assert_eq!(out.status.code(), Some(0), "{what}: {}", stderr(&out));
        let said = stderr(&out);
        assert_eq!(
            said.matches("the output was cut").count(),
            1,
            "{what}: {said}"
        );
        assert!(!said.contains("exported"), "{said}");
    }
}

/// Refused before anything runs: `--max-iterations 0`, `call --user`
/// without `--session`. Read-only commands on a store that does not exist
/// make none. `sessions rm` takes several ids; `keygen --force` replaces
/// a key pair (and without it, refuses to).
#[test]
fn refusals_at_the_door_and_commands_that_make_nothing() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let stateful = guest("stateful");
    let out = run_demo(&["--max-iterations", "0"]);
    refused(&out, "--max-iterations");
    let out = airlock(&[
        "call",
        path(&stateful),
        "increment",
        r#"{"name":"a"}"#,
        "--user",
        "ann",
    ]);
    refused(&out, "pass --session ID too");

    let none = dir.path().join("none.db");
    let out = airlock(&["sessions", "list", "--store", path(&none)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no sessions"));
    for args in [
        vec!["sessions", "show", "x"],
        vec!["sessions", "export", "x"],
        vec!["sessions", "rm", "x"],
        vec!["sessions", "fork", "x", "--at", "1"],
    ] {
        let mut args = args.clone();
        args.extend(["--store", path(&none)]);
        let out = airlock(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            stderr(&out).contains("does not exist yet"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert!(!none.exists(), "a read-only command made the store");

    let db = dir.path().join("s.db");
    for id in ["a", "b", "c"] {
        let out = airlock(&[
            "call",
            path(&stateful),
            "increment",
            r#"{"name":"n"}"#,
            "--session",
            id,
            "--store",
            path(&db),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = airlock(&["sessions", "rm", "a", "b", "--store", path(&db)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("removed a, b from sqlite:"));
    let out = airlock(&["sessions", "rm", "c", "nope", "--store", path(&db)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("removed c from"));
    assert!(stderr(&out).contains("nope"), "{}", stderr(&out));
    let listed = airlock(&["sessions", "list", "--store", path(&db), "--json"]);
    assert_eq!(stdout_json(&listed)["sessions"], json!([]));

    let prefix = dir.path().join("keys/k");
    let keygen = |extra: &[&str]| {
        let mut args = vec!["keygen", "--out", path(&prefix)];
        args.extend_from_slice(extra);
        airlock(&args)
    };
    assert!(keygen(&[]).status.success());
    let public = dir.path().join("keys/k.pub");
    let first = std::fs::read_to_string(&public).unwrap();
    let out = keygen(&[]);
    refused(&out, "--force replaces it");
    assert_eq!(std::fs::read_to_string(&public).unwrap(), first);
    assert!(keygen(&["--force"]).status.success());
    assert_ne!(std::fs::read_to_string(&public).unwrap(), first);
    let mode = std::fs::metadata(dir.path().join("keys/k.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // A prefix that ends in a directory would make hidden `.key` and
    // `.pub` files in it: refused, nothing written.
    let keys = dir.path().join("keys");
    let before = std::fs::read_dir(&keys).unwrap().count();
    for out in [
        format!("{}/", keys.display()),
        format!("{}/.", keys.display()),
    ] {
        let said = airlock(&["keygen", "--out", &out]);
        refused(&said, "not a directory (for example ");
    }
    assert_eq!(std::fs::read_dir(&keys).unwrap().count(), before);
}

/// `--version` names the wasmtime release (as Cargo.lock has it) and the
/// WIT package (as wit/tool.wit declares it).
#[test]
fn the_version_names_wasmtime_and_the_wit_package() {
    let out = airlock(&["--version"]);
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).unwrap();
    let wasmtime = lock
        .split("[[package]]")
        .find(|p| p.contains("\nname = \"wasmtime\"\n"))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
        .unwrap()
        .trim_matches('"')
        .to_owned();
    assert!(said.contains(&format!("wasmtime {wasmtime}\n")), "{said}");
    let wit = std::fs::read_to_string(root().join("wit/tool.wit")).unwrap();
    let package = wit
        .lines()
        .find_map(|l| l.trim().strip_prefix("package "))
        .unwrap()
        .trim_end_matches(';')
        .to_owned();
    assert!(said.contains(&format!("WIT {package} ")), "{said}");
}

/// `airlock completions bash` is a script bash loads, which completes the
/// commands and their flags; zsh's and fish's are printed too.
#[test]
fn completion_scripts_load_and_complete() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_airlock"));
    let complete = |words: &str, cword: usize| {
        let script = format!(
            "source <({bin} completions bash) && COMP_WORDS=({words}) && COMP_CWORD={cword} && \
             _airlock airlock \"${{COMP_WORDS[$COMP_CWORD]}}\" \"${{COMP_WORDS[$COMP_CWORD-1]}}\" && \
             echo \"${{COMPREPLY[@]}}\"",
            bin = bin.display()
        );
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(complete("airlock sess", 1), "sessions");
    assert_eq!(complete("airlock replay --to", 2), "--tool");
    for shell in ["zsh", "fish"] {
        let out = airlock(&["completions", shell]);
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("airlock"));
    }
    let out = airlock(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Text reads as text: a string result of several lines is printed as its
/// lines (not one escaped JSON string), and a WIT doc comment of several
/// lines is shown as lines under its tool in `inspect`.
#[test]
fn text_output_keeps_the_lines_of_text() {
    let reach = crate::support::built("plain/reach");
    let config = root().join("guest-examples/plain.toml");
    let out = airlock(&[
        "call",
        path(&reach),
        "read_script",
        r#"{"path": "/scripts/vowels.json"}"#,
        "--config",
        path(&config),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.starts_with("result: {\n"), "{said}");
    assert!(said.contains("\n          \"description\": "), "{said}");
    assert!(!said.contains("\\n") && !said.contains("\\\""), "{said}");

    let units = crate::support::built("plain/units");
    let out = airlock(&["inspect", path(&units), "--schemas"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!said.contains("\\n"), "{said}");
    assert!(said.contains("of the same quantity\n    (length"), "{said}");
}

/// On a terminal, a question waits for the lines due before it: each
/// approval prompt starts its own line, after the calls it is about, and
/// the answer typed follows it (no progress line between); two calls of a
/// turn are asked one after the other. A rejected call took no time, and
/// the person's time is not counted in an approved one's (issue 65.2).
/// `error:` is coloured as clap colours its own (issue 65.11).
#[test]
fn a_terminal_prompt_is_never_interleaved_with_progress() {
    use crate::support::pty::Terminal;
    let dir = tempfile::tempdir().unwrap();
    let (policy, script) = asking(
        dir.path(),
        r#"[{"name": "increment", "arguments": {"name": "a"}}, {"name": "increment", "arguments": {"name": "b"}}]"#,
    );
    let db = dir.path().join("ask.db");
    let args = [
        "run",
        "--config",
        path(&policy),
        "--script",
        path(&script),
        "--store",
        path(&db),
        "go",
    ];
    let mut terminal = Terminal::start(crate::support::airlock_command(&args, &[]));
    let prompt = "? [y]es / [n]o / [e]dit: ";
    let prompts = |screen: &str| screen.matches(prompt).count();
    let first = terminal.wait_for("the first prompt", |s| prompts(s) == 1);
    let before = &first[..first.find("approve increment").unwrap()];
    assert!(before.ends_with('\n'), "the prompt shares a line:\n{first}");
    for name in ["a", "b"] {
        let line = format!("[turn 1] call increment {{\"name\":\"{name}\"}}\n");
        assert!(
            before.contains(&line),
            "{line} is not before the prompt:\n{first}"
        );
    }
    terminal.type_in("y\n");
    terminal.wait_for("the second prompt", |s| prompts(s) == 2);
    terminal.type_in("n\n");
    let (code, screen) = terminal.finish();
    assert_eq!(code, Some(0), "{screen}");
    // Each answer right after its prompt: nothing was printed between.
    assert!(screen.contains(&format!("{prompt}y\n")), "{screen}");
    assert!(screen.contains(&format!("{prompt}n\n")), "{screen}");
    for (at, _) in screen.match_indices("approve increment") {
        assert!(screen[..at].ends_with('\n'), "{screen}");
    }
    assert!(screen.contains("increment rejected in 0.0 ms"), "{screen}");
    assert_eq!(screen.matches("increment ok in").count(), 1, "{screen}");

    // An error on a terminal is red, as clap's are; not with NO_COLOR.
    let missing = ["sessions", "show", "nope", "--store", path(&db)];
    let (code, screen) = Terminal::start(crate::support::airlock_command(&missing, &[])).finish();
    assert_eq!(code, Some(2), "{screen}");
    assert!(
        screen.starts_with("\u{1b}[1m\u{1b}[31merror:\u{1b}[0m no session nope"),
        "{screen:?}"
    );
    let plain = crate::support::airlock_command(&missing, &[("NO_COLOR", "1")]);
    let (_, screen) = Terminal::start(plain).finish();
    assert!(screen.starts_with("error: no session nope"), "{screen:?}");
}

/// `airlock call` asks a tool's question on the terminal, with or without
/// a session, and asks again until the answer fits the question: what is
/// not JSON, or breaks the question's schema, is refused there with where
/// and by which rule (the check the tool's answer gets), so the person
/// can mend it rather than the tool hearing `unavailable`. An empty line
/// declines.
#[test]
fn a_terminal_answer_that_does_not_fit_is_asked_again() {
    use crate::support::pty::Terminal;
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("ask.toml");
    let everything = guest("everything");
    std::fs::write(
        &policy,
        format!("[[tool]]\npath = {everything:?}\nask = true\nuri_schemes = [\"test\"]\n"),
    )
    .unwrap();
    let db = dir.path().join("ask.db");
    let asked = r#"{"message":"Who are you?"}"#;
    let call = |session: bool| {
        let mut args = vec![
            "call",
            "--config",
            path(&policy),
            path(&everything),
            "test_elicitation",
            asked,
        ];
        if session {
            args.extend(["--session", "s", "--store", path(&db)]);
        }
        Terminal::start(crate::support::airlock_command(&args, &[]))
    };
    let prompt = "answer: ";
    let prompts = |screen: &str| screen.matches(prompt).count();

    let mut terminal = call(false);
    let first = terminal.wait_for("the question", |s| prompts(s) == 1);
    assert!(
        first.contains("a tool asks: Who are you?\n  answer with a JSON object of: email (string, required), username (string, required)"),
        "{first}"
    );
    terminal.type_in("{\"username\": 5, \"email\": \"hidden-value\"}\n");
    terminal.wait_for("the question again", |s| prompts(s) == 2);
    terminal.type_in("nope\n");
    terminal.wait_for("the question a third time", |s| prompts(s) == 3);
    terminal.type_in("{\"username\": \"ann\", \"email\": \"ann@example.com\"}\n");
    let (code, screen) = terminal.finish();
    assert_eq!(code, Some(0), "{screen}");
    let refused = "  that does not fit the question: at /username fails rule \"type\" (schema path /properties/username/type); try again\n";
    assert!(screen.contains(refused), "{screen}");
    assert!(
        screen.contains("  that does not fit the question: it is not JSON; try again\n"),
        "{screen}"
    );
    assert_eq!(
        screen.matches("hidden-value").count(),
        1,
        "only as typed: {screen}"
    );
    assert!(
        screen.contains(
            r#"action=accept, content={\"username\":\"ann\",\"email\":\"ann@example.com\"}"#
        ),
        "{screen}"
    );

    // On a session the same; an empty line declines, and the decline is
    // what the session keeps.
    let mut terminal = call(true);
    terminal.wait_for("the question", |s| prompts(s) == 1);
    terminal.type_in("\n");
    let (code, screen) = terminal.finish();
    assert_eq!(code, Some(0), "{screen}");
    assert!(screen.contains("action=decline"), "{screen}");
    let shown = airlock(&["sessions", "show", "s", "--store", path(&db), "--json"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains(r#""action":"decline""#), "{shown}");
}

/// An approval prompt takes `y`, `n` or `e` in either case, and asks again
/// on anything else, saying what it takes; edited arguments that are not
/// a JSON object are asked for again. The call runs as edited.
#[test]
fn an_approval_prompt_asks_again_on_what_it_does_not_take() {
    use crate::support::pty::Terminal;
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("approve.toml");
    let stateful = guest("stateful");
    std::fs::write(
        &policy,
        format!("[[tool]]\npath = {stateful:?}\napproval = \"ask\"\n"),
    )
    .unwrap();
    let call = |arguments: &str| {
        let args = [
            "call",
            "--config",
            path(&policy),
            path(&stateful),
            "increment",
            arguments,
        ];
        Terminal::start(crate::support::airlock_command(&args, &[]))
    };
    let prompt = "? [y]es / [n]o / [e]dit: ";
    let edit = "new arguments (JSON object; empty rejects): ";
    let count = |screen: &str, what: &str| screen.matches(what).count();

    let mut terminal = call(r#"{"name":"typo"}"#);
    terminal.wait_for("the prompt", |s| count(s, prompt) == 1);
    terminal.type_in("sure\n");
    terminal.wait_for("the prompt again", |s| count(s, prompt) == 2);
    terminal.type_in("E\n");
    terminal.wait_for("the arguments' prompt", |s| count(s, edit) == 1);
    terminal.type_in("[1]\n");
    terminal.wait_for("the arguments' prompt again", |s| count(s, edit) == 2);
    terminal.type_in("{\"name\": \"fixed\"}\n");
    let (code, screen) = terminal.finish();
    assert_eq!(code, Some(0), "{screen}");
    assert!(
        screen.contains("  answer y (yes), n (no) or e (edit); try again\n"),
        "{screen}"
    );
    assert!(
        screen.contains("  the arguments must be a JSON object; try again\n"),
        "{screen}"
    );
    assert!(screen.contains(r#""counter":"fixed""#), "{screen}");

    let mut terminal = call(r#"{"name":"loud"}"#);
    terminal.wait_for("the prompt", |s| count(s, prompt) == 1);
    terminal.type_in("YES\n");
    let (code, screen) = terminal.finish();
    assert_eq!(code, Some(0), "{screen}");
    assert!(screen.contains(r#""counter":"loud""#), "{screen}");
}

/// `inspect` is brief unless asked: each tool's name and the first line of
/// its description, aligned; schemas with `--schemas` (pretty, under
/// `parameters:`) or `--json`; a capability said once for all the
/// interfaces that ask for it (issue 65.3).
#[test]
fn inspect_is_brief_and_says_each_capability_once() {
    let typed = crate::support::built("plain/typed");
    let out = airlock(&["inspect", path(&typed)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!text.contains("parameters:"), "{text}");
    assert!(
        text.contains("\n  version  The example's version.\n"),
        "{text}"
    );
    assert!(
        text.contains("\n  echo     Returns exactly the value it was given.\n"),
        "{text}"
    );
    assert!(text.contains("--schemas"), "{text}");
    assert_eq!(text.matches("stdin empty").count(), 1, "{text}");
    for import in [
        "wasi:cli/stdin@",
        "wasi:cli/terminal-stderr@",
        "wasi:io/streams@",
    ] {
        assert!(text.contains(import), "{import} in:\n{text}");
    }
    assert!(
        text.lines().count() < 50,
        "{} lines:\n{text}",
        text.lines().count()
    );

    let out = airlock(&["inspect", path(&typed), "--schemas"]);
    let full = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(full.contains("    parameters: {\n"), "{full}");
    // Every schema pretty, the shortest too (`nothing` takes no argument).
    assert!(!full.contains("parameters: {\""), "{full}");
    assert!(full.lines().count() > text.lines().count() * 3);
}

/// What `sessions` prints reads as a person reads it: a table with a
/// header and an ephemeral marker; a model turn's calls after what it said;
/// `export` of a missing session says what `show` says; standard input is
/// named so; and a policy's relative paths are shown without `..`
/// (issue 65.11).
#[test]
fn sessions_and_paths_read_as_a_person_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    let stateful = guest("stateful");
    for session in [&["--session", "demo"][..], &[]] {
        let mut args = vec!["--store", path(&store)];
        args.extend_from_slice(session);
        let out = run_demo(&args);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = airlock(&["sessions", "list", "--store", path(&store)]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[1].starts_with("SESSION "), "{text}");
    assert_eq!(lines.len(), 4, "{text}");
    let demo_line = lines.iter().find(|l| l.starts_with("demo ")).unwrap();
    let other = lines.iter().find(|l| l.starts_with("sess_")).unwrap();
    assert!(!demo_line.contains("ephemeral"), "{text}");
    assert!(other.ends_with("ephemeral (one run)"), "{text}");
    // Aligned: each column starts where its header does.
    let column = |line: &str| line.find(" 2026").or(line.find(" 20")).unwrap();
    assert_eq!(
        lines[1].find(" UPDATED").unwrap(),
        column(demo_line),
        "{text}"
    );
    assert_eq!(column(demo_line), column(other), "{text}");

    let out = airlock(&["sessions", "show", "demo", "--store", path(&store)]);
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        shown.contains("model: The vowels in 'elephant' are e, e and a. I'll count each one. (calls increment {\"name\":\"vowels\"}, "),
        "{shown}"
    );
    assert!(shown.contains("  model: calls add_note {"), "{shown}");
    // In the events, a turn that only called tools says so.
    assert!(shown.contains(" model: (calls only)\n"), "{shown}");
    assert!(!shown.contains(" model: \n"), "{shown}");
    assert!(!shown.contains("model:  "), "{shown}");

    let shown = airlock(&["sessions", "show", "nope", "--store", path(&store)]);
    // Which commits wait for the disk is said by name; another is refused.
    let listed = crate::support::airlock_with_env(
        &["sessions", "list", "--store", path(&store)],
        &[("AIRLOCK_STORE_SYNC", "sometimes")],
    );
    assert_eq!(listed.status.code(), Some(2));
    assert!(
        stderr(&listed).contains("AIRLOCK_STORE_SYNC is not one of every-call, by-effect, never"),
        "{}",
        stderr(&listed)
    );
    let exported = airlock(&["sessions", "export", "nope", "--store", path(&store)]);
    assert_eq!(exported.status.code(), Some(2));
    assert_eq!(stderr(&exported), stderr(&shown));
    assert!(
        stderr(&exported).contains("(with no user) in sqlite:"),
        "{}",
        stderr(&exported)
    );

    let mut import =
        crate::support::airlock_command(&["sessions", "import", "-", "--store", path(&store)], &[]);
    let mut child = import
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"not json").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("error: standard input: invalid session file"),
        "{}",
        stderr(&out)
    );

    // A policy one directory down names the tool and a directory with `..`.
    let sub = dir.path().join("policies");
    std::fs::create_dir(&sub).unwrap();
    std::fs::copy(&stateful, dir.path().join("tool.wasm")).unwrap();
    let policy = sub.join("p.toml");
    std::fs::write(
        &policy,
        "[[tool]]\npath = \"../tool.wasm\"\ndirs = [{ host = \"../policies/./\", guest = \"/data\" }]\n",
    )
    .unwrap();
    let tool = dir.path().join("tool.wasm");
    let out = airlock(&["inspect", path(&tool), "--config", path(&policy), "--json"]);
    let doc = stdout_json(&out);
    assert_eq!(doc["path"], path(&tool), "{doc}");
    assert_eq!(doc["grants"]["dirs"][0]["host"], path(&sub), "{doc}");
}

/// The plain example's policy names builds that carry their WIT doc
/// comments: each tool it offers is described by its own docs, never by
/// the placeholder a component without them gets (issue 65.7).
#[test]
fn the_plain_example_describes_its_tools_from_their_docs() {
    let config = root().join("guest-examples/plain.toml");
    for (name, tool, says) in [
        ("plain/units", "convert", "Converts `value` from one unit"),
        ("plain/reach", "read_script", "Reads a text file (UTF-8)."),
    ] {
        let component = crate::support::built(name);
        let out = airlock(&[
            "inspect",
            path(&component),
            "--config",
            path(&config),
            "--json",
        ]);
        let doc = stdout_json(&out);
        let tools = doc["tools"].as_array().unwrap();
        let described = tools.iter().find(|t| t["name"] == tool).unwrap();
        let description = described["description"].as_str().unwrap();
        assert!(description.starts_with(says), "{tool}: {description}");
        for tool in tools {
            assert!(
                !tool["description"]
                    .as_str()
                    .unwrap()
                    .starts_with("The function `"),
                "{tool}"
            );
        }
    }
}

/// A first compile that takes more than a second shows its elapsed time on
/// a terminal, one line written over as it goes and ended with the time it
/// took; with stderr not a terminal, nothing is said of it (issue 66.2).
#[test]
fn a_long_first_compile_shows_its_time_on_a_terminal_only() {
    use crate::support::pty::Terminal;
    let js = crate::support::built("js-stateful");
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = path(cache.path());
    let inspect = ["inspect", path(&js)];
    let env = [("AIRLOCK_CACHE_DIR", cache_dir)];
    let (code, screen) = Terminal::start(crate::support::airlock_command(&inspect, &env)).finish();
    assert_eq!(code, Some(0), "{screen}");
    let compiling = format!("airlock: compiling {} (first use;", path(&js));
    assert!(screen.contains(&compiling), "{screen}");
    // Each tick writes the line again, after a carriage return the
    // terminal shows (the helper drops `\r`, so the ticks follow on).
    let ticks = screen.matches(&compiling).count();
    assert!(ticks >= 1, "{screen}");
    let last = screen.rfind(&compiling).unwrap();
    let line = screen[last..].lines().next().unwrap();
    assert!(line.ends_with(" s"), "{line:?}");

    let quiet = tempfile::tempdir().unwrap();
    let env = [("AIRLOCK_CACHE_DIR", path(quiet.path()))];
    let out = crate::support::airlock_with_env(&inspect, &env);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("compiling"), "{}", stderr(&out));
}
