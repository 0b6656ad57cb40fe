//! Plain components (no Airlock world) as tools: schemas derived from WIT
//! types, values converted both ways, the same in Rust, Python and
//! JavaScript; skipped functions, naming, grants, failures, hostile
//! results; and components from another project, unmodified.

use std::path::PathBuf;
use std::sync::Arc;

use airlock::context::ContextRules;
use airlock::journal::Transcript;
use airlock::llm::ScriptModel;
use airlock::policy::Policy;
use airlock::sandbox::grants::{DirGrant, DirMode, HostPattern, HttpGrant};
use airlock::tools::plain::schema::KEYWORDS;
use airlock::{Agent, CallError, CompileCache, Host, LoadError, RunContext, ToolConfig};
use serde_json::{Value, json};

use crate::support::loopback::Loopback;
use crate::support::{
    airlock, assert_host_still_serves, built, cache_dir, call, guest, guest_dir, host_with,
    prepared, snapshot,
};

/// A plain example with its WIT docs embedded (`make guests` builds them
/// into target/guests/plain).
fn plain(name: &str) -> PathBuf {
    built(&format!("plain/{name}"))
}

/// An example of the `wasip2` crate, built unmodified (`make guests`).
fn third_party(name: &str) -> PathBuf {
    let path = guest_dir().join("examples").join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run `make guests`",
        path.display()
    );
    path
}

async fn host_of(paths: &[PathBuf]) -> Host {
    let mut host = Host::builder()
        .cache(CompileCache::in_dir(cache_dir()))
        .build()
        .unwrap();
    for path in paths {
        host.load(path).await.unwrap();
    }
    host
}

/// A value of every WIT type the typed example's `echo` takes, at the
/// edges of each range (floats written as floats: JSON keeps `2` and
/// `2.0` apart).
fn everything() -> Value {
    json!({
        "flag": true,
        "tiny": -128, "small": 255, "short": -32768, "ushort": 65535,
        "int": -2147483648i64, "uint": 4294967295u64,
        "long": i64::MIN, "ulong": u64::MAX,
        "single": 0.1, "double": 2.5e-300,
        "letter": "é",
        "text": "héllo \u{0} wörld",
        "bytes": [0, 1, 255],
        "words": ["a", ""],
        "maybe": null,
        "maybe-maybe": {"some": null},
        "pair": ["x", 7],
        "at": {"x": 1, "y": -2},
        "shape": {"tag": "rectangle", "val": [2.0, 3.5]},
        "color": "green",
        "permissions": ["read", "execute"],
        "outcome": {"tag": "err", "val": "nope"},
        "done": {"tag": "ok"}
    })
}

