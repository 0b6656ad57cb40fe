//! The docs' commands, run as pasted: every line of every `sh` block of
//! README.md, then of each file in [`DOCS`], from the repository's root,
//! in the order they give them, with the built `airlock` first on `PATH`
//! (the README's `export PATH=…` line) and one data directory for all. A line that needs what a
//! test cannot have here (the network, a model's API key, a registry or a
//! Postgres server started by hand, a crate built outside the repository,
//! a server over stdio that runs until stopped) is skipped for a reason
//! named in [`SKIPPED`]; the tests of those features cover them. An HTTP
//! MCP server a doc starts runs in the background for the `curl` lines
//! after it. Where the README
//! shows a command's output (`$ command` then its lines), each shown line
//! must be in what it prints (a line's `…` stands for what differs by
//! machine, as a path); where it shows `# error: …` after a command,
//! the command must fail saying that. With `AIRLOCK_DOCS_WALK=FILE`, each
//! command and what it printed is appended to FILE, to read the walk.

use std::path::Path;
use std::process::Command;

use crate::support::{cache_dir, root};

/// The files whose commands run, in order (later ones may use what
/// earlier ones made: the README's session `demo`).
const DOCS: &[&str] = &["README.md", "docs/reference.md", "docs/writing-tools.md"];

/// Lines not run, by how they start or what they hold, and why.
const SKIPPED: &[(&str, &str)] = &[
    (
        "TOOL.wasm",
        "a placeholder for the reader's own tool (the lines after it run real ones)",
    ),
    ("my_tool.wasm", "a placeholder for the reader's own tool"),
    (
        "release/notes.wasm",
        "the notes crate is built outside the repository",
    ),
    ("python3 -m venv", "installs a toolchain (make guests does)"),
    ("pip install", "installs a toolchain (make guests does)"),
    ("apt-get install", "installs a toolchain (make guests does)"),
    ("npm install", "installs a toolchain (make guests does)"),
    (
        "componentize-py",
        "builds a tool (make guests does, into target/guests)",
    ),
    ("npx componentize-js", "builds a tool (make guests does)"),
    ("wit-bindgen c", "writes bindings (make c-bindings does)"),
    ("clang-19", "builds a tool (make guests does)"),
    ("wasm-tools component", "builds a tool (make guests does)"),
    (
        "python-stateful.wasm",
        "the tool the skipped build above makes",
    ),
    ("js-stateful.wasm", "the tool the skipped build above makes"),
    ("c-stateful.wasm", "the tool the skipped build above makes"),
    (
        "export PATH=",
        "the test puts the built airlock first on PATH",
    ),
    ("make ", "make targets: what `make test` itself runs"),
    (
        "cargo ",
        "builds a crate (the repository's examples: make guests builds them)",
    ),
    (
        "airlock call target/wasm32-wasip2/release/greeter.wasm",
        "the greeter crate is built outside the repository",
    ),
    (
        "airlock keygen",
        "the registry walk-through (tests/all/oci.rs runs it against a registry)",
    ),
    ("airlock push", "the registry walk-through"),
    ("airlock pull", "the registry walk-through"),
    ("oci://", "the registry walk-through"),
    (
        "--config guest-examples/registry/",
        "the registry walk-through",
    ),
    (
        "airlock mcp",
        "a server over stdio that runs until stopped (tests/all/mcp.rs drives it)",
    ),
    ("=...", "needs an API key or token"),
    ("=sk-", "needs an API key"),
    ("OPENAI_BASE_URL=", "needs a model server"),
];

/// One command of the README and what it is shown to print.
#[derive(Debug)]
struct Shown {
    line: usize,
    command: String,
    /// Lines it prints (after a `$ ` command).
    output: Vec<String>,
    /// Text its error must hold (`# error: …` after it).
    error: Option<String>,
}

