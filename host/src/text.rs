//! Bounded text. What podstamp logs, keeps or sends that came from
//! elsewhere (a plugin's error, a failure message built from one) is cut to
//! a size before it goes anywhere, at a char boundary, and says it was cut.

/// `text` if it is at most `max` bytes; else its start, cut at a char
/// boundary, followed by how long it was.
pub fn cut(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let original = text.len();
    text.truncate(text.floor_char_boundary(max));
    text.push_str(&format!("… (cut: {original} bytes in all)"));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_at_a_char_boundary_and_says_how_long_it_was() {
        assert_eq!(cut("short".into(), 5), "short");
        assert_eq!(cut("ééé".into(), 3), "é… (cut: 6 bytes in all)");
    }
}
