//! Readers for the field types several config sections share, each pushing
//! a problem with the field's path when the value is invalid.

use std::time::Duration;

/// Parses an optional duration field, pushing a problem when it is invalid.
pub(super) fn duration(path: &str, value: &Option<String>, default: Duration, problems: &mut Vec<String>) -> Duration {
    match value {
        None => default,
        Some(text) => match humantime::parse_duration(text) {
            Ok(d) if !d.is_zero() => d,
            _ => {
                problems.push(format!("{path}: {text:?} is not a duration like 10s or 500ms"));
                default
            }
        },
    }
}