/// What a call gives, comparable across languages: the result, or the
/// failure's kind and message.
async fn outcome(host: &Host, name: &str, args: Value) -> Value {
    match call(host, &mut RunContext::default(), name, args).await {
        Ok(outcome) => json!({"ok": outcome.result}),
        Err(e) => json!({"err": e.kind(), "message": e.to_string()}),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_round_trips_with_identical_json_in_rust_python_and_javascript() {
    let calls = [
        ("echo", json!({"value": everything()})),
        (
            "echo",
            json!({"value": {
                "flag": false, "tiny": 127, "small": 0, "short": 32767, "ushort": 0,
                "int": 2147483647, "uint": 0, "long": i64::MAX, "ulong": 0,
                "single": -1.5, "double": 1e300, "letter": "🦀", "text": "",
                "bytes": [], "words": [], "maybe": "here", "maybe-maybe": {"some": 7},
                "pair": ["", 0], "at": {"x": 0, "y": 0}, "shape": {"tag": "dot"},
                "color": "blue", "permissions": [], "outcome": {"tag": "ok", "val": 4294967295u64},
                "done": {"tag": "err"}
            }}),
        ),
        (
            "echo",
            json!({"value": {
                "flag": true, "tiny": 0, "small": 1, "short": 0, "ushort": 1, "int": 0, "uint": 1,
                "long": 0, "ulong": 1, "single": 3.0e38, "double": -0.0, "letter": "a", "text": "x",
                "bytes": [7], "words": ["y"], "maybe": null, "maybe-maybe": null, "pair": ["z", 1],
                "at": {"x": -1, "y": 1}, "shape": {"tag": "circle", "val": 1.5}, "color": "red",
                "permissions": ["write", "read", "execute"], "outcome": {"tag": "ok", "val": 0},
                "done": {"tag": "ok"}
            }}),
        ),
        ("add", json!({"a": 40, "b": 2})),
        // Wraps around (s64). (componentize-js traps when a function
        // returns exactly i64::MIN, so the wrap checked here goes the
        // other way.)
        ("add", json!({"a": i64::MIN, "b": -1})),
        ("divide", json!({"a": 1.0, "b": 4.0})),
        ("divide", json!({"a": 1.0, "b": 0.0})),
        ("area", json!({"shape": {"tag": "circle", "val": 1.0}})),
        (
            "area",
            json!({"shape": {"tag": "rectangle", "val": [2.0, 3.0]}}),
        ),
        ("area", json!({"shape": {"tag": "dot"}})),
        ("check", json!({"at": {"x": 5, "y": 6}})),
        ("check", json!({"at": {"x": 500, "y": 6}})),
        ("nothing", json!({})),
        ("version", json!({})),
        // Counted in a global: a fresh instance every call, prepared
        // ahead or not, so 1 every time, in every language.
        ("calls", json!({})),
        ("calls", json!({})),
        ("calls", json!({})),
    ];
    let mut seen: Vec<(String, Vec<Value>)> = Vec::new();
    for language in ["typed", "python-typed", "js-typed"] {
        let host = host_of(&[plain(language)]).await;
        let mut outcomes = Vec::new();
        for (name, args) in &calls {
            // Python's `calls` takes an instance prepared ahead of demand
            // (the default pool of one): fresh all the same. (Rust and
            // JavaScript instantiate too fast for preparing to be worth it.)
            let taken = if *name == "calls" && language == "python-typed" {
                prepared(&host, 1).await;
                Some(host.pool_usage().prepared_taken)
            } else {
                None
            };
            outcomes.push(outcome(&host, name, args.clone()).await);
            if let Some(taken) = taken {
                assert_eq!(
                    host.pool_usage().prepared_taken,
                    taken + 1,
                    "{language}: `calls` did not take the prepared instance"
                );
            }
        }
        seen.push((language.to_owned(), outcomes));
    }
    let (_, rust) = &seen[0];
    // An echo gives back exactly what it was given (flags in the order
    // the WIT declares them: they are a set).
    for (i, (name, args)) in calls.iter().enumerate() {
        if *name == "echo" {
            let mut expected = args["value"].clone();
            if i == 2 {
                expected["permissions"] = json!(["read", "write", "execute"]);
            }
            assert_eq!(rust[i], json!({"ok": expected}), "echo #{i}");
        }
    }
    assert_eq!(rust[3], json!({"ok": 42}));
    assert_eq!(rust[4], json!({"ok": i64::MAX}));
    assert_eq!(rust[5], json!({"ok": 0.25}));
    assert_eq!(
        rust[6],
        json!({"err": "failed", "message": "the tool failed: \"division by zero\""})
    );
    assert_eq!(rust[10], json!({"ok": {"x": 5, "y": 6}}));
    assert_eq!(
        rust[11],
        json!({"err": "failed", "message": "the tool failed: {\"code\":422,\"message\":\"the point lies outside the square\"}"})
    );
    assert_eq!(rust[12], json!({"ok": null}));
    assert_eq!(rust[13], json!({"ok": "0.1.0"}));
    assert_eq!(
        rust[14..],
        [json!({"ok": 1}), json!({"ok": 1}), json!({"ok": 1})]
    );
    for (language, outcomes) in &seen[1..] {
        for (i, (name, _)) in calls.iter().enumerate() {
            assert_eq!(
                outcomes[i], rust[i],
                "{language}: {name} #{i} differs from Rust"
            );
        }
    }
}

/// The schema of each field of the typed example's `everything`, exactly
/// (the component without docs: no descriptions).
#[tokio::test]
async fn derived_schemas_are_exact_for_every_type() {
    let host = host_of(&[guest("typed")]).await;
    let echo = host.tools().find(|t| t.name == "echo").unwrap();
    let int = |min: Value, max: Value| json!({"type": "integer", "minimum": min, "maximum": max});
    let object = |properties: Value, required: &[&str]| json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false});
    let tagged = |tag: &str, val: Option<Value>| match val {
        Some(val) => object(
            json!({"tag": {"type": "string", "enum": [tag]}, "val": val}),
            &["tag", "val"],
        ),
        None => object(json!({"tag": {"type": "string", "enum": [tag]}}), &["tag"]),
    };
    let u32_schema = int(json!(0), json!(u32::MAX));
    let expected = json!({
        "flag": {"type": "boolean"},
        "tiny": int(json!(-128), json!(127)),
        "small": int(json!(0), json!(255)),
        "short": int(json!(-32768), json!(32767)),
        "ushort": int(json!(0), json!(65535)),
        "int": int(json!(i32::MIN), json!(i32::MAX)),
        "uint": u32_schema,
        "long": int(json!(i64::MIN), json!(i64::MAX)),
        "ulong": int(json!(0), json!(u64::MAX)),
        "single": {"type": "number"},
        "double": {"type": "number"},
        "letter": {"type": "string", "minLength": 1, "maxLength": 1},
        "text": {"type": "string"},
        "bytes": {"type": "array", "items": int(json!(0), json!(255)), "description": "Bytes, as numbers from 0 to 255."},
        "words": {"type": "array", "items": {"type": "string"}},
        "maybe": {"anyOf": [{"type": "null"}, {"type": "string"}]},
        "maybe-maybe": {"anyOf": [{"type": "null"}, object(json!({"some": {"anyOf": [{"type": "null"}, u32_schema]}}), &["some"])]},
        "pair": {"type": "array", "prefixItems": [{"type": "string"}, u32_schema], "minItems": 2, "maxItems": 2},
        "at": object(json!({"x": int(json!(i32::MIN), json!(i32::MAX)), "y": int(json!(i32::MIN), json!(i32::MAX))}), &["x", "y"]),
        "shape": {"anyOf": [
            tagged("circle", Some(json!({"type": "number"}))),
            tagged("rectangle", Some(json!({"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}], "minItems": 2, "maxItems": 2}))),
            tagged("dot", None),
        ]},
        "color": {"type": "string", "enum": ["red", "green", "blue"]},
        "permissions": {"type": "array", "items": {"type": "string", "enum": ["read", "write", "execute"]}, "uniqueItems": true},
        "outcome": {"anyOf": [tagged("ok", Some(u32_schema.clone())), tagged("err", Some(json!({"type": "string"})))]},
        "done": {"anyOf": [tagged("ok", None), tagged("err", None)]},
    });
    let value = &echo.parameters["properties"]["value"];
    for (field, schema) in expected.as_object().unwrap() {
        assert_eq!(&value["properties"][field], schema, "field {field}");
    }
    assert_eq!(
        value["required"].as_array().unwrap().len(),
        expected.as_object().unwrap().len()
    );
    assert_eq!(value["additionalProperties"], false);
    assert_eq!(
        echo.parameters,
        json!({"type": "object", "properties": {"value": value}, "required": ["value"], "additionalProperties": false})
    );
    // No docs in this build: each description is generated, naming the
    // function's interface.
    assert_eq!(
        echo.description,
        "The function `echo` of the interface `example:typed/values@0.1.0`."
    );
    let version = host.tools().find(|t| t.name == "version").unwrap();
    assert_eq!(
        version.description,
        "The function `version`, exported by the component."
    );
    assert_eq!(
        version.parameters,
        json!({"type": "object", "properties": {}, "additionalProperties": false})
    );
}

#[tokio::test]
async fn descriptions_come_from_the_components_wit_docs() {
    let host = host_of(&[plain("typed")]).await;
    let tool = |name: &str| host.tools().find(|t| t.name == name).unwrap().clone();
    assert_eq!(
        tool("echo").description,
        "Returns exactly the value it was given."
    );
    assert_eq!(tool("version").description, "The example's version.");
    let value = &tool("echo").parameters["properties"]["value"];
    assert_eq!(value["description"], "One value of every kind.");
    assert_eq!(
        value["properties"]["at"]["description"],
        "A point on a grid."
    );
    assert_eq!(
        value["properties"]["at"]["properties"]["x"]["description"],
        "Distance from the left edge."
    );
    assert_eq!(
        value["properties"]["color"]["description"],
        "A primary colour of light. (red: Long wavelengths; green: Middle wavelengths; blue: Short wavelengths)"
    );
    assert_eq!(
        value["properties"]["shape"]["anyOf"][2]["description"],
        "A point, which has no area."
    );
    // A world-level function's own types (which wasmtime does not name)
    // are found too.
    let units = host_of(&[plain("units")]).await;
    let convert = units.tools().find(|t| t.name == "convert").unwrap().clone();
    assert_eq!(
        convert.parameters["properties"]["from"]["description"],
        "A unit of length, mass, temperature or volume."
    );
    assert!(
        convert
            .description
            .starts_with("Converts `value` from one unit")
    );
}

/// Every keyword of every derived schema is one OpenAI's and Anthropic's
/// tool formats and MCP accept; the top level is a plain object schema;
/// every schema compiles.
#[tokio::test]
async fn schemas_use_only_what_openai_anthropic_and_mcp_accept() {
    fn walk(schema: &Value, at: &str) {
        let Value::Object(map) = schema else {
            panic!("{at}: a schema must be an object: {schema}");
        };
        for (key, value) in map {
            assert!(KEYWORDS.contains(&key.as_str()), "{at}: keyword {key:?}");
            match key.as_str() {
                "properties" => {
                    for (name, inner) in value.as_object().unwrap() {
                        walk(inner, &format!("{at}/{name}"));
                    }
                }
                "items" => walk(value, &format!("{at}[]")),
                "anyOf" | "prefixItems" => {
                    for (i, inner) in value.as_array().unwrap().iter().enumerate() {
                        walk(inner, &format!("{at}/{key}/{i}"));
                    }
                }
                _ => {}
            }
        }
    }
    let host = host_of(&[plain("typed"), plain("units"), guest("reach")]).await;
    let mut checked = 0;
    for tool in host.tools() {
        let schema = &tool.parameters;
        assert_eq!(schema["type"], "object", "{}", tool.name);
        assert!(schema["properties"].is_object(), "{}", tool.name);
        for banned in ["anyOf", "oneOf", "allOf", "not", "$ref", "enum"] {
            assert!(
                schema.get(banned).is_none(),
                "{}: top-level {banned}",
                tool.name
            );
        }
        walk(schema, &tool.name);
        airlock::spec::compile_schema(schema).unwrap();
        assert!(airlock::policy::is_tool_name(&tool.name));
        checked += 1;
    }
    assert_eq!(checked, 8 + 2 + 5);
}

#[tokio::test]
async fn bad_arguments_name_where_they_are_wrong_and_the_next_call_is_served() {
    let host = host_with(&[("typed", ToolConfig::default())], ContextRules::default()).await;
    let with = |field: &str, value: Value| {
        let mut all = everything();
        all[field] = value;
        json!({"value": all})
    };
    let cases = [
        (with("small", json!(256)), "/value/small"),
        (with("tiny", json!(-129)), "/value/tiny"),
        (with("ulong", json!(-1)), "/value/ulong"),
        (with("long", json!(1.5)), "/value/long"),
        (with("letter", json!("ab")), "/value/letter"),
        (with("letter", json!("")), "/value/letter"),
        (with("color", json!("purple")), "/value/color"),
        (
            with("permissions", json!(["read", "fly"])),
            "/value/permissions/1",
        ),
        (
            with("permissions", json!(["read", "read"])),
            "/value/permissions",
        ),
        (
            with("shape", json!({"tag": "hexagon", "val": 1.0})),
            "/value/shape",
        ),
        (with("shape", json!({"tag": "circle"})), "/value/shape"),
        (
            with("shape", json!({"tag": "dot", "val": 1.0})),
            "/value/shape",
        ),
        (with("pair", json!(["x"])), "/value/pair"),
        (with("at", json!({"x": 1})), "/value/at"),
        (with("at", json!({"x": 1, "y": 2, "z": 3})), "/value/at"),
        // The schema allows any number; f32's range is checked converting.
        (with("single", json!(1e300)), "/value/single"),
        (json!({}), "value"),
        (json!({"value": everything(), "extra": 1}), "extra"),
    ];
    for (args, at) in cases {
        let mut ctx = RunContext::from_value(json!({"keep": 1})).unwrap();
        let before = snapshot(&ctx);
        let err = call(&host, &mut ctx, "echo", args.clone())
            .await
            .unwrap_err();
        let CallError::BadArguments(message) = &err else {
            panic!("{args}: expected the host to refuse them, got {err}");
        };
        assert!(message.contains(at), "{at} not in {message}");
        assert_host_still_serves(&host, &mut ctx, &before).await;
    }
    let ok = call(
        &host,
        &mut RunContext::default(),
        "echo",
        json!({"value": everything()}),
    )
    .await;
    assert_eq!(ok.unwrap().result, everything());
}

#[tokio::test]
async fn functions_that_pass_resources_are_skipped_and_their_siblings_work() {
    let host = host_of(&[plain("typed")]).await;
    let component = &host.components()[0];
    assert!(component.is_plain());
    let skipped: Vec<(&str, &str)> = component
        .skipped()
        .iter()
        .map(|s| (s.function.as_str(), s.reason.as_str()))
        .collect();
    let resource = "it passes a resource handle (own/borrow), which JSON cannot carry";
    assert_eq!(
        skipped,
        [
            (
                "example:typed/values@0.1.0#[constructor]counter",
                format!("its result: {resource}").as_str()
            ),
            (
                "example:typed/values@0.1.0#[method]counter.next",
                format!("parameter `self`: {resource}").as_str()
            ),
            (
                "example:typed/values@0.1.0#make-counter",
                format!("its result: {resource}").as_str()
            ),
        ]
    );
    assert_eq!(
        host.tool_names(),
        [
            "add", "area", "calls", "check", "divide", "echo", "nothing", "version"
        ]
    );
    let missing = call(
        &host,
        &mut RunContext::default(),
        "make-counter",
        json!({"start": 1}),
    )
    .await;
    assert!(matches!(missing, Err(CallError::UnknownTool { .. })));
    let ok = call(
        &host,
        &mut RunContext::default(),
        "add",
        json!({"a": 1, "b": 2}),
    )
    .await;
    assert_eq!(ok.unwrap().result, 3);
}

#[tokio::test]
async fn a_component_with_no_usable_function_is_a_clear_load_error() {
    let mut host = Host::builder()
        .cache(CompileCache::in_dir(cache_dir()))
        .build()
        .unwrap();
    let err = host.load(third_party("http_proxy")).await.unwrap_err();
    assert!(matches!(err, LoadError::NoTools { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("http_proxy.wasm: no exported function can be a tool"),
        "{message}"
    );
    assert!(
        message.contains("wasi:http/incoming-handler@0.2.12#handle: parameter `request`"),
        "{message}"
    );
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.wat");
    std::fs::write(&empty, "(component)").unwrap();
    let err = host.load(&empty).await.unwrap_err();
    assert!(
        err.to_string()
            .ends_with("no exported function can be a tool (it exports no function)"),
        "{err}"
    );
    assert!(host.tool_names().is_empty());
}

#[tokio::test]
async fn components_from_another_project_work_as_they_are() {
    // The wasip2 crate's own examples: a `wasi:cli/run` command (a
    // `main`) and a library exporting `wasi:cli/run`; `run` returns
    // `result` with no payload either side.
    for (file, printed) in [
        ("hello-world", "Hello, world!\n"),
        ("cli_command", "Hello, WASI!"),
    ] {
        let host = host_of(&[third_party(file)]).await;
        assert_eq!(host.tool_names(), ["run"], "{file}");
        let spec = host.tools().next().unwrap();
        assert!(
            spec.description.contains("wasi:cli/run@0.2."),
            "{}",
            spec.description
        );
        let outcome = call(&host, &mut RunContext::default(), "run", json!({}))
            .await
            .unwrap();
        assert_eq!(outcome.result, Value::Null, "{file}");
        assert_eq!(outcome.output.stdout, printed, "{file}");
        assert!(outcome.updates.is_empty());
    }
}

#[tokio::test]
async fn grants_apply_to_plain_components() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("note.txt"), "granted text").unwrap();
    let server = Loopback::start().await;
    let mut granted = ToolConfig::default();
    granted.grants.dirs = vec![DirGrant::new(dir.path(), "/data", DirMode::Ro).unwrap()];
    granted.grants.http = HttpGrant::new(vec![HostPattern::parse(&server.url("")).unwrap()]);
    let host = host_with(&[("reach", granted)], ContextRules::default()).await;
    let mut ctx = RunContext::default();
    let read = call(
        &host,
        &mut ctx,
        "read-text",
        json!({"path": "/data/note.txt"}),
    )
    .await;
    assert_eq!(read.unwrap().result, "granted text");
    let fetched = call(
        &host,
        &mut ctx,
        "fetch-status",
        json!({"url": server.url("/hello")}),
    )
    .await;
    assert_eq!(fetched.unwrap().result, 200);
    assert_eq!(server.requests().len(), 1);

    // Without grants: the function reports what was refused; nothing
    // reached the server; the host serves the next call.
    let denied = host_with(&[("reach", ToolConfig::default())], ContextRules::default()).await;
    let mut ctx = RunContext::from_value(json!({"keep": 1})).unwrap();
    let before = snapshot(&ctx);
    let read = call(
        &denied,
        &mut ctx,
        "read-text",
        json!({"path": "/data/note.txt"}),
    )
    .await;
    assert!(
        matches!(&read, Err(CallError::Failed(m)) if m.starts_with("\"/data/note.txt: ")),
        "{read:?}"
    );
    let fetched = call(
        &denied,
        &mut ctx,
        "fetch-status",
        json!({"url": server.url("/hello")}),
    )
    .await;
    assert!(
        matches!(&fetched, Err(CallError::Failed(m)) if m.contains("HttpRequestDenied")),
        "{fetched:?}"
    );
    assert_eq!(server.requests().len(), 1);
    assert_host_still_serves(&denied, &mut ctx, &before).await;
}

/// A component that exports `test:other/values#add` (the typed example
/// exports `example:typed/values#add`), and `nothing` at the world level.
const OTHER_ADD: &str = r#"(component
  (core module $m
    (func (export "add") (param i64 i64) (result i64) local.get 0 local.get 1 i64.add)
    (func (export "nothing")))
  (core instance $i (instantiate $m))
  (func $add (param "a" s64) (param "b" s64) (result s64) (canon lift (core func $i "add")))
  (func $nothing (canon lift (core func $i "nothing")))
  (instance $values (export "add" (func $add)))
  (export "test:other/values@1.0.0" (instance $values))
  (export "nothing" (func $nothing))
)"#;

fn policy_with(dir: &std::path::Path, extra: &str) -> Result<airlock::Policy, String> {
    std::fs::write(dir.join("other.wat"), OTHER_ADD).unwrap();
    let text = format!(
        "[[tool]]\npath = {:?}\n\n[[tool]]\npath = \"other.wat\"\n{extra}\n",
        plain("typed")
    );
    let path = dir.join("airlock.toml");
    std::fs::write(&path, text).unwrap();
    Policy::load(&path).map_err(|e| e.to_string())
}

async fn host_for(policy: &airlock::Policy) -> Result<Host, LoadError> {
    Host::builder()
        .cache(CompileCache::in_dir(cache_dir()))
        .build_with_policy(policy)
        .await
}

#[tokio::test]
async fn names_are_bare_when_unique_and_qualified_by_interface_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    // `add` is in both (in interfaces named `values`): both get their
    // interfaces' full names. `nothing` is in both, once at the world's
    // level: that one cannot be qualified, so the typed example's is.
    let policy = policy_with(dir.path(), "").unwrap();
    let host = host_for(&policy).await.unwrap();
    let names = host.tool_names();
    for expected in [
        "example_typed_values_0_1_0_add",
        "test_other_values_1_0_0_add",
        "echo",
        "values_nothing",
        "nothing",
        "version",
    ] {
        assert!(
            names.contains(&expected.to_owned()),
            "{expected} not in {names:?}"
        );
    }
    assert!(!names.contains(&"add".to_owned()));
    let mut ctx = RunContext::default();
    let sum = call(
        &host,
        &mut ctx,
        "test_other_values_1_0_0_add",
        json!({"a": 2, "b": 3}),
    )
    .await;
    assert_eq!(sum.unwrap().result, 5);
    let other = host.component_for("nothing").unwrap();
    assert!(other.path().ends_with("other.wat"));

    // The policy chooses: one function renamed, the other keeps `add`.
    let policy = policy_with(
        dir.path(),
        "rename = { \"test:other/values#add\" = \"other_add\" }",
    )
    .unwrap();
    let host = host_for(&policy).await.unwrap();
    let names = host.tool_names();
    assert!(
        names.contains(&"other_add".to_owned()) && names.contains(&"add".to_owned()),
        "{names:?}"
    );
    // Or offers only some: the other component's `nothing` is gone, so
    // the typed example's takes the bare name.
    let policy = policy_with(dir.path(), "functions = [\"add\"]").unwrap();
    let host = host_for(&policy).await.unwrap();
    let other = host
        .components()
        .iter()
        .find(|c| c.path().ends_with("other.wat"))
        .unwrap();
    assert_eq!(other.tools().len(), 1);
    assert!(
        host.component_for("nothing")
            .unwrap()
            .path()
            .ends_with("typed.wasm")
    );

    // A name that names nothing, or names two, is refused.
    let policy = policy_with(dir.path(), "functions = [\"ad\"]").unwrap();
    let err = host_for(&policy).await.unwrap_err().to_string();
    assert!(
        err.contains("other.wat: functions entry \"ad\" names none of its tools"),
        "{err}"
    );
    let policy = policy_with(dir.path(), "rename = { nothing = \"bad name!\" }").unwrap_err();
    assert!(policy.contains("a tool name must match"), "{policy}");

    // The same component twice: nothing can tell its tools apart.
    let mut twice = Host::builder()
        .cache(CompileCache::in_dir(cache_dir()))
        .build()
        .unwrap();
    twice.load(plain("units")).await.unwrap();
    let err = twice.load(plain("units")).await.unwrap_err();
    assert!(
        matches!(&err, LoadError::DuplicateTool { name, .. } if name == "convert"),
        "{err}"
    );
    assert_eq!(twice.components().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn err_results_reach_the_model_as_failures_and_apply_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [
                {"id": "c1", "name": "divide", "arguments": {"a": 1.0, "b": 0.0}},
                {"id": "c2", "name": "area", "arguments": {"shape": {"tag": "circle", "val": 2.0}}},
                {"id": "c3", "name": "check", "arguments": {"at": {"x": -1, "y": 0}}}
            ]},
            {"text": "done"}
        ]})
        .to_string(),
    )
    .unwrap();
    let host = Arc::new(host_of(&[plain("typed")]).await);
    let agent = Agent::new(
        Arc::clone(&host),
        Arc::new(ScriptModel::load(&script).unwrap()),
    );
    let mut ctx = RunContext::from_value(json!({"keep": 1})).unwrap();
    let before = snapshot(&ctx);
    let mut transcript = Transcript::default();
    agent.run(&mut ctx, &mut transcript, "go").await.unwrap();
    let told = crate::support::tool_messages(&transcript.messages);
    assert_eq!(
        told,
        [
            ("c1".into(), "Error (failed): the tool failed: \"division by zero\"".into(), true),
            ("c2".into(), (std::f64::consts::PI * 4.0).to_string(), false),
            (
                "c3".into(),
                "Error (failed): the tool failed: {\"code\":422,\"message\":\"the point lies outside the square\"}".into(),
                true
            ),
        ]
    );
    assert_eq!(snapshot(&ctx), before, "a plain component changes no deps");
}

