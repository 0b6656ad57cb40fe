//! `airlock mcp`: the tools served over the Model Context Protocol, over
//! stdio or streamable HTTP.
//!
//! Over stdio, stdout carries the protocol only; notes and logs go to
//! stderr. The process works on one session (`--session`, created if
//! missing). Over HTTP, each MCP session gets its own Airlock session, and
//! a request may name one in `_meta` (`airlock/session`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;

use airlock::mcp::auth::{Authenticator, METADATA_PATH};
use airlock::mcp::http::{Access, KEEP_ALIVE, McpHttpService, WriteDeadline, read_deadline};
use airlock::mcp::{MIN_STATE_KEY, McpServer, Serving, SessionOpener, StateKey, ToolSet};
use airlock::retention::Retention;
use airlock::sandbox::FileStamp;

use super::{ComponentArg, Failure, RegistryFlags, SessionFlags, print_error, print_note};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Transport {
    /// JSON-RPC on stdin and stdout (desktop and IDE clients launch it).
    Stdio,
    /// Streamable HTTP at `http://ADDR/mcp`.
    Http,
}

#[derive(Debug, Args)]
pub struct McpArgs {
    /// The operator's policy: the tools to serve and what each may do.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Also serve this component (a file, or oci://REGISTRY/REPO:TAG), with
    /// nothing granted (repeatable).
    #[arg(long = "tool", value_name = "TOOL.wasm|oci://REF")]
    tools: Vec<ComponentArg>,
    #[command(flatten)]
    registry: RegistryFlags,
    /// How clients reach the server.
    #[arg(long, value_enum, default_value_t = Transport::Stdio)]
    transport: Transport,
    /// Where the HTTP transport listens (port 0: any free port; the address
    /// is printed on stderr).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8931")]
    listen: SocketAddr,
    /// Over HTTP, how long an MCP session lives without a request, a call
    /// running or an event stream open (`30s`, `5m`, `1h`); then it ends,
    /// and its session's lease with it. Default 5m.
    #[arg(long, value_name = "DURATION", value_parser = idle_timeout)]
    idle_timeout: Option<std::time::Duration>,
    /// Over HTTP, a browser origin whose pages may call the server
    /// (`https://app.example.com`, `http://localhost:*` for any port,
    /// `null`; repeatable). A request with any other `Origin` header is
    /// refused (403); one without the header (not from a browser) is
    /// served.
    #[arg(long = "allow-origin", value_name = "ORIGIN", value_parser = allowed_origin)]
    allow_origins: Vec<String>,
    /// Over HTTP, listen on an address other machines can reach although
    /// the server asks clients for no credentials (the policy has no
    /// `[mcp.auth]`): whoever reaches it calls every tool with the
    /// policy's grants. Only behind something that authenticates (a
    /// reverse proxy) or on a network you trust. Without it, such a
    /// `--listen` is refused.
    #[arg(long)]
    allow_unauthenticated: bool,
    /// Over HTTP, serve HTTPS with this certificate chain (PEM, the
    /// server's certificate first); needs `--tls-key`.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    #[command(flatten)]
    session: SessionFlags,
}

/// `--idle-timeout`: a duration longer than zero.
fn idle_timeout(text: &str) -> Result<std::time::Duration, String> {
    match airlock::retention::parse_age(text)? {
        d if d.is_zero() => Err("must be longer than 0".into()),
        d => Ok(d),
    }
}

/// `--allow-origin`: `null`, or `SCHEME://HOST[:PORT]` (`:*` for any
/// port) with nothing after it, as a browser sends it.
fn allowed_origin(text: &str) -> Result<String, String> {
    if text == "null" {
        return Ok(text.to_owned());
    }
    let bad = || {
        format!(
            "{text:?} is not an origin: write SCHEME://HOST or SCHEME://HOST:PORT (`:*` for any \
             port), with no path, as a browser sends it"
        )
    };
    let base = text.strip_suffix(":*").unwrap_or(text);
    let uri: http::Uri = base.parse().map_err(|_| bad())?;
    let bare = uri.scheme().is_some()
        && uri.authority().is_some_and(|a| !a.host().is_empty())
        && uri.query().is_none()
        && !base.ends_with('/')
        && uri.path() == "/";
    if !bare || text.contains('@') {
        return Err(bad());
    }
    Ok(text.to_owned())
}

impl McpArgs {
    /// Whether the server talks to its client over stdio.
    pub fn over_stdio(&self) -> bool {
        self.transport == Transport::Stdio
    }
}

