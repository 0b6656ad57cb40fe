//! One contract, four languages: the stateful tools written in Rust,
//! Python (componentize-py), JavaScript (componentize-js) and C
//! (wit-bindgen c) run the same scenarios and must produce identical specs,
//! results, ops and deps, errors included.
//!
//! The Python, JavaScript and C components are built by `make guests`
//! (which installs their toolchains); a missing one fails the test loudly.

use airlock::{CompileCache, Host, RunContext, ToolCall, ToolSpec};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use crate::support::{built, cache_dir, guest};

/// The four languages, and the Rust example as built against WIT 0.1.0
/// (committed, never rebuilt): a tool of the first version runs unchanged
/// on a host of a later one.
const LANGUAGES: [&str; 5] = ["rust", "python", "js", "c", "rust-wit-0.1.0"];

fn component(language: &str) -> std::path::PathBuf {
    if language == "rust" {
        return guest("stateful");
    }
    if language == "rust-wit-0.1.0" {
        return crate::support::root().join("tests/data/wit-0.1.0/rust-stateful.wasm");
    }
    built(&format!("{language}-stateful"))
}

/// One host per language (the tools share names), loaded once per run.
async fn host(language: &str) -> &'static Host {
    static HOSTS: [OnceCell<Host>; LANGUAGES.len()] =
        [const { OnceCell::const_new() }; LANGUAGES.len()];
    let index = LANGUAGES
        .iter()
        .position(|l| *l == language)
        .expect("a known language");
    HOSTS[index]
        .get_or_init(|| async {
            let mut host = Host::builder()
                .cache(CompileCache::in_dir(cache_dir()))
                .max_concurrent_calls(8)
                .build()
                .expect("host builds");
            host.load(component(language))
                .await
                .expect("component loads");
            host
        })
        .await
}

/// What a scenario leaves: the result, ops and deps, or the error's kind
/// and message (deps must then be unchanged, which `run` checks).
#[derive(Debug, PartialEq)]
enum Outcome {
    Ok {
        result: Value,
        updates: Value,
        deps: Value,
    },
    Err {
        kind: &'static str,
        message: String,
    },
}

async fn run(language: &str, deps: &Value, tool: &str, args: &Value) -> Outcome {
    let mut ctx = RunContext::from_value(deps.clone()).unwrap();
    let call = ToolCall::new(tool, args.to_string());
    match host(language).await.call(&mut ctx, &call).await {
        Ok(out) => Outcome::Ok {
            result: out.result,
            updates: serde_json::to_value(&out.updates).unwrap(),
            deps: Value::Object(ctx.deps().clone()),
        },
        Err(e) => {
            assert_eq!(
                &Value::Object(ctx.deps().clone()),
                deps,
                "{language}: a failed call changed deps"
            );
            let kind = e.kind().as_str();
            let message = e.to_string();
            Outcome::Err { kind, message }
        }
    }
}

struct Scenario {
    name: &'static str,
    deps: Value,
    tool: &'static str,
    args: Value,
    expect: Outcome,
}

fn ok(result: Value, updates: Value, deps: Value) -> Outcome {
    Outcome::Ok {
        result,
        updates,
        deps,
    }
}

fn err(kind: &'static str, message: &str) -> Outcome {
    Outcome::Err {
        kind,
        message: message.to_owned(),
    }
}

