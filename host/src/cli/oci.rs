//! Components from OCI registries: the `oci://` form every command that
//! takes a component accepts, and `airlock pull`, `push`, `sign` and
//! `keygen`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;

use clap::Args;
use serde_json::{Value, json};

use airlock::oci::signature::{self, PrivateKey};
use airlock::oci::{
    Credentials, Fetch, Lock, OciError, OciSettings, OciStore, OciTool, Pushed, Reference,
    Registry, Resolution, Resolved, Resolver,
};
use airlock::policy::Policy;

use super::{Failure, load_policy, print_json, print_out, report_failure};

/// A component as a command names it: a file, or
/// `oci://REGISTRY/REPO:TAG` (or `@sha256:…`), pulled through the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentArg {
    /// A `.wasm` (or `.wat`) file.
    File(PathBuf),
    /// A reference into a registry.
    Oci(Reference),
}

impl FromStr for ComponentArg {
    type Err = OciError;

    fn from_str(text: &str) -> Result<Self, OciError> {
        if text.starts_with(airlock::oci::SCHEME) {
            Ok(Self::Oci(text.parse()?))
        } else {
            Ok(Self::File(PathBuf::from(text)))
        }
    }
}

impl fmt::Display for ComponentArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => write!(f, "{}", path.display()),
            Self::Oci(reference) => write!(f, "{}{reference}", airlock::oci::SCHEME),
        }
    }
}

/// How a command reaches registries.
#[derive(Debug, Clone, Default, Args)]
pub struct RegistryFlags {
    /// Reach registries on this machine (localhost, 127.0.0.1, [::1]) over
    /// plain HTTP. Never used for any other registry.
    #[arg(long)]
    insecure: bool,
}

impl From<airlock::oci::InvalidReference> for Failure {
    fn from(e: airlock::oci::InvalidReference) -> Self {
        OciError::from(e).into()
    }
}

impl From<OciError> for Failure {
    fn from(e: OciError) -> Self {
        let kind = match &e {
            OciError::InvalidReference { .. } => "invalid_reference",
            OciError::Unreachable { .. } => "registry_unreachable",
            OciError::NotFound { .. } => "not_found",
            OciError::AuthRefused { .. } => "auth_refused",
            OciError::TooLarge { .. } => "too_large",
            OciError::NotWasm { .. } => "not_a_component",
            OciError::DigestMismatch { .. } => "digest_mismatch",
            OciError::Insecure { .. } => "insecure_refused",
            OciError::Unsigned { .. } => "unsigned",
            OciError::NoKey { .. } => "no_key",
            OciError::Key { .. } => "invalid_key",
            OciError::Moved { .. } => "moved",
            OciError::Lock { .. } => "invalid_lock",
            OciError::NotPulled { .. } => "not_pulled",
            OciError::UnsafeStore { .. } => "unsafe_store",
            OciError::Refused { .. } => "address_refused",
            OciError::Credentials(_) => "invalid_credentials",
            OciError::Store { .. } | OciError::Signing(_) => return Self::internal(e.to_string()),
            _ => "registry_error",
        };
        Self::input(kind, e.to_string())
    }
}

/// The resolver for `policy` (its `[oci]` settings and its lock), or, with
/// no policy, for `airlock.lock` in the current directory.
fn resolver(policy: Option<&Policy>, registry: &RegistryFlags) -> Result<Resolver, Failure> {
    let mut settings = policy.map(|p| p.oci.clone()).unwrap_or_default();
    settings.insecure |= registry.insecure;
    let lock = Lock::load(&lock_path(policy))?;
    let store = OciStore::from_env().ok_or_else(|| {
        Failure::input(
            "no_cache",
            "no directory is known for pulled components: set AIRLOCK_OCI_DIR or AIRLOCK_CACHE_DIR",
        )
    })?;
    Ok(Resolver::new(
        settings,
        Credentials::from_env()?,
        store,
        lock,
    ))
}

