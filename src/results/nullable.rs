//! A field that may hold `null` but must be there: what a saved result writes for a figure it
//! could not measure (`"feature_maps": null`). serde reads a missing `Option` field as `None`;
//! a file that lacks the key altogether was not written by memlab_rs, and its reader says so
//! (`rows[1]: missing field `notice``) rather than taking the gap for "not measured".

use serde::{Deserialize, Deserializer};

/// `#[serde(deserialize_with = "nullable")]` on an `Option` field: `null` reads as `None`,
/// a missing key is an error naming the field.
pub fn nullable<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::from_json;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Row {
        #[serde(deserialize_with = "nullable")]
        notice: Option<String>,
    }

    #[test]
    fn null_is_none_and_a_missing_key_is_an_error() {
        assert_eq!(
            from_json::<Row>(r#"{"notice": null}"#),
            Ok(Row { notice: None })
        );
        assert_eq!(
            from_json::<Row>(r#"{"notice": "n"}"#)
                .unwrap()
                .notice
                .as_deref(),
            Some("n")
        );
        let err = from_json::<Vec<Row>>(r#"[{"notice": null}, {}]"#).unwrap_err();
        assert_eq!(err.to_string(), "[1]: missing field `notice`");
    }
}
