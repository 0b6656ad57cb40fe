//! The HTTP grant's sender: bound the call's connections, resolve (behind
//! the host's lookup gate), check the address, connect to the checked
//! address, inject secrets, cap the response and redact the secrets from
//! it.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

use super::{IoFuture, ResolvedSecret};
use crate::policy::grants::{HostPattern, HttpGrant, Scheme, canonical, is_non_public};
use crate::sandbox::Refusals;

/// Connections all calls together may hold open: tools share the host's
/// file descriptors with each other and with the host itself (the cache,
/// the model client), so their sum is bounded, not just each call's. A
/// request waits for a free one until its call's deadline.
const MAX_HOST_CONNECTIONS: usize = 512;
static HOST_CONNECTIONS: Semaphore = Semaphore::const_new(MAX_HOST_CONNECTIONS);

/// DNS lookups in flight across the host. A lookup runs `getaddrinfo` on a
/// blocking thread that cannot be interrupted; its permit is held by that
/// thread until the lookup really ends, so lookups that never answer can
/// hold at most this many threads, whatever their calls' deadlines did.
const MAX_LOOKUPS: usize = 16;
static LOOKUPS: Semaphore = Semaphore::const_new(MAX_LOOKUPS);

/// `send` for one request of a call holding `call_permit` (one of its
/// connection slots), released when the connection ends.
pub(super) async fn send(
    grant: &HttpGrant,
    secrets: &[ResolvedSecret],
    deadline: Instant,
    mut request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
    call_permit: OwnedSemaphorePermit,
    refusals: &Refusals,
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
        let why = HostPattern::explain_miss(grant.allowed(), scheme, &host, port);
        tracing::info!(%uri, "{why}");
        refusals.note(why);
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
        let why = format!(
            "HTTP request to {} refused: {host} resolves to a non-public address ({}), which \
             only a pattern naming that address allows",
            scheme.origin(&host, port),
            addrs
                .iter()
                .map(|a| a.ip().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        tracing::info!(%uri, "{why}");
        refusals.note(why);
        return Err(HttpError::DestinationIpProhibited);
    }

    // A secret goes only to its own origins, and in cleartext only to this
    // machine (its policy allowed an `http://` origin only for loopback).
    let encrypted_or_local =
        scheme == Scheme::Https || permitted.iter().all(|a| canonical(a.ip()).is_loopback());
    let mut injected: Vec<Vec<u8>> = Vec::new();
    for secret in secrets
        .iter()
        .filter(|s| encrypted_or_local && s.binds(scheme, &host, port))
    {
        let (value, raw) = match &secret.value {
            Ok(value) => value,
            Err(missing) => {
                let why = format!(
                    "HTTP request to {} refused: {missing}",
                    scheme.origin(&host, port)
                );
                tracing::info!(%uri, "{why}");
                refusals.note(why);
                refusals.grant_missing(missing.clone());
                return Err(HttpError::HttpRequestDenied);
            }
        };
        request
            .headers_mut()
            .insert(secret.header.clone(), value.clone());
        injected.push(value.as_bytes().to_vec());
        injected.extend(raw.clone());
    }

    let connect_timeout = budget(options.and_then(|o| o.connect_timeout));
    let host_permit = tokio::time::timeout(connect_timeout, HOST_CONNECTIONS.acquire())
        .await
        .map_err(|_| HttpError::ConnectionLimitReached)?
        .map_err(|_| HttpError::ConnectionLimitReached)?;
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
    let mut head = tokio::time::timeout(first_byte, head)
        .await
        .map_err(|_| HttpError::ConnectionReadTimeout)??;

    // A server may echo what it was sent (debug endpoints, some APIs): the
    // secrets this request carried are removed from the response before
    // the guest can read it.
    let redactor = (!injected.is_empty()).then(|| Redactor::new(injected));
    if let Some(redactor) = &redactor {
        redactor.headers(head.headers_mut());
    }
    let limit = grant.max_response_bytes;
    let response = head.map(|incoming| {
        ResponseBody {
            inner: incoming,
            remaining: limit,
            redactor,
            done: false,
        }
        .boxed_unsync()
    });
    // The connection's permits live as long as the connection.
    let io: IoFuture = Box::new(async move {
        let _permits = (call_permit, host_permit);
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
/// Nagle's algorithm is off, as in every HTTP client: a body written after
/// its headers must not wait for the server's delayed ACK (up to 40 ms).
async fn connect_any(addrs: &[SocketAddr]) -> Result<TcpStream, HttpError> {
    let mut last = HttpError::DestinationUnavailable;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(tcp) => {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(error = %e, "cannot set TCP_NODELAY");
                }
                return Ok(tcp);
            }
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
    let host = host.to_owned();
    let lookup = move || {
        use std::net::ToSocketAddrs;
        (host.as_str(), port)
            .to_socket_addrs()
            .map(|addrs| addrs.collect::<Vec<_>>())
    };
    match gated_blocking(&LOOKUPS, budget, lookup).await {
        None => Err(HttpError::DnsTimeout),
        Some(Err(_)) => Err(HttpError::DestinationNotFound),
        Some(Ok(addrs)) if addrs.is_empty() => Err(HttpError::DestinationNotFound),
        Some(Ok(addrs)) => Ok(addrs),
    }
}

/// Runs `work` on a blocking thread holding one of `gate`'s permits until
/// `work` returns, even if the caller stopped waiting. `None` if the
/// permit and the result did not both come within `budget`.
async fn gated_blocking<T: Send + 'static>(
    gate: &'static Semaphore,
    budget: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let run = async {
        let permit = gate.acquire().await.ok()?;
        tokio::task::spawn_blocking(move || {
            let _held = permit;
            work()
        })
        .await
        .ok()
    };
    tokio::time::timeout(budget, run).await.ok().flatten()
}

trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// A response body as the guest reads it: failing once it exceeds its
/// byte cap, and with the request's secrets redacted if it carried any.
struct ResponseBody {
    inner: hyper::body::Incoming,
    remaining: usize,
    redactor: Option<Redactor>,
    /// The inner body has ended (and what the redactor held is released).
    done: bool,
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let data = match frame.into_data() {
                    Ok(data) => data,
                    Err(other) => return Poll::Ready(Some(Ok(other))),
                };
                if data.len() > self.remaining {
                    return Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(None))));
                }
                self.remaining -= data.len();
                let data = match self.redactor.as_mut() {
                    Some(redactor) => Bytes::from(redactor.chunk(&data, false)),
                    None => data,
                };
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(HttpError::from(e)))),
            Poll::Ready(None) => {
                self.done = true;
                match self.redactor.as_mut().map(|r| r.chunk(&[], true)) {
                    Some(rest) if !rest.is_empty() => {
                        Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))))
                    }
                    _ => Poll::Ready(None),
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
            || (self.inner.is_end_stream()
                && self.redactor.as_ref().is_none_or(|r| r.carry.is_empty()))
    }
}

