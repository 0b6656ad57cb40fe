//! Tools from OCI registries, through the real binary and a real registry
//! (Debian's docker-registry on loopback): push, sign, pull, pin, run by
//! reference, offline; every bad input refused by name with nothing stored;
//! a hostile registry; basic auth; another registry client (skopeo); and
//! `airlock mcp` reloading on a changed lock.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{Value, json};

use crate::support::mcp::{Watching, call_with, connect_noting, wait_for_changes, wait_for_note};
use crate::support::registry::{Hostile, Registry, Scripted, digest, free_port};
use crate::support::{PROMPT, airlock_command, guest, root};

pub(crate) const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";

/// The plain units converter (its WIT docs embedded): other bytes than
/// stateful's, and other tools.
pub(crate) fn units() -> PathBuf {
    let path = root().join("target/guests/plain/units.wasm");
    assert!(
        path.is_file(),
        "{} is missing: run `make guests`",
        path.display()
    );
    path
}

/// A working directory for the binary (where a lock without a policy
/// goes), with its own OCI store.
pub(crate) struct Scene {
    dir: tempfile::TempDir,
}

impl Scene {
    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub(crate) fn store(&self) -> PathBuf {
        self.path("store")
    }

    /// The binary in this directory, with this store, no registry
    /// credentials but those in `env`.
    pub(crate) fn command(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Command {
        let mut command = airlock_command(args, &[]);
        command
            .current_dir(self.dir.path())
            .env("AIRLOCK_OCI_DIR", self.store())
            .env("REGISTRY_AUTH_FILE", self.path("no-auth.json"))
            .env_remove("AIRLOCK_REGISTRY")
            .env_remove("AIRLOCK_REGISTRY_USERNAME")
            .env_remove("AIRLOCK_REGISTRY_PASSWORD")
            .env_remove("AIRLOCK_REGISTRY_TOKEN");
        for (k, v) in env {
            command.env(k, v);
        }
        command
    }

    pub(crate) fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.command(args, env).output().unwrap()
    }

    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.run_env(args, &[])
    }

    /// Writes the policy; its path.
    pub(crate) fn policy(&self, text: &str) -> String {
        let path = self.path("airlock.toml");
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }

    pub(crate) fn lock(&self) -> String {
        std::fs::read_to_string(self.path("airlock.lock")).unwrap_or_default()
    }

    /// Every component file in the store.
    pub(crate) fn stored(&self) -> Vec<PathBuf> {
        let dir = self.store().join("components/sha256");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
        files.sort();
        files
    }

    /// `airlock call REFERENCE TOOL ARGS EXTRA... --json`.
    pub(crate) fn call(&self, reference: &str, tool: &str, args: &str, extra: &[&str]) -> Output {
        let mut all = vec!["call", reference, tool, args];
        all.extend_from_slice(extra);
        all.push("--json");
        self.run(&all)
    }

    pub(crate) fn keygen(&self, name: &str) {
        let out = self.run(&["keygen", "--out", &format!("keys/{name}")]);
        assert!(out.status.success(), "{}", stderr(&out));
    }

    /// `airlock push FILE REF --insecure [--sign keys/KEY.key]`: the
    /// manifest digest.
    pub(crate) fn push(&self, file: &Path, reference: &str, key: Option<&str>) -> String {
        let key = key.map(|k| format!("keys/{k}.key"));
        let mut args = vec![
            "push",
            file.to_str().unwrap(),
            reference,
            "--insecure",
            "--json",
        ];
        if let Some(key) = &key {
            args.extend(["--sign", key.as_str()]);
        }
        let doc = ok_json(&self.run(&args));
        assert_eq!(doc["component"], digest(&std::fs::read(file).unwrap()));
        doc["manifest"].as_str().unwrap().to_owned()
    }
}

pub(crate) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The one JSON object a `--json` command printed, which says it worked.
pub(crate) fn ok_json(out: &Output) -> Value {
    let doc: Value = serde_json::from_str(stdout(out).trim())
        .unwrap_or_else(|_| panic!("not JSON: {}\n{}", stdout(out), stderr(out)));
    assert!(
        out.status.success() && doc["ok"] == true,
        "{doc}\n{}",
        stderr(out)
    );
    doc
}

/// A `--json` command's refusal: its kind must be `kind` and its exit code
/// 2 (bad input); the message.
pub(crate) fn refused(out: &Output, kind: &str) -> String {
    let doc: Value = serde_json::from_str(stdout(out).trim())
        .unwrap_or_else(|_| panic!("not JSON: {}\n{}", stdout(out), stderr(out)));
    assert_eq!(doc["ok"], false, "{doc}");
    assert_eq!(doc["error"]["kind"], kind, "{doc}");
    assert_eq!(out.status.code(), Some(2), "{doc}");
    doc["error"]["message"].as_str().unwrap().to_owned()
}

/// A policy that pulls from loopback registries over plain HTTP, with
/// `tools` (already `[[tool]]` tables) and more `[oci]` settings.
pub(crate) fn policy_text(oci: &str, tools: &str) -> String {
    format!("[oci]\ninsecure = true\n{oci}\n\n{tools}")
}

pub(crate) fn stateful_tool(host: &str, tag: &str, verify: &str) -> String {
    format!(
        "[[tool]]\noci = \"{host}/tools/stateful:{tag}\"\n{verify}\ncontext = {{ read = [\"counters\", \"notes\"], write = [\"counters\", \"notes\"] }}\n"
    )
}