pub async fn run(args: McpArgs) -> ExitCode {
    let served = async {
        args.session.check()?;
        if args.transport == Transport::Http && args.session.id.is_some() {
            return Err(Failure::input(
                "usage",
                "--session is for --transport stdio; over HTTP each MCP session gets its own \
                 Airlock session, or names one in _meta \"airlock/session\"",
            ));
        }
        if args.transport == Transport::Stdio && !args.allow_origins.is_empty() {
            return Err(Failure::input(
                "usage",
                "--allow-origin is for --transport http; a stdio client is no browser",
            ));
        }
        if args.transport == Transport::Stdio && args.tls_cert.is_some() {
            return Err(Failure::input(
                "usage",
                "--tls-cert and --tls-key are for --transport http",
            ));
        }
        if args.transport == Transport::Stdio && args.allow_unauthenticated {
            return Err(Failure::input(
                "usage",
                "--allow-unauthenticated is for --transport http; a stdio server is its client's \
                 own process",
            ));
        }
        let policy = super::load_policy(args.config.as_deref())?;
        let auth = policy.as_ref().and_then(|p| p.mcp.auth.clone());
        if args.transport == Transport::Http
            && !args.listen.ip().is_loopback()
            && !args.allow_unauthenticated
            && auth.is_none()
        {
            return Err(Failure::input(
                "usage",
                format!(
                    "--listen {}: other machines could reach this address, and the server asks \
                     clients for no credentials: anyone who reaches it would call every tool with \
                     the policy's grants. Give the policy an [mcp.auth] section (OAuth access \
                     tokens), listen on a loopback address (127.0.0.1, [::1]), or put the server \
                     behind something that authenticates and pass --allow-unauthenticated",
                    args.listen
                ),
            ));
        }
        if auth.is_some() && args.allow_unauthenticated {
            return Err(Failure::input(
                "usage",
                "--allow-unauthenticated: the policy's [mcp.auth] asks every client for a token",
            ));
        }
        if args.transport == Transport::Stdio && args.idle_timeout.is_some() {
            return Err(Failure::input(
                "usage",
                "--idle-timeout is for --transport http; over stdio a session lasts as long as \
                 its client's connection",
            ));
        }
        // The certificate is checked before any tool is loaded.
        let tls = match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(tls_acceptor(cert, key)?),
            _ => None,
        };
        let loaded = load(&args.config, &args.tools, &args.registry).await?;
        let state_key = match &loaded.mcp.state_key_env {
            None => None,
            Some(name) => Some(state_key(name)?),
        };
        let serving = Serving {
            tasks: loaded.mcp.tasks,
            state_key,
        };
        let tools = ToolSet::with(Arc::new(loaded.host), serving);
        let reloader = tokio::spawn(reload_on_change(
            Arc::clone(&tools),
            loaded.files,
            (
                args.config.clone(),
                args.tools.clone(),
                args.registry.clone(),
            ),
        ));
        let retention = loaded.retention;
        let served = match args.transport {
            Transport::Stdio => serve_stdio(&args, tools, &retention).await,
            Transport::Http => {
                let auth = match loaded.mcp.auth {
                    None => None,
                    Some(settings) => Some(Arc::new(
                        Authenticator::new(settings)
                            .await
                            .map_err(|e| Failure::input("auth", e.to_string()))?,
                    )),
                };
                let access = Access {
                    auth,
                    limits: loaded.mcp.limits,
                    max_sessions: loaded.mcp.max_sessions,
                };
                let connections = ConnectionLimits {
                    most: loaded.mcp.max_connections,
                    per_peer: loaded.mcp.max_connections_per_peer,
                };
                serve_http(&args, tls, connections, tools, &retention, access).await
            }
        };
        reloader.abort();
        served
    };
    match served.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            print_error(&failure.message);
            ExitCode::from(failure.exit)
        }
    }
}

/// Tells the operator, for each component, how many of the resources it
/// describes are not offered (a client lists none of them, and could not
/// tell why): what `airlock inspect` lists one by one.
fn note_withheld(host: &airlock::Host) {
    for component in host.components() {
        let withheld = component.withheld();
        if withheld.is_empty() {
            continue;
        }
        let reasons: std::collections::BTreeSet<&str> =
            withheld.iter().map(|w| w.reason.as_str()).collect();
        let file = component.path().file_name().unwrap_or_default();
        print_note(&format!(
            "not offering {} of the resources {} describes: {} (`airlock inspect {}` lists them)",
            withheld.len(),
            file.to_string_lossy(),
            reasons.into_iter().collect::<Vec<_>>().join("; "),
            component.path().display(),
        ));
    }
}

