//! The HTTP grant: outgoing `wasi:http` requests to an allowlist.
//!
//! Checks run where the request is prepared, in this order:
//!
//! 1. the URL's scheme, host and port must match a granted [`HostPattern`];
//! 2. the host is resolved here, by the host; an address that is not public
//!    (loopback, private, link-local, unspecified, CGNAT, multicast, and
//!    IPv4-mapped or NAT64 forms of them) is refused unless the matching
//!    pattern names that address, or `localhost` for a loopback address;
//! 3. the connection goes to the address that passed the check, so a DNS
//!    answer that changes between check and connect (rebinding) cannot
//!    redirect it;
//! 4. secrets bound to the host are added as headers;
//! 5. the response body is capped, and every timeout is capped by what is
//!    left of the call's deadline. Redirects are not followed: the tool sees
//!    the 3xx and any new request goes through these checks again.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::{GrantError, Grants, SecretGrant};

/// Default cap on a response body a tool may read: 10 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 10 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Http,
    Https,
}

impl Scheme {
    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// One allowed destination: `scheme://host[:port]`, where `host` may start
/// with `*.` to allow every subdomain (not the bare domain). Without a
/// port, only the scheme's default port is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    source: String,
    scheme: Scheme,
    /// Lower-case host, without brackets for IPv6; for `*.example.com` this
    /// is `example.com` and `wildcard` is set.
    host: String,
    wildcard: bool,
    port: u16,
}

impl HostPattern {
    pub fn parse(pattern: &str) -> Result<Self, GrantError> {
        let err = |problem: &str| GrantError::HostPattern {
            pattern: pattern.to_owned(),
            problem: problem.to_owned(),
        };
        let (scheme, rest) = if let Some(rest) = pattern.strip_prefix("https://") {
            (Scheme::Https, rest)
        } else if let Some(rest) = pattern.strip_prefix("http://") {
            (Scheme::Http, rest)
        } else if pattern.trim() == "*" {
            return Err(err(
                "a bare `*` would allow the whole network; list the hosts",
            ));
        } else {
            return Err(err("must start with http:// or https://"));
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') || rest.contains('?') || rest.contains('#') || rest.contains('@') {
            return Err(err(
                "give only scheme://host[:port], without a path, query or user",
            ));
        }
        let (host, port) =
            split_host_port(rest).ok_or_else(|| err("the port is not a number from 1 to 65535"))?;
        let host = host.to_ascii_lowercase();
        let (host, wildcard) = match host.strip_prefix("*.") {
            Some(domain) => (domain.to_owned(), true),
            None => (host, false),
        };
        if host.is_empty() || host == "*" {
            return Err(err(
                "a bare `*` would allow the whole network; list the hosts",
            ));
        }
        if host.contains('*') {
            return Err(err(
                "`*` is allowed only as the whole first label, as in *.example.com",
            ));
        }
        let valid = host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
        if !valid {
            return Err(err("the host has characters a host name cannot have"));
        }
        if wildcard && host.parse::<IpAddr>().is_ok() {
            return Err(err("`*.` cannot prefix an IP address"));
        }
        Ok(Self {
            source: pattern.to_owned(),
            scheme,
            port: port.unwrap_or(scheme.default_port()),
            host,
            wildcard,
        })
    }

    /// The pattern as the operator wrote it.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    fn matches(&self, scheme: Scheme, host: &str, port: u16) -> bool {
        if scheme != self.scheme || port != self.port {
            return false;
        }
        if self.wildcard {
            is_subdomain(host, &self.host)
        } else {
            host == self.host
        }
    }

    /// Whether the operator named this non-public address explicitly: the
    /// pattern's host is that IP, or `localhost` and the IP is loopback.
    fn names_address(&self, ip: IpAddr) -> bool {
        if self.wildcard {
            return false;
        }
        if self.host == "localhost" {
            return canonical(ip).is_loopback();
        }
        self.host
            .parse::<IpAddr>()
            .is_ok_and(|named| canonical(named) == canonical(ip))
    }
}

/// Whether `host` is a proper subdomain of `domain` (`a.example.com` of
/// `example.com`; not `example.com` itself, not `badexample.com`).
pub(crate) fn is_subdomain(host: &str, domain: &str) -> bool {
    host.strip_suffix(domain)
        .is_some_and(|prefix| prefix.len() > 1 && prefix.ends_with('.'))
}

/// Splits `host[:port]`, handling `[v6]:port`. `None` if the port is bad.
fn split_host_port(authority: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after.strip_prefix(':') {
            Some(port) => Some((host, Some(parse_port(port)?))),
            None if after.is_empty() => Some((host, None)),
            None => None,
        };
    }
    match authority.rsplit_once(':') {
        // A bare IPv6 address without brackets has several colons.
        Some((host, port)) if !host.contains(':') => Some((host, Some(parse_port(port)?))),
        _ => Some((authority, None)),
    }
}

