//! The HTTP grant's sender: resolve, check the address, connect to the
//! checked address, inject secrets, cap the response.

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
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

use super::address::is_non_public;
use super::pattern::Scheme;
use super::{HttpGrant, IoFuture, ResolvedSecret};

pub(super) async fn send(
    grant: &HttpGrant,
    secrets: &[ResolvedSecret],
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
        request
            .headers_mut()
            .insert(secret.header.clone(), secret.value.clone());
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
