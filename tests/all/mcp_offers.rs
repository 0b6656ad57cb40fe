//! What components offer an MCP client beside their tools (resources,
//! templates, prompts, completions), served by `airlock mcp` to a real
//! client (rmcp's), over stdio and over HTTP.

use std::time::Duration;

use rmcp::model::{
    ArgumentInfo, CallToolRequestParams, CompleteRequestParams, GetPromptRequestParams,
    ReadResourceRequestParams, Reference, ResourceContents, SubscribeRequestParams,
    UnsubscribeRequestParams,
};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;
use tokio::sync::mpsc;

use crate::support::guest;
use crate::support::mcp::{connect_2026, connect_with, serve_http};

/// A client that passes on each `notifications/resources/updated` URI.
#[derive(Clone)]
struct Subscriber {
    updated: mpsc::UnboundedSender<String>,
}

impl rmcp::ClientHandler for Subscriber {
    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        let _ = self.updated.send(params.uri);
    }
}

/// The URIs of updates heard until one for `uri` (at most 60 s).
async fn updates_until(heard: &mut mpsc::UnboundedReceiver<String>, uri: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(60), heard.recv())
            .await
            .unwrap_or_else(|_| panic!("no update of {uri}; heard {seen:?}"))
            .expect("the client is running");
        seen.push(next.clone());
        if next == uri {
            return seen;
        }
    }
}

fn text_of(contents: &ResourceContents) -> &str {
    match contents {
        ResourceContents::TextResourceContents { text, .. } => text,
        other => panic!("expected text, got {other:?}"),
    }
}

/// The policy serving the everything example (its resources use the
/// `test` scheme).
fn everything_policy(dir: &std::path::Path) -> String {
    let policy = dir.join("airlock.toml");
    let tool = format!(
        "[[tool]]\npath = {:?}\nuri_schemes = [\"test\"]\n",
        guest("everything")
    );
    std::fs::write(&policy, tool).unwrap();
    policy.to_str().unwrap().to_owned()
}