async fn serve_stdio(
    args: &McpArgs,
    tools: Arc<ToolSet>,
    retention: &Retention,
) -> Result<(), Failure> {
    let host = tools.current();
    let session = args.session.open_kept(&host, false, retention).await?;
    print_note(&format!(
        "serving {} tools over MCP (stdio) on session {} in {}",
        host.tool_names().len(),
        session.id(),
        session.location()
    ));
    note_withheld(&host);
    let server = McpServer::new(Arc::clone(&tools), session, None);
    let Some(session) = server.session() else {
        return Ok(());
    };
    let result = match server.serve(stdio()).await {
        Ok(running) => running
            .waiting()
            .await
            .map(|reason| tracing::debug!(?reason, "the MCP client went away"))
            .map_err(|e| Failure::input("mcp", format!("the MCP service failed: {e}"))),
        // A client that closes the pipe before initializing went away,
        // as one that closes it later does: nothing failed.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(during)) => {
            tracing::debug!(during, "the MCP client went away before initializing");
            Ok(())
        }
        Err(e) => Err(Failure::input(
            "mcp",
            format!("MCP initialization failed: {e}"),
        )),
    };
    // The client's requests were cancelled as it went; its tasks run on,
    // and are committed, for their outcome to be found later.
    if tools.running() > 0 {
        print_note(&format!(
            "the client went away: finishing the calls under way first (at most {} s)",
            DRAIN.as_secs()
        ));
        if tokio::time::timeout(DRAIN, tools.calls_ended())
            .await
            .is_err()
        {
            // The session stays leased to a call still running: left as
            // a crash leaves it, which a resume answers interrupted.
            tracing::warn!(
                "{} calls were still running after {} s: ending anyway",
                tools.running(),
                DRAIN.as_secs()
            );
            return result;
        }
    }
    if let Err(e) = session.lock().await.release().await {
        tracing::warn!(error = %e, "cannot release the session");
    }
    result
}

/// Serves `tools` over HTTP (with `tls`, HTTPS), at most `connections`
/// connections at once.
async fn serve_http(
    args: &McpArgs,
    tls: Option<tokio_rustls::TlsAcceptor>,
    connections: ConnectionLimits,
    tools: Arc<ToolSet>,
    retention: &Retention,
    access: Access,
) -> Result<(), Failure> {
    let host = tools.current();
    let store = args.session.store.open_synced(retention.sync).await?;
    // A long-lived server keeps its store pruned: now, and every hour.
    let pruner = retention.ttl.map(|_| {
        let (store, retention) = (Arc::clone(&store), *retention);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(PRUNE_EVERY);
            loop {
                every.tick().await;
                super::enforce_retention(store.as_ref(), &retention).await;
            }
        })
    });
    let _pruner = AbortOnDrop(pruner);
    let location = store.location();
    let opener = SessionOpener::new(store, args.session.options()?);
    let scheme = if tls.is_some() { "https" } else { "http" };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| Failure::input("listen", format!("--listen {}: {e}", args.listen)))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::input("listen", format!("--listen {}: {e}", args.listen)))?;
    let mut config = StreamableHttpServerConfig::default();
    // Host-header checks (DNS rebinding) allow loopback names, and the
    // address the server was told to listen on.
    config.allowed_hosts.push(args.listen.ip().to_string());
    // With tokens, also the host clients name the server by: its audience's
    // (a token for another resource is refused whatever its Host header).
    if let Some(audience) = access
        .auth
        .as_ref()
        .and_then(|a| a.settings().audience.parse::<http::Uri>().ok())
        && let Some(host) = audience.host()
    {
        config.allowed_hosts.push(host.to_owned());
    }
    // An `Origin` header must be one the operator allows (the service
    // enforces it), or the server's own on this machine: a page at
    // `http://localhost:PORT` can only come from whatever serves that port,
    // this server, which serves no pages. Any other is refused unless named.
    let own = ["127.0.0.1", "localhost", "[::1]"]
        .map(|host| format!("{scheme}://{host}:{}", bound.port()));
    let config =
        config.with_allowed_origins(own.into_iter().chain(args.allow_origins.iter().cloned()));
    let stop = config.cancellation_token.clone();
    let count = host.tool_names().len();
    let service = Arc::new(McpHttpService::new(
        Arc::clone(&tools),
        opener,
        config,
        args.idle_timeout.unwrap_or(KEEP_ALIVE),
        access,
    ));
    // Listened for before the server says it serves.
    let stopping = super::stop_signal();
    print_note(&format!(
        "serving {count} tools over MCP at {scheme}://{bound}/mcp (sessions in {location})"
    ));
    note_withheld(&host);
    // Connections are accepted by a task of the runtime, not by this
    // future (which `main` blocks on, on a thread of its own): a
    // connection's task, spawned from a worker, starts on that worker, and
    // no other thread is woken for it. rmcp's own client opens a connection
    // for every request.
    let most = within_descriptors(connections.most);
    let open = Arc::new(tokio::sync::Semaphore::new(most));
    let peers = Arc::new(Peers::new(connections.per_peer.min(most)));
    let (drain, draining) = tokio::sync::watch::channel(false);
    let places = Places {
        open: Arc::clone(&open),
        most,
        peers,
    };
    let accepting = accept(listener, tls, service, places, draining);
    let mut accepting = AbortOnDrop(Some(tokio::spawn(accepting)));
    // Ends the server on Ctrl-C or SIGTERM, or at once if neither can be
    // listened for.
    if let Ok(stopped) = stopping {
        stopped.await;
    }
    // No connection is taken from here on; each open one ends once the
    // request it is serving has its answer (an idle one at once), and
    // rmcp's sessions end, and their event streams with them. The calls
    // no request waits for (tasks, and those whose client went away) run
    // to their end and are committed.
    if let Some(task) = accepting.0.take() {
        // Ended, with the place it held for the next connection.
        task.abort();
        let _ = task.await;
    }
    drain.send_replace(true);
    stop.cancel();
    drained(&open, most, &tools).await;
    Ok(())
}

