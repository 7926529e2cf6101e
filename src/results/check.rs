//! A saved result's JSON text, checked before Python parses it: what no real result holds
//! and what would make the parser or the code after it misbehave.
//!
//! Result files come from anyone (attached to a bug report, downloaded from a cluster).
//! Python's `json` takes any nesting until its recursion limit (a `RecursionError`, or a
//! walk of the parsed document that overflows later), any number of digits (parsing a
//! 100,000-digit integer is quadratic on Python 3.9 and 3.10 without the digit limit, and
//! a big integer reaches Rust as an `OverflowError`), `NaN` and `Infinity` (not JSON), and
//! `1e400` (an infinite float). One linear pass over the bytes refuses all of them, naming
//! the byte where it found them; what remains is ordinary JSON whose syntax Python's parser
//! checks and whose fields `results`' schema checks.
//!
//! The text must be UTF-8 (the caller decodes it first, as results are always written):
//! every byte that matters here is ASCII, and no byte of a multi-byte character is. Python
//! calls it as `check_result_json` (`results::py`).

/// Arrays and objects inside one another. A trace result, the deepest kind, nests 8 levels
/// (document, data, snapshot, memlab_rs, start, segments, segment, blocks); torch's own
/// snapshot as JSON about as many.
pub const MAX_DEPTH: usize = 64;

/// Characters of one number. A u64 has 20 digits, Python's shortest float repr at most 24
/// characters (`-2.2250738585072014e-308`).
pub const MAX_NUMBER: usize = 32;

/// Why the text is refused, and at which byte.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    TooDeep(usize),
    LongNumber(usize),
    InfiniteNumber(usize),
    NotANumber(usize),
}

impl Refusal {
    pub fn describe(&self) -> String {
        match self {
            Refusal::TooDeep(at) => format!(
                "arrays and objects nested more than {MAX_DEPTH} deep (at byte {at}); no result \
                 nests more than 8"
            ),
            Refusal::LongNumber(at) => format!(
                "a number of more than {MAX_NUMBER} characters (at byte {at}); results hold \
                 byte counts, which fit in 20 digits"
            ),
            Refusal::InfiniteNumber(at) => {
                format!("a number too large for a float (at byte {at})")
            }
            Refusal::NotANumber(at) => {
                format!("NaN or Infinity (at byte {at}), which is not JSON")
            }
        }
    }
}

/// Check `text` (UTF-8 JSON): nesting, number lengths, no NaN, Infinity or infinite float.
/// Syntax is left to the parser: a damaged text either passes here and fails there, or
/// fails here first.
pub fn check(text: &[u8]) -> Result<(), Refusal> {
    let mut depth = 0usize;
    let mut i = 0usize;
    let n = text.len();
    while i < n {
        match text[i] {
            b'"' => {
                // A string: skip to its closing quote, escapes included.
                i += 1;
                while i < n && text[i] != b'"' {
                    i += if text[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(Refusal::TooDeep(i));
                }
                i += 1;
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'N' | b'I' => return Err(Refusal::NotANumber(i)),
            b'-' | b'0'..=b'9' => {
                let start = i;
                if text[i] == b'-' && text.get(i + 1) == Some(&b'I') {
                    return Err(Refusal::NotANumber(i));
                }
                while i < n && matches!(text[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                    i += 1;
                    if i - start > MAX_NUMBER {
                        return Err(Refusal::LongNumber(start));
                    }
                }
                let token = &text[start..i];
                if token.iter().any(|c| matches!(c, b'.' | b'e' | b'E')) {
                    // ASCII by construction; what does not parse is the parser's to refuse.
                    let parsed = std::str::from_utf8(token)
                        .ok()
                        .and_then(|t| t.parse::<f64>().ok());
                    if parsed.is_some_and(|f| f.is_infinite()) {
                        return Err(Refusal::InfiniteNumber(start));
                    }
                }
            }
            _ => i += 1,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_results_pass() {
        let doc = br#"{"format": "memlab_rs.result", "schema": 1, "data": {"a": [1, -2, 3.5e-3,
            18446744073709551615, -2.2250738585072014e-308, "N[[[[I\"{", null, true]}}"#;
        assert_eq!(check(doc), Ok(()));
    }

    #[test]
    fn depth_is_bounded_outside_strings_only() {
        let deep = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert_eq!(check(deep.as_bytes()), Ok(()));
        let deeper = "[".repeat(MAX_DEPTH + 1);
        assert_eq!(check(deeper.as_bytes()), Err(Refusal::TooDeep(MAX_DEPTH)));
        let quoted = format!("[\"{}\"]", "[".repeat(1000));
        assert_eq!(check(quoted.as_bytes()), Ok(()));
        // siblings do not add up
        let wide = "[[]]".repeat(10_000);
        assert_eq!(check(wide.as_bytes()), Ok(()));
    }

    #[test]
    fn numbers_are_bounded() {
        let long = format!("[{}]", "9".repeat(MAX_NUMBER + 1));
        assert_eq!(check(long.as_bytes()), Err(Refusal::LongNumber(1)));
        let fits = format!("[{}]", "9".repeat(MAX_NUMBER));
        assert_eq!(check(fits.as_bytes()), Ok(()));
        assert_eq!(check(b"[1e400]"), Err(Refusal::InfiniteNumber(1)));
        assert_eq!(check(b"[-1E309]"), Err(Refusal::InfiniteNumber(1)));
        assert_eq!(check(b"[1e-400]"), Ok(())); // zero, finite
    }

    #[test]
    fn nan_and_infinity_are_refused() {
        for text in [&b"[NaN]"[..], b"{\"a\": Infinity}", b"[-Infinity]"] {
            assert!(
                matches!(check(text), Err(Refusal::NotANumber(_))),
                "{text:?}"
            );
        }
    }

    #[test]
    fn an_unterminated_string_or_escape_is_the_parsers_to_refuse() {
        assert_eq!(check(b"[\"abc"), Ok(()));
        assert_eq!(check(b"[\"abc\\"), Ok(()));
    }
}
