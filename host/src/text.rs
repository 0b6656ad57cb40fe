//! Shortening text for messages without splitting a UTF-8 character, and
//! JSON text that a terminal shows rather than acts on.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `e` and each of its causes, `: `-separated, a cause left out when the
/// text before it already says it (HTTP clients repeat their causes).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.contains(&next) {
            text = format!("{text}: {next}");
        }
        source = cause.source();
    }
    text
}

/// `text` if it is at most `max` bytes; otherwise its longest prefix of at
/// most `max` bytes that ends on a character boundary, followed by `…`.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `text` if it is at most `max` bytes; otherwise `…` followed by its
/// longest suffix of at most `max` bytes that starts on a character
/// boundary.
pub fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

/// Characters a terminal (or a reader) may act on rather than show: the
/// C0 and C1 controls, DEL, and the bidi overrides and isolates.
pub fn is_unsafe(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// serde_json text with DEL, the C1 controls and bidi overrides (which it
/// leaves raw) written as `\u` escapes. They can only occur inside JSON
/// strings, where the escape denotes the same character: the document
/// means the same, and printing it moves no cursor.
pub fn safe_json(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_unsafe(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_splits_a_character() {
        assert_eq!(truncate("héllo", 2), "h…");
        assert_eq!(truncate("héllo", 3), "hé…");
        assert_eq!(truncate("abc", 3), "abc");
        assert_eq!(tail("héllo", 4), "…llo");
        assert_eq!(tail("abc", 5), "abc");
    }
}
