//! The directory grant: nothing without a grant, exactly
//! the granted directory (read-only or read-write) with one, and no escape.

use airlock::context::ContextRules;
use airlock::sandbox::grants::{DirGrant, DirMode};
use airlock::{CallError, Host, RunContext, ToolConfig};
use serde_json::json;

use crate::support::{assert_host_still_serves, call, host_with, snapshot};

struct Fixture {
    /// Holds `outside.txt` and the granted `data/` and `rw/` directories.
    root: tempfile::TempDir,
    host: Host,
}

impl Fixture {
    async fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("data");
        let rw = root.path().join("rw");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&rw).unwrap();
        std::fs::write(data.join("ok.txt"), "granted content").unwrap();
        std::fs::write(root.path().join("outside.txt"), "OUTSIDE-SECRET").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("/etc/passwd", data.join("passwd-link")).unwrap();

        let mut config = ToolConfig::default();
        config.grants.dirs = vec![
            DirGrant::new(&data, "/data", DirMode::Ro).unwrap(),
            DirGrant::new(&rw, "/rw", DirMode::Rw).unwrap(),
        ];
        let host = host_with(&[("hostile", config)], ContextRules::default()).await;
        Self { root, host }
    }

    /// Runs an attack that must fail as a tool error; checks deps and the
    /// next call; returns the error message.
    async fn refused(&self, tool: &str, args: serde_json::Value) -> String {
        let mut ctx = RunContext::from_value(json!({"keep": 1})).unwrap();
        let before = snapshot(&ctx);
        let err = call(&self.host, &mut ctx, tool, args.clone())
            .await
            .unwrap_err();
        let CallError::Failed(message) = err else {
            panic!("{tool} {args}: expected a tool failure, got {err}");
        };
        assert_host_still_serves(&self.host, &mut ctx, &before).await;
        message
    }
}

#[tokio::test]
async fn granted_directory_is_readable() {
    let f = Fixture::new().await;
    let mut ctx = RunContext::default();
    let out = call(
        &f.host,
        &mut ctx,
        "read_file",
        json!({"path": "/data/ok.txt"}),
    )
    .await
    .unwrap();
    assert_eq!(out.result["text"], "granted content");
}

#[tokio::test]
async fn etc_passwd_is_not_reachable() {
    let f = Fixture::new().await;
    for path in ["/etc/passwd", "/data/../../etc/passwd", "/data/passwd-link"] {
        let message = f.refused("read_file", json!({"path": path})).await;
        assert!(!message.contains("root:"), "{path}: {message}");
    }
}

#[tokio::test]
async fn dot_dot_cannot_leave_the_granted_directory() {
    let f = Fixture::new().await;
    for path in [
        "/data/../outside.txt",
        "../outside.txt",
        "/data/../../outside.txt",
        "/outside.txt",
    ] {
        let message = f.refused("read_file", json!({"path": path})).await;
        assert!(!message.contains("OUTSIDE-SECRET"), "{path}: {message}");
    }
}

#[tokio::test]
async fn read_only_directory_cannot_be_written() {
    let f = Fixture::new().await;
    f.refused("write_file", json!({"path": "/data/new.txt", "text": "x"}))
        .await;
    f.refused(
        "write_file",
        json!({"path": "/data/ok.txt", "text": "overwritten"}),
    )
    .await;
    assert!(!f.root.path().join("data/new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(f.root.path().join("data/ok.txt")).unwrap(),
        "granted content"
    );
}

#[tokio::test]
async fn read_write_directory_can_be_written() {
    let f = Fixture::new().await;
    let mut ctx = RunContext::default();
    call(
        &f.host,
        &mut ctx,
        "write_file",
        json!({"path": "/rw/new.txt", "text": "written"}),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(f.root.path().join("rw/new.txt")).unwrap(),
        "written"
    );
}

/// A tool granted a writable directory cannot fill the disk: what one
/// call writes there, through a stream, at offsets, by growing a file, or
/// as files it makes (a disk block each), stops at its `max_write_bytes`.
/// The tool is told the disk is full, the call's refusals say why, deps
/// are unchanged, and the next call has a whole budget of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_writes_at_most_its_bound_into_its_directories() {
    const BOUND: u64 = 1 << 20;
    let root = tempfile::tempdir().unwrap();
    let rw = root.path().join("rw");
    std::fs::create_dir_all(&rw).unwrap();
    let mut config = ToolConfig::default();
    config.grants.dirs = vec![DirGrant::new(&rw, "/rw", DirMode::Rw).unwrap()];
    config.limits.max_write_bytes = BOUND;
    // Without the bound, each attack would run to its timeout.
    config.limits.timeout = std::time::Duration::from_secs(2);
    let host = host_with(&[("hostile", config)], ContextRules::default()).await;

    for (how, path) in [
        ("stream", "/rw/stream.bin"),
        ("positional", "/rw/positional.bin"),
        ("grow", "/rw/grown.bin"),
        ("files", "/rw/empty"),
    ] {
        let mut ctx = RunContext::from_value(json!({"keep": 1})).unwrap();
        let before = snapshot(&ctx);
        let args = json!({"path": path, "how": how}).to_string();
        let failure = host
            .call(&mut ctx, &airlock::ToolCall::new("fill_disk", args))
            .await
            .unwrap_err();
        let CallError::Failed(message) = &failure.error else {
            panic!(
                "{how}: expected the tool's own failure, got {}",
                failure.error
            );
        };
        // What the tool sees is its libc's word for the error: a stream's
        // failed write is "I/O error" to wasi-libc, whatever the host says.
        assert!(message.contains(", then: "), "{how}: {message}");
        if how != "stream" {
            assert!(
                message.contains("No space left on device")
                    || message.contains("InsufficientSpace"),
                "{how}: {message}"
            );
        }
        assert!(
            failure
                .output
                .refusals
                .iter()
                .any(|r| r.contains("at most 1048576 bytes into its directories")),
            "{how}: {:?}",
            failure.output.refusals
        );
        assert_host_still_serves(&host, &mut ctx, &before).await;
    }
    // Each file, with the block its making took, within the bound.
    for file in ["stream.bin", "positional.bin"] {
        let size = std::fs::metadata(rw.join(file)).unwrap().len();
        assert!(
            size + airlock::sandbox::ENTRY_BYTES <= BOUND && size >= BOUND / 2,
            "{file}: {size} bytes"
        );
    }
    assert_eq!(std::fs::metadata(rw.join("grown.bin")).unwrap().len(), 0);
    let made = std::fs::read_dir(&rw)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("empty-")
        })
        .count() as u64;
    assert_eq!(
        made,
        BOUND / airlock::sandbox::ENTRY_BYTES,
        "empty files made"
    );

    // The next call's budget is its own.
    let mut ctx = RunContext::default();
    call(
        &host,
        &mut ctx,
        "write_file",
        json!({"path": "/rw/after.txt", "text": "written"}),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(rw.join("after.txt")).unwrap(),
        "written"
    );
}

