//! A component's place in a registry: `REGISTRY/REPO:TAG` or
//! `REGISTRY/REPO@sha256:HEX` (`oci://` in front on the command line).

use std::fmt;
use std::str::FromStr;

/// A reference that is not one: the text (shortened) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid reference {reference:?}: {problem}")]
pub struct InvalidReference {
    /// The text, shortened.
    pub reference: String,
    /// What is wrong with it.
    pub problem: String,
}

/// The prefix that marks a reference where a file path could stand.
pub const SCHEME: &str = "oci://";

/// A reference to a component in an OCI registry. The registry is always
/// named (no implicit Docker Hub): `ghcr.io/acme/units:1.0`,
/// `127.0.0.1:5000/tools/units@sha256:…`. Kept as its text and the
/// offsets of its parts (small enough to carry in every error).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reference {
    /// `registry/repository[:tag][@digest]`.
    text: String,
    /// The repository's start and end in `text`.
    repository: (u16, u16),
    /// The tag's start and end, if there is one.
    tag: Option<(u16, u16)>,
    /// The digest's start (it runs to the end), if there is one.
    digest: Option<u16>,
}

/// Whether `text` is a `sha256:` digest: 64 lowercase hex digits.
pub(crate) fn is_digest(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// A reference's longest text.
const MAX_LEN: usize = 1024;

impl Reference {
    /// Joins parts already checked (each short enough: see [`MAX_LEN`]).
    fn from_parts(
        registry: &str,
        repository: &str,
        tag: Option<&str>,
        digest: Option<&str>,
    ) -> Self {
        let at = |n: usize| u16::try_from(n).unwrap_or(u16::MAX);
        let mut text = format!("{registry}/{repository}");
        let repository = (at(registry.len() + 1), at(text.len()));
        let tag = tag.map(|tag| {
            text.push(':');
            let start = text.len();
            text.push_str(tag);
            (at(start), at(text.len()))
        });
        let digest = digest.map(|digest| {
            text.push('@');
            let start = text.len();
            text.push_str(digest);
            at(start)
        });
        Self {
            text,
            repository,
            tag,
            digest,
        }
    }

    fn slice(&self, (start, end): (u16, u16)) -> &str {
        self.text
            .get(usize::from(start)..usize::from(end))
            .unwrap_or_default()
    }

    /// The registry: `host[:port]`.
    pub fn registry(&self) -> &str {
        self.slice((0, self.repository.0.saturating_sub(1)))
    }

    /// The registry's host, without its port or an IPv6 address's
    /// brackets: `ghcr.io`, `127.0.0.1`, `::1`.
    pub fn host(&self) -> &str {
        let registry = self.registry();
        let host = match registry.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => registry,
        };
        host.trim_start_matches('[').trim_end_matches(']')
    }

    /// The repository within it: `acme/units`.
    pub fn repository(&self) -> &str {
        self.slice(self.repository)
    }

    /// `registry/repository`: the name a signature is made for (cosign's
    /// `docker-reference`), the registry's host in lowercase (host names
    /// are case-insensitive; repositories are lowercase already).
    pub fn repository_name(&self) -> String {
        format!(
            "{}/{}",
            self.registry().to_ascii_lowercase(),
            self.repository()
        )
    }

    /// The tag, if the reference names one.
    pub fn tag(&self) -> Option<&str> {
        self.tag.map(|range| self.slice(range))
    }

    /// The manifest digest, if the reference pins one.
    pub fn digest(&self) -> Option<&str> {
        self.digest
            .and_then(|start| self.text.get(usize::from(start)..))
    }

    /// The same repository at manifest `digest`.
    pub fn at_digest(&self, digest: &str) -> Reference {
        Self::from_parts(self.registry(), self.repository(), None, Some(digest))
    }

    /// The same repository at `tag`.
    pub fn at_tag(&self, tag: &str) -> Reference {
        Self::from_parts(self.registry(), self.repository(), Some(tag), None)
    }

    /// Whether the registry is on this machine (`localhost`, `127.x.x.x`,
    /// `[::1]`): the only registries plain HTTP may reach, and only when
    /// asked.
    pub fn is_loopback(&self) -> bool {
        super::grants::address::is_loopback_host(self.host())
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for Reference {
    type Err = InvalidReference;

    /// Parses `REGISTRY/REPO[:TAG][@sha256:HEX]`, with or without `oci://`.
    fn from_str(text: &str) -> Result<Self, InvalidReference> {
        let invalid = |problem: &str| InvalidReference {
            reference: crate::text::truncate(text, 200),
            problem: problem.to_owned(),
        };
        let rest = text.strip_prefix(SCHEME).unwrap_or(text);
        if rest.is_empty()
            || rest.len() > MAX_LEN
            || rest.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(invalid(
                "a reference is REGISTRY/REPO:TAG or REGISTRY/REPO@sha256:DIGEST",
            ));
        }
        let (rest, digest) = match rest.split_once('@') {
            Some((rest, digest)) => {
                if !is_digest(digest) {
                    return Err(invalid(
                        "the digest must be sha256: and 64 lowercase hex digits",
                    ));
                }
                (rest, Some(digest.to_owned()))
            }
            None => (rest, None),
        };
        let Some((registry, path)) = rest.split_once('/') else {
            return Err(invalid("name the registry: REGISTRY/REPO:TAG"));
        };
        let registry_ok =
            registry == "localhost" || registry.contains('.') || registry.contains(':');
        if !registry_ok {
            return Err(invalid(
                "the first part must be a registry (a host name with a dot, host:port, or localhost)",
            ));
        }
        // A tag follows the last `:` of the path (the registry's port is
        // already split off).
        let (repository, tag) = match path.rsplit_once(':') {
            Some((repository, tag)) => (repository, Some(tag.to_owned())),
            None => (path, None),
        };
        if !repository.split('/').all(is_path_component) {
            return Err(invalid(
                "a repository is `/`-separated parts of lowercase letters and digits, each \
                 starting and ending with one, joined within a part by `.`, `_`, `__` or dashes",
            ));
        }
        if let Some(tag) = &tag {
            let tag_ok = tag.len() <= 128
                && tag
                    .bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
                && tag
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if !tag_ok {
                return Err(invalid(
                    "a tag is up to 128 letters, digits, `.`, `_`, `-`, not starting with `.` or `-`",
                ));
            }
        }
        if tag.is_none() && digest.is_none() {
            return Err(invalid("name a tag (:TAG) or a digest (@sha256:…)"));
        }
        Ok(Self::from_parts(
            registry,
            repository,
            tag.as_deref(),
            digest.as_deref(),
        ))
    }
}

/// Whether `part` is a path component of a repository name, as the OCI
/// distribution specification writes it:
/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`. So no part is `.` or `..`, which
/// a URL would take as a step up its path.
fn is_path_component(part: &str) -> bool {
    let bytes = part.as_bytes();
    let plain = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !bytes.first().is_some_and(plain) || !bytes.last().is_some_and(plain) {
        return false;
    }
    bytes
        .split(plain)
        .filter(|separator| !separator.is_empty())
        .all(|separator| {
            matches!(separator, b"." | b"_" | b"__") || separator.iter().all(|b| *b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_and_print_back() {
        for text in [
            "ghcr.io/acme/units:1.0",
            "127.0.0.1:5000/tools/units:latest",
            "localhost/a@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "r.example:443/a/b/c:v1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "ghcr.io/a.b_c__d---e/f0:_v1.0-rc.1",
        ] {
            let parsed: Reference = text.parse().unwrap();
            assert_eq!(parsed.to_string(), text);
            let prefixed: Reference = format!("oci://{text}").parse().unwrap();
            assert_eq!(prefixed, parsed);
        }
        let local: Reference = "127.0.0.1:5000/t:1".parse().unwrap();
        assert!(local.is_loopback());
        assert!(!"ghcr.io/t:1".parse::<Reference>().unwrap().is_loopback());
        for bad in [
            "units:1.0",
            "ghcr.io/acme/units",
            "ghcr.io/Acme/units:1",
            "ghcr.io/acme/units:1.0@sha256:abc",
            "ghcr.io//x:1",
            "ghcr.io/x:bad tag",
            "",
            "localhost:5000/../../etc:1",
            "localhost:5000/a/./b:1",
            "ghcr.io/a..b:1",
            "ghcr.io/a._b:1",
            "ghcr.io/-a:1",
            "ghcr.io/a-:1",
            "ghcr.io/a___b:1",
            "ghcr.io/a:..",
            "ghcr.io/a:-x",
        ] {
            assert!(bad.parse::<Reference>().is_err(), "{bad}");
        }
    }
}
