//! Anthropic wire details: error shape and the models list.

use bytes::Bytes;
use serde_json::json;

use super::ErrorKind;

/// `{"type":"error","error":{"type","message"}}`, the shape the Anthropic
/// SDKs parse into their typed exceptions.
pub fn error_body(kind: ErrorKind, message: &str) -> Bytes {
    let kind = match kind {
        ErrorKind::InvalidRequest => "invalid_request_error",
        ErrorKind::Authentication => "authentication_error",
        ErrorKind::NotFound => "not_found_error",
        ErrorKind::TooLarge => "request_too_large",
        ErrorKind::RateLimit => "rate_limit_error",
        ErrorKind::Api | ErrorKind::Timeout => "api_error",
        ErrorKind::Overloaded => "overloaded_error",
    };
    Bytes::from(json!({"type": "error", "error": {"type": kind, "message": message}}).to_string())
}

/// `GET /v1/models` in Anthropic's shape, for clients that send
/// `anthropic-version` (the Anthropic SDK's `models.list()`).
pub fn models_list<'a>(aliases: impl Iterator<Item = &'a str>) -> Bytes {
    let data: Vec<_> = aliases
        .map(|id| json!({"type": "model", "id": id, "display_name": id, "created_at": "1970-01-01T00:00:00Z"}))
        .collect();
    let first = data.first().and_then(|m| m["id"].as_str()).map(str::to_owned);
    let last = data.last().and_then(|m| m["id"].as_str()).map(str::to_owned);
    Bytes::from(json!({"data": data, "has_more": false, "first_id": first, "last_id": last}).to_string())
}
