//! HTTP exchanges on a call's tape (`record = true`): a response read
//! whole, kept, and handed to the tool as it was, with the digest of the
//! request body the tool sent; and, in a replay, a recorded response given
//! in place of a request that is never sent, when the request is the one
//! recorded (method, URL and body).

use std::future::Future;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use http_body_util::{BodyExt, Full};
use sha2::{Digest as _, Sha256};
use wasmtime_wasi_http::{Error as HttpError, WasiBody};

use super::IoFuture;
use crate::sandbox::Reel;
use crate::spec::Exchange;

/// What a sent request gave: the response, and the future that drives
/// its connection.
type Sent = (http::Response<WasiBody>, IoFuture);

/// A request's body as it streams, hashed: the digest of all of it is
/// left in [`Hashed::digest`] once its last frame has passed (nothing is
/// buffered; a body never read to its end leaves none).
pub(super) struct Hashing {
    inner: WasiBody,
    hasher: Option<Sha256>,
    digest: Digest,
}

/// Where a [`Hashing`] body leaves its digest (hex).
pub(super) type Digest = Arc<Mutex<Option<String>>>;

impl Hashing {
    /// `body`, hashed as it is read; and where its digest will be.
    pub(super) fn wrap(body: WasiBody) -> (WasiBody, Digest) {
        let digest = Digest::default();
        let hashing = Self {
            inner: body,
            hasher: Some(Sha256::new()),
            digest: Arc::clone(&digest),
        };
        (BodyExt::boxed_unsync(hashing), digest)
    }
}

impl http_body::Body for Hashing {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(hasher)) = (frame.data_ref(), self.hasher.as_mut()) {
                    hasher.update(data);
                }
            }
            std::task::Poll::Ready(None) => {
                if let Some(hasher) = self.hasher.take() {
                    *lock(&self.digest) = Some(hex::encode(hasher.finalize()));
                }
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

fn lock(digest: &Digest) -> std::sync::MutexGuard<'_, Option<String>> {
    digest
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The SHA-256 (hex) of all of `body`, read to its end (streamed, not
/// kept).
pub(super) async fn digest_of(body: WasiBody) -> Result<String, HttpError> {
    let (mut body, digest) = Hashing::wrap(body);
    while body.frame().await.transpose()?.is_some() {}
    let hex = lock(&digest).take().unwrap_or_default();
    Ok(hex)
}

/// Reads `sent`'s body whole (it is already capped at the grant's
/// `max_response_bytes` and redacted), driving its connection meanwhile;
/// keeps the exchange on `reel` (with the request body's digest, when it
/// was sent whole); hands the tool the same response.
pub(super) async fn record(
    reel: Reel,
    (method, url, request_body): (String, String, Digest),
    sent: Sent,
) -> Result<Sent, HttpError> {
    let (response, io) = sent;
    let (parts, body) = response.into_parts();
    let mut io = Box::into_pin(io);
    let mut driven = false;
    let mut collect = std::pin::pin!(body.collect());
    let collected = std::future::poll_fn(|cx| {
        if !driven && io.as_mut().poll(cx).is_ready() {
            // The connection ended (or failed: then so does the body).
            driven = true;
        }
        collect.as_mut().poll(cx)
    })
    .await?;
    let bytes = collected.to_bytes();
    let request_sha256 = lock(&request_body).take();
    reel.keep_exchange(bytes.len(), || Exchange {
        method,
        url,
        request_sha256,
        status: parts.status.as_u16(),
        headers: parts
            .headers
            .iter()
            .map(|(name, value)| {
                let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                (name.as_str().to_owned(), value)
            })
            .collect(),
        body: STANDARD.encode(&bytes),
    });
    let rest: IoFuture = if driven {
        Box::new(async { Ok(()) })
    } else {
        Box::new(io)
    };
    Ok((http::Response::from_parts(parts, body_of(bytes)), rest))
}

/// The recorded response `exchange`, as a response to a request never
/// sent.
pub(super) fn played(exchange: Exchange) -> Result<Sent, HttpError> {
    let damaged = |what: &str| {
        HttpError::InternalError(Some(format!(
            "the recorded response's {what} does not read back"
        )))
    };
    let body = STANDARD
        .decode(exchange.body.as_bytes())
        .map_err(|_| damaged("body"))?;
    let mut response = http::Response::builder().status(exchange.status);
    for (name, value) in &exchange.headers {
        let name = HeaderName::try_from(name.as_str()).map_err(|_| damaged("header name"))?;
        let value = HeaderValue::try_from(value.as_str()).map_err(|_| damaged("header"))?;
        response = response.header(name, value);
    }
    let response = response
        .body(body_of(Bytes::from(body)))
        .map_err(|_| damaged("status"))?;
    let none: IoFuture = Box::new(async { Ok(()) });
    Ok((response, none))
}

fn body_of(bytes: Bytes) -> WasiBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_response_reads_back() {
        let exchange = Exchange {
            method: "GET".into(),
            url: "http://127.0.0.1:1/x".into(),
            request_sha256: None,
            status: 201,
            headers: vec![("content-type".into(), "text/plain".into())],
            body: STANDARD.encode("hi"),
        };
        let (response, _) = played(exchange.clone()).unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers()["content-type"], "text/plain");
        let broken = Exchange {
            body: "not base64!".into(),
            ..exchange
        };
        assert!(played(broken).is_err());
    }
}
