//! The private-address rule for the host's own requests to a registry
//! (DESIGN §10), the same rule a tool's HTTP grant obeys: an address that
//! is not public ([`is_non_public`]) is reached only when the reference
//! names it itself (its registry is that IP, or `localhost` for a loopback
//! address). A registry cannot send the host anywhere else on its network:
//! not by a redirect, a token `realm`, an upload `Location`, nor a DNS
//! answer.
//!
//! Checked in three places, so that no request escapes it:
//! - every URL before a request is made ([`Guard::check`]): the scheme
//!   (HTTPS; plain HTTP only to loopback, only with `insecure`) and a host
//!   that is an IP literal (names never reach the resolver then);
//! - every redirect hop, by the client's redirect policy, the same way;
//! - every name, by the client's resolver ([`Guard`] is one): each
//!   address it resolves to is checked, and the connection goes to the
//!   addresses checked, so an answer that changes between check and
//!   connect cannot move it.
//!
//! Proxies from the environment are not used: a proxy would resolve the
//! names itself.

use std::net::{IpAddr, SocketAddr};

use super::Reference;
use crate::policy::grants::{canonical, is_non_public, names_address};

/// How many redirects one request follows.
const MAX_REDIRECTS: usize = 5;

/// What a registry's traffic may reach, for one reference.
#[derive(Debug, Clone)]
pub(super) struct Guard {
    /// The registry's host as the reference names it
    /// ([`Reference::host`], lowercase).
    named: String,
    /// Plain HTTP to loopback allowed.
    insecure: bool,
}

/// A request the rule refuses. Its text names the host and why, never a
/// credential (URLs are shown without their query).
#[derive(Debug, Clone, thiserror::Error)]
pub enum Refused {
    /// The host is, or resolves to, an address that is not public.
    #[error(
        "{host} is {ip}, not a public address; a registry may send the host only to public addresses, or to the one its reference names"
    )]
    NonPublic {
        /// The host as the URL names it.
        host: String,
        /// The address refused.
        ip: IpAddr,
    },
    /// Plain HTTP where it is not allowed.
    #[error(
        "{url}: plain HTTP is only allowed to registries on this machine, with --insecure (or [oci] insecure)"
    )]
    PlainHttp {
        /// The URL, without its query.
        url: String,
    },
    /// Not an `http(s)` URL with a host.
    #[error("{url}: not an HTTPS URL")]
    NotHttp {
        /// The URL, without its query.
        url: String,
    },
    /// A redirect chain too long.
    #[error("more than {MAX_REDIRECTS} redirects")]
    TooManyRedirects,
}

/// `url` as errors show it: no query (a presigned URL's query is a
/// credential), no user info.
pub(super) fn shown(url: &reqwest::Url) -> String {
    format!(
        "{}://{}{}",
        url.scheme(),
        url.host_str().unwrap_or_default(),
        url.port().map(|p| format!(":{p}")).unwrap_or_default()
    ) + url.path()
}

impl Guard {
    /// The rule for `reference`'s registry.
    pub(super) fn new(reference: &Reference, insecure: bool) -> Self {
        Self {
            named: reference.host().to_ascii_lowercase(),
            insecure,
        }
    }

    /// Whether a connection to `ip` is allowed.
    fn allows(&self, ip: IpAddr) -> bool {
        !is_non_public(ip) || names_address(&self.named, ip)
    }

    /// Checks `url` before a request goes to it (or a redirect is
    /// followed): its scheme, and its host when that is an address.
    pub(crate) fn check(&self, url: &reqwest::Url) -> Result<(), Refused> {
        let Some(host) = url.host_str().filter(|h| !h.is_empty()) else {
            return Err(Refused::NotHttp { url: shown(url) });
        };
        // An address (IPv6 in brackets) never reaches the resolver.
        let ip = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .ok();
        match url.scheme() {
            "https" => {}
            "http" => {
                let loopback = match ip {
                    Some(ip) => canonical(ip).is_loopback(),
                    None => host == "localhost",
                };
                if !(self.insecure && loopback) {
                    return Err(Refused::PlainHttp { url: shown(url) });
                }
            }
            _ => return Err(Refused::NotHttp { url: shown(url) }),
        }
        match ip {
            Some(ip) if !self.allows(ip) => Err(Refused::NonPublic {
                host: host.to_owned(),
                ip,
            }),
            _ => Ok(()),
        }
    }

