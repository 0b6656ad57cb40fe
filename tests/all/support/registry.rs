//! OCI registries for the tests: Debian's `docker-registry` (the CNCF
//! distribution server) on a free loopback port, with or without basic
//! auth, stopped when dropped; a small HTTP/1.1 client to put into it what
//! `airlock push` would never write; and a hostile registry that serves
//! whatever bytes a test scripts.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

const SERVER: &str = "/usr/bin/docker-registry";

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A real registry: `docker-registry serve` on 127.0.0.1, its storage in a
/// temporary directory. Killed (and reaped) when dropped.
pub struct Registry {
    pub addr: SocketAddr,
    credentials: Option<(String, String)>,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Registry {
    /// Anonymous access.
    pub fn start() -> Self {
        Self::spawn(None)
    }

    /// Basic auth (htpasswd, bcrypt) for `user` with `password`.
    pub fn start_with_auth(user: &str, password: &str) -> Self {
        Self::spawn(Some((user.to_owned(), password.to_owned())))
    }

    fn spawn(credentials: Option<(String, String)>) -> Self {
        assert!(
            Path::new(SERVER).is_file(),
            "{SERVER} is missing: `make registry-server` installs Debian's docker-registry"
        );
        let dir = tempfile::tempdir().unwrap();
        let addr = free_port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            dir.path().join("data").display()
        );
        if let Some((user, password)) = &credentials {
            let htpasswd = Command::new("htpasswd")
                .args(["-Bbn", user, password])
                .output()
                .expect("htpasswd runs (`make registry-server` installs apache2-utils)");
            assert!(htpasswd.status.success());
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, htpasswd.stdout).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: airlock-tests\n    path: {}\n",
                file.display()
            ));
        }
        let config_file = dir.path().join("config.yml");
        std::fs::write(&config_file, config).unwrap();
        let child = Command::new(SERVER)
            .arg("serve")
            .arg(&config_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let registry = Self {
            addr,
            credentials,
            child: Some(child),
            _dir: dir,
        };
        // Ready when /v2/ answers (401 with auth): polled, with a deadline.
        let deadline = Instant::now() + Duration::from_secs(30);
        while registry.try_request("GET", "/v2/", &[], b"").is_err() {
            assert!(Instant::now() < deadline, "the registry did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        registry
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// `oci://127.0.0.1:PORT/{path}`.
    pub fn oci(&self, path: &str) -> String {
        format!("oci://{}/{path}", self.addr)
    }

    /// Stops it (SIGKILL) and waits for it to be gone.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn try_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Reply> {
        let mut all: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        if let Some((user, password)) = &self.credentials {
            use base64::Engine as _;
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            all.push(("Authorization".into(), format!("Basic {token}")));
        }
        request(self.addr, method, path, &all, body)
    }

    /// One request, as the registry's owner (with its credentials).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        self.try_request(method, path, headers, body)
            .expect("the registry answers")
    }

    /// Uploads `bytes` as a blob of `repo` (monolithic: POST, then PUT).
    pub fn put_blob(&self, repo: &str, bytes: &[u8]) -> String {
        let digest = digest(bytes);
        let started = self.request("POST", &format!("/v2/{repo}/blobs/uploads/"), &[], b"");
        assert_eq!(started.status, 202, "{}", started.text());
        let location = started.header("location").expect("an upload location");
        let location = match location.find("/v2/") {
            Some(at) => &location[at..],
            None => location,
        };
        let separator = if location.contains('?') { '&' } else { '?' };
        let done = self.request(
            "PUT",
            &format!("{location}{separator}digest={digest}"),
            &[("Content-Type", "application/octet-stream")],
            bytes,
        );
        assert_eq!(done.status, 201, "{}", done.text());
        digest
    }

    /// Puts `manifest` (of `media_type`) at `reference` (a tag or digest)
    /// of `repo`; its digest.
    pub fn put_manifest(
        &self,
        repo: &str,
        reference: &str,
        media_type: &str,
        manifest: &[u8],
    ) -> String {
        let put = self.request(
            "PUT",
            &format!("/v2/{repo}/manifests/{reference}"),
            &[("Content-Type", media_type)],
            manifest,
        );
        assert_eq!(put.status, 201, "{}", put.text());
        digest(manifest)
    }

    /// The manifest at `reference` of `repo`, as stored.
    pub fn manifest(&self, repo: &str, reference: &str) -> Vec<u8> {
        let accept =
            "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json";
        let got = self.request(
            "GET",
            &format!("/v2/{repo}/manifests/{reference}"),
            &[("Accept", accept)],
            b"",
        );
        assert_eq!(got.status, 200, "{}", got.text());
        got.body
    }

    /// Pushes `component` the way an OCI image of one layer is pushed, with
    /// a config of `config_type` and a layer of `layer_type`; the manifest
    /// digest.
    pub fn put_image(
        &self,
        repo: &str,
        tag: &str,
        config_type: &str,
        config: &[u8],
        layer_type: &str,
        layer: &[u8],
    ) -> String {
        let config_digest = self.put_blob(repo, config);
        let layer_digest = self.put_blob(repo, layer);
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": config_type, "digest": config_digest, "size": config.len()},
            "layers": [{"mediaType": layer_type, "digest": layer_digest, "size": layer.len()}],
        });
        self.put_manifest(
            repo,
            tag,
            "application/vnd.oci.image.manifest.v1+json",
            manifest.to_string().as_bytes(),
        )
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loopback address nobody listens on (bound, then released).
pub fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One HTTP/1.1 request (`Connection: close`), read to the end.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> std::io::Result<Reply> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {status_line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let mut body = Vec::new();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if size == 0 {
                break;
            }
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        reader.read_to_end(&mut body)?;
    }
    Ok(Reply {
        status,
        headers,
        body,
    })
}

