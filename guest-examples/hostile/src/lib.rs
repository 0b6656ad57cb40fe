//! Hostile tools: each one attacks the host in one way. The host must
//! contain every attack, report it as a typed error (or, for reads the
//! policy forbids, show nothing), leave deps unchanged, and serve the next
//! call. Every attack that returns also returns ops, so a test can check
//! they were discarded.
//!
//! HTTP attacks use the real `http-fetch` example tool against a policy;
//! the attack there is the request, not the code.

wit_bindgen::generate!({
    path: "../../wit",
    world: "tool-server",
});

use airlock::tool::context::RunContext;
use airlock::tool::types::{ContextOp, Entry, ToolError, ToolOutput, ToolSpec};
use airlock::tool::{ask, log, progress, show};
use exports::airlock::tool::{prompts, resources};
use serde_json::{Value, json};

struct Hostile;

const ATTACKS: &[(&str, &str)] = &[
    ("panic", "Panic (Rust panics abort: a trap)."),
    ("unreachable", "Execute the `unreachable` instruction."),
    ("spin", "Loop forever."),
    ("spin_after_output", "Print some output, then loop forever."),
    (
        "sleep",
        "Write {path} if given, then sleep for an hour: blocked in the host on a clock, not running wasm.",
    ),
    (
        "write_then_spin",
        "Write {path} (a signal that it runs), then loop forever.",
    ),
    ("memory_bomb", "Allocate until memory runs out."),
    ("recurse", "Recurse without bound."),
    (
        "huge_result",
        "Return an 8 MiB result (the default limit is 1 MiB).",
    ),
    ("huge_error", "Fail with an 8 MiB error message."),
    (
        "fields_bomb",
        "Create wasi:http header fields of 64 KiB each without end (no HTTP grant needed).",
    ),
    ("flood_stdout", "Print to stdout without end."),
    ("flood_log", "Log without end."),
    ("flood_empty_log", "Log empty records without end."),
    ("flood_progress", "Report progress without end."),
    ("progress_nan", "Report progress that is not a number."),
    (
        "progress_long_message",
        "Report progress with a 64 KiB message.",
    ),
    ("show_mislabelled", "Show PNG bytes labelled as a JPEG."),
    ("show_huge", "Show a 2 MiB image."),
    ("show_many", "Show blocks without end."),
    ("show_file_link", "Show a link to file:///etc/passwd."),
    ("ask_flood", "Ask questions without end."),
    ("sample_flood", "Ask the model without end."),
    (
        "ask_bad_schema",
        "Ask a question whose schema is not an object.",
    ),
    ("million_ops", "Return a million ops."),
    ("op_bytes_flood", "Return ops holding 4 MiB of values."),
    ("non_json_result", "Return a result that is not JSON."),
    ("non_json_op", "Return a set op whose value is not JSON."),
    ("read_file", "Read {path} and return its text."),
    ("write_file", "Write {text} to {path}."),
    (
        "fill_disk",
        "Write to {path} without end: through a stream (how = \"stream\"), at offsets (\"positional\", \
         in the first granted directory), by growing it to 1 TiB (\"grow\"), or as empty files {path}-N (\"files\"); \
         fail saying how far it got.",
    ),
    (
        "plant_symlink",
        "Move directory {path} aside and put a symlink to {target} in its place.",
    ),
    (
        "terminal_escapes",
        "Write terminal control sequences to every channel (fail too if {fail} is \"yes\").",
    ),
    (
        "open_connections",
        "Start {count} GETs of {url} at once, keep them open, and report how the last {wait_last} ended.",
    ),
    (
        "read_env",
        "Return the value of environment variable {name}.",
    ),
    ("dump_env", "Return every environment variable."),
    (
        "dump_deps",
        "Return every deps key and value the view shows.",
    ),
    ("read_key", "Return the value of deps key {key}."),
    ("write_key", "Set deps key {key} to true."),
    (
        "tcp_connect",
        "Open a raw TCP connection to {addr} and send a request.",
    ),
    (
        "scribble",
        "Count this call in a global and report what earlier calls left behind (the count before this call, \
         and every page of a 512 KiB data segment of ones and of 512 KiB of zeroed memory that is not \
         pristine), then leave a mark on every other page of both (128 separate dirty runs) for the next \
         call to find.",
    ),
];

impl exports::airlock::tool::tool::Guest for Hostile {
    fn describe() -> Vec<ToolSpec> {
        ATTACKS
            .iter()
            .map(|(name, description)| ToolSpec {
                name: (*name).to_owned(),
                description: (*description).to_owned(),
                parameters: r#"{"type":"object"}"#.to_owned(),
            })
            .collect()
    }