/// A hostile component returns a `list<u8>` of 60 MB (inside its memory):
/// reading it would make the host allocate gigabytes of values. It is
/// refused before it is read, and the next call is served.
#[tokio::test]
async fn a_huge_result_is_refused_before_the_host_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let hostile = dir.path().join("huge.wat");
    std::fs::write(
        &hostile,
        r#"(component
  (core module $m
    (memory (export "memory") 1000)
    (func (export "huge") (result i32)
      (i32.store (i32.const 0) (i32.const 16))
      (i32.store (i32.const 4) (i32.const 60000000))
      (i32.const 0)))
  (core instance $i (instantiate $m))
  (alias core export $i "memory" (core memory $mem))
  (func $huge (result (list u8)) (canon lift (core func $i "huge") (memory $mem)))
  (export "huge" (func $huge))
)"#,
    )
    .unwrap();
    let host = host_with(&[], ContextRules::default()).await;
    let mut host = host;
    host.load(&hostile).await.unwrap();
    let mut ctx = RunContext::from_value(json!({"keep": 1})).unwrap();
    let before = snapshot(&ctx);
    let err = call(&host, &mut ctx, "huge", json!({})).await.unwrap_err();
    assert_eq!(err.kind(), airlock::ErrorKind::ResultTooLarge, "{err}");
    assert!(
        err.to_string()
            .contains("larger than its 1048576-byte limit"),
        "{err}"
    );
    assert_host_still_serves(&host, &mut ctx, &before).await;
}