#[tokio::test]
async fn no_grant_no_files() {
    let host = host_with(
        &[("hostile", ToolConfig::default())],
        ContextRules::default(),
    )
    .await;
    let mut ctx = RunContext::default();
    let err = call(
        &host,
        &mut ctx,
        "read_file",
        json!({"path": "/etc/hostname"}),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, CallError::Failed(m) if m.starts_with("read /etc/hostname: ")),
        "{err}"
    );
}

/// Issue 12 item 1: a tool with a read-write grant swaps a directory that
/// another grant points into for a relative symlink to the parent of both.
/// The other grant stays bound to the directory it checked: it still shows
/// that directory's files (now moved aside), and nothing outside.
#[tokio::test]
async fn a_grant_stays_bound_to_the_directory_it_checked() {
    let root = tempfile::tempdir().unwrap();
    let rw = root.path().join("rw");
    std::fs::create_dir_all(rw.join("shared")).unwrap();
    std::fs::write(rw.join("shared/ok.txt"), "shared content").unwrap();
    std::fs::write(root.path().join("outside.txt"), "OUTSIDE-SECRET").unwrap();
    let mut config = ToolConfig::default();
    // Built through the library, which (unlike a policy file) does not
    // refuse nesting, so the binding itself is what is tested.
    config.grants.dirs = vec![
        DirGrant::new(&rw, "/rw", DirMode::Rw).unwrap(),
        DirGrant::new(rw.join("shared"), "/shared", DirMode::Ro).unwrap(),
    ];
    let host = host_with(&[("hostile", config)], ContextRules::default()).await;

    let mut ctx = RunContext::from_value(json!({"keep": 1})).unwrap();
    let before = snapshot(&ctx);
    call(
        &host,
        &mut ctx,
        "plant_symlink",
        json!({"path": "/rw/shared", "target": ".."}),
    )
    .await
    .unwrap();
    let link = std::fs::read_link(rw.join("shared")).unwrap();
    assert_eq!(link, std::path::Path::new(".."), "the symlink was planted");
    assert_eq!(
        std::fs::read_to_string(rw.join("shared/outside.txt")).unwrap(),
        "OUTSIDE-SECRET",
        "following the path by name now leads outside"
    );

    let mut ctx = RunContext::from_value(json!({"keep": 1})).unwrap();
    let err = call(
        &host,
        &mut ctx,
        "read_file",
        json!({"path": "/shared/outside.txt"}),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, CallError::Failed(m) if !m.contains("OUTSIDE-SECRET")),
        "{err}"
    );
    assert_host_still_serves(&host, &mut ctx, &before).await;
    let out = call(
        &host,
        &mut ctx,
        "read_file",
        json!({"path": "/shared/ok.txt"}),
    )
    .await
    .unwrap();
    assert_eq!(out.result["text"], "shared content");
}

#[test]
fn bad_directory_grants_are_refused() {
    let err = DirGrant::new("/definitely/not/here", "/data", DirMode::Ro).unwrap_err();
    assert!(err.to_string().contains("/definitely/not/here"), "{err}");
    let file = tempfile::NamedTempFile::new().unwrap();
    let err = DirGrant::new(file.path(), "/data", DirMode::Ro).unwrap_err();
    assert!(err.to_string().contains("not a directory"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let err = DirGrant::new(dir.path(), "relative", DirMode::Ro).unwrap_err();
    assert!(err.to_string().contains("absolute"), "{err}");
}
