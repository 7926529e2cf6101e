//! Counts and byte sizes in a result's data: whole numbers from 0 to 2^63 - 1, what an i64
//! holds, so that every figure a result file carries fits NumPy's int64 and every
//! renderer's arithmetic. A field takes them with `#[serde(deserialize_with = "count")]`
//! (`opt_count` for one that may be null, `counts` for a list); a number out of range is
//! the derive's error at that field, as a wrong type is.

use serde::de::{Error, Unexpected};
use serde::{Deserialize, Deserializer};

/// The largest count a result holds: `i64::MAX`.
pub const MAX: u64 = i64::MAX as u64;

const EXPECTED: &str = "a whole number from 0 to 2^63 - 1";

fn bounded<E: Error>(n: u64) -> Result<u64, E> {
    if n > MAX {
        Err(E::invalid_value(Unexpected::Unsigned(n), &EXPECTED))
    } else {
        Ok(n)
    }
}

/// A count: 0 to 2^63 - 1.
pub fn count<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    bounded(u64::deserialize(d)?)
}

/// A count or null.
pub fn opt_count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<u64>::deserialize(d)?.map(bounded).transpose()
}

/// A list of counts; the error names the item out of range.
pub fn counts<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
    let values = Vec::<u64>::deserialize(d)?;
    if let Some(i) = values.iter().position(|&n| n > MAX) {
        return Err(D::Error::custom(format!(
            "[{i}]: invalid value: integer `{}`, expected {EXPECTED}",
            values[i]
        )));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::from_json;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Doc {
        #[serde(deserialize_with = "count")]
        n: u64,
        #[serde(deserialize_with = "opt_count")]
        m: Option<u64>,
        #[serde(deserialize_with = "counts")]
        list: Vec<u64>,
    }

    #[test]
    fn counts_fit_an_i64() {
        let ok = from_json::<Doc>(r#"{"n":9223372036854775807,"m":null,"list":[0,1]}"#);
        assert_eq!(
            ok,
            Ok(Doc {
                n: MAX,
                m: None,
                list: vec![0, 1]
            })
        );
        let err = from_json::<Doc>(r#"{"n":9223372036854775808,"m":1,"list":[]}"#).unwrap_err();
        assert_eq!(err.path, "n");
        assert!(
            err.message
                .contains("expected a whole number from 0 to 2^63 - 1"),
            "{err}"
        );
        let err = from_json::<Doc>(r#"{"n":1,"m":18446744073709551615,"list":[]}"#).unwrap_err();
        assert_eq!(err.path, "m");
        let err = from_json::<Doc>(r#"{"n":1,"m":1,"list":[1,9223372036854775808]}"#).unwrap_err();
        assert_eq!(err.to_string(), "list: [1]: invalid value: integer `9223372036854775808`, expected a whole number from 0 to 2^63 - 1");
        let err = from_json::<Doc>(r#"{"n":-1,"m":1,"list":[]}"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "n: invalid value: integer `-1`, expected u64"
        );
    }
}