#[test]
fn a_signed_component_is_pushed_pulled_pinned_and_run_by_reference() {
    let registry = Registry::start();
    let scene = Scene::new();
    scene.keygen("publisher");
    let reference = registry.oci("tools/stateful:1.0");
    let manifest = scene.push(&guest("stateful"), &reference, Some("publisher"));
    let config = scene.policy(&policy_text(
        "require_signature = true",
        &stateful_tool(
            &registry.host(),
            "1.0",
            "verify = { key = \"keys/publisher.pub\" }",
        ),
    ));

    let pulled = ok_json(&scene.run(&["pull", "--config", &config, "--json"]));
    let component = digest(&std::fs::read(guest("stateful")).unwrap());
    let entry = &pulled["components"][0];
    assert_eq!(entry["manifest"], manifest.as_str());
    assert_eq!(entry["component"], component.as_str());
    assert!(
        entry["signed_by"][0]
            .as_str()
            .unwrap()
            .ends_with("keys/publisher.pub"),
        "{pulled}"
    );
    assert_eq!(pulled["lock_changed"], true);
    // The lock pins both digests and says who signed, relative to itself.
    let lock = scene.lock();
    for expected in [
        format!("reference = \"{}/tools/stateful:1.0\"", registry.host()),
        format!("manifest = \"{manifest}\""),
        format!("component = \"{component}\""),
        "signed_by = [\"keys/publisher.pub\"]".to_owned(),
    ] {
        assert!(lock.contains(&expected), "{expected} not in:\n{lock}");
    }
    // The store holds exactly the component's bytes, private.
    let stored = scene.stored();
    assert_eq!(stored.len(), 1);
    assert_eq!(
        std::fs::read(&stored[0]).unwrap(),
        std::fs::read(guest("stateful")).unwrap()
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&stored[0]), 0o600);
        assert_eq!(mode(&scene.store()), 0o700);
    }
    // Pulling again changes nothing.
    let again = ok_json(&scene.run(&["pull", "--config", &config, "--json"]));
    assert_eq!(again["lock_changed"], false);

    // Called by reference, under the policy's grants.
    let called = ok_json(&scene.call(
        &reference,
        "increment",
        r#"{"name": "a"}"#,
        &["--config", &config],
    ));
    assert_eq!(called["result"]["value"], 1);
    assert_eq!(called["deps"]["counters"]["a"], 1);

    // inspect shows the digests and the signer.
    let inspected =
        ok_json_inspect(&scene.run(&["inspect", &reference, "--config", &config, "--json"]));
    assert_eq!(inspected["oci"]["manifest"], manifest.as_str());
    assert_eq!(inspected["oci"]["component"], component.as_str());
    assert!(
        inspected["oci"]["signed_by"][0]
            .as_str()
            .unwrap()
            .ends_with("keys/publisher.pub")
    );
    let text = stdout(&scene.run(&["inspect", &reference, "--config", &config]));
    assert!(text.contains(&format!("manifest:  {manifest}")), "{text}");
    assert!(
        text.contains("signed by: ") && text.contains("keys/publisher.pub"),
        "{text}"
    );

    // An agent run with the policy's tools, named by reference.
    let script = root().join("guest-examples/scripts/vowels.json");
    let run = scene.run(&[
        "run",
        "--config",
        &config,
        "--script",
        script.to_str().unwrap(),
        "--store",
        scene.path("sessions.db").to_str().unwrap(),
        "--json",
        PROMPT,
    ]);
    let doc = ok_json(&run);
    assert_eq!(doc["deps"]["counters"]["vowels"], 3, "{doc}");
}

