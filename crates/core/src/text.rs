//! Text cut to a size, for messages that quote what others wrote (an error, a response body)
//! and must stay short.

/// `text` cut to at most `max` bytes (at a character boundary), with `…` marking a cut.
pub fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::shorten;

    #[test]
    fn text_is_cut_at_a_character_boundary_and_marked() {
        assert_eq!(shorten("short", 10), "short");
        assert_eq!(shorten("abcdef", 3), "abc…");
        assert_eq!(
            shorten("ééé", 3),
            "é…",
            "é is two bytes: the cut backs off to a boundary"
        );
    }
}