/// How long a stopping server waits for the requests it is serving and
/// the calls it runs (over stdio, once its client went away).
const DRAIN: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until every connection of `open` (`most` places) has ended and
/// no call runs on `tools`, for at most [`DRAIN`], or until the command
/// is asked to stop again.
async fn drained(open: &tokio::sync::Semaphore, most: usize, tools: &ToolSet) {
    let all = u32::try_from(most).unwrap_or(u32::MAX);
    if open.available_permits() >= most && tools.running() == 0 {
        return;
    }
    print_note(&format!(
        "stopping: answering the requests and finishing the calls under way first (at most {} \
         s; Ctrl-C again ends at once)",
        DRAIN.as_secs()
    ));
    let again = async {
        match super::stop_signal() {
            Ok(stopped) => stopped.await,
            Err(_) => std::future::pending().await,
        }
    };
    let ended = async {
        // Held by nobody once every connection has ended.
        let _all = open.acquire_many(all).await;
        tools.calls_ended().await;
    };
    tokio::select! {
        ended = tokio::time::timeout(DRAIN, ended) => {
            if ended.is_err() {
                let left = most.saturating_sub(open.available_permits());
                tracing::warn!(
                    "{left} connections still had requests running, and {} calls were still \
                     running, after {} s: ending anyway",
                    tools.running(),
                    DRAIN.as_secs()
                );
            }
        }
        () = again => {}
    }
}

/// Descriptors the HTTP server keeps for what is not a connection (its
/// store, its tools' files and connections, the compile cache): this many,
/// or an eighth of what the process may open if that is more.
const RESERVED_DESCRIPTORS: u64 = 64;

/// `most` connections, or fewer when the process may not open that many
/// descriptors and keep [`RESERVED_DESCRIPTORS`] for the rest of its work:
/// connections that took every descriptor would fail every call (no store
/// to commit to, no file or connection for a tool), and every session
/// with them.
fn within_descriptors(most: usize) -> usize {
    let Some(may_open) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current
    else {
        return most;
    };
    let reserved = RESERVED_DESCRIPTORS.max(may_open / 8);
    let fit = usize::try_from(may_open.saturating_sub(reserved))
        .unwrap_or(usize::MAX)
        .max(1);
    if fit >= most {
        return most;
    }
    tracing::warn!(
        "this process may open {may_open} descriptors (`ulimit -n`): the server serves at most \
         {fit} connections at once, not [mcp] max_connections ({most}), to keep {reserved} \
         for its store and its tools"
    );
    fit
}

/// The policy's bounds on the HTTP server's connections: `[mcp]
/// max_connections` and `max_connections_per_peer`.
#[derive(Debug, Clone, Copy)]
struct ConnectionLimits {
    most: usize,
    per_peer: usize,
}

/// The places the HTTP server has for connections: `most` in all (`open`
/// holds those left), and `peers`' for each peer.
struct Places {
    open: Arc<tokio::sync::Semaphore>,
    most: usize,
    peers: Arc<Peers>,
}

/// The connections open from each peer, at most `most` a peer. A peer is
/// an IPv4 address, or an IPv6 address's /64: one machine is commonly
/// given a whole /64, and would otherwise be a peer per address it
/// chose. Cost: a lock and a hash lookup when a connection is accepted
/// and when it closes; an entry only for a peer with connections open.
#[derive(Debug)]
struct Peers {
    open: std::sync::Mutex<HashMap<IpAddr, usize>>,
    most: usize,
}

/// A connection's place among its peer's, given back when dropped.
struct PeerPlace {
    peers: Arc<Peers>,
    peer: IpAddr,
}

impl Peers {
    fn new(most: usize) -> Self {
        Self {
            open: std::sync::Mutex::default(),
            most,
        }
    }

    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A place for a connection from `address`, or, when its peer has
    /// `most` open, the peer refused.
    fn admit(self: &Arc<Self>, address: IpAddr) -> Result<PeerPlace, IpAddr> {
        let peer = peer_of(address);
        let mut open = self.open();
        let count = open.entry(peer).or_insert(0);
        if *count >= self.most {
            return Err(peer);
        }
        *count += 1;
        Ok(PeerPlace {
            peers: Arc::clone(self),
            peer,
        })
    }
}

