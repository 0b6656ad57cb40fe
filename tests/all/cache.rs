//! The compile cache: a component is compiled once and loaded from the
//! cache after, and a changed file is never served from a stale entry.

use airlock::{CompileCache, Host};

use crate::support::guest;

#[tokio::test]
async fn compile_cache_is_used_on_the_second_load() {
    let dir = tempfile::tempdir().unwrap();
    let load = || async {
        let mut host = Host::builder()
            .cache(CompileCache::in_dir(dir.path()))
            .max_concurrent_calls(4)
            .build()
            .unwrap();
        host.load(guest("stateful")).await.unwrap().cache_outcome()
    };
    assert_eq!(load().await, airlock::sandbox::CacheOutcome::Compiled);
    assert_eq!(load().await, airlock::sandbox::CacheOutcome::Hit);

    // A corrupt entry is replaced, not trusted.
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "cwasm") {
            std::fs::write(path, b"corrupt").unwrap();
        }
    }
    assert_eq!(load().await, airlock::sandbox::CacheOutcome::Compiled);
    assert_eq!(load().await, airlock::sandbox::CacheOutcome::Hit);
}

#[tokio::test]
async fn a_changed_file_is_never_served_from_the_cache() {
    // The cache finds a known file by its identity (path, inode, size,
    // times) without reading it; once the file changes, it must load the
    // new content.
    let cache = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tool = dir.path().join("tool.wasm");
    let load = |expect: &'static [&'static str]| {
        let cache = cache.path().to_path_buf();
        let tool = tool.clone();
        async move {
            let mut host = Host::builder()
                .cache(CompileCache::in_dir(cache))
                .max_concurrent_calls(4)
                .build()
                .unwrap();
            let loaded = host.load(&tool).await.unwrap();
            assert_eq!(host.tool_names(), expect);
            loaded.cache_outcome()
        }
    };
    std::fs::copy(guest("stateful"), &tool).unwrap();
    assert_eq!(
        load(&["add_note", "increment", "show_state"]).await,
        airlock::sandbox::CacheOutcome::Compiled
    );
    assert_eq!(
        load(&["add_note", "increment", "show_state"]).await,
        airlock::sandbox::CacheOutcome::Hit
    );
    std::fs::copy(guest("context_probe"), &tool).unwrap();
    let outcome = load(&["apply", "derive", "read"]).await;
    assert_eq!(outcome, airlock::sandbox::CacheOutcome::Compiled);
}

/// A WAT component describing one tool named `name` (every name the tests
/// use has the same length, so the files have the same size).
fn write_tool(path: &std::path::Path, name: &str) {
    let fixed = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
    let text = crate::support::describe_wat(name, "A tool.", r#"{"type":"object"}"#);
    std::fs::write(path, text).unwrap();
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(fixed).unwrap();
}

/// Waits (for a condition, not a time) until an index entry written now
/// for `path` is no longer racy.
fn wait_until_not_racy(path: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).unwrap();
    let changed = std::time::UNIX_EPOCH
        + std::time::Duration::new(meta.ctime() as u64, meta.ctime_nsec() as u32);
    while std::time::SystemTime::now() <= changed + CompileCache::RACY_WINDOW {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

async fn tool_names_with_cache(
    cache: &std::path::Path,
    tool: &std::path::Path,
    on_compile: Option<Box<dyn Fn() + Send + Sync>>,
) -> Vec<String> {
    let mut builder = Host::builder()
        .cache(CompileCache::in_dir(cache))
        .max_concurrent_calls(4);
    if let Some(hook) = on_compile {
        builder = builder.on_compile(move |progress| {
            if matches!(progress, airlock::tools::CompileProgress::Started { .. }) {
                hook();
            }
        });
    }
    let mut host = builder.build().unwrap();
    host.load(tool).await.unwrap();
    host.tool_names()
}

/// Issue 12 item 6: a component replaced in place by one of the same size
/// with its modification time kept (as `cp -p`, `rsync -a`, tar and fixed
/// `SOURCE_DATE_EPOCH` builds do) is not served from the stale entry: the
/// fast path also keys on the inode and the status-change time, which no
/// writer can keep.
#[tokio::test]
async fn a_replacement_keeping_size_and_mtime_is_not_served_stale() {
    let cache = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tool = dir.path().join("tool.wat");
    let names = || tool_names_with_cache(cache.path(), &tool, None);
    write_tool(&tool, "first");
    wait_until_not_racy(&tool);
    assert_eq!(names().await, ["first"], "compiled");
    assert_eq!(names().await, ["first"], "from the cache's file index");

    let before = std::fs::metadata(&tool).unwrap();
    write_tool(&tool, "other");
    let after = std::fs::metadata(&tool).unwrap();
    assert_eq!(
        (before.len(), before.modified().unwrap()),
        (after.len(), after.modified().unwrap()),
        "the replacement keeps size and mtime"
    );
    assert_eq!(names().await, ["other"]);
}

/// A component replaced while its first compile is in progress: the
/// compile result (of the old bytes) is never filed under the new file's
/// identity, so the next load gets the new code. The replacement is made
/// non-racy before the compile ends, so only that rule can catch it.
#[tokio::test]
async fn a_file_changed_during_its_compile_is_not_indexed() {
    let cache = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tool = dir.path().join("tool.wat");
    write_tool(&tool, "first");
    let swap = tool.clone();
    let hook: Box<dyn Fn() + Send + Sync> = Box::new(move || {
        write_tool(&swap, "other");
        wait_until_not_racy(&swap);
    });
    // The load itself saw the old bytes.
    assert_eq!(
        tool_names_with_cache(cache.path(), &tool, Some(hook)).await,
        ["first"]
    );
    assert_eq!(
        tool_names_with_cache(cache.path(), &tool, None).await,
        ["other"]
    );
}

/// Issue 17 item 7: compiled code is native code, so a cache directory or
/// entry that others could have written is refused, naming the path and
/// the fix, and nothing in it is loaded; a new cache directory is private.
#[test]
fn a_cache_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let cache = root.path().join("cache");
    let stateful = guest("stateful");
    let inspect = |cache: &std::path::Path| {
        crate::support::airlock_with_env(
            &["inspect", stateful.to_str().unwrap()],
            &[("AIRLOCK_CACHE_DIR", cache.to_str().unwrap())],
        )
    };
    let chmod = |path: &std::path::Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let mode =
        |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;

    // A new cache directory is created private, and works.
    let out = inspect(&cache);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&cache), 0o700);
    let entry = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .expect("an entry was written");
    assert_eq!(
        mode(&entry) & 0o022,
        0,
        "entries are not writable by others"
    );

    // The directory writable by others: refused.
    chmod(&cache, 0o777);
    let out = inspect(&cache);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "compile cache {}: is writable by its group or others (mode 777)",
            cache.display()
        )) && err.contains("chmod 700"),
        "{err}"
    );

    // A private directory with an entry others could have written (as a
    // planted one would be): refused, naming the entry.
    chmod(&cache, 0o700);
    chmod(&entry, 0o666);
    let out = inspect(&cache);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("compile cache {}: is writable", entry.display()))
            && err.contains("Fix: remove it"),
        "{err}"
    );

    // Removed, it is compiled and written again, privately.
    std::fs::remove_file(&entry).unwrap();
    let out = inspect(&cache);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&entry) & 0o022, 0);

    // A file where the cache directory should be: refused as not one.
    let file = root.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = inspect(&file);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "compile cache {}: is not a directory",
            file.display()
        )) && err.contains("Fix: move what is there away"),
        "{err}"
    );
}
