//! The trust edges of tools from registries (DESIGN §10, issue 60): what
//! is signed is what Airlock pushed, a signature counts for its own
//! repository only, credentials reach only their own registry, an edited
//! lock cannot point a signed tool at another stored component, and no
//! registry can send the host to an address on its own network. Each
//! through the real binary, against Debian's registry or a scripted one
//! on loopback; nothing leaves loopback.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::oci::{
    MANIFEST, Scene, artifact, ok_json, ok_json_inspect, policy_text, refused, stateful_tool,
    stderr, units,
};
use crate::support::guest;
use crate::support::registry::{Hostile, Proxy, Registry, Scripted, digest};

/// The cosign signature tag of `manifest`.
fn signature_tag(manifest: &str) -> String {
    format!("{}.sig", manifest.replace(':', "-"))
}

/// Whether `repo` of `registry` has a manifest at `reference`.
fn has_manifest(registry: &Registry, repo: &str, reference: &str) -> bool {
    let got = registry.request(
        "GET",
        &format!("/v2/{repo}/manifests/{reference}"),
        &[("Accept", MANIFEST)],
        b"",
    );
    got.status == 200
}

/// Copies the manifest at `tag` of `from`, with its blobs, to `to`: the
/// same bytes, so the same digest.
fn copy(registry: &Registry, from: &str, to: &str, tag: &str) -> String {
    let bytes = registry.manifest(from, tag);
    let doc: Value = serde_json::from_slice(&bytes).unwrap();
    let layers = doc["layers"].as_array().unwrap();
    for blob in std::iter::once(&doc["config"]).chain(layers) {
        let blob_digest = blob["digest"].as_str().unwrap();
        let got = registry.request("GET", &format!("/v2/{from}/blobs/{blob_digest}"), &[], b"");
        assert_eq!(got.status, 200);
        assert_eq!(registry.put_blob(to, &got.body), blob_digest);
    }
    registry.put_manifest(to, tag, MANIFEST, &bytes)
}

/// `push --sign` signs the digest of the manifest bytes it sent, never
/// what the registry answers when asked afterwards; `sign` on a tag shows
/// what the tag names now and signs it only when told to (issue 60.1).
#[test]
fn what_is_signed_is_what_was_pushed() {
    let registry = Registry::start();
    let scene = Scene::new();
    scene.keygen("publisher");
    let stateful = digest(&std::fs::read(guest("stateful")).unwrap());
    let units_digest = digest(&std::fs::read(units()).unwrap());
    // Another component in the same repository, which the rewriting
    // proxy serves as the tag once the push is done.
    let swapped = scene.push(&units(), &registry.oci("tools/stateful:swap"), None);
    let swapped_bytes = registry.manifest("tools/stateful", "swap");
    let proxy = Proxy::start(
        registry.addr,
        BTreeMap::from([(
            "/v2/tools/stateful/manifests/1.0".to_owned(),
            Scripted::Bytes {
                content_type: MANIFEST.into(),
                digest: Some(swapped.clone()),
                body: swapped_bytes,
            },
        )]),
    );
    let pushed = scene.push(
        &guest("stateful"),
        &proxy.oci("tools/stateful:1.0"),
        Some("publisher"),
    );
    assert_ne!(pushed, swapped);
    assert_eq!(digest(&registry.manifest("tools/stateful", "1.0")), pushed);
    assert!(has_manifest(
        &registry,
        "tools/stateful",
        &signature_tag(&pushed)
    ));
    assert!(
        !has_manifest(&registry, "tools/stateful", &signature_tag(&swapped)),
        "the registry's answer was signed"
    );
    // The signature is for the pushed component: it verifies where the
    // tag names it (made for the repository as the push named it, the
    // proxy's)...
    let verify = "verify = { key = \"keys/publisher.pub\" }";
    let config = scene.policy(&policy_text(
        "require_signature = true",
        &stateful_tool(
            &registry.host(),
            "1.0",
            &format!(
                "verify = {{ key = \"keys/publisher.pub\", repositories = [\"{}/tools/stateful\"] }}",
                proxy.addr
            ),
        ),
    ));
    let pulled = ok_json(&scene.run(&["pull", "--config", &config, "--json"]));
    assert_eq!(pulled["components"][0]["manifest"], pushed.as_str());
    assert_eq!(pulled["components"][0]["component"], stateful.as_str());
    // ...and the swapped bytes carry no signature.
    let other = Scene::new();
    std::fs::create_dir_all(other.path("keys")).unwrap();
    std::fs::copy(
        scene.path("keys/publisher.pub"),
        other.path("keys/publisher.pub"),
    )
    .unwrap();
    let config = other.policy(&policy_text(
        "require_signature = true",
        &stateful_tool(&proxy.addr.to_string(), "1.0", verify),
    ));
    let message = refused(
        &other.run(&["pull", "--config", &config, "--json"]),
        "unsigned",
    );
    assert!(message.contains(&swapped), "{message}");

    // `sign` on a tag, in a script: refused, showing what it would sign.
    let sign = |reference: &str, extra: &[&str]| {
        let mut args = vec![
            "sign",
            reference,
            "--key",
            "keys/publisher.key",
            "--insecure",
            "--json",
        ];
        args.extend_from_slice(extra);
        scene.run(&args)
    };
    let tag = proxy.oci("tools/stateful:1.0");
    let message = refused(&sign(&tag, &[]), "confirm");
    for shown in [swapped.as_str(), units_digest.as_str(), "--yes", "@sha256:"] {
        assert!(message.contains(shown), "{shown} not in {message}");
    }
    assert!(!has_manifest(
        &registry,
        "tools/stateful",
        &signature_tag(&swapped)
    ));
    // By digest, it signs that manifest and says which component it is.
    let by_digest = registry.oci(&format!("tools/stateful@{swapped}"));
    let signed = ok_json(&sign(&by_digest, &[]));
    assert_eq!(signed["manifest"], swapped.as_str());
    assert_eq!(signed["component"], units_digest.as_str());
    assert!(has_manifest(
        &registry,
        "tools/stateful",
        &signature_tag(&swapped)
    ));
    // A push names the tag it moves; a digest is no place to push to.
    let out = scene.run(&[
        "push",
        guest("stateful").to_str().unwrap(),
        &by_digest,
        "--insecure",
        "--json",
    ]);
    assert!(refused(&out, "invalid_reference").contains("a push names a tag"));
    // With --yes, the tag's manifest now, as shown.
    let signed = ok_json(&sign(&registry.oci("tools/stateful:1.0"), &["--yes"]));
    assert_eq!(signed["manifest"], pushed.as_str());
    assert_eq!(signed["component"], stateful.as_str());
}

