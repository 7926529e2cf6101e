//! Byte sizes as text: pytorch_memlab's compact form ("4.00M"), a human form ("4.0 MiB"), and
//! sizes people write ("512 MB", "1.5GiB") parsed exactly (`parse_bytes`). Python reaches
//! them through `text::py` (`readable_size`, `parse_size`).
//!
//! pytorch_memlab formats sizes with `'{:.2f}'.format(calmsize.size(n))`: the largest
//! 1024-based unit that fits the absolute value, two decimals, no space. We reproduce that
//! exactly, including its quirks (`1024.00K` for 1048575 bytes, `infP`), because users diff
//! our output against theirs.

const UNITS: [(f64, &str); 6] = [
    (1125899906842624.0, "P"),
    (1099511627776.0, "T"),
    (1073741824.0, "G"),
    (1048576.0, "M"),
    (1024.0, "K"),
    (1.0, "B"),
];

/// pytorch_memlab's size string for a number of bytes ("" for NaN).
pub fn memlab_size(num_bytes: f64) -> String {
    if num_bytes.is_nan() {
        return String::new();
    }
    let magnitude = num_bytes.abs();
    let (factor, unit) = UNITS
        .iter()
        .find(|(factor, _)| magnitude >= *factor)
        .copied()
        .unwrap_or((1.0, "B"));
    let sign = if num_bytes >= 0.0 { 1.0 } else { -1.0 };
    // Rust and Python both round the exact binary value half-to-even here.
    format!("{:.2}{}", magnitude / factor * sign, unit)
}

/// `memlab_size` for byte counts we hold as integers.
pub fn memlab_bytes(num_bytes: i128) -> String {
    // `as f64` rounds to nearest like Python's int -> float, and dividing by a power of two
    // is exact, so this equals Python's `int / int` true division.
    memlab_size(num_bytes as f64)
}

/// `1048576` as `1,048,576`.
pub fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

/// A human form with IEC units ("4.0 MiB"), for HTML and summaries.
pub fn human_bytes(num_bytes: i128) -> String {
    let text = bytesize::ByteSize(num_bytes.unsigned_abs() as u64)
        .display()
        .iec()
        .to_string();
    if num_bytes < 0 {
        format!("-{text}")
    } else {
        text
    }
}

/// What `parse_size` accepts, for its error messages.
pub const SIZE_FORMS: &str = "a whole number of bytes (1048576) or a number and a unit: \
    B, KB, MB, GB, TB, PB, EB (powers of 1000) or KiB, MiB, GiB, TiB, PiB, EiB and K, M, G, \
    T, P, E (powers of 1024, as readable_size writes \"4.00M\"), any case, space optional, \
    e.g. \"512 MB\", \"1.5GiB\", \"16M\"";

/// The bytes one unit of `unit` stands for (any case), or None for no unit we know.
///
/// "KB", "MB", ... are SI (powers of 1000) and "KiB", "MiB", ... IEC (powers of 1024), as
/// everywhere. A bare letter ("K", "M", "G") is what pytorch_memlab's `readable_size` and
/// ours print ("4.00M" is 4 MiB), so it means the power of 1024 too: a size copied from a
/// report parses back to the bytes the report meant. "Ki", "Mi" (no B) are IEC as well.
fn unit_bytes(unit: &str) -> Option<u64> {
    let upper = unit.to_ascii_uppercase();
    if upper.is_empty() || upper == "B" {
        return Some(1);
    }
    let prefix = upper.chars().next()?;
    let power = "KMGTPE".find(prefix)? as u32 + 1;
    match &upper[prefix.len_utf8()..] {
        "" | "I" | "IB" => Some(1024u64.pow(power)),
        "B" => Some(1000u64.pow(power)),
        _ => None,
    }
}

/// The number of bytes a size string means, exactly.
///
/// The units are `unit_bytes`' ("KB" is 1000 bytes; "KiB", "Ki" and "K" 1024). The
/// arithmetic is exact: the decimal digits are an integer and its scale, so "4.1 MB" is
/// 4100000 bytes (an `f64` product, `bytesize`'s, gives 4099999), and a size that is not a
/// whole number of bytes ("0.1 KiB", 102.4 bytes) is an error rather than rounded, except
/// in readable_size's own form, a bare letter ("1.01K": its two decimals are rounded, so
/// the nearest byte, 1034). A bare number is bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("it is empty".to_string());
    }
    if trimmed.starts_with('-') {
        return Err("a size cannot be negative".to_string());
    }
    let number_len = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, rest) = trimmed.split_at(number_len);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err("it does not start with a number".to_string());
    }
    if fraction.contains('.') {
        return Err(format!("{number:?} is not a number"));
    }
    let unit = rest.trim_start();
    let factor = if unit.is_empty() {
        1
    } else {
        match unit_bytes(unit) {
            Some(bytes) => bytes,
            None => return Err(format!("{unit:?} is not a unit")),
        }
    };
    // Trailing zeros of the fraction change nothing: "1.50 KB" is "1.5 KB".
    let fraction = fraction.trim_end_matches('0');
    let too_big = || format!("it is more than {} bytes", u64::MAX);
    let scale = 10u128
        .checked_pow(fraction.len() as u32)
        .ok_or_else(|| format!("{number:?} has too many decimal places"))?;
    let all_digits = format!("{whole}{fraction}");
    let digits: u128 = match all_digits.trim_start_matches('0') {
        "" => 0,
        significant => significant.parse().map_err(|_| too_big())?,
    };
    let scaled = digits.checked_mul(factor as u128).ok_or_else(too_big)?;
    let bytes = if scaled % scale == 0 {
        scaled / scale
    } else if is_report_form(unit) {
        // "1.01K" is what readable_size prints for 1030 to 1039 bytes: it means about that
        // many, so the nearest byte (1034; halves up), not an error.
        scaled.checked_add(scale / 2).ok_or_else(too_big)? / scale
    } else {
        let exact = scaled as f64 / scale as f64;
        return Err(format!("it is {exact} bytes, not a whole number of bytes"));
    };
    u64::try_from(bytes).map_err(|_| too_big())
}