fn lock_path(policy: Option<&Policy>) -> PathBuf {
    airlock::oci::lock_path(policy.map(|p| p.source.as_path()))
}

/// What `policy` says about `reference`: its trusted keys (none when the
/// policy does not list it).
fn tool_for(policy: Option<&Policy>, reference: &Reference) -> OciTool {
    policy
        .and_then(|p| p.for_reference(reference))
        .and_then(|t| t.oci.clone())
        .unwrap_or_else(|| OciTool::unverified(reference.clone()))
}

/// Points the policy's entry for `resolved` (if it lists it) at the pulled
/// file, so that its grants apply.
fn point_entry(policy: Option<&mut Policy>, resolved: &Resolved) {
    let entry = policy.and_then(|p| {
        p.tools.iter_mut().find(|t| {
            t.oci
                .as_ref()
                .is_some_and(|o| o.reference == resolved.reference)
        })
    });
    if let Some(entry) = entry {
        entry.path = resolved.path.clone();
        entry.pulled = Some(resolved.clone());
    }
}

/// The component one command works on (`inspect`, `call`): its file, and
/// what its reference resolved to. Only that reference is resolved
/// (pulled if the store lacks it); the policy's entry for it, if any,
/// points at the pulled file. The lock is never written: a reference it
/// does not pin is resolved for this command only, and said so.
pub(super) async fn resolve_one(
    component: &ComponentArg,
    policy: Option<&mut Policy>,
    registry: &RegistryFlags,
) -> Result<(PathBuf, Option<Resolved>), Failure> {
    let reference = match component {
        ComponentArg::File(path) => return Ok((path.clone(), None)),
        ComponentArg::Oci(reference) => reference,
    };
    let mut resolver = resolver(policy.as_deref(), registry)?;
    let tool = tool_for(policy.as_deref(), reference);
    let new = unpinned(&resolver, reference);
    let resolved = resolver.resolve(&tool, Fetch::Missing).await?;
    if new {
        say_unpinned(&resolver, std::slice::from_ref(&resolved));
    }
    point_entry(policy, &resolved);
    Ok((resolved.path.clone(), Some(resolved)))
}

/// The policy's references and `extra`'s, resolved (pulling what the store
/// lacks; the lock never written: what it does not pin is resolved for
/// this command only, and said so): `extra` as files, in order, and the
/// lock file, when any reference was involved.
pub(super) async fn resolve_all(
    policy: Option<&mut Policy>,
    extra: &[ComponentArg],
    registry: &RegistryFlags,
) -> Result<(Vec<PathBuf>, Option<PathBuf>), Failure> {
    let any_reference = policy
        .as_deref()
        .is_some_and(|p| p.tools.iter().any(|t| t.oci.is_some()))
        || extra.iter().any(|c| matches!(c, ComponentArg::Oci(_)));
    if !any_reference {
        let files = extra.iter().filter_map(|c| match c {
            ComponentArg::File(path) => Some(path.clone()),
            ComponentArg::Oci(_) => None,
        });
        return Ok((files.collect(), None));
    }
    let mut resolver = resolver(policy.as_deref(), registry)?;
    let mut policy = policy;
    let mut resolved = Vec::new();
    if let Some(policy) = policy.as_deref_mut() {
        let new: Vec<Reference> = policy
            .tools
            .iter()
            .filter(|t| t.pulled.is_none())
            .filter_map(|t| t.oci.as_ref().map(|o| o.reference.clone()))
            .filter(|r| unpinned(&resolver, r))
            .collect();
        resolver.resolve_policy(policy, Fetch::Missing).await?;
        resolved.extend(
            policy
                .tools
                .iter()
                .filter_map(|t| t.pulled.clone())
                .filter(|p| new.contains(&p.reference)),
        );
    }
    let mut files = Vec::with_capacity(extra.len());
    for component in extra {
        files.push(match component {
            ComponentArg::File(path) => path.clone(),
            ComponentArg::Oci(reference) => {
                let tool = tool_for(policy.as_deref(), reference);
                let new = unpinned(&resolver, reference);
                let pulled = resolver.resolve(&tool, Fetch::Missing).await?;
                let path = pulled.path.clone();
                if new {
                    resolved.push(pulled);
                }
                path
            }
        });
    }
    say_unpinned(&resolver, &resolved);
    Ok((files, Some(resolver.lock().path().to_path_buf())))
}