impl Drop for PeerPlace {
    fn drop(&mut self) {
        let mut open = self.peers.open();
        if let Some(count) = open.get_mut(&self.peer) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// The peer `address` is counted under: an IPv4 address (one an IPv6
/// socket sees as IPv4-mapped too), or an IPv6 address's /64.
fn peer_of(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let [a, b, c, d, ..] = v6.segments();
                IpAddr::V6(Ipv6Addr::new(a, b, c, d, 0, 0, 0, 0))
            }
        },
    }
}

/// How `peer` is named to the operator: an IPv6 peer as its /64.
fn peer_name(peer: IpAddr) -> String {
    match peer {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("{v6}/64"),
    }
}

/// How long the HTTP server waits after failing to accept a connection.
const ACCEPT_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// The least time between two warnings that the HTTP server has as many
/// connections open as it serves (in all, or from one peer).
const FULL_TOLD_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// When a warning was last given, so that it is given at most once every
/// [`FULL_TOLD_EVERY`].
#[derive(Default)]
struct Told(Option<std::time::Instant>);

impl Told {
    /// Whether the warning is to be given now (and, if so, counted as
    /// given).
    fn due(&mut self) -> bool {
        if self.0.is_some_and(|at| at.elapsed() < FULL_TOLD_EVERY) {
            return false;
        }
        self.0 = Some(std::time::Instant::now());
        true
    }
}

/// How long a client has to finish its TLS handshake.
const TLS_HANDSHAKE: std::time::Duration = std::time::Duration::from_secs(10);