/// Replaces every occurrence of the secrets a request carried with
/// [`REDACTED`] in its response, across chunk boundaries: the last
/// `longest - 1` bytes of a chunk are held back until the next one shows
/// whether they start a secret. Each redaction is logged (never the value).
struct Redactor {
    /// Longest first, so a formatted value wins over the secret inside it.
    needles: Vec<Vec<u8>>,
    longest: usize,
    carry: Vec<u8>,
}

/// What a redacted secret becomes.
const REDACTED: &[u8] = b"[redacted]";

impl Redactor {
    fn new(mut needles: Vec<Vec<u8>>) -> Self {
        needles.retain(|n| !n.is_empty());
        needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
        let longest = needles.first().map_or(0, Vec::len);
        Self {
            needles,
            longest,
            carry: Vec::new(),
        }
    }

    /// Redacts header values in place.
    fn headers(&self, headers: &mut http::HeaderMap) {
        for value in headers.values_mut() {
            let (clean, _, count) = self.replace_all(value.as_bytes(), usize::MAX);
            if count > 0 {
                tracing::warn!(count, "redacted an injected secret from response headers");
                if let Ok(new) = http::HeaderValue::from_bytes(&clean) {
                    *value = new;
                }
            }
        }
    }

    /// The redacted bytes of `data` that can be released now; at the end
    /// of the body (`last`), everything held back too.
    fn chunk(&mut self, data: &[u8], last: bool) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(data);
        let release = if last {
            buf.len()
        } else {
            buf.len().saturating_sub(self.longest.saturating_sub(1))
        };
        let (out, held, count) = self.replace_all(&buf, release);
        if count > 0 {
            tracing::warn!(count, "redacted an injected secret from a response body");
        }
        self.carry = held;
        out
    }

    /// Redacts `buf`, releasing bytes up to `release` (a secret that starts
    /// before it is still redacted whole): `(released, held, redactions)`.
    fn replace_all(&self, buf: &[u8], release: usize) -> (Vec<u8>, Vec<u8>, usize) {
        let mut out = Vec::with_capacity(buf.len());
        let mut count = 0;
        let mut i = 0;
        while i < buf.len() {
            if let Some(needle) = self.needles.iter().find(|n| buf[i..].starts_with(n)) {
                out.extend_from_slice(REDACTED);
                i += needle.len();
                count += 1;
            } else if i >= release {
                break;
            } else {
                out.push(buf[i]);
                i += 1;
            }
        }
        (out, buf[i..].to_vec(), count)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A secret split at every possible point between two chunks (and one
    /// inside another's formatted value) is still redacted whole.
    #[test]
    fn secrets_are_redacted_across_chunk_boundaries() {
        let body = b"a: Bearer s3cr3t-token!\nb: s3cr3t-token.".to_vec();
        let expected = b"a: [redacted]!\nb: [redacted].".to_vec();
        for split in 0..=body.len() {
            let mut r = Redactor::new(vec![
                b"Bearer s3cr3t-token".to_vec(),
                b"s3cr3t-token".to_vec(),
            ]);
            let mut out = r.chunk(&body[..split], false);
            out.extend(r.chunk(&body[split..], false));
            out.extend(r.chunk(&[], true));
            assert_eq!(out, expected, "split at {split}");
        }
        let r = Redactor::new(vec![b"s3cr3t-token".to_vec()]);
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "x-echo",
            http::HeaderValue::from_static("Bearer s3cr3t-token"),
        );
        r.headers(&mut headers);
        assert_eq!(headers["x-echo"], "Bearer [redacted]");
    }

    /// The gate bounds the threads that lookups hold, and a lookup whose
    /// caller timed out keeps its permit until it really ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn blocking_lookups_are_gated_past_their_deadline() {
        static GATE: Semaphore = Semaphore::const_new(2);
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let wait = Arc::new(std::sync::Mutex::new(wait));
        let hang = |wait: Arc<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>| {
            move || {
                let _ = wait.lock().map(|w| w.recv());
            }
        };
        // Two lookups that never answer: both time out for their callers.
        for _ in 0..2 {
            let out = gated_blocking(&GATE, Duration::from_millis(50), hang(wait.clone())).await;
            assert!(out.is_none());
        }
        // Their threads still hold both permits: a third lookup cannot
        // start, and its caller gets its timeout, not a thread.
        assert_eq!(GATE.available_permits(), 0);
        let quick = gated_blocking(&GATE, Duration::from_millis(50), || 7).await;
        assert_eq!(quick, None);
        // Once the hung lookups end, their permits return and lookups run.
        release.send(()).unwrap();
        release.send(()).unwrap();
        let quick = gated_blocking(&GATE, Duration::from_secs(600), || 7).await;
        assert_eq!(quick, Some(7));
    }
}
