//! Bad input gets a clear, typed error and loses nothing: unknown tools,
//! bad arguments, files that are not components.

use airlock::{CallError, CompileCache, Host, LoadError, RunContext, ToolCall};
use serde_json::json;

use crate::support::{assert_host_still_serves, cache_dir, call, guest, host, snapshot};

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
    assert_eq!(
        available,
        &["add_note", "apply", "increment", "read", "show_state"]
    );
    assert!(
        err.to_string()
            .contains("available: add_note, apply, increment"),
        "{err}"
    );
    assert_eq!(err.kind(), "unknown_tool");
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
        assert!(matches!(err, CallError::InvalidArgs(_)), "{bad:?}: {err}");
        assert_eq!(err.kind(), "invalid_args");
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

    let err = load_error(
        b"\0asm\x0d\0\x01\0garbage that is not a section",
        "broken.wasm",
    )
    .await;
    assert!(matches!(err, LoadError::Invalid { .. }), "{err}");

    let err = load_error(b"(component", "truncated.wat").await;
    assert!(matches!(err, LoadError::Invalid { .. }), "{err}");

    // A valid component that is not a tool.
    let err = load_error(b"(component)", "empty.wat").await;
    assert!(matches!(err, LoadError::Incompatible { .. }), "{err}");
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