/// Whether `unit` is a bare letter, the form of `readable_size`'s rounded output ("4.00M").
fn is_report_form(unit: &str) -> bool {
    unit.len() == 1 && "KMGTPE".contains(unit.to_ascii_uppercase().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_pytorch_memlab_strings() {
        assert_eq!(memlab_size(0.0), "0.00B");
        assert_eq!(memlab_size(512.0), "512.00B");
        assert_eq!(memlab_size(1024.0), "1.00K");
        assert_eq!(memlab_size(1048575.0), "1024.00K");
        assert_eq!(memlab_size(4194304.0), "4.00M");
        assert_eq!(memlab_size(-2048.0), "-2.00K");
        assert_eq!(memlab_size(f64::NAN), "");
        assert_eq!(memlab_size(1152.0), "1.12K"); // 1.125: a tie, rounded half to even
        assert_eq!(memlab_bytes(1 << 60), "1024.00P");
    }

    #[test]
    fn human_form_uses_iec_units() {
        assert_eq!(human_bytes(4 * 1024 * 1024), "4.0 MiB");
        assert_eq!(human_bytes(-1536), "-1.5 KiB");
    }

    #[test]
    fn parses_sizes_exactly() {
        assert_eq!(parse_bytes("512 MB"), Ok(512_000_000));
        assert_eq!(parse_bytes("1.5GiB"), Ok(1_610_612_736));
        assert_eq!(parse_bytes("2 GB"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("1048576"), Ok(1_048_576));
        assert_eq!(parse_bytes(" 2 mib "), Ok(2 << 20));
        assert_eq!(parse_bytes("1KB"), Ok(1000));
        assert_eq!(parse_bytes("1Ki"), Ok(1024));
        // A bare letter is readable_size's: "4.00M" is 4 MiB, "1.50K" 1536 bytes.
        assert_eq!(parse_bytes("1K"), Ok(1024));
        assert_eq!(parse_bytes("4.00M"), Ok(4 << 20));
        assert_eq!(parse_bytes("1.50k"), Ok(1536));
        assert_eq!(parse_bytes("2 mb"), Ok(2_000_000));
        assert_eq!(parse_bytes("1E"), Ok(1 << 60));
        // readable_size's rounded form means the nearest byte; other units must be exact.
        assert_eq!(parse_bytes("1.01K"), Ok(1034)); // 1034.24
        assert_eq!(parse_bytes("0.0005k"), Ok(1)); // 0.512
        assert_eq!(parse_bytes("0.00048828125K"), Ok(1)); // 0.5: halves up
        assert_eq!(parse_bytes("0.0004K"), Ok(0)); // 0.4096
        assert_eq!(parse_bytes("1 EB"), Ok(1_000_000_000_000_000_000));
        assert_eq!(parse_bytes("0 B"), Ok(0));
        assert_eq!(parse_bytes("0.5KiB"), Ok(512));
        assert_eq!(parse_bytes(".5 KB"), Ok(500));
        assert_eq!(parse_bytes("1.50 KB"), Ok(1500));
        assert_eq!(
            parse_bytes("16 EiB"),
            Err(format!("it is more than {} bytes", u64::MAX))
        );
        assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
        // bytesize's f64 loses a byte here; we do not
        assert_eq!(
            "4.1 MB".parse::<bytesize::ByteSize>().map(|b| b.0),
            Ok(4_099_999)
        );
        assert_eq!(parse_bytes("4.1 MB"), Ok(4_100_000));
    }

    #[test]
    fn rejects_malformed_sizes() {
        for (text, why) in [
            ("", "it is empty"),
            ("   ", "it is empty"),
            ("-1 MB", "a size cannot be negative"),
            ("lots", "it does not start with a number"),
            ("MB", "it does not start with a number"),
            (".", "it does not start with a number"),
            ("1.2.3 MB", "\"1.2.3\" is not a number"),
            ("2 GBs", "\"GBs\" is not a unit"),
            ("2 KIBB", "\"KIBB\" is not a unit"),
            ("2 Z", "\"Z\" is not a unit"),
            ("2 kilobytes", "\"kilobytes\" is not a unit"),
            ("1e3 KB", "\"e3 KB\" is not a unit"),
            ("0.1 KiB", "it is 102.4 bytes, not a whole number of bytes"),
            ("1.5", "it is 1.5 bytes, not a whole number of bytes"),
        ] {
            assert_eq!(parse_bytes(text), Err(why.to_string()), "{text:?}");
        }
    }
}