/// Every command of the README's `sh` blocks, in order.
fn commands(readme: &str) -> Vec<Shown> {
    let mut shown: Vec<Shown> = Vec::new();
    let mut in_sh = false;
    let mut prompted = false;
    let mut pending = String::new();
    for (n, raw) in readme.lines().enumerate() {
        if raw.starts_with("```") {
            in_sh = raw == "```sh";
            prompted = false;
            continue;
        }
        if !in_sh {
            continue;
        }
        let line = raw.trim();
        if let Some(error) = line.strip_prefix("# error: ") {
            if let Some(last) = shown.last_mut() {
                last.error = Some(error.trim_matches('"').to_owned());
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let command = match line.strip_prefix("$ ") {
            // A command continued from the line before.
            _ if !pending.is_empty() => line,
            Some(command) => {
                prompted = true;
                command
            }
            None if prompted => {
                if let Some(last) = shown.last_mut() {
                    last.output.push(line.to_owned());
                }
                continue;
            }
            None => line,
        };
        // A trailing backslash, or an open quote, continues the command on
        // the next line.
        if let Some(head) = command.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(command);
        if open_quote(&pending) {
            pending.push('\n');
            continue;
        }
        let whole = std::mem::take(&mut pending);
        shown.push(Shown {
            line: n + 1,
            command: whole,
            output: Vec::new(),
            error: None,
        });
    }
    shown
}

/// Whether `text` ends inside a quoted string (as `sh` reads quotes; a
/// `#` after a blank outside quotes starts a comment, whose quotes do not
/// count).
fn open_quote(text: &str) -> bool {
    let (mut quote, mut escaped, mut blank) = (None, false, true);
    for c in text.chars() {
        match (quote, c) {
            (_, _) if escaped => escaped = false,
            (None, '#') if blank => break,
            (None | Some('"'), '\\') => escaped = true,
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            _ => {}
        }
        blank = c.is_whitespace() || c == '\n';
    }
    quote.is_some()
}

/// Whether `stdout` has a line that `shown` stands for: a line holding
/// it, or, where `shown` leaves out what differs from one machine to the
/// next (`…`, as in a path), holding each of its other parts in order.
fn printed(stdout: &str, shown: &str) -> bool {
    stdout.lines().any(|line| {
        let mut rest = line;
        shown.split('…').all(|part| match rest.find(part) {
            Some(at) => {
                rest = &rest[at + part.len()..];
                true
            }
            None => false,
        })
    })
}

/// How a doc starts the HTTP MCP server its `curl` examples reach.
const HTTP_SERVER: &str = "airlock mcp --transport http --listen ";

/// A doc's `airlock mcp --transport http` line, running.
struct Server(std::process::Child);

impl Server {
    /// Runs `command` as the doc gives it, and waits (a minute at most)
    /// until its `--listen` address takes connections.
    fn start(command: &str, root: &Path, path: &str, data: &Path) -> Self {
        let listen = command[HTTP_SERVER.len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned();
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {command}"))
            .current_dir(root)
            .env("PATH", path)
            .env("AIRLOCK_DATA_DIR", data)
            .env("AIRLOCK_CACHE_DIR", cache_dir())
            .env_remove("AIRLOCK_STORE")
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut server = Self(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::net::TcpStream::connect(&listen).is_err() {
            assert!(
                server.0.try_wait().unwrap().is_none(),
                "{command}: the server ended"
            );
            assert!(
                std::time::Instant::now() < deadline,
                "{command}: never listened"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn skipped(command: &str) -> Option<&'static str> {
    SKIPPED
        .iter()
        .find(|(pattern, _)| command.starts_with(pattern) || command.contains(pattern))
        .map(|(_, why)| *why)
}

#[test]
fn every_offline_command_in_the_docs_runs_as_pasted() {
    let root = root();
    let data = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_airlock")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let all: Vec<(&str, Shown)> = DOCS
        .iter()
        .flat_map(|doc| {
            let text = std::fs::read_to_string(root.join(doc)).unwrap();
            commands(&text).into_iter().map(move |shown| (*doc, shown))
        })
        .collect();
    assert!(all.len() > 20, "the docs' commands were not found");
    let (mut ran, mut skips) = (0, Vec::new());
    // The HTTP MCP server a doc starts: the `curl` lines after it are its
    // clients. Stopped when the test ends.
    let mut servers: Vec<Server> = Vec::new();
    for (doc, shown) in &all {
        if shown.command.starts_with(HTTP_SERVER) {
            servers.push(Server::start(&shown.command, &root, &path, data.path()));
            ran += 1;
            continue;
        }
        if let Some(why) = skipped(&shown.command) {
            skips.push(format!("{doc}:{}: {} ({why})", shown.line, shown.command));
            continue;
        }
        let mut command = Command::new("sh");
        // Postgres's client settings of the server `make test` runs under
        // would make the README's own `pg_virtualenv` collide with it.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("PG") {
                command.env_remove(name);
            }
        }
        let out = command
            .arg("-c")
            .arg(&shown.command)
            .current_dir(&root)
            .env("PATH", &path)
            .env("AIRLOCK_DATA_DIR", data.path())
            .env("AIRLOCK_CACHE_DIR", cache_dir())
            .env_remove("AIRLOCK_STORE")
            .env_remove("RUST_LOG")
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        let at = format!(
            "{doc}:{}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            shown.line, shown.command
        );
        // The walk, for a person to read: every command and what it said.
        if let Some(walk) = std::env::var_os("AIRLOCK_DOCS_WALK") {
            use std::io::Write as _;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(walk)
                .unwrap();
            writeln!(
                file,
                "$ {}  [{doc}:{}, exit {:?}]\n{stdout}{stderr}",
                shown.command,
                shown.line,
                out.status.code()
            )
            .unwrap();
        }
        match &shown.error {
            Some(error) => {
                assert!(!out.status.success(), "{at}: should fail");
                assert!(
                    stderr.contains(error.as_str()),
                    "{at}: should say {error:?}"
                );
            }
            None => assert!(out.status.success(), "{at}"),
        }
        for line in &shown.output {
            assert!(printed(&stdout, line), "{at}: should print {line:?}");
        }
        ran += 1;
    }
    assert!(ran >= 15, "only {ran} commands ran");
    #[allow(clippy::print_stderr)]
    {
        eprintln!("docs: {ran} commands ran as pasted; skipped:");
        for skip in &skips {
            eprintln!("  {skip}");
        }
    }
}