/// The acceptor of `--tls-cert`/`--tls-key`: rustls with its safe
/// defaults (TLS 1.2 and 1.3), HTTP/1.1 offered by ALPN. An error names
/// the file at fault.
fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, Failure> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |file: &Path, problem: String| {
        Failure::input("tls", format!("{}: {problem}", file.display()))
    };
    let read = |file: &Path| {
        airlock::fs::read_settings(file).map_err(|e| bad(file, format!("cannot read: {e}")))
    };
    let chain = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(cert, format!("cannot read a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(bad(cert, "holds no certificate".into()));
    }
    let key_der = PrivateKeyDer::from_pem_slice(&read(key)?)
        .map_err(|e| bad(key, format!("cannot read a PEM private key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Failure::input("tls", format!("TLS configuration: {e}")))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| bad(key, format!("does not go with {}: {e}", cert.display())))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Accepts MCP connections on `listener` and serves each in a task of its
/// own (over TLS when `tls` is given: a client that does not finish its
/// handshake in [`TLS_HANDSHAKE`] is dropped), until aborted. While
/// `places.most` are open, the next waits in the listener's queue until
/// one closes (an idle one closes after
/// [`READ_DEADLINE`](airlock::mcp::http::READ_DEADLINE)); one from a peer
/// that has as many open as `places.peers` allows is closed once accepted
/// (before any TLS handshake), so the rest of the places stay for other
/// peers.
async fn accept(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    service: Arc<McpHttpService>,
    places: Places,
    draining: tokio::sync::watch::Receiver<bool>,
) {
    let Places { open, most, peers } = places;
    // The operator is told the server is full, or a peer was refused, at
    // most once a minute each, however many connections wait.
    let (mut full, mut refused) = (Told::default(), Told::default());
    loop {
        let place = match Arc::clone(&open).try_acquire_owned() {
            Ok(place) => place,
            Err(_) => {
                if full.due() {
                    tracing::warn!(
                        "{most} MCP connections are open, the most this server serves \
                         ([mcp] max_connections): new ones wait until one closes"
                    );
                }
                match Arc::clone(&open).acquire_owned().await {
                    Ok(place) => place,
                    // Never closed.
                    Err(_) => return,
                }
            }
        };
        let (stream, address) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say: the error repeats until
                // connections close, so pause rather than spin on it.
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let peer_place = match peers.admit(address.ip()) {
            Ok(place) => place,
            Err(peer) => {
                if refused.due() {
                    tracing::warn!(
                        "{} MCP connections from {} are open, the most this server serves from \
                         one peer ([mcp] max_connections_per_peer): more from it are closed \
                         until one ends",
                        peers.most,
                        peer_name(peer)
                    );
                }
                // Closed now: its place is the next connection's.
                continue;
            }
        };
        // A request's answer goes out as soon as it is written: with
        // Nagle's algorithm on, the end of a streamed response waits for
        // the client's delayed ACK (up to 40 ms on Linux).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an MCP connection");
        }
        let service = Arc::clone(&service);
        let tls = tls.clone();
        let draining = draining.clone();
        tokio::spawn(async move {
            let _places = (place, peer_place);
            match tls {
                None => serve_connection(stream, service, draining).await,
                Some(tls) => match tokio::time::timeout(TLS_HANDSHAKE, tls.accept(stream)).await {
                    Ok(Ok(stream)) => serve_connection(stream, service, draining).await,
                    Ok(Err(e)) => tracing::debug!(error = %e, "a TLS handshake failed"),
                    Err(_) => tracing::debug!("a TLS handshake took too long"),
                },
            }
        });
    }
}

/// Serves MCP requests on one connection until it ends, or, once
/// `draining` turns true, until the request it is serving has its answer.
async fn serve_connection<S>(
    stream: S,
    service: Arc<McpHttpService>,
    mut draining: tokio::sync::watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let handler = hyper::service::service_fn(move |request: hyper::Request<_>| {
        let service = Arc::clone(&service);
        async move {
            let path = request.uri().path();
            if path != "/mcp" && !path.starts_with(METADATA_PATH) {
                return Ok::<_, Infallible>(not_found());
            }
            let delete = request.method() == hyper::Method::DELETE;
            let mut response = service
                .handle(request)
                .await
                .map(http_body_util::Either::Left);
            // A session ended by DELETE: rmcp answers 202, which
            // clients read as a failure (the MCP Python SDK logs
            // "Session termination failed: 202"); a success with
            // nothing to say is 204. Its Airlock session's lease
            // ends as the MCP session's server is dropped.
            if delete && response.status() == hyper::StatusCode::ACCEPTED {
                *response.status_mut() = hyper::StatusCode::NO_CONTENT;
            }
            Ok(response)
        }
    });
    // One limit for a request's headers and for a client that reads
    // nothing (its body's is the library's, `McpHttpService::handle`).
    let limit = read_deadline();
    let io = wasmtime_wasi_http::io::TokioIo::new(WriteDeadline::new(stream, limit));
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limit)
        .serve_connection(io, handler);
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = async { drop(draining.wait_for(|draining| *draining).await) } => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = served {
        let error = airlock::text::error_chain(&e);
        tracing::debug!(%error, "an MCP connection ended");
    }
}

type Body = http_body_util::Either<
    http_body_util::combinators::BoxBody<bytes::Bytes, Infallible>,
    http_body_util::Full<bytes::Bytes>,
>;

fn not_found() -> hyper::Response<Body> {
    let mut response = hyper::Response::new(http_body_util::Either::Right(
        http_body_util::Full::new(bytes::Bytes::from_static(b"MCP is served at /mcp\n")),
    ));
    *response.status_mut() = hyper::StatusCode::NOT_FOUND;
    response
}

/// How often `airlock mcp` over HTTP prunes its store when the policy has
/// a `[sessions] ttl`.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// Aborts a background task when dropped.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// How often `airlock mcp` looks for changed components and policy.
const RELOAD_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// What `airlock mcp` serves: the policy at `config` and the `--tool`s.
async fn load(
    config: &Option<PathBuf>,
    extra: &[ComponentArg],
    registry: &RegistryFlags,
) -> Result<super::Tools, Failure> {
    let policy = super::load_policy(config.as_deref())?;
    super::tools_host(policy, extra, registry, super::Lifetime::Serving).await
}

fn stamps(files: &[PathBuf]) -> Vec<Option<FileStamp>> {
    files.iter().map(|file| FileStamp::of(file)).collect()
}

/// Rebuilds the tools when a file they were built from changes (the
/// policy, a component, the lock, a trusted key), and tells the clients.
/// A change that does not load keeps the previous tools serving, says why
/// on stderr, and is tried again at the next change.
async fn reload_on_change(
    tools: Arc<ToolSet>,
    mut files: Vec<PathBuf>,
    (config, extra, registry): (Option<PathBuf>, Vec<ComponentArg>, RegistryFlags),
) {
    let mut seen = stamps(&files);
    loop {
        tokio::time::sleep(RELOAD_POLL).await;
        let now = stamps(&files);
        if now == seen {
            continue;
        }
        // What changed, named: the policy, a component, the lock, a key.
        let changed: Vec<String> = files
            .iter()
            .zip(now.iter().zip(&seen))
            .filter(|(_, (now, then))| now != then)
            .map(|(file, _)| file.display().to_string())
            .collect();
        seen = now;
        match load(&config, &extra, &registry).await {
            Ok(loaded) => {
                let names = loaded.host.tool_names().join(", ");
                tools.replace(Arc::new(loaded.host)).await;
                print_note(&format!("reloaded the tools: {names}"));
                files = loaded.files;
                seen = stamps(&files);
            }
            Err(failure) => print_note(&format!(
                "the change to {} did not load; the previous tools keep serving: {}",
                changed.join(", "),
                failure.message
            )),
        }
    }
}

/// The most bytes a message over stdio may have, its newline included:
/// what a request's body may have over HTTP (rmcp's bound there).
const MAX_LINE_BYTES: usize = 4 << 20;

/// The stdio transport, checked: a line that is not JSON is answered
/// with a JSON-RPC parse error (-32700), JSON that is not a JSON-RPC 2.0
/// message, or a line over [`MAX_LINE_BYTES`] (skipped as it arrives,
/// never held), with an invalid-request error (-32600), and the server
/// keeps serving (rmcp alone would skip the first two without a word, and
/// hold a line of any length). Every message out, rmcp's and these, is
/// written whole, one line each.
fn stdio() -> (tokio::io::DuplexStream, LineWriter) {
    use tokio::io::AsyncWriteExt;
    let (input, mut output) = raw_stdio();
    let (lines, mut outgoing) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(line) = outgoing.recv().await {
            if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
                break;
            }
        }
    });
    let (mut to_server, from_client) = tokio::io::duplex(1 << 16);
    let errors = lines.clone();
    tokio::spawn(async move {
        let mut input = tokio::io::BufReader::new(input);
        let mut line = Vec::new();
        loop {
            line.clear();
            match read_line(&mut input, &mut line, MAX_LINE_BYTES).await {
                Ok(Line::End) | Err(_) => break,
                Ok(Line::Whole) => {}
                Ok(Line::TooLong) => {
                    let _ = errors.send(error_reply(
                        &serde_json::Value::Null,
                        -32600,
                        &format!("Invalid Request: the message is over {MAX_LINE_BYTES} bytes"),
                    ));
                    continue;
                }
            }
            match check_message(&line) {
                Ok(()) => {
                    if to_server.write_all(&line).await.is_err() {
                        break;
                    }
                }
                Err(reply) => {
                    let _ = errors.send(reply);
                }
            }
        }
        // End of input: dropping `to_server` ends the server's.
    });
    (
        from_client,
        LineWriter {
            pending: Vec::new(),
            lines,
        },
    )
}