/// Lists, reads (fixed, binary, template), subscriptions that hear of
/// exactly the calls that change what the resource read, prompts with
/// their arguments checked, and completions; errors with MCP's codes.
// `resources/subscribe` is the 2025 revisions' (rmcp marks it legacy).
#[allow(deprecated)]
async fn resources_and_prompts(
    client: &RunningService<RoleClient, Subscriber>,
    heard: &mut mpsc::UnboundedReceiver<String>,
) {
    let resources = client.list_all_resources().await.unwrap();
    let uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
    assert_eq!(
        uris,
        [
            "airlock://session/deps",
            "test://static-text",
            "test://static-binary",
            "test://watched-resource"
        ]
    );
    let templates = client.list_all_resource_templates().await.unwrap();
    assert_eq!(templates.len(), 1);
    assert_eq!(templates[0].uri_template, "test://template/{id}/data");

    let read = |uri: &str| client.read_resource(ReadResourceRequestParams::new(uri));
    let data = read("test://template/a%20b/data").await.unwrap();
    let data: serde_json::Value = serde_json::from_str(text_of(&data.contents[0])).unwrap();
    assert_eq!(data["id"], "a b", "{data}");
    let binary = read("test://static-binary").await.unwrap();
    assert!(
        matches!(&binary.contents[0], ResourceContents::BlobResourceContents { blob, mime_type, .. }
            if blob.starts_with("iVBORw0KGgo") && mime_type.as_deref() == Some("image/png")),
        "{binary:?}"
    );
    for unknown in ["test://nothing", "test://template/1/2/data"] {
        let err = read(unknown).await.unwrap_err().to_string();
        assert!(
            err.contains("-32002") && err.contains("no resource"),
            "{unknown}: {err}"
        );
    }

    // A subscription hears of a call that changes what its resource read,
    // and not of one that changes nothing it read.
    for uri in ["test://watched-resource", "test://static-text"] {
        client
            .subscribe(SubscribeRequestParams::new(uri))
            .await
            .unwrap();
    }
    let set = |text: &str| {
        client.call_tool(
            CallToolRequestParams::new("set_watched")
                .with_arguments(json!({"text": text}).as_object().unwrap().clone()),
        )
    };
    set("first").await.unwrap();
    let seen = updates_until(heard, "test://watched-resource").await;
    assert!(!seen.iter().any(|u| u == "test://static-text"), "{seen:?}");
    let watched = read("test://watched-resource").await.unwrap();
    assert_eq!(text_of(&watched.contents[0]), "Watched: first");
    client
        .unsubscribe(UnsubscribeRequestParams::new("test://watched-resource"))
        .await
        .unwrap();
    client
        .subscribe(SubscribeRequestParams::new("airlock://session/deps"))
        .await
        .unwrap();
    set("second").await.unwrap();
    let seen = updates_until(heard, "airlock://session/deps").await;
    assert_eq!(seen, ["airlock://session/deps"], "after unsubscribing");
    // A client watches at most 256 resources (2 so far).
    for n in 0..254 {
        let uri = format!("test://template/{n}/data");
        client
            .subscribe(SubscribeRequestParams::new(uri))
            .await
            .unwrap();
    }
    let err = client
        .subscribe(SubscribeRequestParams::new("test://template/x/data"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("at most 256 resources"), "{err}");

    // Prompts: listed with their arguments, filled in, checked first.
    let prompts = client.list_all_prompts().await.unwrap();
    let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    let with_args = prompts
        .iter()
        .find(|p| p.name == "test_prompt_with_arguments")
        .unwrap();
    assert_eq!(with_args.arguments.as_ref().unwrap().len(), 2);
    let get = |args: serde_json::Value| {
        client.get_prompt(
            GetPromptRequestParams::new("test_prompt_with_arguments")
                .with_arguments(args.as_object().unwrap().clone()),
        )
    };
    let prompt = get(json!({"arg1": "one", "arg2": "two"})).await.unwrap();
    let said = serde_json::to_string(&prompt.messages).unwrap();
    assert!(said.contains("arg1='one', arg2='two'"), "{said}");
    let err = get(json!({"arg1": "one"})).await.unwrap_err().to_string();
    assert!(
        err.contains("-32602") && err.contains("\"arg2\" is required"),
        "{err}"
    );
    // An argument that is no string is refused, named cut short however
    // long its name.
    let long = "a".repeat(100_000);
    let err = get(json!({"arg1": "one", "arg2": "two", long: 1}))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("-32602") && err.contains("the argument \"aaa"),
        "{err}"
    );
    assert!(err.len() < 1000, "{} bytes", err.len());
    let err = client
        .get_prompt(GetPromptRequestParams::new("nope"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no prompt \"nope\""), "{err}");

    // Completions, for a prompt's argument and a template's variable.
    let complete = |reference, name: &str, value: &str| {
        client.complete(CompleteRequestParams::new(
            reference,
            ArgumentInfo::new(name, value),
        ))
    };
    let values = complete(
        Reference::for_prompt("test_prompt_with_arguments"),
        "arg1",
        "te",
    )
    .await
    .unwrap()
    .completion
    .values;
    assert_eq!(values, ["test", "testValue1"]);
    let values = complete(
        Reference::for_resource("test://template/{id}/data"),
        "id",
        "1",
    )
    .await
    .unwrap()
    .completion
    .values;
    assert_eq!(values, ["123"]);
    let err = complete(Reference::for_prompt("nope"), "x", "")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("-32602"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_serve_resources_prompts_and_completions_over_stdio_and_http() {
    let dir = tempfile::tempdir().unwrap();
    let config = everything_policy(dir.path());
    let db = dir.path().join("sessions.db");
    let (updated, mut heard) = mpsc::unbounded_channel();
    let (client, _pid) = connect_with(
        Subscriber { updated },
        &[
            "--config",
            &config,
            "--store",
            db.to_str().unwrap(),
            "--session",
            "offers",
        ],
    )
    .await;
    resources_and_prompts(&client, &mut heard).await;
    client.cancel().await.unwrap();

    let server = serve_http(&config, db.to_str().unwrap());
    let (updated, mut heard) = mpsc::unbounded_channel();
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(server.url.clone());
    let client = Subscriber { updated }
        .serve(transport)
        .await
        .expect("initialize over HTTP");
    resources_and_prompts(&client, &mut heard).await;
}

/// A component's resource URIs must use a scheme its policy allows, as
/// the links it shows must: without the operator's word its resources are
/// withheld (`inspect` says which and why, and `airlock mcp` how many as it
/// starts: its clients list none), and its tools still load.
#[test]
fn resources_with_a_scheme_the_policy_does_not_allow_are_withheld() {
    let everything = guest("everything");
    let out = crate::support::airlock(&["inspect", everything.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["resources"], json!([]), "{doc}");
    let withheld = doc["withheld"].as_array().unwrap();
    assert_eq!(withheld.len(), 4, "{doc}");
    assert_eq!(withheld[0]["uri"], "test://static-text");
    let reason = withheld[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("test:") && reason.contains("uri_schemes"),
        "{reason}"
    );
    assert_eq!(doc["prompts"].as_array().unwrap().len(), 4, "{doc}");
    assert!(doc["tools"].as_array().unwrap().len() > 10, "{doc}");

    let dir = tempfile::tempdir().unwrap();
    let config = everything_policy(dir.path());
    let out =
        crate::support::airlock(&["inspect", everything.to_str().unwrap(), "--config", &config]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(
            "resources (for an MCP client):\n  test://static-text         A text resource"
        ) && text.contains("test://template/{id}/data")
            && text.contains("test_prompt_with_arguments(arg1, arg2)")
            && !text.contains("not offered"),
        "{text}"
    );

    // `airlock mcp` says so as it starts (its client, here none, ends it).
    let store = dir.path().join("s.db");
    let serve = |policy: &[&str]| {
        let mut args = vec!["mcp", "--store", store.to_str().unwrap()];
        args.extend_from_slice(policy);
        let out = crate::support::airlock(&args);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let said = serve(&["--tool", everything.to_str().unwrap()]);
    assert!(
        said.contains(
            "not offering 4 of the resources everything.wasm describes: its scheme test:"
        ) && said.contains("(uri_schemes)"),
        "{said}"
    );
    let said = serve(&["--config", &config]);
    assert!(
        said.contains("serving") && !said.contains("not offering"),
        "{said}"
    );
}

/// The next notification of a listen (at most 60 s).
async fn next_note(listening: &mut rmcp::service::Subscription) -> rmcp::model::ServerNotification {
    tokio::time::timeout(Duration::from_secs(60), listening.next())
        .await
        .expect("a notification")
        .unwrap()
        .expect("the stream is open")
}

/// A client of the 2026-07-28 revision (no `initialize`: `server/discover`)
/// listens (`subscriptions/listen`) for a resource it names: a call that
/// changes what the resource's read looked at is heard on that stream,
/// one that does not is not, and the listener's end is the server's to
/// keep serving after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_client_listens_for_the_resources_it_names() {
    use rmcp::model::GetMeta;
    use rmcp::model::{ServerNotification, SubscriptionFilter};
    let dir = tempfile::tempdir().unwrap();
    let config = everything_policy(dir.path());
    let db = dir.path().join("sessions.db");
    let client = connect_2026(
        (),
        &[
            "--config",
            &config,
            "--store",
            db.to_str().unwrap(),
            "--session",
            "listened",
        ],
    )
    .await;
    let mut listening = client
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription("test://watched-resource")
                .resource_subscription("test://static-text")
                .tools_list_changed()
                .build(),
        )
        .await
        .unwrap();
    let accepted = listening.acknowledged().clone();
    assert_eq!(accepted.tools_list_changed, Some(true), "{accepted:?}");
    let set = |text: &str| {
        client.call_tool(
            CallToolRequestParams::new("set_watched")
                .with_arguments(json!({"text": text}).as_object().unwrap().clone()),
        )
    };
    set("listened").await.unwrap();
    let heard = next_note(&mut listening).await;
    let ServerNotification::ResourceUpdatedNotification(note) = &heard else {
        panic!("{heard:?}");
    };
    assert_eq!(note.params.uri, "test://watched-resource");
    assert_eq!(
        heard.get_meta().subscription_id(),
        Some(listening.id().clone())
    );
    let watched = client
        .read_resource(ReadResourceRequestParams::new("test://watched-resource"))
        .await
        .unwrap();
    assert_eq!(text_of(&watched.contents[0]), "Watched: listened");
    // A second change is heard too, and nothing was heard of static-text
    // in between (the stream is in order).
    set("again").await.unwrap();
    let heard = next_note(&mut listening).await;
    assert!(
        matches!(&heard, ServerNotification::ResourceUpdatedNotification(n)
            if n.params.uri == "test://watched-resource"),
        "{heard:?}"
    );
    // A URI nothing offers is refused: the stream, acknowledged first
    // (the SDK's order), ends with the error.
    let mut refused = client
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription("test://nothing")
                .build(),
        )
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(60), refused.next())
        .await
        .expect("the stream ends");
    let err = ended.expect_err("an error ends it").to_string();
    assert!(err.contains("no resource \"test://nothing\""), "{err}");
    // The first listener still hears: a change of the policy on disk
    // reloads the tools, and it accepted tool list changes.
    let policy = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("# changed\n{policy}")).unwrap();
    let heard = next_note(&mut listening).await;
    assert!(
        matches!(heard, ServerNotification::ToolListChangedNotification(_)),
        "{heard:?}"
    );
}

