//! Host patterns: the allowlist entries of the HTTP grant.

use std::net::IpAddr;

use super::GrantError;
use super::address::canonical;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub(crate) fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    /// `scheme://host:port` as a refusal names it (an IPv6 host in
    /// brackets).
    pub(crate) fn origin(self, host: &str, port: u16) -> String {
        let scheme = match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        if host.contains(':') {
            format!("{scheme}://[{host}]:{port}")
        } else {
            format!("{scheme}://{host}:{port}")
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
    /// Parses `scheme://host[:port]`; refuses paths, users, bare `*` and
    /// misplaced wildcards.
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

    pub(crate) fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// Whether the pattern names only this machine: `localhost` or a
    /// loopback address.
    pub(crate) fn is_loopback(&self) -> bool {
        !self.wildcard && super::address::is_loopback_host(&self.host)
    }

    /// Why no pattern of `allow` lets a request to `scheme://host:port`
    /// through, in one sentence an operator can act on. Patterns match a
    /// host as the URL writes it: `localhost` and a loopback address are
    /// different hosts to them, and that is said when it is the reason.
    pub(crate) fn explain_miss(
        allow: &[HostPattern],
        scheme: Scheme,
        host: &str,
        port: u16,
    ) -> String {
        let wanted = scheme.origin(host, port);
        let loopback = |h: &str| {
            h == "localhost"
                || h.parse::<IpAddr>()
                    .is_ok_and(|ip| canonical(ip).is_loopback())
        };
        let other_name = allow.iter().find(|p| {
            p.scheme == scheme
                && p.port == port
                && p.is_loopback()
                && loopback(host)
                && p.host != host
        });
        let listed: Vec<&str> = allow.iter().map(HostPattern::as_str).collect();
        let listed = if listed.is_empty() {
            "the tool has no HTTP grant".to_owned()
        } else {
            format!("the allowlist is {}", listed.join(", "))
        };
        match other_name {
            Some(p) => format!(
                "HTTP request to {wanted} refused: host {host} is not in the allowlist; the \
                 allowlist names {} (a pattern matches the host as the URL writes it) — list the \
                 address itself",
                p.host
            ),
            None => format!("HTTP request to {wanted} refused: not on the allowlist ({listed})"),
        }
    }

    pub(crate) fn matches(&self, scheme: Scheme, host: &str, port: u16) -> bool {
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
    pub(crate) fn names_address(&self, ip: IpAddr) -> bool {
        !self.wildcard && super::address::names_address(&self.host, ip)
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

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn label() -> impl Strategy<Value = String> {
        "[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?"
    }

    fn host() -> impl Strategy<Value = String> {
        prop::collection::vec(label(), 1..4).prop_map(|labels| labels.join("."))
    }

    proptest! {
        /// Any text at all: an error or a pattern, never a panic.
        #[test]
        fn parse_never_panics(text in "\\PC{0,40}") {
            let _ = HostPattern::parse(&text);
        }

        /// Text shaped like a pattern (schemes, brackets, colons, stars).
        #[test]
        fn parse_never_panics_on_near_misses(text in "(https?://)?[a-z0-9.*:\\[\\]/@?#-]{0,30}") {
            let _ = HostPattern::parse(&text);
        }

        /// An exact pattern matches its own scheme, host and port, and
        /// nothing else: no other scheme, port, subdomain, or look-alike.
        #[test]
        fn exact_patterns_match_only_themselves(
            host in host(),
            other in label(),
            port in 1u16..,
            https in any::<bool>(),
        ) {
            let (scheme, text) = if https { (Scheme::Https, "https") } else { (Scheme::Http, "http") };
            let pattern = HostPattern::parse(&format!("{text}://{host}:{port}")).unwrap();
            prop_assert!(pattern.matches(scheme, &host, port));
            let flipped = if https { Scheme::Http } else { Scheme::Https };
            prop_assert!(!pattern.matches(flipped, &host, port));
            prop_assert!(!pattern.matches(scheme, &host, port.wrapping_add(1).max(1)) || port == u16::MAX);
            let subdomain = format!("{other}.{host}");
            let lookalike = format!("{other}{host}");
            prop_assert!(!pattern.matches(scheme, &subdomain, port));
            prop_assert!(!pattern.matches(scheme, &lookalike, port));
        }

        /// `*.domain` matches every proper subdomain, and neither the bare
        /// domain nor a name that merely ends with it.
        #[test]
        fn wildcards_match_proper_subdomains_only(
            domain in host(),
            sub in host(),
            other in label(),
        ) {
            let pattern = HostPattern::parse(&format!("https://*.{domain}")).unwrap();
            let subdomain = format!("{sub}.{domain}");
            let lookalike = format!("{other}{domain}");
            prop_assert!(pattern.matches(Scheme::Https, &subdomain, 443));
            prop_assert!(!pattern.matches(Scheme::Https, &domain, 443));
            prop_assert!(!pattern.matches(Scheme::Https, &lookalike, 443));
            prop_assert!(!pattern.matches(Scheme::Https, &subdomain, 80));
        }
    }
}