    /// The redirect policy: each hop checked as a first request is, at
    /// most [`MAX_REDIRECTS`] of them. (reqwest drops `Authorization` on
    /// a hop to another host or port, so credentials never follow one.)
    pub(super) fn redirects(&self) -> reqwest::redirect::Policy {
        let guard = self.clone();
        reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                return attempt.error(Refused::TooManyRedirects);
            }
            match guard.check(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(refused) => attempt.error(refused),
            }
        })
    }
}

impl reqwest::dns::Resolve for Guard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = self.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if let Some(ip) = addrs
                .iter()
                .map(SocketAddr::ip)
                .find(|ip| !guard.allows(*ip))
            {
                return Err(Box::new(Refused::NonPublic { host, ip }) as _);
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The refusal somewhere in `e`'s chain of causes, if it is one.
pub(super) fn refusal<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e Refused> {
    let mut next = Some(e);
    while let Some(cause) = next {
        if let Some(refused) = cause.downcast_ref::<Refused>() {
            return Some(refused);
        }
        next = cause.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> reqwest::Url {
        text.parse().unwrap()
    }

    fn reference(registry: &str) -> Reference {
        format!("{registry}/tools/t:1").parse().unwrap()
    }

    #[test]
    fn only_public_addresses_or_the_named_one_pass() {
        let public = Guard::new(&reference("registry.example"), false);
        for bad in [
            "https://10.0.0.1/token",
            "https://169.254.169.254/latest",
            "https://127.0.0.1:5000/v2/",
            "https://[::1]/v2/",
            "https://[::ffff:10.0.0.1]/v2/",
            "http://registry.example/v2/",
            "ftp://registry.example/x",
        ] {
            assert!(public.check(&url(bad)).is_err(), "{bad}");
        }
        assert!(public.check(&url("https://8.8.8.8/token")).is_ok());
        assert!(public.check(&url("https://auth.example/token")).is_ok());

        let local = Guard::new(&reference("127.0.0.1:5000"), true);
        assert!(local.check(&url("http://127.0.0.1:5000/v2/")).is_ok());
        assert!(local.check(&url("http://127.0.0.1:6000/token")).is_ok());
        assert!(local.check(&url("http://10.0.0.1/token")).is_err());
        assert!(local.check(&url("https://127.0.0.2/token")).is_err());
        let named = Guard::new(&reference("localhost:5000"), false);
        assert!(named.allows("127.0.0.1".parse().unwrap()));
        assert!(named.allows("::1".parse().unwrap()));
        assert!(!named.allows("10.0.0.1".parse().unwrap()));
        assert!(named.check(&url("http://localhost:5000/v2/")).is_err());
    }

    /// A name is judged by what it resolves to: `localhost` (loopback) is
    /// refused to a registry named by another name, and allowed to one
    /// named `localhost`.
    #[tokio::test]
    async fn names_are_judged_by_their_addresses() {
        use reqwest::dns::Resolve as _;
        let name = |text: &str| text.parse::<reqwest::dns::Name>().unwrap();
        let refused = Guard::new(&reference("registry.example"), false)
            .resolve(name("localhost"))
            .await
            .err()
            .expect("loopback refused");
        assert!(
            matches!(refusal(refused.as_ref()), Some(Refused::NonPublic { host, .. }) if host == "localhost"),
            "{refused}"
        );
        let allowed = Guard::new(&reference("localhost:5000"), true)
            .resolve(name("localhost"))
            .await
            .map(|addrs| addrs.count());
        assert!(allowed.is_ok_and(|n| n > 0));
    }

    #[test]
    fn urls_are_shown_without_their_query_or_user() {
        let shown = shown(&url(
            "https://user:pw@blobs.example:8443/b/c?X-Amz-Signature=secret",
        ));
        assert_eq!(shown, "https://blobs.example:8443/b/c");
    }
}