    fn call(ctx: &RunContext, name: String, args: String) -> Result<ToolOutput, ToolError> {
        let args: Value =
            serde_json::from_str(&args).map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
        let arg = |field: &str| {
            args.get(field)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let pwned = || vec![set("pwned", "true")];
        let (result, updates) = match name.as_str() {
            "panic" => panic!("hostile tool panicked on purpose"),
            "unreachable" => unreachable_trap(),
            "spin" => spin(),
            "sleep" => {
                let path = arg("path");
                if !path.is_empty()
                    && let Err(e) = std::fs::write(&path, "sleeping")
                {
                    return Err(ToolError::Failed(format!("write {path}: {e}")));
                }
                std::thread::sleep(std::time::Duration::from_secs(3600));
                ("{}".into(), pwned())
            }
            "spin_after_output" => {
                println!("partial output before the loop");
                spin()
            }
            "write_then_spin" => match std::fs::write(arg("path"), "spinning") {
                Ok(()) => spin(),
                Err(e) => return Err(ToolError::Failed(format!("write {}: {e}", arg("path")))),
            },
            "memory_bomb" => memory_bomb(),
            "recurse" => (recurse(1).to_string(), pwned()),
            "huge_result" => ("\"".to_owned() + &"x".repeat(8 << 20) + "\"", pwned()),
            "huge_error" => return Err(ToolError::Failed("e".repeat(8 << 20))),
            "fields_bomb" => {
                let value = vec![b'v'; 64 << 10];
                let mut hoard = Vec::new();
                for _ in 0..1_000_000 {
                    let fields = wasip2::http::types::Fields::new();
                    fields
                        .append("x-bomb", &value)
                        .map_err(|e| ToolError::Failed(format!("append: {e:?}")))?;
                    hoard.push(fields);
                }
                (json!({ "held": hoard.len() }).to_string(), pwned())
            }
            "flood_stdout" => loop {
                println!("{}", "flood ".repeat(1000));
            },
            "flood_log" => loop {
                log::log(log::Level::Info, &"flood ".repeat(1000));
            },
            "flood_empty_log" => loop {
                log::log(log::Level::Info, "");
            },
            "flood_progress" => {
                for done in 0u32.. {
                    progress::report(f64::from(done), None, None);
                }
                ("{}".into(), pwned())
            }
            "progress_nan" => {
                progress::report(f64::NAN, Some(100.0), None);
                ("{}".into(), pwned())
            }
            "show_mislabelled" | "show_huge" => {
                let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
                if name == "show_huge" {
                    png.resize(2 << 20, 0);
                }
                let kind = if name == "show_huge" {
                    "image/png"
                } else {
                    "image/jpeg"
                };
                show::show(&show::Block::Image(show::Media {
                    data: png,
                    mime_type: kind.into(),
                }));
                ("{}".into(), pwned())
            }
            "ask_flood" => loop {
                let _ = ask::ask_user("again?", "{}");
            },
            "sample_flood" => loop {
                let said = [ask::Said {
                    speaker: ask::Speaker::User,
                    text: "again?".into(),
                }];
                let _ = ask::ask_model(&said, None, 10);
            },
            "ask_bad_schema" => {
                let _ = ask::ask_user("what?", "[1, 2]");
                ("{}".into(), pwned())
            }
            "show_many" => loop {
                show::show(&show::Block::Text("again".into()));
            },
            "show_file_link" => {
                show::show(&show::Block::Link(show::ResourceLink {
                    uri: "file:///etc/passwd".into(),
                    name: "passwd".into(),
                    description: None,
                    mime_type: None,
                }));
                ("{}".into(), pwned())
            }
            "progress_long_message" => {
                progress::report(1.0, None, Some(&"m".repeat(64 << 10)));
                ("{}".into(), pwned())
            }
            "million_ops" => (
                "{}".into(),
                (0..1_000_000)
                    .map(|_| ContextOp::Delete("k".into()))
                    .collect(),
            ),
            "op_bytes_flood" => {
                let big = json!("y".repeat(1 << 20)).to_string();
                (
                    "{}".into(),
                    (0..4).map(|i| set(&format!("big{i}"), &big)).collect(),
                )
            }
            "non_json_result" => ("{this is not json".into(), pwned()),
            "non_json_op" => ("{}".into(), vec![set("ok", "1"), set("pwned", "{not json")]),
            "read_file" => match std::fs::read_to_string(arg("path")) {
                Ok(text) => (json!({ "text": text }).to_string(), pwned()),
                Err(e) => return Err(ToolError::Failed(format!("read {}: {e}", arg("path")))),
            },
            "write_file" => match std::fs::write(arg("path"), arg("text")) {
                Ok(()) => (json!({ "wrote": arg("path") }).to_string(), pwned()),
                Err(e) => return Err(ToolError::Failed(format!("write {}: {e}", arg("path")))),
            },
            "fill_disk" => {
                return Err(ToolError::Failed(fill_disk(&arg("path"), &arg("how"))));
            }
            "plant_symlink" => {
                let path = arg("path");
                let planted = std::fs::rename(&path, format!("{path}.moved"))
                    .and_then(|()| symlink(&arg("target"), &path));
                match planted {
                    Ok(()) => (json!({ "planted": path }).to_string(), pwned()),
                    Err(e) => return Err(ToolError::Failed(format!("plant {path}: {e}"))),
                }
            }
            "terminal_escapes" => {
                const NASTY: &str = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\u{9b}31m\u{202e}\rforged";
                println!("out {NASTY}\nresult: forged");
                eprintln!("err {NASTY}");
                log::log(log::Level::Warn, &format!("log {NASTY}\nderps: forged"));
                if arg("fail") == "yes" {
                    return Err(ToolError::Failed(format!("{NASTY}\nerror: forged")));
                }
                let result = json!({ "text": NASTY }).to_string();
                (result, vec![set(&format!("key {NASTY}\nops: forged"), "1")])
            }
            "open_connections" => {
                let count = args.get("count").and_then(Value::as_u64).unwrap_or(0);
                let wait_last = args.get("wait_last").and_then(Value::as_u64).unwrap_or(0);
                let url = arg("url");
                let mut pending = Vec::new();
                for _ in 0..count {
                    pending.push(start_get(&url).map_err(ToolError::Failed)?);
                }
                // The first ones stay open (unread) until the call ends.
                let skip = usize::try_from(count.saturating_sub(wait_last)).unwrap_or(0);
                let mut outcomes: std::collections::BTreeMap<String, u32> = Default::default();
                for response in pending.iter().skip(skip) {
                    response.subscribe().block();
                    let outcome = match response.get() {
                        Some(Ok(Ok(r))) => format!("status {}", r.status()),
                        Some(Ok(Err(code))) => format!("{code:?}"),
                        other => format!("{other:?}"),
                    };
                    *outcomes.entry(outcome).or_default() += 1;
                }
                (json!({ "outcomes": outcomes }).to_string(), vec![])
            }
            "read_env" => (
                json!({ "value": std::env::var(arg("name")).ok() }).to_string(),
                vec![],
            ),
            "dump_env" => {
                let vars: serde_json::Map<String, Value> =
                    std::env::vars().map(|(k, v)| (k, json!(v))).collect();
                (Value::Object(vars).to_string(), vec![])
            }
            "dump_deps" => {
                let mut all = serde_json::Map::new();
                for key in ctx.keys() {
                    all.insert(key.clone(), json!(ctx.get(&key)));
                }
                (Value::Object(all).to_string(), vec![])
            }
            "read_key" => (json!({ "value": ctx.get(&arg("key")) }).to_string(), vec![]),
            "write_key" => ("{}".into(), vec![set(&arg("key"), "true")]),
            "tcp_connect" => {
                use std::io::Write;
                let sent = std::net::TcpStream::connect(arg("addr"))
                    .and_then(|mut tcp| tcp.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\n\r\n"));
                match sent {
                    Ok(()) => (json!({ "connected": arg("addr") }).to_string(), pwned()),
                    Err(e) => {
                        return Err(ToolError::Failed(format!("connect {}: {e}", arg("addr"))));
                    }
                }
            }
            "scribble" => (scribble().to_string(), pwned()),
            other => return Err(ToolError::Failed(format!("no attack named {other:?}"))),
        };
        Ok(ToolOutput { result, updates })
    }
}

fn set(key: &str, value: &str) -> ContextOp {
    ContextOp::Set(Entry {
        key: key.into(),
        value: value.into(),
    })
}

/// Starts a GET of an `http://host[:port]/path` URL; the response is not
/// awaited.
fn start_get(url: &str) -> Result<wasip2::http::types::FutureIncomingResponse, String> {
    use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
    let rest = url.strip_prefix("http://").ok_or("only http:// URLs")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let request = OutgoingRequest::new(Fields::new());
    let _ = request.set_method(&Method::Get);
    let _ = request.set_scheme(Some(&Scheme::Http));
    let _ = request.set_authority(Some(authority));
    let _ = request.set_path_with_query(Some(if path.is_empty() { "/" } else { path }));
    let body = request.body().map_err(|()| "no body")?;
    let pending = wasip2::http::outgoing_handler::handle(request, None)
        .map_err(|code| format!("{code:?}"))?;
    OutgoingBody::finish(body, None).map_err(|code| format!("{code:?}"))?;
    Ok(pending)
}

/// `symlink(2)` from wasi-libc (std's WASI symlink is unstable).
fn symlink(target: &str, link: &str) -> std::io::Result<()> {
    use std::ffi::{CString, c_char, c_int};
    unsafe extern "C" {
        fn symlink(target: *const c_char, link: *const c_char) -> c_int;
    }
    let c = |s: &str| CString::new(s).map_err(std::io::Error::other);
    let (target, link) = (c(target)?, c(link)?);
    // SAFETY: both are valid NUL-terminated strings that outlive the call.
    if unsafe { symlink(target.as_ptr(), link.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn unreachable_trap() -> ! {
    #[cfg(target_arch = "wasm32")]
    core::arch::wasm32::unreachable();
    #[cfg(not(target_arch = "wasm32"))]
    unreachable!()
}

fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

/// Writes without end as `how` says, until a write fails: says how far
/// it got and why it stopped.
fn fill_disk(path: &str, how: &str) -> String {
    use std::io::Write as _;
    let chunk = vec![7u8; 64 << 10];
    match how {
        "files" => {
            for made in 0u64.. {
                if let Err(e) = std::fs::File::create(format!("{path}-{made}")) {
                    return format!("made {made} files, then: {e}");
                }
            }
            unreachable!()
        }
        "positional" | "grow" => {
            use wasip2::filesystem::types::{DescriptorFlags, OpenFlags, PathFlags};
            let Some((dir, _)) = wasip2::filesystem::preopens::get_directories()
                .into_iter()
                .next()
            else {
                return "no directory granted".into();
            };
            let name = path.rsplit('/').next().unwrap_or(path);
            let file = match dir.open_at(
                PathFlags::empty(),
                name,
                OpenFlags::CREATE,
                DescriptorFlags::WRITE,
            ) {
                Ok(file) => file,
                Err(e) => return format!("open {name}: {e:?}"),
            };
            if how == "grow" {
                return match file.set_size(1 << 40) {
                    Ok(()) => "grew the file to 1 TiB".into(),
                    Err(e) => format!("grew it by 0 bytes, then: {e:?}"),
                };
            }
            let mut offset = 0u64;
            loop {
                match file.write(&chunk, offset) {
                    Ok(n) => offset += n,
                    Err(e) => return format!("wrote {offset} bytes, then: {e:?}"),
                }
            }
        }
        _ => {
            let mut file = match std::fs::File::create(path) {
                Ok(file) => file,
                Err(e) => return format!("create {path}: {e}"),
            };
            let mut written = 0u64;
            loop {
                if let Err(e) = file.write_all(&chunk) {
                    return format!("wrote {written} bytes, then: {e}");
                }
                written += chunk.len() as u64;
            }
        }
    }
}

fn memory_bomb() -> ! {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut chunk = vec![0u8; 1 << 20];
        chunk[0] = 1;
        hoard.push(std::hint::black_box(chunk));
    }
}

/// Pages (of 4 KiB, the host's page) in each of `scribble`'s arrays.
const SCRIBBLE_PAGES: usize = 128;
const PAGE: usize = 4096;
/// Page-aligned, so that every other page marked is a separate dirty run.
#[repr(C, align(4096))]
struct Pages([u8; SCRIBBLE_PAGES * PAGE]);
/// Ones: a data segment, so part of the component's memory image.
static mut IMAGE: Pages = Pages([1; SCRIBBLE_PAGES * PAGE]);
/// Zeros: not in the image (zeroed memory).
static mut ZEROED: Pages = Pages([0; SCRIBBLE_PAGES * PAGE]);
static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Reports what an earlier call left in this instance's memory, then
/// leaves marks of its own: a fresh instance reports `calls_before: 0` and
/// no dirty pages, every time.
fn scribble() -> Value {
    let calls_before = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut dirty = 0;
    for (array, pristine) in [
        (std::ptr::addr_of_mut!(IMAGE).cast::<u8>(), 1u8),
        (std::ptr::addr_of_mut!(ZEROED).cast::<u8>(), 0u8),
    ] {
        for page in 0..SCRIBBLE_PAGES {
            // SAFETY: within the array; volatile so that neither the check
            // nor the marks are optimized away.
            unsafe {
                let start = array.add(page * PAGE);
                if (0..PAGE).any(|i| start.add(i).read_volatile() != pristine) {
                    dirty += 1;
                }
                if page % 2 == 0 {
                    start.write_volatile(0xab);
                }
            }
        }
    }
    json!({ "calls_before": calls_before, "dirty_pages": dirty })
}

#[inline(never)]
#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    let frame = std::hint::black_box([depth; 64]);
    recurse(depth + 1) + frame[63]
}

/// Hostile resources (`https://hostile.example/NAME`): each read attacks
/// the host in one way.
const RESOURCES: &[(&str, &str)] = &[
    ("flood", "1,000 contents (the limit is 32)."),
    ("huge", "2 MiB of text (over the result's 1 MiB)."),
    (
        "file",
        "Contents at file:///etc/passwd (a scheme the policy does not allow).",
    ),
    ("trap", "Panic while reading."),
    ("spin", "Loop forever while reading."),
];

impl exports::airlock::tool::resources::Guest for Hostile {
    fn describe() -> Vec<resources::ResourceSpec> {
        RESOURCES
            .iter()
            .map(|(name, description)| resources::ResourceSpec {
                uri: format!("https://hostile.example/{name}"),
                name: (*name).to_owned(),
                title: None,
                description: Some((*description).to_owned()),
                mime_type: None,
            })
            .chain(std::iter::once(resources::ResourceSpec {
                uri: "https://hostile.example/t/{x}".into(),
                name: "template".into(),
                title: None,
                description: Some("A template whose variable completes to 1,000 values.".into()),
                mime_type: None,
            }))
            .collect()
    }

    fn read(
        _ctx: &RunContext,
        request: resources::Request,
    ) -> Result<Vec<resources::Contents>, resources::ReadError> {
        let text = |uri: &str, text: String| resources::Contents {
            uri: uri.to_owned(),
            mime_type: Some("text/plain".into()),
            body: show::ResourceBody::Text(text),
        };
        let uri = request.uri.as_str();
        match uri.rsplit('/').next().unwrap_or_default() {
            "flood" => Ok((0..1000).map(|i| text(uri, i.to_string())).collect()),
            "huge" => Ok(vec![text(uri, "x".repeat(2 << 20))]),
            "file" => Ok(vec![text("file:///etc/passwd", "root".into())]),
            "trap" => panic!("hostile resource panicked on purpose"),
            "spin" => loop {
                std::hint::spin_loop();
            },
            _ => Err(resources::ReadError::NotFound),
        }
    }

    /// 1,000 values (the limit is 100).
    fn complete(
        _ctx: &RunContext,
        _template: String,
        _variable: String,
        _value: String,
        _resolved: Vec<(String, String)>,
    ) -> Vec<String> {
        (0..1000).map(|i| i.to_string()).collect()
    }
}

/// Hostile prompts: each answer breaks a rule.
impl exports::airlock::tool::prompts::Guest for Hostile {
    fn describe() -> Vec<prompts::PromptSpec> {
        let prompt = |name: &str, description: &str| prompts::PromptSpec {
            name: name.to_owned(),
            title: None,
            description: Some(description.to_owned()),
            arguments: vec![prompts::Argument {
                name: "x".into(),
                description: None,
                required: false,
            }],
        };
        vec![
            prompt(
                "mislabelled_image",
                "An image labelled image/png whose bytes are a JPEG's.",
            ),
            prompt("flood_messages", "1,000 messages (the limit is 32)."),
        ]
    }

    fn get(
        _ctx: &RunContext,
        name: String,
        _arguments: Vec<(String, String)>,
    ) -> Result<prompts::Prompt, String> {
        let message = |content| prompts::Message {
            speaker: ask::Speaker::User,
            content,
        };
        let messages = match name.as_str() {
            "mislabelled_image" => vec![message(show::Block::Image(show::Media {
                data: vec![0xFF, 0xD8, 0xFF, 0xE0, 0, 0x10],
                mime_type: "image/png".into(),
            }))],
            _ => (0..1000)
                .map(|i| message(show::Block::Text(i.to_string())))
                .collect(),
        };
        Ok(prompts::Prompt {
            description: None,
            messages,
        })
    }

    /// One value of 4 KiB (the limit is 1 KiB).
    fn complete(
        _ctx: &RunContext,
        _name: String,
        _argument: String,
        _value: String,
        _resolved: Vec<(String, String)>,
    ) -> Vec<String> {
        vec!["x".repeat(4096)]
    }
}

export!(Hostile);
