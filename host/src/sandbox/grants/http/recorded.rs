//! HTTP exchanges on a call's tape (`record = true`): a response read
//! whole, kept, and handed to the tool as it was; and, in a replay, a
//! recorded response given in place of a request that is never sent.

use std::future::Future;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use http_body_util::{BodyExt, Full};
use wasmtime_wasi_http::{Error as HttpError, WasiBody};

use super::IoFuture;
use crate::sandbox::Reel;
use crate::spec::Exchange;

/// What a sent request gave: the response, and the future that drives
/// its connection.
type Sent = (http::Response<WasiBody>, IoFuture);

/// Reads `sent`'s body whole (it is already capped at the grant's
/// `max_response_bytes` and redacted), driving its connection meanwhile;
/// keeps the exchange on `reel`; hands the tool the same response.
pub(super) async fn record(
    reel: Reel,
    method: String,
    url: String,
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
    reel.keep_exchange(bytes.len(), || Exchange {
        method,
        url,
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