/// A 2026-07-28 message over stateless HTTP (no MCP session): the
/// revision's `_meta` keys, and the Airlock session it works on.
fn stateless(id: u32, method: &str, mut params: serde_json::Value) -> serde_json::Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "airlock/session": "shared",
    });
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// A POST of `message` as a 2026-07-28 client sends it: the revision's
/// headers, the method and (for a call) the tool's name among them.
fn post_2026(url: &str, message: serde_json::Value) -> reqwest::RequestBuilder {
    let mut request = crate::support::mcp::RawHttp::new(url)
        .http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", message["method"].as_str().unwrap());
    if let Some(name) = message["params"]["name"].as_str() {
        request = request.header("mcp-name", name);
    }
    request.body(message.to_string())
}

/// Over stateless HTTP, where each request stands alone, a listen names
/// its Airlock session in `_meta` like any request: a call on that
/// session, in a request of its own, is heard on the listen's stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_over_stateless_http_hears_a_call_in_another_request() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("listen.db");
    let policy = dir.path().join("airlock.toml");
    std::fs::write(
        &policy,
        format!(
            "[[tool]]\npath = {:?}\nuri_schemes = [\"test\"]\n",
            guest("everything")
        ),
    )
    .unwrap();
    let server = serve_http(policy.to_str().unwrap(), db.to_str().unwrap());
    let listen = stateless(
        1,
        "subscriptions/listen",
        json!({"notifications": {"resourceSubscriptions": ["test://watched-resource"]}}),
    );
    let mut stream = post_2026(&server.url, listen).send().await.unwrap();
    if stream.status() != 200 {
        panic!("{}: {}", stream.status(), stream.text().await.unwrap());
    }
    // The call is made once the listen is acknowledged.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut heard = String::new();
    let mut hear = async |heard: &mut String, what: &str| {
        while !heard.contains(what) {
            let chunk = tokio::time::timeout_at(deadline, stream.chunk())
                .await
                .unwrap_or_else(|_| panic!("no {what} on the listen's stream: {heard}"))
                .unwrap()
                .expect("the stream stays open");
            heard.push_str(&String::from_utf8_lossy(&chunk));
        }
    };
    hear(&mut heard, "notifications/subscriptions/acknowledged").await;
    let call = stateless(
        2,
        "tools/call",
        json!({"name": "set_watched", "arguments": {"text": "seen"}}),
    );
    let answer = post_2026(&server.url, call).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let answer = answer.text().await.unwrap();
    assert!(answer.contains("\"id\":2"), "{answer}");
    hear(&mut heard, "notifications/resources/updated").await;
    assert!(heard.contains("test://watched-resource"), "{heard}");
}
