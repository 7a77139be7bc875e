//! Client key check, in constant time.

use http::HeaderMap;
use http::header::AUTHORIZATION;
use subtle::ConstantTimeEq;

use crate::config::ClientKey;

/// The key a client presented: `Authorization: Bearer <key>` (OpenAI SDKs)
/// or `x-api-key` (Anthropic SDKs).
fn presented(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(value) = headers.get(AUTHORIZATION) {
        let bytes = value.as_bytes();
        if bytes.len() > 7 && bytes[..7].eq_ignore_ascii_case(b"bearer ") {
            return Some(bytes[7..].trim_ascii());
        }
    }
    headers.get("x-api-key").map(|v| v.as_bytes().trim_ascii())
}

/// Returns the matching key's name; `Ok(None)` when no keys are configured.
/// Every configured key is compared, so timing reveals neither the key nor
/// which entry matched.
pub fn authenticate<'a>(keys: &'a [ClientKey], headers: &HeaderMap) -> Result<Option<&'a str>, ()> {
    if keys.is_empty() {
        return Ok(None);
    }
    let given = presented(headers).ok_or(())?;
    let mut found = None;
    for key in keys {
        if bool::from(key.key.expose().as_bytes().ct_eq(given)) {
            found = Some(key.name.as_str());
        }
    }
    found.map(Some).ok_or(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn keys() -> Vec<ClientKey> {
        vec![
            ClientKey { name: "alice".into(), key: Secret::new("k-alice") },
            ClientKey { name: "bob".into(), key: Secret::new("k-bob") },
        ]
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn accepts_bearer_and_x_api_key() {
        let k = keys();
        assert_eq!(authenticate(&k, &headers(&[("authorization", "Bearer k-bob")])), Ok(Some("bob")));
        assert_eq!(authenticate(&k, &headers(&[("authorization", "bearer k-alice")])), Ok(Some("alice")));
        assert_eq!(authenticate(&k, &headers(&[("x-api-key", "k-alice")])), Ok(Some("alice")));
    }

    #[test]
    fn rejects_missing_wrong_and_prefix_keys() {
        let k = keys();
        assert_eq!(authenticate(&k, &headers(&[])), Err(()));
        assert_eq!(authenticate(&k, &headers(&[("x-api-key", "k-alic")])), Err(()));
        assert_eq!(authenticate(&k, &headers(&[("x-api-key", "k-alice2")])), Err(()));
        assert_eq!(authenticate(&k, &headers(&[("authorization", "Basic k-alice")])), Err(()));
        assert_eq!(authenticate(&[], &headers(&[])), Ok(None));
    }
}
