//! Lowercase hexadecimal for the few byte strings people type or read:
//! the JSON API's page tokens and the gossip key file. Decoding refuses an
//! odd length, a non-ASCII character and anything not a hex digit.

/// `bytes` as lowercase hex, two digits a byte.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of `text`, or `None` when it is not hex.
pub fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_non_hex_is_refused() {
        let token = vec![1, 0xab, 0, 0xff, b'a'];
        assert_eq!(from_hex(&to_hex(&token)), Some(token));
        for bad in ["a", "zz", "0g", "é0"] {
            assert_eq!(from_hex(bad), None, "{bad}");
        }
    }
}