/// Whether the lock does not pin `reference` (a command that is not
/// `pull` then resolves it for itself, and says so).
fn unpinned(resolver: &Resolver, reference: &Reference) -> bool {
    resolver.lock().get(reference).is_none()
}

/// Says that each of `resolved`, references the lock does not pin, was
/// resolved for this command only (a command that is not `pull` never
/// writes the lock).
fn say_unpinned(resolver: &Resolver, resolved: &[Resolved]) {
    for pulled in resolved {
        super::print_note(&format!(
            "{}{} is not pinned in {}: this command runs {} without pinning it; \
             `airlock pull` pins it",
            airlock::oci::SCHEME,
            pulled.reference,
            resolver.lock().path().display(),
            pulled.component
        ));
    }
}

/// What `airlock inspect` shows about a pulled component.
pub(super) fn describe(resolved: &Resolved) -> (String, Value) {
    let signed_by: Vec<String> = resolved
        .signed_by
        .iter()
        .map(|k| k.display().to_string())
        .collect();
    let signer = if signed_by.is_empty() {
        "not checked (no `verify` key for it)".to_owned()
    } else {
        signed_by.join(", ")
    };
    let text = format!(
        "{}{}\n  manifest:  {}\n  component: {}\n  signed by: {signer}\n",
        airlock::oci::SCHEME,
        resolved.reference,
        resolved.manifest,
        resolved.component
    );
    let doc = json!({
        "reference": resolved.reference.to_string(),
        "manifest": resolved.manifest,
        "component": resolved.component,
        "signed_by": signed_by,
    });
    (text, doc)
}