/// `Ok` for a line to pass to the server (a JSON-RPC 2.0 message, a
/// batch, or a blank line); else the error response to send back. Reads
/// only `jsonrpc` and `id` (the rest is skipped, not built), as this runs
/// on every message before rmcp parses it.
fn check_message(line: &[u8]) -> Result<(), Vec<u8>> {
    use serde_json::Value;
    #[derive(serde::Deserialize)]
    struct Probe {
        jsonrpc: Option<String>,
        #[serde(default)]
        id: Value,
    }
    let start = line.iter().position(|b| !b.is_ascii_whitespace());
    let Some(start) = start else {
        return Ok(());
    };
    if line[start] == b'[' {
        return Ok(());
    }
    let (id, code, message) = match serde_json::from_slice::<Probe>(line) {
        Ok(probe) if probe.jsonrpc.as_deref() == Some("2.0") => return Ok(()),
        Ok(probe) => (probe.id, -32600, INVALID_REQUEST.to_owned()),
        Err(e) if e.is_data() => (Value::Null, -32600, INVALID_REQUEST.to_owned()),
        Err(e) => (Value::Null, -32700, format!("Parse error: {e}")),
    };
    Err(error_reply(&id, code, &message))
}

/// A JSON-RPC error response to request `id`, as a line.
fn error_reply(id: &serde_json::Value, code: i64, message: &str) -> Vec<u8> {
    let reply = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    let mut reply = reply.to_string().into_bytes();
    reply.push(b'\n');
    reply
}

/// What [`read_line`] read.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A line, its newline included (or the input's last bytes).
    Whole,
    /// A line over the bound, skipped to its end; nothing kept.
    TooLong,
    /// The end of the input.
    End,
}

/// Reads the next line of `input` into `line`, holding at most `max`
/// bytes of it: a longer one is read on to its end and dropped as it
/// comes.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    input: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    use tokio::io::AsyncBufReadExt;
    let mut too_long = false;
    loop {
        let buffer = input.fill_buf().await?;
        if buffer.is_empty() {
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => Line::TooLong,
                (false, true) => Line::End,
                (false, false) => Line::Whole,
            });
        }
        let (taken, ended) = match buffer.iter().position(|b| *b == b'\n') {
            Some(at) => (at + 1, true),
            None => (buffer.len(), false),
        };
        if !too_long && line.len() + taken <= max {
            line.extend_from_slice(&buffer[..taken]);
        } else {
            too_long = true;
            line.clear();
        }
        input.consume(taken);
        if ended {
            return Ok(if too_long { Line::TooLong } else { Line::Whole });
        }
    }
}

const INVALID_REQUEST: &str = "Invalid Request: not a JSON-RPC 2.0 message";

