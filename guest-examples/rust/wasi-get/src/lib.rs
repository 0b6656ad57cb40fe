//! A GET (or a POST with a body) through `wasi:http`: the URL split into
//! scheme, authority and path, the request sent, the whole response body
//! read. What the host refuses comes back as the WASI HTTP error code's
//! name (`HttpRequestDenied`, `DestinationIpProhibited`, ...).

use wasip2::http::outgoing_handler;
use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasip2::io::streams::StreamError;

/// Sends `GET url`; the response's status and body.
pub fn get(url: &str) -> Result<(u16, Vec<u8>), String> {
    send(url, None)
}

/// Sends `POST url` with `body` when there is one, else `GET url`; the
/// response's status and body.
pub fn send(url: &str, body: Option<&[u8]>) -> Result<(u16, Vec<u8>), String> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (Scheme::Https, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (Scheme::Http, rest)
    } else {
        return Err("the URL must start with http:// or https://".into());
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };

    let request = OutgoingRequest::new(Fields::new());
    let invalid = |what: &str| format!("invalid {what}");
    let method = if body.is_some() {
        Method::Post
    } else {
        Method::Get
    };
    request
        .set_method(&method)
        .map_err(|()| invalid("method"))?;
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| invalid("scheme"))?;
    request
        .set_authority(Some(authority))
        .map_err(|()| invalid("authority"))?;
    request
        .set_path_with_query(Some(path))
        .map_err(|()| invalid("path"))?;
    let outgoing = request
        .body()
        .map_err(|()| "the request body was already taken".to_string())?;
    let pending = outgoing_handler::handle(request, None).map_err(|code| format!("{code:?}"))?;
    if let Some(bytes) = body {
        let stream = outgoing
            .write()
            .map_err(|()| "the request body's stream was already taken".to_string())?;
        // At most 4096 bytes a call, as `blocking-write-and-flush` takes.
        for chunk in bytes.chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| format!("writing the request body: {e:?}"))?;
        }
    }
    OutgoingBody::finish(outgoing, None).map_err(|code| format!("{code:?}"))?;

    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(format!("{code:?}")),
        Some(Err(())) => return Err("the response was already taken".into()),
        None => return Err("no response".into()),
    };
    let status = response.status();
    let incoming = response
        .consume()
        .map_err(|()| "the body was already taken".to_string())?;
    let mut bytes = Vec::new();
    {
        let stream = incoming
            .stream()
            .map_err(|()| "the body stream was already taken".to_string())?;
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(e)) => return Err(e.to_debug_string()),
            }
        }
    }
    Ok((status, bytes))
}
