//! OpenAI wire details: error shape and the `/v1/models` list.

use bytes::Bytes;
use serde_json::json;

use super::ErrorKind;

/// `{"error":{"message","type","code"}}`, the shape the OpenAI SDKs parse
/// into their typed exceptions.
pub fn error_body(kind: ErrorKind, message: &str, code: Option<&str>) -> Bytes {
    let kind = match kind {
        ErrorKind::InvalidRequest | ErrorKind::NotFound | ErrorKind::TooLarge => "invalid_request_error",
        ErrorKind::Authentication => "authentication_error",
        ErrorKind::RateLimit => "rate_limit_error",
        ErrorKind::Api | ErrorKind::Overloaded => "api_error",
        ErrorKind::Timeout => "timeout_error",
    };
    Bytes::from(json!({"error": {"message": message, "type": kind, "param": null, "code": code}}).to_string())
}

/// `GET /v1/models` answer listing the configured aliases.
pub fn models_list<'a>(aliases: impl Iterator<Item = &'a str>) -> Bytes {
    let data: Vec<_> =
        aliases.map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "tidegate"})).collect();
    Bytes::from(json!({"object": "list", "data": data}).to_string())
}
