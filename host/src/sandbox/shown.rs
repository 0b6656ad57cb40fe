//! What a call shows beside its result (the `show` import): each block
//! checked as it is shown, and kept, bounded, until the call ends.
//!
//! A block is refused (and the call fails) when an image's or audio's
//! bytes are not of the kind its MIME type names (read from their first
//! bytes: what a client would decode them as), when a URI's scheme is not
//! one the tool may use, or past [`MAX_BLOCKS`] blocks or the call's
//! `max_result_bytes` in all. Cost: a copy of each block's bytes into
//! base64, and for media a look at its first 12 bytes.

use base64::Engine;

use crate::policy::grants::is_uri_scheme;
use crate::spec::Shown;

/// The most blocks one call may show.
pub const MAX_BLOCKS: usize = 32;

/// The schemes a tool's links and resources may use when the operator
/// names none.
pub const DEFAULT_URI_SCHEMES: [&str; 1] = ["https"];

/// A block as the guest showed it.
#[derive(Debug)]
pub(crate) enum Block {
    Text(String),
    Image(Vec<u8>, String),
    Audio(Vec<u8>, String),
    Link {
        uri: String,
        name: String,
        description: Option<String>,
        mime_type: Option<String>,
    },
    Embedded {
        uri: String,
        mime_type: Option<String>,
        body: Body,
    },
}

/// An embedded resource's contents.
#[derive(Debug)]
pub(crate) enum Body {
    Text(String),
    Blob(Vec<u8>),
}

/// The blocks a call has shown, and what they may still take.
#[derive(Debug, Default)]
pub(crate) struct ShownSoFar {
    blocks: Vec<Shown>,
    bytes: usize,
    max_bytes: usize,
}

impl ShownSoFar {
    /// Nothing shown yet; `max_bytes` in all.
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            blocks: Vec::new(),
            bytes: 0,
            max_bytes,
        }
    }

    /// Checks `block` (its URIs against `schemes`, the tool's
    /// `uri_schemes`; empty: [`DEFAULT_URI_SCHEMES`]) and keeps it; why
    /// not, when it breaks a rule.
    pub(crate) fn push(&mut self, block: Block, schemes: &[String]) -> Result<(), String> {
        if self.blocks.len() >= MAX_BLOCKS {
            return Err(format!(
                "the tool showed more than {MAX_BLOCKS} blocks in one call"
            ));
        }
        let size = match &block {
            Block::Text(text) => text.len(),
            Block::Image(data, kind) | Block::Audio(data, kind) => data.len() + kind.len(),
            Block::Link {
                uri,
                name,
                description,
                mime_type,
            } => {
                uri.len()
                    + name.len()
                    + description.as_ref().map_or(0, String::len)
                    + mime_type.as_ref().map_or(0, String::len)
            }
            Block::Embedded {
                uri,
                mime_type,
                body,
            } => {
                uri.len()
                    + mime_type.as_ref().map_or(0, String::len)
                    + match body {
                        Body::Text(text) => text.len(),
                        Body::Blob(data) => data.len(),
                    }
            }
        };
        if self.bytes + size > self.max_bytes {
            return Err(format!(
                "the tool showed more than {} bytes in one call (max_result_bytes)",
                self.max_bytes
            ));
        }
        let base64 = |data: &[u8]| base64::engine::general_purpose::STANDARD.encode(data);
        let shown = match block {
            Block::Text(text) => Shown::Text { text },
            Block::Image(data, mime_type) => {
                check_media(&data, &mime_type, &IMAGES, "an image")?;
                Shown::Image {
                    data: base64(&data),
                    mime_type,
                }
            }
            Block::Audio(data, mime_type) => {
                check_media(&data, &mime_type, &AUDIO, "audio")?;
                Shown::Audio {
                    data: base64(&data),
                    mime_type,
                }
            }
            Block::Link {
                uri,
                name,
                description,
                mime_type,
            } => {
                check_uri(&uri, schemes)?;
                Shown::ResourceLink {
                    uri,
                    name,
                    description,
                    mime_type,
                }
            }
            Block::Embedded {
                uri,
                mime_type,
                body,
            } => {
                check_uri(&uri, schemes)?;
                let (text, blob) = match body {
                    Body::Text(text) => (Some(text), None),
                    Body::Blob(data) => (None, Some(base64(&data))),
                };
                Shown::Resource {
                    uri,
                    mime_type,
                    text,
                    blob,
                }
            }
        };
        self.bytes += size;
        self.blocks.push(shown);
        Ok(())
    }

    /// Takes what was shown.
    pub(crate) fn take(&mut self) -> Vec<Shown> {
        self.bytes = 0;
        std::mem::take(&mut self.blocks)
    }
}

/// Refuses a URI without a scheme of `schemes` (empty:
/// [`DEFAULT_URI_SCHEMES`]); schemes compare without case.
fn check_uri(uri: &str, schemes: &[String]) -> Result<(), String> {
    let scheme = uri_scheme(uri)
        .ok_or_else(|| format!("the tool showed a URI without a scheme ({})", shorten(uri)))?;
    if scheme_allowed(scheme, schemes) {
        Ok(())
    } else {
        Err(format!(
            "the tool showed a {}: URI, a scheme its policy does not allow (uri_schemes)",
            scheme.to_ascii_lowercase()
        ))
    }
}

