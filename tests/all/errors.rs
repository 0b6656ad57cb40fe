//! Bad input gets a clear, typed error and loses nothing: unknown tools,
//! bad arguments, files that are not components.

use airlock::{CallError, CompileCache, Host, LoadError, RunContext, ToolCall};
use serde_json::json;

use crate::support::{
    HOST_TOOLS, assert_host_still_serves, cache_dir, call, guest, host, snapshot,
};

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
    assert_eq!(available, &HOST_TOOLS);
    assert!(
        err.to_string()
            .contains("available: add_note, apply, derive, increment"),
        "{err}"
    );
    assert_eq!(err.kind(), airlock::ErrorKind::UnknownTool);
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
        assert!(
            matches!(err.error, CallError::BadArguments(_)),
            "{bad:?}: {err}"
        );
        assert_eq!(err.kind(), airlock::ErrorKind::InvalidArgs);
        assert!(err.output.is_empty(), "the tool never ran");
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

    // A valid component that offers no tool.
    let err = load_error(b"(component)", "empty.wat").await;
    assert!(matches!(err, LoadError::NoTools { .. }), "{err}");

    // One that imports what this host does not provide: named.
    let err = load_error(
        b"(component (import \"acme:missing/thing\" (func)))",
        "imports.wat",
    )
    .await;
    assert!(matches!(err, LoadError::Incompatible { .. }), "{err}");
    assert!(err.to_string().contains("acme:missing/thing"), "{err}");
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