/// How the hostile registry answers one path.
#[derive(Debug, Clone)]
pub enum Scripted {
    /// 200 with these headers and bytes.
    Bytes {
        content_type: String,
        /// `Docker-Content-Digest`, if any.
        digest: Option<String>,
        body: Vec<u8>,
    },
    /// Declares `declared` bytes, sends `body` (fewer), and hangs up.
    Truncated { declared: usize, body: Vec<u8> },
    /// No length; bytes until the client hangs up.
    Endless,
    /// This status, no body.
    Status(u16),
    /// This status with these headers (a redirect's `Location`, a
    /// challenge's `WWW-Authenticate`, an upload's `Location`), no body.
    Answer {
        status: u16,
        headers: Vec<(String, String)>,
    },
}

impl Scripted {
    /// A redirect (307) to `location`.
    pub fn redirect(location: &str) -> Self {
        Self::Answer {
            status: 307,
            headers: vec![("Location".into(), location.into())],
        }
    }

    /// A 401 asking for a token from `realm`.
    pub fn token_challenge(realm: &str) -> Self {
        Self::Answer {
            status: 401,
            headers: vec![(
                "WWW-Authenticate".into(),
                format!("Bearer realm=\"{realm}\",service=\"hostile\""),
            )],
        }
    }
}

/// One request as a server saw it: method, path (without the query), and
/// headers.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A registry that serves what a test scripts, path by path (404 for the
/// rest), on a free loopback port, and records every path asked for.
/// Stopped when dropped.
pub struct Hostile {
    pub addr: SocketAddr,
    asked: Arc<Mutex<Vec<Seen>>>,
    _server: Listening,
}

/// A loopback listener answering each connection on a thread of its own
/// with `answer`, until dropped.
struct Listening {
    addr: SocketAddr,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Listening {
    fn start(listener: TcpListener, answer: impl Fn(TcpStream) + Send + Sync + 'static) -> Self {
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let answer = Arc::new(answer);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let answer = Arc::clone(&answer);
                std::thread::spawn(move || answer(stream));
            }
        });
        Self { addr, stop }
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

impl Hostile {
    /// Serves the routes `routes` makes, given the address it serves on.
    pub fn start_with(routes: impl FnOnce(SocketAddr) -> BTreeMap<String, Scripted>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let routes = routes(addr);
        let asked = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&asked);
        let server = Listening::start(listener, move |stream| {
            let _ = answer(stream, &routes, &recorded);
        });
        Self {
            addr,
            asked,
            _server: server,
        }
    }

    /// `oci://127.0.0.1:PORT/{path}`.
    pub fn oci(&self, path: &str) -> String {
        format!("oci://{}/{path}", self.addr)
    }

    /// Every path asked for, in order.
    pub fn asked(&self) -> Vec<String> {
        self.seen().into_iter().map(|seen| seen.path).collect()
    }

    /// Every request, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.asked.lock().unwrap().clone()
    }
}