fn parse_port(text: &str) -> Option<u16> {
    text.parse::<u16>().ok().filter(|&p| p != 0)
}

/// An IPv4 address hidden in an IPv6 one (IPv4-mapped, or the NAT64
/// well-known prefix) is judged as the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                return IpAddr::V4(Ipv4Addr::new(a, b, c, d));
            }
            IpAddr::V6(v6)
        }
        v4 => v4,
    }
}

/// Whether `ip` is anything but a public unicast address.
pub fn is_non_public(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64/10
                || (a == 198 && (b == 18 || b == 19)) // benchmarking 198.18/15
                || a >= 240 // reserved
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
                || v6 == Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 1)
        }
    }
}

/// The hosts one tool may send HTTP requests to. Empty by default: every
/// request is refused.
#[derive(Debug, Clone)]
pub struct HttpGrant {
    allow: Vec<HostPattern>,
    /// Largest response body the tool may read.
    pub max_response_bytes: usize,
}

impl Default for HttpGrant {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

impl HttpGrant {
    pub fn new(allow: Vec<HostPattern>) -> Self {
        Self {
            allow,
            ..Self::default()
        }
    }

    pub fn allowed(&self) -> &[HostPattern] {
        &self.allow
    }

    fn find(&self, scheme: Scheme, host: &str, port: u16) -> Option<&HostPattern> {
        self.allow.iter().find(|p| p.matches(scheme, host, port))
    }
}

/// The `wasi:http` hooks of one call: the tool's grants and the deadline.
pub(crate) struct HttpHooks {
    grants: Arc<Grants>,
    deadline: Instant,
}

impl HttpHooks {
    pub(crate) fn new(grants: Arc<Grants>, deadline: Instant) -> Self {
        Self { grants, deadline }
    }
}

type IoFuture = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

impl WasiHttpHooks for HttpHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: IoFuture,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), HttpError>> + Send>
    {
        drop(fut);
        let grants = Arc::clone(&self.grants);
        let deadline = self.deadline;
        Box::new(
            async move { send(&grants.http, &grants.secrets, deadline, request, options).await },
        )
    }
}

async fn send(
    grant: &HttpGrant,
    secrets: &[SecretGrant],
    deadline: Instant,
    mut request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
) -> Result<(http::Response<WasiBody>, IoFuture), HttpError> {
    let uri = request.uri().clone();
    let scheme = match uri.scheme_str() {
        Some("http") => Scheme::Http,
        Some("https") => Scheme::Https,
        _ => return Err(HttpError::HttpRequestUriInvalid),
    };
    let host = uri
        .host()
        .ok_or(HttpError::HttpRequestUriInvalid)?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or(scheme.default_port());

    let Some(pattern) = grant.find(scheme, &host, port) else {
        tracing::info!(%uri, "HTTP request refused: not on the tool's allowlist");
        return Err(HttpError::HttpRequestDenied);
    };

    let budget = |limit: Option<Duration>| {
        let left = deadline.saturating_duration_since(Instant::now());
        limit.map_or(left, |l| l.min(left))
    };
    let addrs = resolve(&host, port, budget(None)).await?;
    let permitted: Vec<SocketAddr> = addrs
        .iter()
        .copied()
        .filter(|a| !is_non_public(a.ip()) || pattern.names_address(a.ip()))
        .collect();
    if permitted.is_empty() {
        tracing::info!(%uri, ?addrs, "HTTP request refused: resolves to a non-public address");
        return Err(HttpError::DestinationIpProhibited);
    }

    for secret in secrets.iter().filter(|s| s.binds(&host)) {
        let (name, value) = secret.header();
        request.headers_mut().insert(name, value);
    }

    let connect_timeout = budget(options.and_then(|o| o.connect_timeout));
    let tcp = tokio::time::timeout(connect_timeout, connect_any(&permitted))
        .await
        .map_err(|_| HttpError::ConnectionTimeout)??;
    let stream: Box<dyn Stream> = match scheme {
        Scheme::Http => Box::new(tcp),
        Scheme::Https => {
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|_| HttpError::HttpRequestUriInvalid)?;
            let tls = tokio_rustls::TlsConnector::from(
                crate::tls::client_config().map_err(|e| HttpError::InternalError(Some(e)))?,
            );
            let connected = tokio::time::timeout(connect_timeout, tls.connect(name, tcp))
                .await
                .map_err(|_| HttpError::ConnectionTimeout)?
                .map_err(HttpError::Tls)?;
            Box::new(connected)
        }
    };

    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(HttpError::from)?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    *request.uri_mut() = path.parse().map_err(|_| HttpError::HttpRequestUriInvalid)?;

    // Drive the connection while waiting for the response head; whatever
    // of the connection is left is handed back to be driven with the body.
    let mut conn = Some(Box::pin(conn));
    let mut response = Box::pin(sender.send_request(request));
    let head = std::future::poll_fn(|cx| {
        if let Poll::Ready(result) = response.as_mut().poll(cx) {
            return Poll::Ready(result.map_err(HttpError::from));
        }
        if let Some(c) = conn.as_mut()
            && let Poll::Ready(done) = c.as_mut().poll(cx)
        {
            conn = None;
            if let Err(e) = done {
                return Poll::Ready(Err(HttpError::from(e)));
            }
            return response.as_mut().poll(cx).map_err(HttpError::from);
        }
        Poll::Pending
    });
    let first_byte = budget(options.and_then(|o| o.first_byte_timeout));
    let head = tokio::time::timeout(first_byte, head)
        .await
        .map_err(|_| HttpError::ConnectionReadTimeout)??;

    let limit = grant.max_response_bytes;
    let response = head.map(|incoming| {
        CappedBody {
            inner: incoming,
            remaining: limit,
        }
        .boxed_unsync()
    });
    let io: IoFuture = Box::new(async move {
        if let Some(conn) = conn {
            conn.await.map_err(HttpError::from)?;
        }
        Ok(())
    });
    Ok((response, io))
}