/// A signature names the repository it was made for, and verification
/// checks it: the same signed bytes copied to another repository are
/// unsigned there, online and offline, unless the policy names the
/// original as one whose signatures count (a mirror) (issue 60.2).
#[test]
fn a_signature_counts_only_for_the_repository_it_was_made_for() {
    let registry = Registry::start();
    let scene = Scene::new();
    scene.keygen("publisher");
    let manifest = scene.push(
        &guest("stateful"),
        &registry.oci("tools/stateful:1.0"),
        Some("publisher"),
    );
    assert_eq!(
        copy(&registry, "tools/stateful", "mirror/stateful", "1.0"),
        manifest
    );
    copy(
        &registry,
        "tools/stateful",
        "mirror/stateful",
        &signature_tag(&manifest),
    );
    let host = registry.host();
    let tool = |verify: &str| {
        format!(
            "[[tool]]\noci = \"{host}/mirror/stateful:1.0\"\n{verify}\ncontext = {{ read = [\"counters\"], write = [\"counters\"] }}\n"
        )
    };
    let plain = scene.policy(&policy_text(
        "require_signature = true",
        &tool("verify = { key = \"keys/publisher.pub\" }"),
    ));
    let message = refused(
        &scene.run(&["pull", "--config", &plain, "--json"]),
        "unsigned",
    );
    assert!(
        message.contains(&manifest) && message.contains("(1 signatures found)"),
        "{message}"
    );
    assert!(scene.stored().is_empty());

    let mirrored = format!(
        "verify = {{ key = \"keys/publisher.pub\", repositories = [\"{host}/tools/stateful\"] }}"
    );
    let config = scene.policy(&policy_text("require_signature = true", &tool(&mirrored)));
    let pulled = ok_json(&scene.run(&["pull", "--config", &config, "--json"]));
    assert_eq!(pulled["components"][0]["manifest"], manifest.as_str());
    let mirror = registry.oci("mirror/stateful:1.0");
    let call = || {
        scene.call(
            &mirror,
            "increment",
            r#"{"name": "a"}"#,
            &["--config", &plain],
        )
    };
    // Offline, the kept signature is checked against the repository too.
    drop(registry);
    scene.policy(&policy_text(
        "require_signature = true",
        &tool("verify = { key = \"keys/publisher.pub\" }"),
    ));
    refused(&call(), "unsigned");
    scene.policy(&policy_text("require_signature = true", &tool(&mirrored)));
    assert_eq!(ok_json(&call())["result"]["value"], 1);

    // A repository that is not one is refused by name.
    scene.policy(&policy_text(
        "",
        &tool("verify = { key = \"keys/publisher.pub\", repositories = [\"stateful:1.0\"] }"),
    ));
    let out = call();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("\"stateful:1.0\" is not REGISTRY/REPOSITORY")
            || String::from_utf8_lossy(&out.stdout).contains("is not REGISTRY/REPOSITORY"),
        "{}",
        stderr(&out)
    );
}