/// Reads one request's head (and its body, by `Content-Length`).
fn read_request(reader: &mut BufReader<TcpStream>) -> std::io::Result<(Seen, String, Vec<u8>)> {
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
            break;
        }
        if let Some((k, v)) = line.trim_end().split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or("GET").to_owned();
    let target = parts.next().unwrap_or("/").to_owned();
    let path = target.split('?').next().unwrap_or("/").to_owned();
    let length = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok((
        Seen {
            method,
            path,
            headers,
        },
        target,
        body,
    ))
}

fn answer(
    stream: TcpStream,
    routes: &BTreeMap<String, Scripted>,
    recorded: &Mutex<Vec<Seen>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let (seen, _, _) = read_request(&mut reader)?;
    let path = seen.path.clone();
    recorded.lock().unwrap().push(seen);
    let out = stream;
    let scripted = match routes.get(&path) {
        Some(scripted) => scripted.clone(),
        None if path == "/v2/" => Scripted::Bytes {
            content_type: "application/json".into(),
            digest: None,
            body: b"{}".to_vec(),
        },
        None => Scripted::Status(404),
    };
    write_scripted(out, scripted)
}

fn write_scripted(mut out: TcpStream, scripted: Scripted) -> std::io::Result<()> {
    match scripted {
        Scripted::Bytes {
            content_type,
            digest,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            if let Some(digest) = digest {
                head.push_str(&format!("Docker-Content-Digest: {digest}\r\n"));
            }
            head.push_str("\r\n");
            out.write_all(head.as_bytes())?;
            out.write_all(&body)?;
        }
        Scripted::Truncated { declared, body } => {
            out.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {declared}\r\nConnection: close\r\n\r\n"
                )
                .as_bytes(),
            )?;
            out.write_all(&body)?;
        }
        Scripted::Endless => {
            out.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nConnection: close\r\n\r\n",
            )?;
            let chunk = vec![b' '; 64 << 10];
            // Until the client hangs up (or 1 GiB, a bound for the test).
            for _ in 0..(1 << 14) {
                out.write_all(&chunk)?;
            }
        }
        Scripted::Status(code) => {
            out.write_all(
                format!("HTTP/1.1 {code} Nope\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )?;
        }
        Scripted::Answer { status, headers } => {
            let mut head = format!("HTTP/1.1 {status} Scripted\r\n");
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("Content-Length: 0\r\nConnection: close\r\n\r\n");
            out.write_all(head.as_bytes())?;
        }
    }
    out.flush()?;
    let _ = out.shutdown(std::net::Shutdown::Both);
    Ok(())
}

/// A proxy in front of a real registry that forwards every request to it
/// and relays the answer, except the `GET`s of the paths it was given,
/// which it answers itself (a registry that rewrites what it serves).
pub struct Proxy {
    pub addr: SocketAddr,
    _server: Listening,
}

impl Proxy {
    /// Forwards to `upstream`, answering a `GET` of a path in `swapped`
    /// with its script.
    pub fn start(upstream: SocketAddr, swapped: BTreeMap<String, Scripted>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = Listening::start(listener, move |stream| {
            let _ = forward(stream, upstream, &swapped);
        });
        Self {
            addr,
            _server: server,
        }
    }

    /// `oci://127.0.0.1:PORT/{path}`.
    pub fn oci(&self, path: &str) -> String {
        format!("oci://{}/{path}", self.addr)
    }
}

fn forward(
    stream: TcpStream,
    upstream: SocketAddr,
    swapped: &BTreeMap<String, Scripted>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let (seen, target, body) = read_request(&mut reader)?;
    if seen.method == "GET"
        && let Some(scripted) = swapped.get(&seen.path)
    {
        return write_scripted(stream, scripted.clone());
    }
    let headers: Vec<(String, String)> = seen
        .headers
        .into_iter()
        .filter(|(k, _)| {
            !["host", "connection", "content-length"]
                .iter()
                .any(|skip| k.eq_ignore_ascii_case(skip))
        })
        .collect();
    let reply = request(upstream, &seen.method, &target, &headers, &body)?;
    let mut head = format!("HTTP/1.1 {} Relayed\r\n", reply.status);
    for (k, v) in &reply.headers {
        if !["content-length", "transfer-encoding", "connection"]
            .iter()
            .any(|skip| k.eq_ignore_ascii_case(skip))
        {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        reply.body.len()
    ));
    let mut out = stream;
    out.write_all(head.as_bytes())?;
    if seen.method != "HEAD" {
        out.write_all(&reply.body)?;
    }
    out.flush()?;
    let _ = out.shutdown(std::net::Shutdown::Both);
    Ok(())
}
