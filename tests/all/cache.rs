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
    // The cache finds a known file by path, size and mtime without reading
    // it; once the file changes, it must load the new content.
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
    let outcome = load(&["apply", "read"]).await;
    assert_eq!(outcome, airlock::sandbox::CacheOutcome::Compiled);
}
