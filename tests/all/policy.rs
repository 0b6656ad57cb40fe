//! The policy file through the `airlock` binary: the shipped example loads,
//! bad policies fail naming file, line and problem, and grants take effect.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{Value, json};

use crate::support::{airlock_with_env as airlock, guest, root};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test paths")
}

fn example_policy() -> PathBuf {
    root().join("guest-examples/airlock.toml")
}

/// `airlock inspect --json` of the example fetcher under the example
/// policy, with `env` set.
fn inspect_example(env: &[(&str, &str)]) -> Value {
    let fetch = guest("http_fetch");
    let policy = example_policy();
    let out = airlock(
        &["inspect", s(&fetch), "--config", s(&policy), "--json"],
        env,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn example_policy_loads_and_inspect_shows_the_grants() {
    let fetch = guest("http_fetch");
    let policy = example_policy();
    let doc = inspect_example(&[("GITHUB_TOKEN", "ghp-example-secret")]);
    let grants = &doc["grants"];
    assert_eq!(
        grants["http"],
        json!(["https://api.github.com", "http://localhost:8080"])
    );
    assert_eq!(grants["env"], json!(["TZ"]));
    assert_eq!(grants["dirs"][0]["guest"], "/examples");
    assert_eq!(grants["dirs"][0]["mode"], "ro");
    assert_eq!(
        grants["secrets"],
        json!([{"env": "GITHUB_TOKEN", "set": true, "header": "authorization", "origins": ["https://api.github.com"]}])
    );
    assert_eq!(grants["limits"]["timeout_ms"], 10000);
    assert_eq!(grants["limits"]["memory_bytes"], 64 << 20);
    assert_eq!(grants["context"], json!({"read": [], "write": []}));
    assert!(
        !doc.to_string().contains("ghp-example-secret"),
        "inspect never prints a secret"
    );

    let out = airlock(
        &["inspect", s(&fetch), "--config", s(&policy)],
        &[("GITHUB_TOKEN", "ghp-example-secret")],
    );
    let shown = text(&out.stdout);
    assert!(
        shown.contains("outgoing HTTP: granted: https://api.github.com, http://localhost:8080"),
        "{shown}"
    );
    assert!(
        shown.contains(
            "  secret       GITHUB_TOKEN (set) -> header authorization on https://api.github.com"
        ),
        "{shown}"
    );
    assert!(!shown.contains("ghp-example-secret"));
}

/// Secrets are read when a call is prepared, not when the policy loads:
/// `inspect` works without them. A call that never sends a request to a
/// secret's origin runs without it; one whose request would carry an
/// unset secret has that request refused unsent, and fails with
/// `grant_unavailable` naming the variable (never a value).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_resolved_per_call_and_needed_only_by_their_requests() {
    let fetch = guest("http_fetch");
    let policy = example_policy();
    let doc = inspect_example(&[]);
    assert_eq!(doc["grants"]["secrets"][0]["set"], false);
    let out = airlock(&["inspect", s(&fetch), "--config", s(&policy)], &[]);
    assert!(
        text(&out.stdout).contains("  secret       GITHUB_TOKEN (not set) -> header authorization"),
        "{}",
        text(&out.stdout)
    );

    let stateful = guest("stateful");
    let policy = format!(
        "[[tool]]\npath = {:?}\nsecrets = [{{ env = \"AIRLOCK_TEST_UNSET\", hosts = [\"x.example\"] }}]\n",
        s(&stateful)
    );
    let out = show_state_under(&policy, &["--json"], &[]);
    assert!(out.status.success(), "{}", text(&out.stdout));

    // The fetcher: its secret bound to one loopback server, unset; the
    // other server is granted too, without a secret.
    let (bound, free) = (
        crate::support::loopback::Loopback::start().await,
        crate::support::loopback::Loopback::start().await,
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("airlock.toml");
    std::fs::write(
        &file,
        format!(
            "[[tool]]\npath = {:?}\nhttp = [{:?}, {:?}]\nsecrets = [{{ env = \"AIRLOCK_TEST_UNSET\", \
             origins = [{:?}], cleartext_loopback = true }}]\n",
            s(&fetch),
            bound.url(""),
            free.url(""),
            bound.url("")
        ),
    )
    .unwrap();
    let call = |url: String, env: &[(&str, &str)]| {
        let args = serde_json::json!({ "url": url }).to_string();
        airlock(
            &[
                "call",
                s(&fetch),
                "fetch",
                &args,
                "--config",
                s(&file),
                "--json",
            ],
            env,
        )
    };
    let out = call(free.url("/hello"), &[]);
    assert!(out.status.success(), "{}", text(&out.stdout));
    let out = call(bound.url("/hello"), &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["error"]["kind"], "grant_unavailable", "{doc}");
    let message = doc["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("AIRLOCK_TEST_UNSET") && message.contains("not set"),
        "{message}"
    );
    assert!(
        bound.requests().is_empty(),
        "the request went out without its secret"
    );
    // Set, the same policy serves the call, and the value is never shown.
    let out = call(
        bound.url("/hello"),
        &[("AIRLOCK_TEST_UNSET", "now-set-value")],
    );
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(!text(&out.stdout).contains("now-set-value"));
    assert_eq!(bound.requests().len(), 1);
}

/// `airlock call <stateful> show_state {}` under the policy `policy`
/// (written to a fresh `airlock.toml`), with `extra` flags and `env` set.
fn show_state_under(policy: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("airlock.toml");
    std::fs::write(&file, policy).unwrap();
    let stateful = guest("stateful");
    let mut args = vec![
        "call",
        s(&stateful),
        "show_state",
        "{}",
        "--config",
        s(&file),
    ];
    args.extend_from_slice(extra);
    airlock(&args, env)
}

/// The error `airlock call` prints for `policy`.
fn policy_error(policy: &str, env: &[(&str, &str)]) -> String {
    let out = show_state_under(policy, &[], env);
    assert_eq!(out.status.code(), Some(2), "stdout: {}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.starts_with("error: ") && err.contains("airlock.toml:"),
        "{err}"
    );
    err
}

#[test]
fn bad_policies_name_the_line_and_the_problem() {
    let stateful = guest("stateful");
    let tool = format!("[[tool]]\npath = {:?}\n", s(&stateful));

    let err = policy_error("[limits]\ntimeout_ms = 10\nmemroy_mb = 5\n", &[]);
    assert!(
        err.contains("airlock.toml:3:") && err.contains("memroy_mb"),
        "{err}"
    );

    let err = policy_error("\n\n[[tool]]\npath = \"missing.wasm\"\n", &[]);
    assert!(
        err.contains("airlock.toml:4:") && err.contains("missing.wasm"),
        "{err}"
    );

    let err = policy_error(
        &format!("{tool}http = [\"https://ok.example\", \"*\"]\n"),
        &[],
    );
    assert!(
        err.contains("airlock.toml:3:") && err.contains("bare `*`"),
        "{err}"
    );

    let err = policy_error("[sessions]\nttl = \"30d\"\nsync = \"sometimes\"\n", &[]);
    assert!(
        err.contains("airlock.toml:") && err.contains("\"every-call\", \"by-effect\", \"never\""),
        "{err}"
    );

    let err = policy_error(&format!("{tool}record = true\n"), &[]);
    assert!(
        err.contains("airlock.toml:3:") && err.contains("granted no `http` origin"),
        "{err}"
    );

    let err = policy_error(&format!("{tool}http = [\"https://a.*.example\"]\n"), &[]);
    assert!(
        err.contains("airlock.toml:3:") && err.contains("first label"),
        "{err}"
    );

    let err = policy_error(
        &format!("{tool}dirs = [{{ host = \"no/such/dir\", guest = \"/d\" }}]\n"),
        &[],
    );
    assert!(
        err.contains("airlock.toml:3:") && err.contains("no/such/dir"),
        "{err}"
    );

    let err = policy_error(
        &format!("{tool}secrets = [{{ env = \"TOKEN\", hosts = [\"x.example/path\"] }}]\n"),
        &[],
    );
    assert!(
        err.contains("airlock.toml:3:")
            && err.contains("secret \"TOKEN\": origin \"x.example/path\""),
        "{err}"
    );

    let err = policy_error(
        &format!(
            "{tool}env = [\"TOKEN\"]\nsecrets = [{{ env = \"TOKEN\", hosts = [\"x.example\"] }}]\n"
        ),
        &[("TOKEN", "value")],
    );
    assert!(err.contains("secrets never enter the guest"), "{err}");

    let err = policy_error("[context]\nschema.k = { type = 12 }\n", &[]);
    assert!(err.contains("\"k\""), "{err}");
}

#[test]
fn a_granted_directory_reaches_the_tool_only_with_the_policy() {
    let hostile = guest("hostile");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::write(dir.path().join("data/hello.txt"), "from the operator").unwrap();
    let policy = dir.path().join("airlock.toml");
    std::fs::write(
        &policy,
        format!(
            "[[tool]]\npath = {:?}\ndirs = [{{ host = \"data\", guest = \"/data\" }}]\n",
            s(&hostile)
        ),
    )
    .unwrap();
    let args = r#"{"path": "/data/hello.txt"}"#;

    let out = airlock(
        &[
            "call",
            s(&hostile),
            "read_file",
            args,
            "--config",
            s(&policy),
            "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["result"]["text"], "from the operator");

    let out = airlock(&["call", s(&hostile), "read_file", args, "--json"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["error"]["kind"], "failed");
}

/// A policy's `[limits]` are every tool's defaults, a component given on
/// the command line that the policy does not list included: it runs with
/// no grants and those limits, not the built-in ones. So a bound the
/// operator tightened holds for it, and a bound the host cannot give is
/// refused naming the component, before anything runs.
#[test]
fn a_component_the_policy_does_not_list_gets_the_policys_limits() {
    let out = show_state_under("[limits]\nmax_result_bytes = 8\n", &["--json"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["error"]["kind"], "result_too_large", "{doc}");
    assert_eq!(
        doc["error"]["message"],
        "the result is 26 bytes; the limit is 8"
    );

    let out = show_state_under("[limits]\nmemory_mb = 5000\n", &[], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.contains("stateful.wasm: the memory limit (5000 MiB) is over the host's ceiling"),
        "{err}"
    );

    // Listed beside another tool, the note says which limits it runs with;
    // and without a `[limits]`, the built-in ones hold.
    let hostile = guest("hostile");
    let policy = format!(
        "[limits]\nmax_result_bytes = 8\n\n[[tool]]\npath = {:?}\n",
        s(&hostile)
    );
    let out = show_state_under(&policy, &[], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("does not list")
            && text(&out.stderr).contains("so it runs with no grants and the policy's [limits]"),
        "{}",
        text(&out.stderr)
    );
    let out = show_state_under("[context]\nhidden = [\"secret\"]\n", &["--json"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A directory inside another grant's read-write directory is refused at
/// load (whoever writes the outer one could swap the inner one for a
/// symlink before the next load); the same directory granted twice is not.
#[test]
fn grants_nested_in_a_writable_grant_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("work/shared")).unwrap();
    let stateful = guest("stateful");
    let hostile = guest("hostile");
    let tool = |path: &Path, name: &str, dir: &str, mode: &str| {
        format!(
            "[[tool]]\npath = {:?}\nname = {name:?}\ndirs = [{{ host = {dir:?}, guest = \"/d\", mode = {mode:?} }}]\n",
            s(path)
        )
    };
    let parse =
        |text: &str| airlock::Policy::parse(text, &dir.path().join("airlock.toml"), dir.path());

    let nested =
        tool(&hostile, "writer", "work", "rw") + &tool(&stateful, "reader", "work/shared", "ro");
    let err = parse(&nested).unwrap_err().to_string();
    assert!(
        err.contains("tool \"reader\"")
            && err.contains("work/shared")
            && err.contains("inside tool \"writer\"'s read-write directory"),
        "{err}"
    );

    let shared = tool(&hostile, "writer", "work", "rw") + &tool(&stateful, "reader", "work", "ro");
    parse(&shared).unwrap();
    let read_only = tool(&hostile, "a", "work", "ro") + &tool(&stateful, "b", "work/shared", "ro");
    parse(&read_only).unwrap();
}
