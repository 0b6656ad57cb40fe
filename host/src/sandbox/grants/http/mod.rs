//! The HTTP grant: outgoing `wasi:http` requests to an allowlist.
//!
//! Checks run where the request is prepared, in this order:
//!
//! 1. the URL's scheme, host and port must match a granted [`HostPattern`];
//! 2. the host is resolved here, by the host; an address that is not public
//!    (per the IANA special-purpose registries of both families, with IPv4
//!    embedded in IPv6 judged as IPv4: see [`is_non_public`]) is refused
//!    unless the matching pattern names that address, or `localhost` for a
//!    loopback address;
//! 3. the connection goes to the address that passed the check, so a DNS
//!    answer that changes between check and connect (rebinding) cannot
//!    redirect it;
//! 4. secrets bound to the request's origin (scheme, host, port) are added
//!    as headers, in cleartext only to loopback;
//! 5. the response body is capped, the secrets the request carried are
//!    redacted from the response, and every timeout is capped by what is
//!    left of the call's deadline. Redirects are not followed: the tool sees
//!    the 3xx and any new request goes through these checks again.
//!
//! Before all of it, the request must fit the call's budgets
//! (`max_requests`, `max_connections`) and, to connect, the host's
//! (`MAX_HOST_CONNECTIONS`); a lookup holds one of the host's `MAX_LOOKUPS`
//! slots until it really ends.

mod recorded;
mod sender;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderName, HeaderValue};
use tokio::sync::Semaphore;
use wasmtime::component::Linker;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::{CallSetup, Capability, GrantError, Grants, HostPattern, HttpGrant};
use crate::policy::grants::Scheme;
use crate::sandbox::{CallState, Reel, Refusals};

impl Capability for HttpGrant {
    /// Links `wasi:http/outgoing-handler` and its types. Every request goes
    /// through the call's HTTP hooks, which refuse what the call was not granted.
    fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)
    }

    /// The allowlist is shared with the call's hooks; nothing to copy.
    fn prepare(&self, _call: &mut CallSetup<'_>) -> Result<(), GrantError> {
        Ok(())
    }
}

/// A secret's header, resolved for one call, and the origins it goes to.
#[derive(Clone)]
pub(crate) struct ResolvedSecret {
    pub(crate) header: HeaderName,
    /// The header value, and the secret alone when it is long enough to
    /// be redacted from responses by itself (the header value always is;
    /// see `sender::Redactor`); or why it cannot be had now (its variable
    /// unset), for a request that would carry it to fail with.
    pub(crate) value: Result<(HeaderValue, Option<Vec<u8>>), GrantError>,
    pub(crate) origins: Arc<[HostPattern]>,
}

impl ResolvedSecret {
    /// Whether the secret is sent to this origin.
    pub(crate) fn binds(&self, scheme: Scheme, host: &str, port: u16) -> bool {
        self.origins.iter().any(|o| o.matches(scheme, host, port))
    }
}

/// The `wasi:http` hooks of one call: the tool's grants, the deadline, and
/// what the call has used of its request and connection budgets.
pub(crate) struct HttpHooks {
    grants: Arc<Grants>,
    /// Usually empty; cloned into a request only when one is sent.
    secrets: Vec<ResolvedSecret>,
    deadline: Instant,
    /// Requests sent so far.
    requests: u32,
    /// One permit per open connection; made on the call's first request.
    connections: Option<Arc<Semaphore>>,
    /// Where a refused request is noted, with why, for the call's output.
    refusals: Refusals,
    /// A replayed call's reel: a request is answered from it, or refused
    /// unsent and noted there.
    replayed: Option<Reel>,
    /// Where a call whose grant says `record = true` keeps its exchanges.
    recording: Option<Reel>,
}

impl HttpHooks {
    pub(crate) fn new(
        grants: Arc<Grants>,
        secrets: Vec<ResolvedSecret>,
        deadline: Instant,
        refusals: Refusals,
        replayed: Option<Reel>,
        recording: Option<Reel>,
    ) -> Self {
        Self {
            grants,
            secrets,
            deadline,
            requests: 0,
            connections: None,
            refusals,
            replayed,
            recording,
        }
    }

    /// Moves the call's deadline (for a store made ahead of its call).
    pub(crate) fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
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
        if let Some(reel) = &self.replayed {
            let (method, url) = (request.method().to_string(), request.uri().to_string());
            if let Some(exchange) = reel.next_exchange(&method, &url) {
                let reel = reel.clone();
                return Box::new(async move {
                    // The recorded answer is this request's only if the
                    // tool sent the same body (read, hashed, not kept).
                    if let Some(expected) = &exchange.request_sha256 {
                        let sent = recorded::digest_of(request.into_body()).await?;
                        if &sent != expected {
                            reel.short(&format!(
                                "sends a request whose body differs from its recorded call's \
                                 ({method} {url})"
                            ));
                            return Err(HttpError::HttpRequestDenied);
                        }
                    }
                    recorded::played(exchange)
                });
            }
            self.refusals
                .note("HTTP request not sent: a replayed call sends none".to_owned());
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        let grant = &self.grants.http;
        self.requests = self.requests.saturating_add(1);
        let permit = if self.requests > grant.max_requests {
            let why = format!(
                "HTTP request refused: the call may send at most {} (max_requests)",
                grant.max_requests
            );
            tracing::info!("{why}");
            self.refusals.note(why);
            None
        } else {
            let connections = self
                .connections
                .get_or_insert_with(|| Arc::new(Semaphore::new(grant.max_connections)));
            let permit = Arc::clone(connections).try_acquire_owned().ok();
            if permit.is_none() {
                let why = format!(
                    "HTTP request refused: the call may hold at most {} connections at once \
                     (max_connections)",
                    grant.max_connections
                );
                tracing::info!("{why}");
                self.refusals.note(why);
            }
            permit
        };
        let grants = Arc::clone(&self.grants);
        let secrets = self.secrets.clone();
        let deadline = self.deadline;
        let refusals = self.refusals.clone();
        // A recorded request's body is hashed as it is sent.
        let (request, recording) = match self.recording.clone() {
            None => (request, None),
            Some(reel) => {
                let (method, url) = (request.method().to_string(), request.uri().to_string());
                let (parts, body) = request.into_parts();
                let (body, digest) = recorded::Hashing::wrap(body);
                let request = http::Request::from_parts(parts, body);
                (request, Some((reel, (method, url, digest))))
            }
        };
        Box::new(async move {
            let permit = permit.ok_or(HttpError::ConnectionLimitReached)?;
            let sent = sender::send(
                &grants.http,
                &secrets,
                deadline,
                request,
                options,
                permit,
                &refusals,
            )
            .await?;
            match recording {
                None => Ok(sent),
                Some((reel, asked)) => recorded::record(reel, asked, sent).await,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
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
