//! §13 Tools from a registry: starting a host whose tool the policy names
//! by reference (lock, store, signature check) beside the same tool named
//! by file path, both from a filled compile cache, paired.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{Bench, Pinned, batch, component};
use airlock::oci::signature::{self, PrivateKey};
use airlock::oci::{
    Credentials, Fetch, Lock, OciSettings, OciStore, Reference, Registry, Resolver,
};
use airlock::policy::Policy;
use airlock::{CompileCache, Host};

/// Debian's docker-registry on a free loopback port, its data in `dir`;
/// ready when `/v2/` answers.
fn start_registry(dir: &Path) -> (Child, String) {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let config = dir.join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
            dir.join("registry").display()
        ),
    )
    .unwrap();
    let child = Command::new("/usr/bin/docker-registry")
        .arg("serve")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("docker-registry (make registry-server)");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "the registry did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, addr.to_string())
}

/// A host for the policy at `path`, its references resolved from the lock
/// and store beside it without the network: what `airlock run --config`
/// does before the first call.
async fn start(path: &Path, store: &OciStore, cache: &Path) -> Host {
    let (policy, _) = resolved(path, store, Fetch::Never).await;
    Host::builder()
        .cache(CompileCache::in_dir(cache))
        .build_with_policy(&policy)
        .await
        .unwrap()
}

/// The policy at `path`, its references resolved through the lock beside
/// it and `store` as `fetch` allows; and the resolver (to save the lock).
async fn resolved(path: &Path, store: &OciStore, fetch: Fetch) -> (Policy, Resolver) {
    let mut policy = Policy::load(path).unwrap();
    let lock = Lock::load(&policy.lock_path()).unwrap();
    let mut resolver = Resolver::new(
        policy.oci.clone(),
        Credentials::anonymous(),
        store.clone(),
        lock,
    );
    resolver.resolve_policy(&mut policy, fetch).await.unwrap();
    (policy, resolver)
}

pub(crate) async fn run(b: &Bench, out: &mut String) {
    writeln!(out, "## 13. Tools from a registry: start by reference\n").unwrap();
    writeln!(
        out,
        "Starting a host for a one-tool policy (the Rust stateful example), from a filled compile \
         cache: **by reference** reads the policy, the lock beside it and the OCI store, checks the \
         component's cosign signature (ECDSA P-256) against the trusted key, then loads the component \
         from the store; **by path** reads the policy and loads the same component from its file. \
         Neither touches the network (the registry, Debian's docker-registry on loopback, only \
         filled the store).\n"
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (mut registry, host) = start_registry(dir.path());
    let file = component("wasm32-wasip2/release/stateful.wasm");
    let reference: Reference = format!("{host}/bench/stateful:1").parse().unwrap();
    let settings = OciSettings {
        insecure: true,
        ..OciSettings::default()
    };
    let (private, public) = signature::generate().unwrap();
    std::fs::write(dir.path().join("k.key"), private).unwrap();
    std::fs::write(dir.path().join("k.pub"), public).unwrap();
    let key = PrivateKey::load(&dir.path().join("k.key")).unwrap();
    let pushing = Registry::connect(&reference, &settings, &Credentials::anonymous()).unwrap();
    let manifest = pushing
        .push(&std::fs::read(&file).unwrap())
        .await
        .unwrap()
        .manifest;
    pushing
        .push_signature(&manifest, &key.sign(&reference, &manifest).unwrap())
        .await
        .unwrap();

    let by_reference = dir.path().join("by-reference/airlock.toml");
    let by_path = dir.path().join("by-path/airlock.toml");
    for (policy, tool) in [
        (
            &by_reference,
            format!(
                "[oci]\ninsecure = true\n\n[[tool]]\noci = \"{reference}\"\nverify = {{ key = \"../k.pub\" }}\n"
            ),
        ),
        (&by_path, format!("[[tool]]\npath = {:?}\n", file)),
    ] {
        std::fs::create_dir_all(policy.parent().unwrap()).unwrap();
        std::fs::write(policy, tool).unwrap();
    }
    // Pull once (what `airlock pull` does), then stop the registry.
    let store = OciStore::in_dir(dir.path().join("store"));
    let (_, mut resolver) = resolved(&by_reference, &store, Fetch::Check).await;
    resolver.save().unwrap();
    let _ = registry.kill();
    let _ = registry.wait();
    // An operator pulls, then starts later: wait until the compile cache
    // trusts the new file's timestamps (within the racy window a start
    // hashes the whole component), and start once to index it.
    std::thread::sleep(CompileCache::RACY_WINDOW + Duration::from_millis(100));
    drop(start(&by_reference, &store, &b.cache).await);

    let pairs = if b.quick { 5 } else { 45 };
    let batch_size = if b.quick { 5 } else { 20 };
    let pinned = Pinned::here(&[]);
    let measured = b
        .paired(
            "start: by reference / by path",
            pairs,
            async || {
                batch(batch_size, async || {
                    drop(start(&by_reference, &store, &b.cache).await);
                })
                .await
            },
            async || {
                batch(batch_size, async || {
                    drop(start(&by_path, &store, &b.cache).await);
                })
                .await
            },
        )
        .await;
    drop(pinned);
    if !b.reporting() {
        return;
    }
    writeln!(
        out,
        "| pair | by reference | by path | reference / path | target ≤ 1.1× |"
    )
    .unwrap();
    writeln!(out, "|---|---|---|---|---|").unwrap();
    writeln!(
        out,
        "{} {} |\n",
        measured.row("policy to a host with one tool (signed, from the store)"),
        measured.at_most(1.1)
    )
    .unwrap();
}