/// The README's walk-through: its policy (`guest-examples/registry`, on
/// this test's registry instead of port 5000) with the key where
/// `airlock keygen --out target/keys/publisher` puts it.
#[test]
fn the_readme_registry_policy_pulls_signed_and_refuses_unsigned() {
    let registry = Registry::start();
    let scene = Scene::new();
    let out = scene.run(&["keygen", "--out", "target/keys/publisher"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let reference = registry.oci("tools/stateful:1.0");
    let file = guest("stateful");
    let pushed = ok_json(&scene.run(&[
        "push",
        file.to_str().unwrap(),
        &reference,
        "--insecure",
        "--sign",
        "target/keys/publisher.key",
        "--json",
    ]));
    let text =
        std::fs::read_to_string(root().join("guest-examples/registry/airlock.toml")).unwrap();
    assert!(text.contains("127.0.0.1:5000/tools/stateful:1.0"), "{text}");
    let dir = scene.path("guest-examples/registry");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("airlock.toml");
    std::fs::write(&config, text.replace("127.0.0.1:5000", &registry.host())).unwrap();
    let config = config.to_str().unwrap();

    let pulled = ok_json(&scene.run(&["pull", "--config", config, "--json"]));
    assert_eq!(pulled["components"][0]["manifest"], pushed["manifest"]);
    let lock = std::fs::read_to_string(dir.join("airlock.lock")).unwrap();
    assert!(
        lock.contains("signed_by = [\"../../target/keys/publisher.pub\"]"),
        "{lock}"
    );
    let called = ok_json(&scene.call(
        &reference,
        "increment",
        r#"{"name": "runs"}"#,
        &["--config", config],
    ));
    assert_eq!(called["deps"]["counters"]["runs"], 1);

    // The tag moved to unsigned bytes: refused, and the pinned bytes still run.
    scene.push(&units(), &reference, None);
    let update = scene.run(&["pull", "--update", "--config", config, "--json"]);
    let message = refused(&update, "unsigned");
    assert!(message.contains("target/keys/publisher.pub"), "{message}");
    let called = ok_json(&scene.call(
        &reference,
        "increment",
        r#"{"name": "runs"}"#,
        &["--config", config],
    ));
    assert_eq!(called["result"]["value"], 1);
}

/// `inspect --json` prints no `ok` field: the document itself.
pub(crate) fn ok_json_inspect(out: &Output) -> Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_str(stdout(out).trim()).unwrap()
}

#[test]
fn a_tag_moved_to_other_bytes_is_refused_until_update() {
    let registry = Registry::start();
    let scene = Scene::new();
    let reference = registry.oci("tools/moving:1");
    let first = scene.push(&guest("stateful"), &reference, None);
    // No policy: the lock is airlock.lock in the current directory.
    ok_json(&scene.run(&["pull", &reference, "--insecure", "--json"]));
    let pinned = scene.lock();
    assert!(pinned.contains(&first), "{pinned}");

    let second = scene.push(&units(), &reference, None);
    let moved = refused(
        &scene.run(&["pull", &reference, "--insecure", "--json"]),
        "moved",
    );
    assert!(moved.contains(&first) && moved.contains(&second), "{moved}");
    assert!(moved.contains("airlock pull --update"), "{moved}");
    assert!(
        moved.contains(&format!("{}/tools/moving:1", registry.host())),
        "{moved}"
    );
    assert_eq!(scene.lock(), pinned, "a refused pull changes the lock");
    assert_eq!(scene.stored().len(), 1, "the moved tag's bytes were stored");

    // Runs keep to the pin.
    let called = ok_json(&scene.call(&reference, "increment", r#"{"name": "x"}"#, &[]));
    assert_eq!(called["result"]["value"], 1);

    // After review, --update moves the pin, and runs follow it.
    ok_json(&scene.run(&["pull", &reference, "--insecure", "--update", "--json"]));
    assert!(scene.lock().contains(&second));
    let converted = ok_json(&scene.call(
        &reference,
        "convert",
        r#"{"value": 1, "from": "kilometre", "to": "metre"}"#,
        &[],
    ));
    assert_eq!(converted["result"], 1000.0);
}

/// Only `pull` pins: `inspect` and `call` of a reference the lock does
/// not pin run it for that command only, say so, and write no lock (with
/// or without a policy); `pull` then writes it.
#[test]
fn only_pull_writes_the_lock() {
    let registry = Registry::start();
    let scene = Scene::new();
    let reference = registry.oci("tools/stateful:1");
    scene.push(&guest("stateful"), &reference, None);
    // Without --insecure, the plain-HTTP registry on this machine is
    // unreachable, and the error says which flag reaches it.
    let out = scene.run(&["inspect", &reference]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is reached with --insecure"),
        "{}",
        stderr(&out)
    );
    let out = scene.run(&["inspect", &reference, "--insecure"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is not pinned in"),
        "{}",
        stderr(&out)
    );
    assert!(!scene.path("airlock.lock").exists(), "inspect wrote a lock");

    let config = scene.policy(&policy_text(
        "",
        &format!("[[tool]]\noci = \"{}/tools/stateful:1\"\n", registry.host()),
    ));
    let called = scene.call(
        &reference,
        "increment",
        r#"{"name": "x"}"#,
        &["--config", &config],
    );
    assert!(called.status.success(), "{}", stderr(&called));
    assert_eq!(ok_json(&called)["result"]["value"], 1);
    assert!(
        stderr(&called).contains("`airlock pull` pins it"),
        "{}",
        stderr(&called)
    );
    assert_eq!(
        stderr(&called).matches("is not pinned").count(),
        1,
        "{}",
        stderr(&called)
    );
    assert!(!scene.path("airlock.lock").exists(), "call wrote a lock");

    let pulled = scene.run(&["pull", "--config", &config]);
    assert!(pulled.status.success(), "{}", stderr(&pulled));
    assert!(stdout(&pulled).contains("wrote "), "{}", stdout(&pulled));
    assert!(scene.path("airlock.lock").exists());
    let called = scene.call(
        &reference,
        "increment",
        r#"{"name": "x"}"#,
        &["--config", &config],
    );
    assert!(
        !stderr(&called).contains("is not pinned"),
        "{}",
        stderr(&called)
    );
}

/// `pull --update --replay`: a tag moved to v2 of `stamp`; the calls
/// sessions made with v1 are replayed against v2 before the lock moves.
/// One differs: the lock is not written (exit 1, the difference shown, in
/// text and JSON) until `--yes`; once it has moved, nothing is replayed.
#[test]
fn an_update_replays_the_sessions_before_it_moves_the_lock() {
    let registry = Registry::start();
    let scene = Scene::new();
    let reference = registry.oci("tools/stamp:1");
    scene.push(&guest("stamp"), &reference, None);
    ok_json(&scene.run(&["pull", &reference, "--insecure", "--json"]));
    let sessions = scene.path("sessions.db");
    let sessions = sessions.to_str().unwrap();
    for label in ["Launch", "review"] {
        let args = json!({ "label": label }).to_string();
        ok_json(&scene.call(
            &reference,
            "stamp",
            &args,
            &["--session", "s1", "--store", sessions],
        ));
    }
    let pinned = scene.lock();
    let second = scene.push(&guest("stamp_v2"), &reference, None);
    let replaying = [
        "pull",
        reference.as_str(),
        "--insecure",
        "--update",
        "--replay",
    ];
    let update = |extra: &[&str]| {
        let mut args = replaying.to_vec();
        args.extend_from_slice(&["s1", "--store", sessions]);
        args.extend_from_slice(extra);
        scene.run(&args)
    };

    let out = update(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stdout(&out);
    assert!(said.contains("replayed against oci://"), "{said}");
    assert!(said.contains("1 same, 1 different, 0 failed"), "{said}");
    assert!(
        said.contains(r#"result.stamp.label: "Launch" → "launch""#),
        "{said}"
    );
    assert!(stderr(&out).contains("was not written"), "{}", stderr(&out));
    assert!(stderr(&out).contains("--yes"), "{}", stderr(&out));
    assert_eq!(
        scene.lock(),
        pinned,
        "the lock moved although a call differs"
    );

    // The reference may follow the sessions: `--replay` takes the words
    // after it, and one naming a reference is the reference.
    let out = scene.run(&[
        "pull",
        "--insecure",
        "--update",
        "--replay",
        "s1",
        reference.as_str(),
        "--store",
        sessions,
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["error"]["kind"], "replay_differs", "{doc}");
    assert_eq!(doc["replays"][0]["summary"]["different"], 1, "{doc}");
    assert_eq!(
        doc["replays"][0]["calls"][0]["arguments"]["label"],
        "Launch"
    );
    assert_eq!(scene.lock(), pinned);

    // Evidence from a store that does not exist: none. The update is
    // refused (exit 2), the lock stays, and no store is made.
    let none = scene.path("none.db");
    let none = none.to_str().unwrap();
    for sessions in [&["s1"][..], &[]] {
        let mut args = replaying.to_vec();
        args.extend_from_slice(sessions);
        args.extend_from_slice(&["--store", none]);
        let out = scene.run(&args);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("sqlite:{none}"))
                && stderr(&out).contains("does not exist yet"),
            "{}",
            stderr(&out)
        );
    }
    assert!(!std::path::Path::new(none).exists());
    assert_eq!(scene.lock(), pinned);

    let out = update(&["--yes"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(scene.lock().contains(&second), "{}", scene.lock());
    let said = stdout(&out);
    assert!(
        said.contains("1 different") && said.contains("wrote "),
        "{said}"
    );

    // Pinned to v2 already: nothing moves, nothing is replayed.
    let out = update(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stdout(&out).contains("replayed"), "{}", stdout(&out));
}

#[test]
fn with_the_lock_and_the_store_filled_no_network_is_needed() {
    let mut registry = Registry::start();
    let scene = Scene::new();
    let reference = registry.oci("tools/stateful:1.0");
    scene.push(&guest("stateful"), &reference, None);
    let config = scene.policy(&policy_text(
        "",
        &stateful_tool(&registry.host(), "1.0", ""),
    ));
    ok_json(&scene.run(&["pull", "--config", &config, "--json"]));
    let lock = scene.lock();
    registry.stop();

    let called = ok_json(&scene.call(
        &reference,
        "increment",
        r#"{"name": "offline"}"#,
        &["--config", &config],
    ));
    assert_eq!(called["result"]["value"], 1);
    ok_json_inspect(&scene.run(&["inspect", &reference, "--config", &config, "--json"]));
    let script = root().join("guest-examples/scripts/vowels.json");
    let doc = ok_json(&scene.run(&[
        "run",
        "--config",
        &config,
        "--script",
        script.to_str().unwrap(),
        "--store",
        scene.path("sessions.db").to_str().unwrap(),
        "--json",
        PROMPT,
    ]));
    assert_eq!(doc["deps"]["counters"]["vowels"], 3);

    // What needs the registry says so, naming the reference; nothing moves.
    let message = refused(
        &scene.run(&["pull", "--config", &config, "--json"]),
        "registry_unreachable",
    );
    assert!(
        message.contains(&format!("{}/tools/stateful:1.0", registry.host())),
        "{message}"
    );
    let other = registry.oci("tools/other:1");
    let message = refused(
        &scene.run(&["call", &other, "increment", "{}", "--insecure", "--json"]),
        "registry_unreachable",
    );
    assert!(message.contains("tools/other:1"), "{message}");
    assert_eq!(scene.lock(), lock);

    // A pinned component the store lost, with the registry down: the
    // error names the digest it asked for, the lock and the store.
    let stored = scene.stored();
    let kept = stored[0].with_extension("kept");
    std::fs::rename(&stored[0], &kept).unwrap();
    let message = refused(
        &scene.call(&reference, "increment", "{}", &["--config", &config]),
        "registry_unreachable",
    );
    let digest = format!(
        "sha256:{}",
        stored[0].file_stem().unwrap().to_str().unwrap()
    );
    assert!(
        message.contains(&digest) && message.contains(scene.store().to_str().unwrap()),
        "{message}"
    );
    std::fs::rename(&kept, &stored[0]).unwrap();

    // A store another user could write is used for nothing, and said so.
    {
        use std::os::unix::fs::PermissionsExt;
        let chmod = |mode| {
            std::fs::set_permissions(scene.store(), std::fs::Permissions::from_mode(mode)).unwrap()
        };
        chmod(0o777);
        let call = |name: &str| {
            scene.call(
                &reference,
                "increment",
                &format!(r#"{{"name": "{name}"}}"#),
                &["--config", &config],
            )
        };
        let message = refused(&call("shared"), "unsafe_store");
        assert!(
            message.contains(scene.store().to_str().unwrap())
                && message.contains("Fix: make it a directory only you can write (`chmod 700`)")
                && message.contains("AIRLOCK_OCI_DIR"),
            "{message}"
        );
        chmod(0o700);
        assert_eq!(ok_json(&call("private"))["result"]["value"], 1);
    }
    assert_eq!(scene.stored().len(), 1);
}

#[test]
fn signatures_are_checked_before_anything_is_stored() {
    let registry = Registry::start();
    let scene = Scene::new();
    scene.keygen("publisher");
    scene.keygen("other");
    let host = registry.host();
    let units_digest = digest(&std::fs::read(units()).unwrap());
    let units_stored = || {
        scene
            .stored()
            .iter()
            .any(|p| p.to_str().unwrap().contains(&units_digest[7..]))
    };
    let tool = |tag: &str, key: &str| {
        format!(
            "[[tool]]\noci = \"{host}/tools/units:{tag}\"\nverify = {{ key = \"keys/{key}.pub\" }}\n"
        )
    };
    let pull = |tag: &str, key: &str| {
        let config = scene.policy(&policy_text("", &tool(tag, key)));
        scene.run(&["pull", "--config", &config, "--json"])
    };

    // Unsigned.
    scene.push(&units(), &registry.oci("tools/units:unsigned"), None);
    let message = refused(&pull("unsigned", "publisher"), "unsigned");
    assert!(message.contains("tools/units:unsigned"), "{message}");
    assert!(message.contains("keys/publisher.pub"), "{message}");
    assert!(message.contains("0 signatures found"), "{message}");
    assert!(!units_stored(), "an unsigned component was stored");

    // Signed by a key the policy does not trust.
    scene.push(&units(), &registry.oci("tools/units:other"), Some("other"));
    let message = refused(&pull("other", "publisher"), "unsigned");
    assert!(message.contains("1 signatures found"), "{message}");
    assert!(!units_stored());

    // A trusted key's signature, but for another manifest: copied from a
    // signed component's signature tag to this one's.
    let signed = scene.push(
        &guest("stateful"),
        &registry.oci("tools/units:signed"),
        Some("publisher"),
    );
    let target = scene.push(&units(), &registry.oci("tools/units:copied"), None);
    let tag = |digest: &str| format!("{}.sig", digest.replace(':', "-"));
    let signature = registry.manifest("tools/units", &tag(&signed));
    registry.put_manifest("tools/units", &tag(&target), MANIFEST, &signature);
    let message = refused(&pull("copied", "publisher"), "unsigned");
    assert!(message.contains(&target), "{message}");
    assert!(!units_stored());

    // The trusted key's own signature verifies, and is kept for offline
    // checks: a policy that trusts another key refuses it without the
    // network.
    ok_json(&pull("signed", "publisher"));
    let config = scene.policy(&policy_text("", &tool("signed", "other")));
    let message = refused(
        &scene.call(
            &registry.oci("tools/units:signed"),
            "increment",
            "{}",
            &["--config", &config],
        ),
        "unsigned",
    );
    assert!(message.contains("keys/other.pub"), "{message}");

    // A tampered payload: the registry's signature layer now holds other
    // bytes under the same signature; a pull checks again and refuses.
    let mut sig_manifest: Value = serde_json::from_slice(&signature).unwrap();
    let payload = format!(
        "{{\"critical\":{{\"identity\":{{\"docker-reference\":\"{host}/tools/units\"}},\"image\":{{\"docker-manifest-digest\":\"{target}\"}},\"type\":\"cosign container image signature\"}},\"optional\":null}}"
    );
    let payload_digest = registry.put_blob("tools/units", payload.as_bytes());
    sig_manifest["layers"][0]["digest"] = json!(payload_digest);
    sig_manifest["layers"][0]["size"] = json!(payload.len());
    registry.put_manifest(
        "tools/units",
        &tag(&target),
        MANIFEST,
        sig_manifest.to_string().as_bytes(),
    );
    let message = refused(&pull("copied", "publisher"), "unsigned");
    assert!(message.contains("1 signatures found"), "{message}");
    assert!(!units_stored());

    // require_signature: a policy tool without `verify` does not load, and
    // a reference on the command line the policy does not vouch for is
    // refused.
    let config = scene.policy(&policy_text(
        "require_signature = true",
        &format!("[[tool]]\noci = \"{host}/tools/units:signed\"\n"),
    ));
    let message = refused(
        &scene.run(&["pull", "--config", &config, "--json"]),
        "invalid_config",
    );
    assert!(message.contains("require_signature"), "{message}");
    let config = scene.policy(&policy_text(
        "require_signature = true",
        &tool("signed", "publisher"),
    ));
    let message = refused(
        &scene.call(
            &registry.oci("tools/units:unsigned"),
            "convert",
            "{}",
            &["--config", &config],
        ),
        "no_key",
    );
    assert!(message.contains("tools/units:unsigned"), "{message}");
    assert!(!units_stored());
}

#[test]
fn basic_auth_comes_from_the_docker_config_or_the_environment_and_is_never_shown() {
    const USER: &str = "publisher";
    const PASSWORD: &str = "hunter2-correct-horse";
    let registry = Registry::start_with_auth(USER, PASSWORD);
    let scene = Scene::new();
    let reference = registry.oci("tools/stateful:1.0");
    let file = guest("stateful");
    let push = |env: &[(&str, &str)]| {
        scene.run_env(
            &[
                "push",
                file.to_str().unwrap(),
                &reference,
                "--insecure",
                "--json",
            ],
            env,
        )
    };
    let message = refused(&push(&[]), "auth_refused");
    assert!(message.contains("tools/stateful:1.0"), "{message}");
    let host = registry.host();
    // Credentials in the environment must name their registry.
    let unbound = [
        ("AIRLOCK_REGISTRY_USERNAME", USER),
        ("AIRLOCK_REGISTRY_PASSWORD", PASSWORD),
    ];
    let message = refused(&push(&unbound), "invalid_credentials");
    assert!(
        message.contains("AIRLOCK_REGISTRY=HOST[:PORT]"),
        "{message}"
    );
    let with_env = [
        ("AIRLOCK_REGISTRY", host.as_str()),
        ("AIRLOCK_REGISTRY_USERNAME", USER),
        ("AIRLOCK_REGISTRY_PASSWORD", PASSWORD),
    ];
    ok_json(&push(&with_env));

    let pull =
        |env: &[(&str, &str)]| scene.run_env(&["pull", &reference, "--insecure", "--json"], env);
    let message = refused(&pull(&[]), "auth_refused");
    assert!(message.contains("tools/stateful:1.0"), "{message}");
    let wrong = [
        ("AIRLOCK_REGISTRY", host.as_str()),
        ("AIRLOCK_REGISTRY_USERNAME", USER),
        ("AIRLOCK_REGISTRY_PASSWORD", "wrong"),
    ];
    refused(&pull(&wrong), "auth_refused");
    assert!(scene.stored().is_empty());

    // The docker credential file (REGISTRY_AUTH_FILE), with tracing at
    // its most verbose.
    use base64::Engine as _;
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    let auth_file = scene.path("auth.json");
    std::fs::write(
        &auth_file,
        json!({"auths": {registry.host(): {"auth": token}}}).to_string(),
    )
    .unwrap();
    let pulled = scene.run_env(
        &["pull", &reference, "--insecure", "--json"],
        &[
            ("REGISTRY_AUTH_FILE", auth_file.to_str().unwrap()),
            ("RUST_LOG", "trace"),
        ],
    );
    ok_json(&pulled);
    assert_eq!(scene.stored().len(), 1);
    let called = scene.run_env(
        &[
            "call",
            &reference,
            "increment",
            r#"{"name": "a"}"#,
            "--json",
        ],
        &[("RUST_LOG", "trace")],
    );
    ok_json(&called);

    // The secret is nowhere: not in any output, the lock, or the store.
    let mut seen = vec![
        stdout(&pulled),
        stderr(&pulled),
        stdout(&called),
        stderr(&called),
        scene.lock(),
    ];
    for out in [push(&with_env), pull(&wrong)] {
        seen.extend([stdout(&out), stderr(&out)]);
    }
    for entry in walk(&scene.store()) {
        seen.push(String::from_utf8_lossy(&std::fs::read(entry).unwrap()).into_owned());
    }
    for text in &seen {
        assert!(
            !text.contains(PASSWORD) && !text.contains(&token),
            "a credential leaked: {text:.300}"
        );
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn registries_that_cannot_serve_a_component_are_refused_by_name() {
    let registry = Registry::start();
    let scene = Scene::new();
    let host = registry.host();
    let pull = |reference: &str| scene.run(&["pull", reference, "--insecure", "--json"]);
    let names =
        |message: &str, what: &str| assert!(message.contains(what), "{what} not in {message}");

    names(
        &refused(&pull("oci://no-registry-here"), "invalid_reference"),
        "no-registry-here",
    );
    let nobody = format!("oci://{}/tools/x:1", free_port());
    names(
        &refused(&pull(&nobody), "registry_unreachable"),
        "tools/x:1",
    );
    names(
        &refused(&pull(&registry.oci("tools/none:1")), "not_found"),
        "tools/none:1",
    );
    let zero = format!("sha256:{}", "0".repeat(64));
    names(
        &refused(
            &pull(&registry.oci(&format!("tools/none@{zero}"))),
            "not_found",
        ),
        &zero,
    );
    // Plain HTTP is for this machine only, whatever the flag says.
    names(
        &refused(
            &pull("oci://registry.example/tools/x:1"),
            "insecure_refused",
        ),
        "registry.example/tools/x:1",
    );

    // A container image, not a component.
    let tarball = b"not a wasm layer".to_vec();
    registry.put_image(
        "tools/image",
        "1",
        "application/vnd.oci.image.config.v1+json",
        b"{}",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        &tarball,
    );
    let message = refused(&pull(&registry.oci("tools/image:1")), "not_a_component");
    names(&message, "tools/image:1");
    names(&message, "application/vnd.oci.image.layer.v1.tar+gzip");

    // A manifest list with no wasm entry; then one with.
    let image = registry.put_image(
        "tools/multi",
        "amd64",
        "application/vnd.oci.image.config.v1+json",
        b"{}",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        &tarball,
    );
    let entry = |digest: &str, architecture: &str, os: &str| json!({"mediaType": MANIFEST, "digest": digest, "size": registry.manifest("tools/multi", digest).len(), "platform": {"architecture": architecture, "os": os}});
    let index = json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [entry(&image, "amd64", "linux")]});
    registry.put_manifest("tools/multi", "1", INDEX, index.to_string().as_bytes());
    names(
        &refused(&pull(&registry.oci("tools/multi:1")), "not_a_component"),
        "manifest list with no wasm entry",
    );
    let stateful = std::fs::read(guest("stateful")).unwrap();
    let wasm = registry.put_image(
        "tools/multi",
        "wasm",
        WASM_CONFIG,
        br#"{"architecture":"wasm","os":"wasip2"}"#,
        "application/wasm",
        &stateful,
    );
    let index = json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [entry(&image, "amd64", "linux"), entry(&wasm, "wasm", "wasip2")]});
    registry.put_manifest("tools/multi", "2", INDEX, index.to_string().as_bytes());
    let pulled = ok_json(&pull(&registry.oci("tools/multi:2")));
    assert_eq!(pulled["components"][0]["component"], digest(&stateful));

    // A plain single-layer application/wasm image (any config) pulls too.
    let units_bytes = std::fs::read(units()).unwrap();
    registry.put_image(
        "tools/plainimage",
        "1",
        "application/vnd.oci.image.config.v1+json",
        b"{}",
        "application/wasm",
        &units_bytes,
    );
    let pulled = ok_json(&pull(&registry.oci("tools/plainimage:1")));
    assert_eq!(pulled["components"][0]["component"], digest(&units_bytes));
    assert_eq!(scene.stored().len(), 2);

    // Over the policy's size bounds; nothing more is stored.
    scene.push(
        &guest("context_probe"),
        &registry.oci("tools/probe:1"),
        None,
    );
    let tool = format!("[[tool]]\noci = \"{host}/tools/probe:1\"\n");
    let config = scene.policy(&policy_text("max_manifest_bytes = 64", &tool));
    let message = refused(
        &scene.run(&["pull", "--config", &config, "--json"]),
        "too_large",
    );
    names(&message, "the manifest is");
    names(&message, "tools/probe:1");
    let config = scene.policy(&policy_text("max_layer_bytes = 1024", &tool));
    let message = refused(
        &scene.run(&["pull", "--config", &config, "--json"]),
        "too_large",
    );
    names(&message, "the layer is");
    assert_eq!(scene.stored().len(), 2);
}

#[test]
fn a_lock_edited_into_nonsense_is_refused_naming_the_line() {
    let registry = Registry::start();
    let scene = Scene::new();
    let reference = registry.oci("tools/stateful:1.0");
    scene.push(&guest("stateful"), &reference, None);
    ok_json(&scene.run(&["pull", &reference, "--insecure", "--json"]));
    let lock = scene.lock();
    let component = digest(&std::fs::read(guest("stateful")).unwrap());
    let call = || scene.call(&reference, "increment", r#"{"name": "a"}"#, &["--insecure"]);
    let write = |text: &str| std::fs::write(scene.path("airlock.lock"), text).unwrap();

    let line = lock
        .lines()
        .position(|l| l.starts_with("component"))
        .unwrap()
        + 1;
    write(&lock.replace(&component, "sha256:nope"));
    let message = refused(&call(), "invalid_lock");
    assert!(
        message.contains(&format!("airlock.lock:{line}:")),
        "{message}"
    );
    assert!(
        message.contains("`component` is not a sha256 digest"),
        "{message}"
    );

    write("version = 1\n[[component]\n");
    let message = refused(&call(), "invalid_lock");
    assert!(message.contains("airlock.lock:2:"), "{message}");
    refused(
        &scene.run(&["pull", &reference, "--insecure", "--json"]),
        "invalid_lock",
    );

    // A well-formed digest that the pinned manifest does not name.
    let other = format!("sha256:{}", "a".repeat(64));
    write(&lock.replace(&component, &other));
    let message = refused(&call(), "invalid_lock");
    assert!(
        message.contains(&other) && message.contains(&component),
        "{message}"
    );
    assert_eq!(scene.stored().len(), 1);

    // Put back, it serves again.
    write(&lock);
    ok_json(&call());
}

/// The wasm artifact layout of `component`, as a hostile registry serves
/// it: (manifest bytes, manifest digest, config bytes, layer digest).
pub(crate) fn artifact(
    component: &[u8],
    declared_size: Option<usize>,
    urls: Option<Vec<String>>,
) -> (Vec<u8>, String, Vec<u8>, String) {
    let config = br#"{"architecture":"wasm","os":"wasip2","layerDigests":[]}"#.to_vec();
    let layer = digest(component);
    let mut layer_descriptor = json!({"mediaType": "application/wasm", "digest": layer, "size": declared_size.unwrap_or(component.len())});
    if let Some(urls) = urls {
        layer_descriptor["urls"] = json!(urls);
    }
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": WASM_CONFIG, "digest": digest(&config), "size": config.len()},
        "layers": [layer_descriptor],
    })
    .to_string()
    .into_bytes();
    let manifest_digest = digest(&manifest);
    (manifest, manifest_digest, config, layer)
}

/// What the hostile registry at `addr` serves, around the honest
/// component `good` (repository `t/good`).
fn hostile_routes(good: &[u8], addr: std::net::SocketAddr) -> BTreeMap<String, Scripted> {
    let mut routes = BTreeMap::new();
    // A manifest, by tag `1` and by its digest.
    let manifest_route = |routes: &mut BTreeMap<String, Scripted>,
                          repo: &str,
                          manifest: &[u8],
                          stated: Option<String>| {
        for reference in ["1".to_owned(), digest(manifest)] {
            routes.insert(
                format!("/v2/{repo}/manifests/{reference}"),
                Scripted::Bytes {
                    content_type: MANIFEST.into(),
                    digest: stated.clone(),
                    body: manifest.to_vec(),
                },
            );
        }
    };
    let blob = |bytes: Vec<u8>| Scripted::Bytes {
        content_type: "application/octet-stream".into(),
        digest: None,
        body: bytes,
    };

    // Honest: the component as it is.
    let (manifest, manifest_digest, _, layer) = artifact(good, None, None);
    manifest_route(
        &mut routes,
        "t/good",
        &manifest,
        Some(manifest_digest.clone()),
    );
    routes.insert(format!("/v2/t/good/blobs/{layer}"), blob(good.to_vec()));
    // Tampered: one byte of the component flipped.
    manifest_route(
        &mut routes,
        "t/tampered",
        &manifest,
        Some(manifest_digest.clone()),
    );
    let mut tampered = good.to_vec();
    let middle = tampered.len() / 2;
    tampered[middle] ^= 0xff;
    routes.insert(format!("/v2/t/tampered/blobs/{layer}"), blob(tampered));
    // Truncated: the connection drops halfway.
    manifest_route(
        &mut routes,
        "t/truncated",
        &manifest,
        Some(manifest_digest.clone()),
    );
    routes.insert(
        format!("/v2/t/truncated/blobs/{layer}"),
        Scripted::Truncated {
            declared: good.len(),
            body: good[..middle].to_vec(),
        },
    );
    // A manifest that never ends.
    routes.insert("/v2/t/endless/manifests/1".into(), Scripted::Endless);
    // A manifest whose stated digest is not its own.
    manifest_route(
        &mut routes,
        "t/misdigest",
        &manifest,
        Some(format!("sha256:{}", "b".repeat(64))),
    );
    // A layer that declares 100 bytes and streams without end.
    let (small, small_digest, _, small_layer) = artifact(good, Some(100), None);
    manifest_route(&mut routes, "t/liar", &small, Some(small_digest));
    routes.insert(format!("/v2/t/liar/blobs/{small_layer}"), Scripted::Endless);
    // A layer with `urls` elsewhere (here, to see whether it is asked):
    // never followed.
    let (elsewhere, elsewhere_digest, _, _) =
        artifact(good, None, Some(vec![format!("http://{addr}/diverted")]));
    manifest_route(
        &mut routes,
        "t/elsewhere",
        &elsewhere,
        Some(elsewhere_digest),
    );
    routes
}

#[test]
fn a_hostile_registry_is_refused_and_nothing_is_stored() {
    let good = std::fs::read(guest("stateful")).unwrap();
    let hostile = Hostile::start_with(|addr| hostile_routes(&good, addr));
    let scene = Scene::new();
    let pull = |repo: &str| {
        scene.run(&[
            "pull",
            &hostile.oci(&format!("{repo}:1")),
            "--insecure",
            "--json",
        ])
    };
    ok_json(&pull("t/good"));
    let lock = scene.lock();
    assert_eq!(scene.stored().len(), 1);
    let only_good = scene.stored();
    std::fs::remove_file(&only_good[0]).unwrap();

    let message = refused(&pull("t/tampered"), "digest_mismatch");
    assert!(
        message.contains("t/tampered:1") && message.contains("component"),
        "{message}"
    );
    let message = refused(&pull("t/truncated"), "registry_error");
    assert!(message.contains("t/truncated:1"), "{message}");
    let message = refused(&pull("t/endless"), "too_large");
    assert!(message.contains("the manifest is"), "{message}");
    let message = refused(&pull("t/misdigest"), "digest_mismatch");
    assert!(message.contains("manifest"), "{message}");
    let config = scene.policy(&policy_text(
        "max_layer_bytes = 65536",
        &format!("[[tool]]\noci = \"{}/t/liar:1\"\n", hostile.addr),
    ));
    let message = refused(
        &scene.run(&["pull", "--config", &config, "--json"]),
        "too_large",
    );
    assert!(message.contains("the layer is"), "{message}");
    refused(&pull("t/elsewhere"), "not_found");
    assert!(
        !hostile.asked().iter().any(|p| p.contains("diverted")),
        "{:?}",
        hostile.asked()
    );

    // Nothing was stored (not even a partial download), and the lock holds
    // only what verified.
    assert!(
        walk(&scene.store().join("components")).is_empty(),
        "{:?}",
        walk(&scene.store())
    );
    assert_eq!(
        std::fs::read_to_string(scene.path("airlock.lock")).unwrap(),
        lock
    );
    // The good one is fetched again by its pinned digest and serves.
    let called = ok_json(&scene.call(
        &hostile.oci("t/good:1"),
        "increment",
        r#"{"name": "after"}"#,
        &["--insecure"],
    ));
    assert_eq!(called["result"]["value"], 1);
}

#[test]
fn components_cross_with_another_registry_client() {
    let skopeo = Path::new("/usr/bin/skopeo");
    assert!(
        skopeo.is_file(),
        "skopeo is missing: `make registry-server` installs it"
    );
    let registry = Registry::start();
    let scene = Scene::new();

    // Pushed by Airlock, read by skopeo: the wasm artifact layout.
    let reference = registry.oci("tools/stateful:1.0");
    scene.push(&guest("stateful"), &reference, None);
    let out_dir = scene.path("copied");
    let copied = std::process::Command::new(skopeo)
        .args(["copy", "--src-tls-verify=false", "--insecure-policy"])
        .arg(format!("docker://{}/tools/stateful:1.0", registry.host()))
        .arg(format!("dir:{}", out_dir.display()))
        .output()
        .unwrap();
    assert!(copied.status.success(), "{}", stderr(&copied));
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["config"]["mediaType"], WASM_CONFIG);
    assert_eq!(manifest["layers"][0]["mediaType"], "application/wasm");
    let blob = |descriptor: &Value| {
        let digest = descriptor["digest"].as_str().unwrap();
        std::fs::read(out_dir.join(digest.trim_start_matches("sha256:"))).unwrap()
    };
    assert_eq!(
        blob(&manifest["layers"][0]),
        std::fs::read(guest("stateful")).unwrap()
    );
    let config: Value = serde_json::from_slice(&blob(&manifest["config"])).unwrap();
    assert_eq!(config["architecture"], "wasm");
    assert_eq!(config["os"], "wasip2");
    assert_eq!(config["layerDigests"][0], manifest["layers"][0]["digest"]);
    let exports = config["component"]["exports"].to_string();
    assert!(exports.contains("airlock:tool/tool@0.1.2"), "{config}");

    // Written as an OCI layout the way wkg writes one, pushed by skopeo,
    // pulled and run by Airlock.
    let component = std::fs::read(units()).unwrap();
    let layout = scene.path("layout");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let d = digest(bytes);
        std::fs::write(blobs.join(&d[7..]), bytes).unwrap();
        d
    };
    let config = json!({
        "created": "2026-01-01T00:00:00Z",
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [digest(&component)],
        "component": {"exports": ["convert", "units"], "imports": []},
    })
    .to_string();
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": WASM_CONFIG, "digest": put(config.as_bytes()), "size": config.len()},
        "layers": [{"mediaType": "application/wasm", "digest": put(&component), "size": component.len()}],
        "annotations": {"org.opencontainers.image.version": "0.1.0", "org.opencontainers.image.description": "A unit converter"},
    })
    .to_string();
    let manifest_digest = put(manifest.as_bytes());
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    std::fs::write(
        layout.join("index.json"),
        json!({"schemaVersion": 2, "manifests": [{"mediaType": MANIFEST, "digest": manifest_digest, "size": manifest.len(), "annotations": {"org.opencontainers.image.ref.name": "0.1.0"}}]}).to_string(),
    )
    .unwrap();
    let pushed = std::process::Command::new(skopeo)
        .args([
            "copy",
            "--dest-tls-verify=false",
            "--insecure-policy",
            "--preserve-digests",
        ])
        .arg(format!("oci:{}:0.1.0", layout.display()))
        .arg(format!("docker://{}/ext/units:0.1.0", registry.host()))
        .output()
        .unwrap();
    assert!(pushed.status.success(), "{}", stderr(&pushed));
    let theirs = registry.oci("ext/units:0.1.0");
    let pulled = ok_json(&scene.run(&["pull", &theirs, "--insecure", "--json"]));
    assert_eq!(
        pulled["components"][0]["manifest"],
        manifest_digest.as_str()
    );
    assert_eq!(pulled["components"][0]["component"], digest(&component));
    let converted = ok_json(&scene.call(
        &theirs,
        "convert",
        r#"{"value": 2, "from": "kilometre", "to": "metre"}"#,
        &[],
    ));
    assert_eq!(converted["result"], 2000.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_reloads_on_a_changed_lock_and_keeps_serving_through_a_bad_one() {
    let registry = Registry::start();
    let scene = Scene::new();
    let reference = registry.oci("tools/served:1");
    scene.push(&guest("stateful"), &reference, None);
    let config = scene.policy(&policy_text(
        "",
        &format!("[[tool]]\noci = \"{}/tools/served:1\"\n", registry.host()),
    ));
    ok_json(&scene.run(&["pull", "--config", &config, "--json"]));
    let db = scene.path("mcp.db");
    let watching = Watching::default();
    let command = scene.command(
        &[
            "mcp",
            "--config",
            &config,
            "--store",
            db.to_str().unwrap(),
            "--session",
            "s",
        ],
        &[],
    );
    let (client, mut noted) = connect_noting(watching.clone(), command).await;
    let names = |tools: Vec<rmcp::model::Tool>| -> Vec<String> {
        tools.into_iter().map(|t| t.name.to_string()).collect()
    };
    assert!(names(client.list_all_tools().await.unwrap()).contains(&"increment".to_owned()));

    // The tag moves; a reviewed `pull --update` moves the lock; the server
    // follows.
    scene.push(&units(), &reference, None);
    let update = scene.command(&["pull", "--config", &config, "--update", "--json"], &[]);
    let updated = tokio::task::spawn_blocking(move || {
        let mut update = update;
        update.output().unwrap()
    })
    .await
    .unwrap();
    ok_json(&updated);
    wait_for_changes(&watching, 1).await;
    let listed = names(client.list_all_tools().await.unwrap());
    assert!(listed.contains(&"convert".to_owned()), "{listed:?}");
    let args = json!({"value": 3, "from": "kilometre", "to": "metre"});
    let converted = call_with(&client, serde_json::Map::new(), "convert", args.clone()).await;
    assert_eq!(converted.is_error, Some(false));

    // A lock edited into nonsense: the server says why and keeps serving.
    std::fs::write(scene.path("airlock.lock"), "version = 1\n[[component]\n").unwrap();
    let note = wait_for_note(&mut noted, "did not load; the previous tools keep serving").await;
    assert!(note.contains("airlock.lock"), "{note}");
    let converted = call_with(&client, serde_json::Map::new(), "convert", args).await;
    assert_eq!(converted.is_error, Some(false));
    assert_eq!(watching.changes(), 1);
    client.cancel().await.unwrap();
}