#[derive(Debug, Args)]
pub struct PullArgs {
    /// The references to pull (`oci://REGISTRY/REPO:TAG`); default: every
    /// tool the policy names by reference.
    #[arg(value_name = "REFERENCE")]
    references: Vec<String>,
    /// The policy whose references (and `[oci]` settings, and lock beside
    /// it) to use. Without it, `airlock.lock` in the current directory.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Move the lock to what the registry has now (after reviewing it).
    /// Without it, a tag that now names other bytes is refused.
    #[arg(long)]
    update: bool,
    /// With --update: before the lock is written, replay the journaled
    /// calls of each component that changes against its new version (in
    /// the sessions named, or every session of --user within --since),
    /// and show what differs. When a call differs or fails, the lock is
    /// written only with --yes.
    #[arg(long, num_args = 0.., value_name = "SESSION", requires = "update")]
    replay: Option<Vec<String>>,
    /// With --replay: only sessions updated within this long (`7d`).
    #[arg(long, value_name = "AGE", requires = "replay")]
    since: Option<String>,
    /// With --replay: every user's sessions.
    #[arg(long, requires = "replay")]
    all_users: bool,
    /// Write the lock although a replayed call differs.
    #[arg(long, requires = "replay")]
    yes: bool,
    #[command(flatten)]
    store: super::StoreFlags,
    #[command(flatten)]
    registry: RegistryFlags,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

impl PullArgs {
    /// The references to pull and the sessions to replay. `--replay`
    /// takes the words after it, so in `pull --update --replay
    /// oci://REGISTRY/REPO:TAG` the reference would be read as a session:
    /// a word that names a reference (`oci://`, which no session id can
    /// hold) is one, wherever it stands.
    fn references_and_sessions(&self) -> (Vec<String>, Option<Vec<String>>) {
        let mut references = self.references.clone();
        let sessions = self.replay.as_ref().map(|words| {
            let (named, sessions): (Vec<String>, Vec<String>) = words
                .iter()
                .cloned()
                .partition(|word| word.starts_with(airlock::oci::SCHEME));
            references.extend(named);
            sessions
        });
        (references, sessions)
    }
}

/// `airlock pull`: resolves each reference at the registry, checks it
/// against the lock and its signature against the trusted keys, downloads
/// what the store lacks, and writes the lock.
pub async fn pull(args: PullArgs) -> ExitCode {
    let mut replays = Vec::new();
    match pull_all(&args, &mut replays).await {
        Ok((pulled, lock, changed)) => {
            if args.json {
                let components: Vec<Value> = pulled.iter().map(|r| describe(r).1).collect();
                print_json(&json!({
                    "ok": true,
                    "components": components,
                    "lock": lock,
                    "lock_changed": changed,
                    "replays": replays,
                }));
            } else {
                let mut text: String = pulled.iter().map(|r| describe(r).0).collect();
                for replay in &replays {
                    text.push_str(replay["text"].as_str().unwrap_or_default());
                    text.push('\n');
                }
                text.push_str(&if changed {
                    format!("wrote {}", lock.display())
                } else {
                    format!("{} is up to date", lock.display())
                });
                print_out(&text);
            }
            ExitCode::SUCCESS
        }
        Err(failure) => {
            if !args.json {
                for replay in &replays {
                    print_out(replay["text"].as_str().unwrap_or_default());
                }
            }
            let mut extra = serde_json::Map::new();
            extra.insert("replays".into(), Value::from(replays));
            report_failure(&failure, args.json, extra)
        }
    }
}

/// Resolves every reference (and, with `--replay`, compares each changed
/// component's calls, its report added to `replays`); writes the lock
/// unless a replayed call differs and `--yes` was not given.
async fn pull_all(
    args: &PullArgs,
    replays: &mut Vec<Value>,
) -> Result<(Vec<Resolved>, PathBuf, bool), Failure> {
    let policy = load_policy(args.config.as_deref())?;
    let (references, sessions) = args.references_and_sessions();
    let mut tools = Vec::new();
    for text in &references {
        let reference: Reference = text.parse()?;
        tools.push(tool_for(policy.as_ref(), &reference));
    }
    if references.is_empty() {
        tools.extend(
            policy
                .iter()
                .flat_map(|p| p.tools.iter().filter_map(|t| t.oci.clone())),
        );
        if tools.is_empty() {
            return Err(Failure::input(
                "usage",
                "nothing to pull: name references (oci://REGISTRY/REPO:TAG), or a policy \
                 (--config FILE) with `oci = \"…\"` tools",
            ));
        }
    }
    let mut resolver = resolver(policy.as_ref(), &args.registry)?;
    let fetch = if args.update {
        Fetch::Update
    } else {
        Fetch::Check
    };
    let mut pulled = Vec::with_capacity(tools.len());
    let mut moved = Vec::new();
    for tool in &tools {
        // What the lock pins now, when it pins it and the store has it.
        let before = match sessions {
            Some(_) => resolver.resolve(tool, Fetch::Never).await.ok(),
            None => None,
        };
        let resolved = resolver.resolve(tool, fetch).await?;
        if before.is_some_and(|b| b.component != resolved.component) {
            moved.push(resolved.clone());
        }
        pulled.push(resolved);
    }
    if let Some(sessions) = &sessions {
        let differ = replay_moved(args, policy.as_ref(), sessions, &moved, replays).await?;
        if differ > 0 && !args.yes {
            return Err(Failure {
                kind: "replay_differs",
                message: format!(
                    "{differ} replayed call{} differ{} from the journal: {} was not written \
                     (review the differences, then run again with --yes to write it)",
                    if differ == 1 { "" } else { "s" },
                    if differ == 1 { "s" } else { "" },
                    resolver.lock().path().display()
                ),
                exit: super::EXIT_TOOL_FAILED,
            });
        }
    }
    let changed = resolver.save()?;
    Ok((pulled, resolver.lock().path().to_path_buf(), changed))
}

/// Replays the journaled calls of each `moved` component's tools against
/// its new version, under the policy's entry for it; each report (text
/// and JSON) added to `replays`. How many calls differ or fail in all.
async fn replay_moved(
    args: &PullArgs,
    policy: Option<&Policy>,
    sessions: &[String],
    moved: &[Resolved],
    replays: &mut Vec<Value>,
) -> Result<u64, Failure> {
    use super::compare::{Selection, chosen, compare, cores};
    use std::collections::BTreeSet;
    use std::sync::Arc;
    if moved.is_empty() {
        return Ok(0);
    }
    let owner = args.store.owner()?;
    let store = super::compare::store_to_replay(&args.store, sessions, owner).await?;
    let selection = Selection {
        sessions,
        since: args.since.as_deref(),
        all_users: args.all_users,
    };
    let chosen = chosen(&selection, store.as_ref(), owner).await?;
    let mut differ = 0;
    for resolved in moved {
        let entry = policy.and_then(|p| p.for_reference(&resolved.reference));
        let mut host = super::compare::empty_host(policy)?;
        let loaded = match entry {
            Some(entry) => host.load_with(&resolved.path, entry.config.clone()).await?,
            None => host.load(&resolved.path).await?,
        };
        let tools: BTreeSet<String> = loaded.tools().iter().map(|t| t.name.clone()).collect();
        let host = Arc::new(host);
        let compared = compare(store.as_ref(), &host, &tools, &chosen, cores()).await?;
        differ += compared.differ();
        let title = format!(
            "replayed against {}{} (component {}):\n",
            airlock::oci::SCHEME,
            resolved.reference,
            resolved.component
        );
        let mut report = compared.json(&store.location());
        if let Some(report) = report.as_object_mut() {
            report.insert(
                "reference".into(),
                Value::from(resolved.reference.to_string()),
            );
            report.insert(
                "text".into(),
                Value::from(title + &compared.text(&store.location(), &tools) + "\n"),
            );
        }
        replays.push(report);
    }
    Ok(differ)
}

#[derive(Debug, Args)]
pub struct PushArgs {
    /// The component to publish (.wasm).
    file: PathBuf,
    /// Where: `oci://REGISTRY/REPO:TAG`.
    #[arg(value_name = "REFERENCE")]
    reference: String,
    /// Also sign it with this private key (see `airlock keygen`).
    #[arg(long, value_name = "FILE")]
    sign: Option<PathBuf>,
    #[command(flatten)]
    registry: RegistryFlags,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `airlock push`: the component as the wasm OCI artifact layout (and,
/// with `--sign`, its signature).
pub async fn push(args: PushArgs) -> ExitCode {
    let pushed = async {
        let reference: Reference = args.reference.parse()?;
        // The key is read first: a bad key costs no upload.
        let key = args.sign.as_deref().map(PrivateKey::load).transpose()?;
        let bytes = read_component(&args.file)?;
        let registry = connect(&reference, &args.registry)?;
        // What is signed is the digest of the manifest bytes this push
        // sent, never what the registry says the tag names afterwards.
        let Pushed {
            manifest,
            component,
        } = registry.push(&bytes).await?;
        if let Some(key) = &key {
            registry
                .push_signature(&manifest, &key.sign(&reference, &manifest)?)
                .await?;
        }
        Ok::<_, Failure>((reference, manifest, component))
    };
    match pushed.await {
        Ok((reference, manifest, component)) => {
            let signed = args.sign.as_ref().map(|k| k.display().to_string());
            if args.json {
                print_json(
                    &json!({"ok": true, "reference": reference.to_string(), "manifest": manifest, "component": component, "signed_with": signed}),
                );
            } else {
                let mut text = format!(
                    "pushed {} to {}{reference}\n  manifest:  {manifest}\n  component: {component}",
                    args.file.display(),
                    airlock::oci::SCHEME
                );
                if let Some(key) = signed {
                    text.push_str(&format!("\n  signed with {key}"));
                }
                print_out(&text);
            }
            ExitCode::SUCCESS
        }
        Err(failure) => report_failure(&failure, args.json, serde_json::Map::new()),
    }
}

/// The bytes of the component at `path`, refused unless they are a valid
/// component (a registry is no place to find out).
fn read_component(path: &Path) -> Result<Vec<u8>, Failure> {
    let bytes = airlock::fs::read_component(path).map_err(|e| {
        Failure::input(
            "file_not_readable",
            format!("{}: cannot read: {e}", path.display()),
        )
    })?;
    if !wasmparser::Parser::is_component(&bytes) {
        return Err(Failure::input(
            "not_a_component",
            format!(
                "{}: not a WebAssembly component (build for wasm32-wasip2, or wrap a module with `wasm-tools component new`)",
                path.display()
            ),
        ));
    }
    let mut validator = wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all());
    validator.validate_all(&bytes).map_err(|e| {
        Failure::input(
            "invalid_component",
            format!("{}: invalid component: {e}", path.display()),
        )
    })?;
    Ok(bytes)
}

fn connect(reference: &Reference, flags: &RegistryFlags) -> Result<Registry, Failure> {
    let settings = OciSettings {
        insecure: flags.insecure,
        ..OciSettings::default()
    };
    Ok(Registry::connect(
        reference,
        &settings,
        &Credentials::from_env()?,
    )?)
}

#[derive(Debug, Args)]
pub struct SignArgs {
    /// What to sign: `oci://REGISTRY/REPO@sha256:…` (that manifest), or
    /// `oci://REGISTRY/REPO:TAG` (the manifest the tag names now, shown
    /// before it is signed: confirmed at a terminal, or with `--yes`).
    #[arg(value_name = "REFERENCE")]
    reference: String,
    /// The private key (PEM, PKCS#8; see `airlock keygen`).
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// Sign what a tag names without asking (a script's way; signing by
    /// digest needs no confirmation).
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    registry: RegistryFlags,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `airlock sign`: a cosign-compatible signature for the manifest the
/// reference names, for the reference's repository, stored beside it in
/// the registry. A tag is resolved first and what it names (manifest and
/// component digests) shown; it is signed only once confirmed, since a
/// tag names whatever the registry says at that moment.
pub async fn sign(args: SignArgs) -> ExitCode {
    let signed = async {
        let reference: Reference = args.reference.parse()?;
        let key = PrivateKey::load(&args.key)?;
        let registry = connect(&reference, &args.registry)?;
        let Resolution {
            manifest, layer, ..
        } = registry.resolve(&reference).await?;
        if reference.digest().is_none() && !args.yes {
            confirm_signing(&reference, &manifest, &layer.digest)?;
        }
        registry
            .push_signature(&manifest, &key.sign(&reference, &manifest)?)
            .await?;
        Ok::<_, Failure>((reference, manifest, layer.digest))
    };
    match signed.await {
        Ok((reference, manifest, component)) => {
            if args.json {
                print_json(
                    &json!({"ok": true, "reference": reference.to_string(), "manifest": manifest, "component": component, "signed_with": args.key}),
                );
            } else {
                print_out(&format!(
                    "signed {}{reference}\n  manifest:  {manifest}\n  component: {component}\n  with {}",
                    airlock::oci::SCHEME,
                    args.key.display()
                ));
            }
            ExitCode::SUCCESS
        }
        Err(failure) => report_failure(&failure, args.json, serde_json::Map::new()),
    }
}

/// Asks the person at the terminal whether to sign what `reference` names
/// now; refused (saying what it names, and how to sign it by digest)
/// when no one is there to ask.
fn confirm_signing(reference: &Reference, manifest: &str, component: &str) -> Result<(), Failure> {
    use std::io::IsTerminal as _;
    let at = format!("{}{reference}", airlock::oci::SCHEME);
    let names = format!("{at} names manifest {manifest} (component {component})");
    let by_digest = format!("{}{}", airlock::oci::SCHEME, reference.at_digest(manifest));
    if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        return Err(Failure::input(
            "confirm",
            format!(
                "{names}; a tag names whatever the registry says now, so sign it by digest \
                 ({by_digest}) or pass --yes"
            ),
        ));
    }
    super::print_note(&format!("{names}."));
    super::print_note("sign it? [y/N]");
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .map_err(|e| Failure::input("confirm", format!("cannot read the answer: {e}")))?;
    if super::terminal::says_yes(&answer) {
        Ok(())
    } else {
        Err(Failure::input("confirm", format!("not signed: {names}")))
    }
}

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Where to write: PREFIX.key (private, 0600) and PREFIX.pub.
    #[arg(long, value_name = "PREFIX")]
    out: PathBuf,
    /// Replace a key pair already there (signatures made with it will no
    /// longer verify against the new public key).
    #[arg(long)]
    force: bool,
}

/// `airlock keygen`: an ECDSA P-256 key pair, the kind cosign uses.
pub fn keygen(args: KeygenArgs) -> ExitCode {
    let written = (|| {
        // A prefix names the files' path less their suffix: one that
        // ends in a directory would make hidden `.key` and `.pub` in it.
        if airlock::fs::ends_in_a_directory(&args.out) {
            return Err(Failure::input(
                "usage",
                format!(
                    "--out {}: say the files' name less .key and .pub, not a directory (for \
                     example {})",
                    args.out.display(),
                    args.out.join("signing").display()
                ),
            ));
        }
        let with = |suffix: &str| {
            let mut path = args.out.clone().into_os_string();
            path.push(suffix);
            PathBuf::from(path)
        };
        let (private, public) = (with(".key"), with(".pub"));
        for path in [&private, &public] {
            if path.exists() && !args.force {
                return Err(Failure::input(
                    "exists",
                    format!(
                        "{}: already exists; not overwritten (--force replaces it)",
                        path.display()
                    ),
                ));
            }
        }
        if let Some(dir) = private.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                Failure::input(
                    "file_not_writable",
                    format!("{}: cannot create: {e}", dir.display()),
                )
            })?;
        }
        let (private_pem, public_pem) = signature::generate()?;
        let write = |path: &Path, text: &str, mode: u32| {
            use std::io::Write as _;
            use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
            let written = if args.force {
                // Replaced whole or not at all: a file beside it (made
                // 0600), renamed over it once written.
                airlock::fs::Destination::open(path).and_then(|mut file| {
                    file.write_all(text.as_bytes())?;
                    if let airlock::fs::Destination::Replace(..) = file {
                        file.file()
                            .set_permissions(std::fs::Permissions::from_mode(mode))?;
                    }
                    file.commit()
                })
            } else {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(mode)
                    .open(path)
                    .and_then(|mut file| file.write_all(text.as_bytes()))
            };
            written.map_err(|e| {
                Failure::input(
                    "file_not_writable",
                    format!("{}: cannot write: {e}", path.display()),
                )
            })
        };
        write(&private, &private_pem, 0o600)?;
        write(&public, &public_pem, 0o644)?;
        Ok((private, public))
    })();
    match written {
        Ok((private, public)) => {
            print_out(&format!(
                "wrote {} (private: keep it secret) and {} (public: give it to operators, for `verify = {{ key = … }}`)",
                private.display(),
                public.display()
            ));
            ExitCode::SUCCESS
        }
        Err(failure) => report_failure(&failure, false, serde_json::Map::new()),
    }
}
