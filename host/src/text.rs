//! Shortening text for messages without splitting a UTF-8 character.

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