fn scenarios() -> Vec<Scenario> {
    let tricky = "line\n\"quoted\" \\ tab\t é 🚀 \u{1}";
    vec![
        Scenario {
            name: "increment a new counter",
            deps: json!({}),
            tool: "increment",
            args: json!({"name": "vowels"}),
            expect: ok(
                json!({"counter": "vowels", "value": 1}),
                json!([{"op": "set", "key": "counters", "value": {"vowels": 1}}]),
                json!({"counters": {"vowels": 1}}),
            ),
        },
        Scenario {
            name: "increment keeps other counters and keys",
            deps: json!({"counters": {"a": 5, "b": 1}, "other": true}),
            tool: "increment",
            args: json!({"name": "a"}),
            expect: ok(
                json!({"counter": "a", "value": 6}),
                json!([{"op": "set", "key": "counters", "value": {"a": 6, "b": 1}}]),
                json!({"counters": {"a": 6, "b": 1}, "other": true}),
            ),
        },
        Scenario {
            name: "increment with a non-ASCII name",
            deps: json!({"counters": {"größe": 41}}),
            tool: "increment",
            args: json!({"name": "größe"}),
            expect: ok(
                json!({"counter": "größe", "value": 42}),
                json!([{"op": "set", "key": "counters", "value": {"größe": 42}}]),
                json!({"counters": {"größe": 42}}),
            ),
        },
        Scenario {
            name: "null counters count as empty",
            deps: json!({"counters": null}),
            tool: "increment",
            args: json!({"name": "x"}),
            expect: ok(
                json!({"counter": "x", "value": 1}),
                json!([{"op": "set", "key": "counters", "value": {"x": 1}}]),
                json!({"counters": {"x": 1}}),
            ),
        },
        Scenario {
            name: "add the first note",
            deps: json!({}),
            tool: "add_note",
            args: json!({"text": "first"}),
            expect: ok(
                json!({"added": "first", "total": 1}),
                json!([{"op": "append", "key": "notes", "value": "first"}]),
                json!({"notes": ["first"]}),
            ),
        },
        Scenario {
            name: "add a note with escapes and non-ASCII text",
            deps: json!({"notes": ["a"]}),
            tool: "add_note",
            args: json!({"text": tricky}),
            expect: ok(
                json!({"added": tricky, "total": 2}),
                json!([{"op": "append", "key": "notes", "value": tricky}]),
                json!({"notes": ["a", tricky]}),
            ),
        },
        Scenario {
            name: "show an empty state",
            deps: json!({}),
            tool: "show_state",
            args: json!({}),
            expect: ok(json!({"counters": {}, "notes": []}), json!([]), json!({})),
        },
        Scenario {
            name: "show a state",
            deps: json!({"counters": {"v": 3}, "notes": ["x", {"n": 1.5}], "z": 0}),
            tool: "show_state",
            args: json!({}),
            expect: ok(
                json!({"counters": {"v": 3}, "notes": ["x", {"n": 1.5}]}),
                json!([]),
                json!({"counters": {"v": 3}, "notes": ["x", {"n": 1.5}], "z": 0}),
            ),
        },
        Scenario {
            name: "missing argument",
            deps: json!({"counters": {"a": 1}}),
            tool: "increment",
            args: json!({}),
            expect: err(
                "invalid_args",
                "the host refused the arguments: the arguments do not match the tool's schema: \"name\" is a required property",
            ),
        },
        Scenario {
            name: "argument of the wrong type",
            deps: json!({}),
            tool: "increment",
            args: json!({"name": 5}),
            expect: err(
                "invalid_args",
                "the host refused the arguments: the arguments do not match the tool's schema at /name: 5 is not of type \"string\"",
            ),
        },
        Scenario {
            name: "unexpected argument",
            deps: json!({}),
            tool: "add_note",
            args: json!({"text": "x", "extra": 1}),
            expect: err(
                "invalid_args",
                "the host refused the arguments: the arguments do not match the tool's schema: Additional properties are not allowed ('extra' was unexpected)",
            ),
        },
        Scenario {
            name: "append onto a string",
            deps: json!({"notes": "not a list"}),
            tool: "add_note",
            args: json!({"text": "x"}),
            expect: err(
                "op_rejected",
                "op #0 (append \"notes\") rejected: the key holds a string; append needs an array, null or a missing key",
            ),
        },
        Scenario {
            name: "counters that are not an object",
            deps: json!({"counters": [1, 2]}),
            tool: "increment",
            args: json!({"name": "a"}),
            expect: err(
                "failed",
                "the tool failed: deps key \"counters\" is not an object",
            ),
        },
        Scenario {
            name: "a counter that is not an integer",
            deps: json!({"counters": {"x": "7"}}),
            tool: "increment",
            args: json!({"name": "x"}),
            expect: err("failed", "the tool failed: counter \"x\" is not an integer"),
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_language_describes_the_same_tools() {
    let specs = |host: &Host| host.tools().cloned().collect::<Vec<ToolSpec>>();
    let rust = specs(host("rust").await);
    assert_eq!(rust.len(), 3);
    for language in &LANGUAGES[1..] {
        assert_eq!(
            specs(host(language).await),
            rust,
            "{language} describes different tools"
        );
    }
}

async fn check(language: &str) {
    let mut failures = Vec::new();
    for s in scenarios() {
        let got = run(language, &s.deps, s.tool, &s.args).await;
        if got != s.expect {
            failures.push(format!(
                "{}:\n  expected {:?}\n  got      {:?}",
                s.name, s.expect, got
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{language} differs from the contract:\n{}",
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_passes_the_scenarios() {
    check("rust").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_passes_the_scenarios() {
    check("python").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_passes_the_scenarios() {
    check("js").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_passes_the_scenarios() {
    check("c").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_built_against_wit_0_1_0_passes_the_scenarios() {
    check("rust-wit-0.1.0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_walkthrough_ends_the_same_in_every_language() {
    for language in LANGUAGES {
        let host = host(language).await;
        let mut ctx = RunContext::default();
        for _ in 0..3 {
            host.call(
                &mut ctx,
                &ToolCall::new("increment", r#"{"name":"vowels"}"#),
            )
            .await
            .unwrap();
        }
        host.call(
            &mut ctx,
            &ToolCall::new("add_note", r#"{"text":"e, e, a"}"#),
        )
        .await
        .unwrap();
        let state = host
            .call(&mut ctx, &ToolCall::new("show_state", "{}"))
            .await
            .unwrap();
        let expected = json!({"counters": {"vowels": 3}, "notes": ["e, e, a"]});
        assert_eq!(state.result, expected, "{language}");
        assert_eq!(Value::Object(ctx.deps().clone()), expected, "{language}");
    }
}

/// A tool that reports progress and shows a picture, in Rust
/// (`everything`'s `sketch`), Python and JavaScript (`picture`): the same
/// spec, result, reports (each heard as the call made it) and image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_language_reports_progress_and_shows_the_same_picture() {
    use airlock::sandbox::{CallEvent, CancelToken};
    let mut seen = Vec::new();
    for (language, path) in [
        ("rust", guest("everything")),
        ("python", built("python-picture")),
        ("js", built("js-picture")),
    ] {
        let mut host = Host::builder()
            .cache(CompileCache::in_dir(cache_dir()))
            .build()
            .unwrap();
        host.load(path).await.expect("component loads");
        let spec = host.tools().find(|s| s.name == "sketch").cloned().unwrap();
        let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let hearing = std::sync::Arc::clone(&heard);
        let cancel = CancelToken::observed(move |event| {
            if let CallEvent::Progress(report) = event {
                let report = report.into_owned();
                hearing
                    .lock()
                    .unwrap()
                    .push((report.done, report.total, report.message));
            }
        });
        let mut ctx = RunContext::default();
        let call = ToolCall {
            id: "c1".into(),
            name: "sketch".into(),
            arguments: json!({"steps": 3}).to_string(),
            retry: 0,
        };
        let outcome = host
            .call_cancellable(&mut ctx, &call, &cancel)
            .await
            .unwrap_or_else(|e| panic!("{language}: {}", e.error));
        let progress = heard.lock().unwrap().clone();
        assert_eq!(progress.len(), 3, "{language}: {progress:?}");
        assert_eq!(
            progress[2],
            (3.0, Some(3.0), Some("stroke 3 of 3".to_owned())),
            "{language}"
        );
        assert_eq!(outcome.output.progress.len(), 3, "{language}");
        let [airlock::Shown::Image { data, mime_type }] = outcome.output.shown.as_slice() else {
            panic!("{language}: {:?}", outcome.output.shown);
        };
        assert_eq!(mime_type, "image/png", "{language}");
        seen.push((spec, outcome.result.clone(), data.clone(), progress));
    }
    for other in &seen[1..] {
        assert_eq!(other, &seen[0]);
    }
    assert_eq!(
        seen[0].1,
        json!({"steps": 3, "shown": "image/png", "bytes": 86})
    );
}