/// Connects to the first of `addrs` that accepts, in resolver order (so a
/// name with both IPv6 and IPv4 addresses works when the server listens on
/// only one). Only addresses that passed the checks are ever tried.
async fn connect_any(addrs: &[SocketAddr]) -> Result<TcpStream, HttpError> {
    let mut last = HttpError::DestinationUnavailable;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(tcp) => return Ok(tcp),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                last = HttpError::ConnectionRefused;
            }
            Err(e) => last = HttpError::Connect(e),
        }
    }
    Err(last)
}

async fn resolve(host: &str, port: u16, budget: Duration) -> Result<Vec<SocketAddr>, HttpError> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    match tokio::time::timeout(budget, tokio::net::lookup_host((host, port))).await {
        Err(_) => Err(HttpError::DnsTimeout),
        Ok(Err(_)) => Err(HttpError::DestinationNotFound),
        Ok(Ok(addrs)) => {
            let addrs: Vec<SocketAddr> = addrs.collect();
            if addrs.is_empty() {
                Err(HttpError::DestinationNotFound)
            } else {
                Ok(addrs)
            }
        }
    }
}

trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// A response body that fails once it exceeds its byte cap.
struct CappedBody {
    inner: hyper::body::Incoming,
    remaining: usize,
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if data.len() > self.remaining {
                        return Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(None))));
                    }
                    self.remaining -= data.len();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(HttpError::from(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn non_public_addresses() {
        for s in [
            "127.0.0.1",
            "127.1.2.3",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "fc00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::ffff:169.254.169.254",
            "64:ff9b::a00:1",
            "ff02::1",
        ] {
            assert!(is_non_public(ip(s)), "{s} must be refused");
        }
        for s in [
            "93.184.216.34",
            "1.1.1.1",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(!is_non_public(ip(s)), "{s} is public");
        }
    }

    #[test]
    fn patterns_parse_and_match() {
        let p = HostPattern::parse("https://*.example.com").unwrap();
        assert!(p.matches(Scheme::Https, "api.example.com", 443));
        assert!(p.matches(Scheme::Https, "a.b.example.com", 443));
        assert!(!p.matches(Scheme::Https, "example.com", 443));
        assert!(!p.matches(Scheme::Https, "evilexample.com", 443));
        assert!(!p.matches(Scheme::Http, "api.example.com", 80));
        assert!(!p.matches(Scheme::Https, "api.example.com", 8443));

        let p = HostPattern::parse("http://127.0.0.1:8080").unwrap();
        assert!(p.matches(Scheme::Http, "127.0.0.1", 8080));
        assert!(p.names_address(ip("127.0.0.1")));
        assert!(p.names_address(ip("::ffff:127.0.0.1")));
        assert!(!p.names_address(ip("127.0.0.2")));

        let p = HostPattern::parse("http://[::1]:9000/").unwrap();
        assert!(p.matches(Scheme::Http, "::1", 9000));
        assert!(
            HostPattern::parse("http://localhost:1")
                .unwrap()
                .names_address(ip("127.0.0.1"))
        );
        assert!(
            !HostPattern::parse("http://localhost.:1")
                .unwrap()
                .names_address(ip("127.0.0.1"))
        );
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in [
            "*",
            "http://*",
            "https://*.",
            "api.example.com",
            "ftp://x.com",
            "https://a.*.com",
            "https://x.com/path",
            "https://x.com:0",
            "https://x.com:99999",
            "https://user@x.com",
            "https://*.10.0.0.1",
            "https://ex ample.com",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad} must be refused");
        }
    }
}