/// rmcp's side of stdout: what it writes goes out a whole line at a time,
/// so that an error response sent meanwhile never lands inside one of its
/// messages.
struct LineWriter {
    pending: Vec<u8>,
    lines: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
}

impl tokio::io::AsyncWrite for LineWriter {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        bytes: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.pending.extend_from_slice(bytes);
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            if self.lines.send(line).is_err() {
                return std::task::Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
            }
        }
        std::task::Poll::Ready(Ok(bytes.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.pending.is_empty() {
            let rest = std::mem::take(&mut self.pending);
            let _ = self.lines.send(rest);
        }
        std::task::Poll::Ready(Ok(()))
    }
}

/// stdin and stdout. When they are pipes (a client that
/// launched the server), they are read and written through the runtime's
/// reactor; tokio's own stdin and stdout hand every read and write to a
/// blocking thread, a thread hop each way per message
/// (docs/benchmarks.md §8). Anything else (a terminal, a file) keeps
/// those.
fn raw_stdio() -> (
    Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
) {
    use std::os::fd::AsFd;
    use tokio::net::unix::pipe;
    let reader = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| pipe::Receiver::from_owned_fd(fd).ok());
    let writer = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| pipe::Sender::from_owned_fd(fd).ok());
    (
        match reader {
            Some(pipe) => Box::new(pipe),
            None => Box::new(tokio::io::stdin()),
        },
        match writer {
            Some(pipe) => Box::new(pipe),
            None => Box::new(tokio::io::stdout()),
        },
    )
}

/// The key in environment variable `name` (`[mcp] state_key_env`).
fn state_key(name: &str) -> Result<StateKey, Failure> {
    let fail = |problem: String| {
        Failure::input("invalid_config", format!("[mcp] state_key_env: {problem}"))
    };
    let secret = std::env::var_os(name)
        .ok_or_else(|| fail(format!("the environment variable {name} is not set")))?;
    StateKey::from_secret(secret.as_encoded_bytes()).ok_or_else(|| {
        fail(format!(
            "the environment variable {name} holds fewer than {MIN_STATE_KEY} bytes"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default `--idle-timeout`'s help names is what the server uses
    /// without the flag; zero and what is no duration are refused.
    #[test]
    fn the_idle_timeout_default_its_help_names_is_keep_alive() {
        assert_eq!(idle_timeout("5m"), Ok(KEEP_ALIVE));
        assert!(idle_timeout("0s").is_err());
        assert!(idle_timeout("soon").is_err());
    }

    /// A line over the bound is read to its end and dropped, however its
    /// bytes arrive, and the next line is read whole; so is a last line
    /// without a newline.
    #[tokio::test]
    async fn a_line_over_the_bound_is_skipped_and_the_next_read_whole() {
        let input: &[u8] = b"0123456789\nabc\n0123\nxyz";
        // A buffer of 3 bytes: the long line arrives in pieces.
        let mut input = tokio::io::BufReader::with_capacity(3, input);
        let mut line = Vec::new();
        let mut read = Vec::new();
        loop {
            line.clear();
            match read_line(&mut input, &mut line, 5).await.unwrap() {
                Line::End => break,
                got => read.push((got, String::from_utf8(line.clone()).unwrap())),
            }
        }
        assert_eq!(
            read,
            [
                (Line::TooLong, String::new()),
                (Line::Whole, "abc\n".to_owned()),
                (Line::Whole, "0123\n".to_owned()),
                (Line::Whole, "xyz".to_owned()),
            ]
        );
    }

    /// A peer is an IPv4 address (mapped into IPv6 or not) or an IPv6
    /// /64; each has at most `most` places, and a place given back is the
    /// next connection's. A peer with none open holds no entry.
    #[test]
    fn each_peer_has_its_own_places() {
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        assert_eq!(peer_of(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(peer_of(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(peer_name(ip("2001:db8:1:2::")), "2001:db8:1:2::/64");
        let peers = Arc::new(Peers::new(2));
        let first = peers.admit(ip("10.0.0.1")).unwrap();
        let _second = peers.admit(ip("::ffff:10.0.0.1")).unwrap();
        assert_eq!(peers.admit(ip("10.0.0.1")).err(), Some(ip("10.0.0.1")));
        let _other = peers.admit(ip("10.0.0.2")).unwrap();
        let _a = peers.admit(ip("2001:db8:1:2::1")).unwrap();
        let _b = peers.admit(ip("2001:db8:1:2::2")).unwrap();
        assert!(peers.admit(ip("2001:db8:1:2::3")).is_err());
        assert!(peers.admit(ip("2001:db8:1:3::1")).is_ok());
        drop(first);
        let _again = peers.admit(ip("10.0.0.1")).unwrap();
        drop((_second, _again));
        assert!(!peers.open().contains_key(&ip("10.0.0.1")));
    }
}