/// The scheme of `uri`, when it has one.
pub(crate) fn uri_scheme(uri: &str) -> Option<&str> {
    uri.split_once(':')
        .map(|(scheme, _)| scheme)
        .filter(|s| is_uri_scheme(s))
}

/// Whether `scheme` is one of `schemes` (empty: [`DEFAULT_URI_SCHEMES`]),
/// without case.
pub(crate) fn scheme_allowed(scheme: &str, schemes: &[String]) -> bool {
    if schemes.is_empty() {
        DEFAULT_URI_SCHEMES
            .iter()
            .any(|s| s.eq_ignore_ascii_case(scheme))
    } else {
        schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme))
    }
}

/// A MIME type and how its bytes begin.
type Kind = (&'static str, fn(&[u8]) -> bool);

const IMAGES: [Kind; 4] = [
    ("image/png", |b| b.starts_with(b"\x89PNG\r\n\x1a\n")),
    ("image/jpeg", |b| b.starts_with(&[0xFF, 0xD8, 0xFF])),
    ("image/gif", |b| {
        b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a")
    }),
    ("image/webp", |b| {
        b.starts_with(b"RIFF") && b.get(8..12) == Some(b"WEBP")
    }),
];

const AUDIO: [Kind; 4] = [
    ("audio/wav", |b| {
        b.starts_with(b"RIFF") && b.get(8..12) == Some(b"WAVE")
    }),
    ("audio/mpeg", |b| {
        b.starts_with(b"ID3") || (b.len() >= 2 && b[0] == 0xFF && b[1] & 0xE0 == 0xE0)
    }),
    ("audio/ogg", |b| b.starts_with(b"OggS")),
    ("audio/flac", |b| b.starts_with(b"fLaC")),
];

/// Refuses `data` unless `mime_type` is one of `kinds` and the bytes
/// begin as that type's do.
fn check_media(data: &[u8], mime_type: &str, kinds: &[Kind], what: &str) -> Result<(), String> {
    let essence = mime_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let essence = match essence.as_str() {
        "audio/wave" | "audio/x-wav" => "audio/wav".to_owned(),
        "audio/mp3" => "audio/mpeg".to_owned(),
        _ => essence,
    };
    let Some((_, begins)) = kinds.iter().find(|(name, _)| *name == essence) else {
        let names: Vec<&str> = kinds.iter().map(|(name, _)| *name).collect();
        return Err(format!(
            "the tool showed {what} of type {:?}; the types are {}",
            shorten(mime_type),
            names.join(", ")
        ));
    };
    if begins(data) {
        Ok(())
    } else {
        Err(format!(
            "the tool showed {what} labelled {essence} whose bytes are not {essence}"
        ))
    }
}

/// At most 64 characters of `text`, for a message.
fn shorten(text: &str) -> String {
    crate::text::truncate(text, 64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    #[test]
    fn media_must_be_what_its_type_says() {
        let mut shown = ShownSoFar::new(1 << 20);
        let image = |kind: &str| Block::Image(PNG.to_vec(), kind.into());
        assert!(shown.push(image("image/png"), &[]).is_ok());
        let err = shown.push(image("image/jpeg"), &[]).unwrap_err();
        assert!(err.contains("not image/jpeg"), "{err}");
        let err = shown.push(image("image/svg+xml"), &[]).unwrap_err();
        assert!(err.contains("the types are"), "{err}");
        let wav = b"RIFF\0\0\0\0WAVEfmt ".to_vec();
        assert!(
            shown
                .push(Block::Audio(wav, "audio/wave".into()), &[])
                .is_ok()
        );
        assert_eq!(shown.take().len(), 2);
    }

    #[test]
    fn uris_need_a_scheme_the_policy_allows_and_blocks_are_bounded() {
        let link = |uri: &str| Block::Link {
            uri: uri.into(),
            name: "n".into(),
            description: None,
            mime_type: None,
        };
        let mut shown = ShownSoFar::new(1 << 20);
        assert!(shown.push(link("https://example.com/a"), &[]).is_ok());
        let err = shown.push(link("file:///etc/passwd"), &[]).unwrap_err();
        assert!(err.contains("file:"), "{err}");
        let err = shown.push(link("no scheme"), &[]).unwrap_err();
        assert!(err.contains("without a scheme"), "{err}");
        let test = ["Test".to_owned()];
        assert!(shown.push(link("test://x"), &test).is_ok());
        assert!(shown.push(link("https://x"), &test).is_err());
        let text = |t: &str| Block::Text(t.into());
        let mut small = ShownSoFar::new(10);
        assert!(small.push(text("0123456789"), &[]).is_ok());
        let err = small.push(text("!"), &[]).unwrap_err();
        assert!(err.contains("max_result_bytes"), "{err}");
        let mut many = ShownSoFar::new(1 << 20);
        for _ in 0..MAX_BLOCKS {
            many.push(text(""), &[]).unwrap();
        }
        assert!(many.push(text(""), &[]).is_err());
    }
}