#[tokio::test]
async fn the_cli_inspects_and_calls_plain_components() {
    let typed = plain("typed");
    let out = airlock(&["inspect", typed.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["kind"], "plain");
    assert_eq!(doc["skipped"].as_array().unwrap().len(), 3);
    let echo = doc["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "echo")
        .unwrap();
    assert_eq!(echo["source"], "example:typed/values@0.1.0#echo");
    let text = airlock(&["inspect", typed.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("not offered as tools:"), "{text}");
    assert!(
        text.contains("a plain component gets no view of deps"),
        "{text}"
    );

    let units = plain("units");
    let out = airlock(&[
        "call",
        units.to_str().unwrap(),
        "convert",
        r#"{"value": 100, "from": "celsius", "to": "kelvin"}"#,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["result"], 373.15);
    assert_eq!(doc["ops"], json!([]));
    let out = airlock(&[
        "call",
        units.to_str().unwrap(),
        "convert",
        r#"{"value": 1, "from": "metre", "to": "kilogram"}"#,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.trim(),
        "error: the tool failed: \"cannot convert length to mass\""
    );
    let out = airlock(&[
        "call",
        units.to_str().unwrap(),
        "convert",
        r#"{"value": 1, "from": "parsec", "to": "metre"}"#,
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at /from"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_serves_plain_components_with_their_derived_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "[[tool]]\npath = {:?}\n\n[[tool]]\npath = {:?}\n",
            plain("typed"),
            plain("units")
        ),
    )
    .unwrap();
    let db = dir.path().join("mcp.db");
    let (client, _) = crate::support::mcp::connect(&[
        "--config",
        config.to_str().unwrap(),
        "--store",
        db.to_str().unwrap(),
        "--session",
        "p",
    ])
    .await;
    let listed = client.list_all_tools().await.unwrap();
    let host = host_of(&[plain("typed"), plain("units")]).await;
    for spec in host.tools() {
        let tool = listed
            .iter()
            .find(|t| t.name == spec.name.as_str())
            .unwrap();
        let tool = serde_json::to_value(tool).unwrap();
        assert_eq!(tool["inputSchema"], spec.parameters, "{}", spec.name);
        assert_eq!(tool["description"], spec.description.as_str());
    }
    let call = |name: &str, args: Value| {
        let Value::Object(args) = args else {
            unreachable!()
        };
        rmcp::model::CallToolRequestParams::new(name.to_owned()).with_arguments(args)
    };
    let echoed = client
        .call_tool(call("echo", json!({"value": everything()})))
        .await
        .unwrap();
    assert_eq!(echoed.is_error, Some(false));
    assert_eq!(echoed.structured_content.unwrap(), everything());
    let failed = client
        .call_tool(call("divide", json!({"a": 1.0, "b": 0.0})))
        .await
        .unwrap();
    assert_eq!(failed.is_error, Some(true));
    let text = serde_json::to_value(&failed.content).unwrap()[0]["text"].clone();
    assert_eq!(
        text,
        "Error (failed): the tool failed: \"division by zero\""
    );
    let converted = client
        .call_tool(call(
            "convert",
            json!({"value": 1.0, "from": "kilometre", "to": "metre"}),
        ))
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(&converted.content).unwrap()[0]["text"],
        "1000.0"
    );
    client.cancel().await.unwrap();
    // The session journaled the calls, as for any tool.
    let out = airlock(&[
        "sessions",
        "show",
        "p",
        "--store",
        db.to_str().unwrap(),
        "--json",
    ]);
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    let outputs = shown["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .count();
    assert_eq!(outputs, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_of_plain_calls_runs_in_parallel_with_the_results_of_running_them_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    let calls: Vec<Value> = (0..6)
        .map(|i| json!({"id": format!("c{i}"), "name": "convert", "arguments": {"value": f64::from(i), "from": "kilometre", "to": "metre"}}))
        .collect();
    std::fs::write(
        &script,
        json!({"turns": [{"tool_calls": calls}, {"text": "done"}]}).to_string(),
    )
    .unwrap();
    let host = Arc::new(host_of(&[plain("units")]).await);
    let run = |parallel: bool| {
        let host = Arc::clone(&host);
        let script = script.clone();
        async move {
            let options = airlock::agent::AgentOptions {
                turn: airlock::policy::TurnPolicy {
                    parallel,
                    max_parallel: 8,
                    ..Default::default()
                },
                ..Default::default()
            };
            let agent =
                Agent::new(host, Arc::new(ScriptModel::load(&script).unwrap())).options(options);
            let mut transcript = Transcript::default();
            agent
                .run(&mut RunContext::default(), &mut transcript, "go")
                .await
                .unwrap();
            crate::support::tool_messages(&transcript.messages)
        }
    };
    let parallel = run(true).await;
    assert_eq!(parallel, run(false).await);
    let values: Vec<String> = parallel
        .iter()
        .map(|(_, content, _)| content.clone())
        .collect();
    assert_eq!(
        values,
        ["0.0", "1000.0", "2000.0", "3000.0", "4000.0", "5000.0"]
    );
}

#[tokio::test]
async fn a_plain_component_is_compiled_once_and_then_taken_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("units.wasm");
    std::fs::copy(plain("units"), &copy).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let load = || async {
        let mut host = Host::builder()
            .cache(CompileCache::in_dir(cache.path()))
            .build()
            .unwrap();
        host.load(&copy).await.unwrap().cache_outcome()
    };
    assert_eq!(load().await, airlock::sandbox::CacheOutcome::Compiled);
    assert_eq!(load().await, airlock::sandbox::CacheOutcome::Hit);
}

/// Types built to hurt whoever describes them: lists nested 41 deep, and a
/// tuple of tuples whose schema would have 2^17 leaves (the validator's
/// own bound on a type's size is 10^6). Neither is offered
/// (the schema is built within a budget, so describing it costs little),
/// and the component's other function is.
#[tokio::test]
async fn types_too_deep_or_too_large_to_describe_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let hostile = dir.path().join("types.wat");
    std::fs::write(&hostile, HOSTILE_TYPES).unwrap();
    let mut host = host_with(&[], ContextRules::default()).await;
    host.load(&hostile).await.unwrap();
    let component = host.component_for("fine").unwrap();
    let skipped: Vec<(&str, &str)> = component
        .skipped()
        .iter()
        .map(|s| (s.function.as_str(), s.reason.as_str()))
        .collect();
    assert_eq!(
        skipped,
        [
            (
                "deep",
                "parameter `x`: its types nest deeper than 32 levels"
            ),
            ("wide", "its parameters' schema would be over 65536 bytes"),
        ]
    );
    let ok = call(&host, &mut RunContext::default(), "fine", json!({"x": 7})).await;
    assert_eq!(ok.unwrap().result, 7);
}

const HOSTILE_TYPES: &str = r#"(component
  (core module $m
    (memory (export "memory") 1)
    (func (export "realloc") (param i32 i32 i32 i32) (result i32) i32.const 8)
    (func (export "deep") (param i32 i32))
    (func (export "wide") (param i32))
    (func (export "fine") (param i32) (result i32) local.get 0))
  (core instance $i (instantiate $m))
  (alias core export $i "memory" (core memory $mem))
  (alias core export $i "realloc" (core func $realloc))
  (type $l0 (list u8))
  (type $l1 (list $l0))
  (type $l2 (list $l1))
  (type $l3 (list $l2))
  (type $l4 (list $l3))
  (type $l5 (list $l4))
  (type $l6 (list $l5))
  (type $l7 (list $l6))
  (type $l8 (list $l7))
  (type $l9 (list $l8))
  (type $l10 (list $l9))
  (type $l11 (list $l10))
  (type $l12 (list $l11))
  (type $l13 (list $l12))
  (type $l14 (list $l13))
  (type $l15 (list $l14))
  (type $l16 (list $l15))
  (type $l17 (list $l16))
  (type $l18 (list $l17))
  (type $l19 (list $l18))
  (type $l20 (list $l19))
  (type $l21 (list $l20))
  (type $l22 (list $l21))
  (type $l23 (list $l22))
  (type $l24 (list $l23))
  (type $l25 (list $l24))
  (type $l26 (list $l25))
  (type $l27 (list $l26))
  (type $l28 (list $l27))
  (type $l29 (list $l28))
  (type $l30 (list $l29))
  (type $l31 (list $l30))
  (type $l32 (list $l31))
  (type $l33 (list $l32))
  (type $l34 (list $l33))
  (type $l35 (list $l34))
  (type $l36 (list $l35))
  (type $l37 (list $l36))
  (type $l38 (list $l37))
  (type $l39 (list $l38))
  (type $l40 (list $l39))
  (type $t0 (tuple u8 u8))
  (type $t1 (tuple $t0 $t0))
  (type $t2 (tuple $t1 $t1))
  (type $t3 (tuple $t2 $t2))
  (type $t4 (tuple $t3 $t3))
  (type $t5 (tuple $t4 $t4))
  (type $t6 (tuple $t5 $t5))
  (type $t7 (tuple $t6 $t6))
  (type $t8 (tuple $t7 $t7))
  (type $t9 (tuple $t8 $t8))
  (type $t10 (tuple $t9 $t9))
  (type $t11 (tuple $t10 $t10))
  (type $t12 (tuple $t11 $t11))
  (type $t13 (tuple $t12 $t12))
  (type $t14 (tuple $t13 $t13))
  (type $t15 (tuple $t14 $t14))
  (type $t16 (tuple $t15 $t15))
  (func $deep (param "x" $l40) (canon lift (core func $i "deep") (memory $mem) (realloc $realloc)))
  (func $wide (param "x" $t16) (canon lift (core func $i "wide") (memory $mem) (realloc $realloc)))
  (func $fine (param "x" u32) (result u32) (canon lift (core func $i "fine")))
  (export "deep" (func $deep))
  (export "wide" (func $wide))
  (export "fine" (func $fine))
)"#;

/// A component exporting one function under `names` names (`f0`, `f1`,
/// …), whose parameter is a `u32`, or with `fields`, an exported record of
/// that many `u32` fields.
fn exported_under_names(fields: Option<usize>, names: usize) -> Vec<u8> {
    let exports: String = (0..names)
        .map(|i| format!("(export \"f{i}\" (func $f))"))
        .collect();
    let (types, param) = match fields {
        None => (String::new(), "u32"),
        Some(fields) => {
            let fields: String = (0..fields)
                .map(|i| format!(" (field \"field-{i}\" u32)"))
                .collect();
            (
                format!("(type $r (record{fields})) (export $wide \"wide\" (type $r))"),
                "$wide",
            )
        }
    };
    let wat = format!(
        r#"(component
  (core module $m
    (memory (export "memory") 1)
    (func (export "realloc") (param i32 i32 i32 i32) (result i32) i32.const 8)
    (func (export "f") (param i32)))
  (core instance $i (instantiate $m))
  (alias core export $i "memory" (core memory $mem))
  (alias core export $i "realloc" (core func $realloc))
  {types}
  (func $f (param "x" {param})
    (canon lift (core func $i "f") (memory $mem) (realloc $realloc)))
  {exports})"#
    );
    wat::parse_str(&wat).unwrap()
}

/// A plain component meets the same load bounds as an Airlock tool, and
/// the work to find them out is bounded (issue 60.5): one function under
/// 100,000 names (a megabyte of component) is refused before it is
/// compiled; a 550-field record parameter under 1,000 names (a few KB of
/// component whose schemas would take gigabytes) is refused before any
/// schema is built; under 200 names, once its schemas reach their total.
/// Each through the binary, in a few hundred milliseconds of CPU and tens
/// of MB, bounds an order of magnitude above what the refusal costs (on a
/// debug build, the first took 24 s and 1.1 GB, the second 27 s and
/// 1.8 GB before); the same shapes under a few names load.
#[test]
fn plain_components_are_bounded_before_their_tools_are_described() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let env = [("AIRLOCK_CACHE_DIR", cache.to_str().unwrap())];
    let cases = [
        (
            "names",
            exported_under_names(None, 100_000),
            "compile_limit",
            "declares more than 4096 names",
        ),
        (
            "tools",
            exported_under_names(Some(550), 1_000),
            "offers_too_much",
            "more than 256 functions that could be tools",
        ),
        (
            "schemas",
            exported_under_names(Some(550), 200),
            "offers_too_much",
            "schemas add up to more than 1048576 bytes",
        ),
    ];
    for (name, bytes, kind, expected) in cases {
        let file = dir.path().join(format!("{name}.wasm"));
        std::fs::write(&file, &bytes).unwrap();
        let out =
            crate::support::airlock_measured(&["inspect", file.to_str().unwrap(), "--json"], &env);
        assert_eq!(out.code, Some(2), "{name}: {}", out.stderr);
        let doc: Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|_| panic!("{name}: {}\n{}", out.stdout, out.stderr));
        assert_eq!(doc["error"]["kind"], kind, "{name}: {doc}");
        let message = doc["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(expected) && message.contains(&format!("{name}.wasm")),
            "{name}: {message}"
        );
        assert!(
            out.cpu < std::time::Duration::from_secs(1),
            "{name} ({} bytes): {:?} of CPU",
            bytes.len(),
            out.cpu
        );
        assert!(
            out.max_rss_bytes < 100 << 20,
            "{name}: {} MB",
            out.max_rss_bytes >> 20
        );
    }
    // The same shapes, a few names each, load: the refusals are the
    // bounds, not the generator.
    let fine = dir.path().join("fine.wasm");
    std::fs::write(&fine, exported_under_names(Some(550), 3)).unwrap();
    let out =
        crate::support::airlock_measured(&["inspect", fine.to_str().unwrap(), "--json"], &env);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let doc: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let tools = doc["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 3, "{doc:.300}");
    assert_eq!(
        tools[0]["parameters"]["properties"]["x"]["properties"]
            .as_object()
            .unwrap()
            .len(),
        550
    );
}