/// Credentials from the environment or the docker config file reach only
/// the registry they were given for: not another registry a command
/// names, not a token service on another host (issue 60.3).
#[test]
fn registry_credentials_reach_only_their_own_registry() {
    const USER: &str = "publisher";
    const PASSWORD: &str = "hunter2-correct-horse";
    let owner = Registry::start_with_auth(USER, PASSWORD);
    let other = Hostile::start_with(|_| BTreeMap::new());
    let scene = Scene::new();
    use base64::Engine as _;
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    let auth_file = scene.path("auth.json");
    let file_for = |hosts: &[String]| {
        let auths: serde_json::Map<String, Value> = hosts
            .iter()
            .map(|h| (h.clone(), json!({"auth": token})))
            .collect();
        std::fs::write(&auth_file, json!({"auths": auths}).to_string()).unwrap();
    };
    file_for(&[owner.host()]);
    let env = [
        ("AIRLOCK_REGISTRY", owner.host()),
        ("AIRLOCK_REGISTRY_USERNAME", USER.to_owned()),
        ("AIRLOCK_REGISTRY_PASSWORD", PASSWORD.to_owned()),
        ("REGISTRY_AUTH_FILE", auth_file.to_str().unwrap().to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = scene.run_env(
        &["inspect", &other.oci("tools/x:1"), "--insecure", "--json"],
        &env,
    );
    refused(&out, "not_found");
    let seen = other.seen();
    assert!(!seen.is_empty());
    for request in &seen {
        assert_eq!(request.header("authorization"), None, "{request:?}");
    }

    // A registry whose token service is another host's.
    let realm = format!("http://{}/token", other.addr);
    let asking = Hostile::start_with(|_| {
        BTreeMap::from([("/v2/".to_owned(), Scripted::token_challenge(&realm))])
    });
    let env = [
        ("AIRLOCK_REGISTRY", asking.addr.to_string()),
        ("AIRLOCK_REGISTRY_USERNAME", USER.to_owned()),
        ("AIRLOCK_REGISTRY_PASSWORD", PASSWORD.to_owned()),
        ("REGISTRY_AUTH_FILE", auth_file.to_str().unwrap().to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let pull = || {
        scene.run_env(
            &["pull", &asking.oci("tools/x:1"), "--insecure", "--json"],
            &env,
        )
    };
    refused(&pull(), "auth_refused");
    let asked_token = |auth: bool| {
        let tokens: Vec<_> = other
            .seen()
            .into_iter()
            .filter(|r| r.path == "/token")
            .collect();
        assert!(!tokens.is_empty());
        tokens
            .last()
            .unwrap()
            .header("authorization")
            .is_some_and(|a| a == format!("Basic {token}"))
            == auth
    };
    assert!(
        asked_token(false),
        "the registry's credentials went to its token service's host"
    );
    // Credentials filed for the token service's own host go to it.
    file_for(&[owner.host(), other.addr.to_string()]);
    refused(&pull(), "auth_refused");
    assert!(asked_token(true));
}

/// Offline, a run re-derives the component from the manifest bytes the
/// store kept: a lock edited to name another component in the store is
/// refused with both digests, and `inspect` reports no trusted signer for
/// it (issue 60.4).
#[test]
fn a_lock_edited_to_another_stored_component_is_refused_offline() {
    let mut registry = Registry::start();
    let scene = Scene::new();
    scene.keygen("publisher");
    let host = registry.host();
    scene.push(
        &guest("stateful"),
        &registry.oci("tools/stateful:1.0"),
        Some("publisher"),
    );
    scene.push(&units(), &registry.oci("tools/units:1"), None);
    let config = scene.policy(&policy_text(
        "",
        &format!(
            "{}\n[[tool]]\noci = \"{host}/tools/units:1\"\n",
            stateful_tool(&host, "1.0", "verify = { key = \"keys/publisher.pub\" }")
        ),
    ));
    ok_json(&scene.run(&["pull", "--config", &config, "--json"]));
    assert_eq!(scene.stored().len(), 2);
    registry.stop();
    let stateful = digest(&std::fs::read(guest("stateful")).unwrap());
    let units_digest = digest(&std::fs::read(units()).unwrap());
    let reference = format!("oci://{host}/tools/stateful:1.0");
    let lock = scene.lock();
    let stateful_entry = lock.find(&format!("{host}/tools/stateful:1.0")).unwrap();
    let edited = format!(
        "{}{}",
        &lock[..stateful_entry],
        lock[stateful_entry..].replacen(&stateful, &units_digest, 1)
    );
    assert_ne!(edited, lock);
    std::fs::write(scene.path("airlock.lock"), &edited).unwrap();
    let convert = r#"{"value": 1, "from": "kilometre", "to": "metre"}"#;
    let message = refused(
        &scene.call(&reference, "convert", convert, &["--config", &config]),
        "invalid_lock",
    );
    assert!(
        message.contains(&units_digest) && message.contains(&stateful),
        "{message}"
    );
    let out = scene.run(&["inspect", &reference, "--config", &config, "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // The lock put back, the signed tool runs offline again.
    std::fs::write(scene.path("airlock.lock"), &lock).unwrap();
    let called = ok_json(&scene.call(
        &reference,
        "increment",
        r#"{"name": "a"}"#,
        &["--config", &config],
    ));
    assert_eq!(called["result"]["value"], 1);
    let inspected =
        ok_json_inspect(&scene.run(&["inspect", &reference, "--config", &config, "--json"]));
    assert_eq!(inspected["oci"]["component"], stateful.as_str());
}

/// No registry can make the host send a request to an address on its own
/// network: a redirect of a manifest or a blob, a token realm, an upload
/// location naming a private or link-local address is refused before any
/// connection is made (`address_refused`, not `registry_unreachable`),
/// and nothing is stored. A redirect back to the registry itself is
/// followed (issue 60.7).
#[test]
fn registries_cannot_send_the_host_to_private_addresses() {
    let good = std::fs::read(guest("stateful")).unwrap();
    let (manifest, manifest_digest, _, layer) = artifact(&good, None, None);
    let manifest_at = |body: &[u8]| Scripted::Bytes {
        content_type: MANIFEST.into(),
        digest: None,
        body: body.to_vec(),
    };
    let hostile = Hostile::start_with(|addr| {
        BTreeMap::from([
            (
                "/v2/t/moved/manifests/1".to_owned(),
                Scripted::redirect("http://10.0.0.1/v2/t/moved/manifests/1"),
            ),
            ("/v2/t/blob/manifests/1".to_owned(), manifest_at(&manifest)),
            (
                format!("/v2/t/blob/blobs/{layer}"),
                Scripted::redirect("https://169.254.169.254/latest/meta-data"),
            ),
            ("/v2/t/home/manifests/1".to_owned(), manifest_at(&manifest)),
            (
                format!("/v2/t/home/blobs/{layer}"),
                Scripted::redirect(&format!("http://{addr}/served/{layer}")),
            ),
            (
                format!("/served/{layer}"),
                Scripted::Bytes {
                    content_type: "application/octet-stream".into(),
                    digest: None,
                    body: good.clone(),
                },
            ),
            (
                "/v2/t/upload/blobs/uploads/".to_owned(),
                Scripted::Answer {
                    status: 202,
                    headers: vec![("Location".into(), "http://10.0.0.1/upload/1".into())],
                },
            ),
        ])
    });
    let realm = Hostile::start_with(|_| {
        BTreeMap::from([(
            "/v2/".to_owned(),
            Scripted::token_challenge("http://10.0.0.1/token"),
        )])
    });
    let scene = Scene::new();
    let pull = |reference: &str| scene.run(&["pull", reference, "--insecure", "--json"]);
    for (reference, address) in [
        (hostile.oci("t/moved:1"), "10.0.0.1"),
        (hostile.oci("t/blob:1"), "169.254.169.254"),
        (realm.oci("t/x:1"), "10.0.0.1"),
    ] {
        let message = refused(&pull(&reference), "address_refused");
        assert!(message.contains(address), "{message}");
    }
    let pushed = scene.run(&[
        "push",
        guest("stateful").to_str().unwrap(),
        &hostile.oci("t/upload:1"),
        "--insecure",
        "--json",
    ]);
    let message = refused(&pushed, "address_refused");
    assert!(message.contains("10.0.0.1"), "{message}");
    assert!(scene.stored().is_empty());
    assert!(!realm.asked().iter().any(|p| p == "/token"));

    // A redirect to the registry's own address is followed.
    let pulled = ok_json(&pull(&hostile.oci("t/home:1")));
    assert_eq!(
        pulled["components"][0]["manifest"],
        manifest_digest.as_str()
    );
    assert_eq!(scene.stored().len(), 1);
}
