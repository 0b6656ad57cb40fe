//! A plain component (no Airlock world) with effects: `read-text` reads a
//! file through WASI, `fetch-status` sends a GET through `wasi:http`. It
//! reaches only what the operator's policy grants; anything else is an
//! `err` naming what was refused.

wit_bindgen::generate!({ path: "wit", world: "reach" });

use wasip2::http::outgoing_handler;
use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

struct Reach;

impl Guest for Reach {
    fn read_text(path: String) -> Result<String, String> {
        std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))
    }

    fn fetch_status(url: String) -> Result<u16, String> {
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
        request
            .set_method(&Method::Get)
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
        let body = request.body().map_err(|()| "no request body".to_string())?;
        let pending =
            outgoing_handler::handle(request, None).map_err(|code| format!("{code:?}"))?;
        OutgoingBody::finish(body, None).map_err(|code| format!("{code:?}"))?;
        pending.subscribe().block();
        match pending.get() {
            Some(Ok(Ok(response))) => Ok(response.status()),
            Some(Ok(Err(code))) => Err(format!("{code:?}")),
            Some(Err(())) => Err("the response was already taken".into()),
            None => Err("no response".into()),
        }
    }
}

export!(Reach);
