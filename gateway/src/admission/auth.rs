//! Client key check, in constant time.

use http::HeaderMap;
use http::header::AUTHORIZATION;
use subtle::ConstantTimeEq;

use crate::config::ClientKey;
use crate::error::GatewayError;

/// The header a Gemini client's key arrives in (and where one sent as
/// `?key=` is put, so it is checked like the others and never forwarded).
pub const GOOG_API_KEY: http::HeaderName = http::HeaderName::from_static("x-goog-api-key");
/// Anthropic's key header. (Names as constants: a lookup by `&str` parses
/// the name first, on every request.)
const X_API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");

/// The key a client presented: `Authorization: Bearer <key>` (OpenAI SDKs),
/// `x-api-key` (Anthropic SDKs) or `x-goog-api-key` (Google's).
fn presented(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(value) = headers.get(AUTHORIZATION) {
        let bytes = value.as_bytes();
        if bytes.len() > 7 && bytes[..7].eq_ignore_ascii_case(b"bearer ") {
            return Some(bytes[7..].trim_ascii());
        }
    }
    headers.get(X_API_KEY).or_else(|| headers.get(GOOG_API_KEY)).map(|v| v.as_bytes().trim_ascii())
}

/// A Gemini client's key sent in the URL (`?key=…`, as Google's REST
/// examples do), moved to [`GOOG_API_KEY`] unless a key header is already
/// there. The URL itself is never logged or forwarded.
pub fn key_from_query(uri: &http::Uri, headers: &mut HeaderMap) {
    let Some(query) = uri.query() else { return };
    if presented(headers).is_some() {
        return;
    }
    let key = url::form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "key").map(|(_, v)| v.into_owned());
    if let Some(mut value) = key.and_then(|k| http::HeaderValue::try_from(k).ok()) {
        value.set_sensitive(true);
        headers.insert(GOOG_API_KEY, value);
    }
}

/// No key, or a key that is not one of the configured ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadKey;

/// Returns the matching key's name; `Ok(None)` when no keys are configured.
/// Every configured key is compared, so timing reveals neither the key nor
/// which entry matched.
pub fn authenticate<'a>(keys: &'a [ClientKey], headers: &HeaderMap) -> Result<Option<&'a str>, BadKey> {
    if keys.is_empty() {
        return Ok(None);
    }
    let given = presented(headers).ok_or(BadKey)?;
    let mut found = None;
    for key in keys {
        if bool::from(key.key.expose().as_bytes().ct_eq(given)) {
            found = Some(key.name.as_str());
        }
    }
    found.map(Some).ok_or(BadKey)
}

/// Keyless mode (no `client_keys`) serves local clients only: a request
/// whose `Host` (DNS rebinding) or `Origin` (a page in a browser, even a
/// "simple" cross-site `text/plain` POST) is not loopback, nor listed in
/// `allowed_origins`, is refused — it would spend the operator's upstream
/// keys. Clients that send neither (SDKs, curl, agents) pass.
pub fn local_only(headers: &HeaderMap, allowed: &[String]) -> Result<(), GatewayError> {
    // The common case, a local client with no Origin: no parsing.
    let origin = headers.get(http::header::ORIGIN);
    if origin.is_none() && headers.get(http::header::HOST).is_none_or(|h| local_host_fast(h.as_bytes())) {
        return Ok(());
    }
    let listed = |host: &str| allowed.iter().any(|a| a.eq_ignore_ascii_case(host));
    if let Some(host) = headers.get(http::header::HOST) {
        let host = host.to_str().unwrap_or("?");
        let name = strip_port(host);
        if !is_loopback(name) && !listed(name) && !listed(host) {
            return Err(GatewayError::Forbidden(format!(
                "Host {host:?} is not this machine: without client_keys tidegate serves local clients only \
                 (add it to allowed_origins, or configure client_keys)"
            )));
        }
    }
    if let Some(origin) = headers.get(http::header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("?");
        let host = url::Url::parse(origin).ok().and_then(|u| u.host_str().map(str::to_owned));
        let ok =
            host.as_deref().is_some_and(|h| is_loopback(h.trim_start_matches('[').trim_end_matches(']')) || listed(h))
                || listed(origin);
        if !ok {
            return Err(GatewayError::Forbidden(format!(
                "requests from the web page {origin:?} are refused: without client_keys tidegate serves local \
                 clients only (add the origin to allowed_origins, or configure client_keys)"
            )));
        }
    }
    Ok(())
}

/// `127.0.0.1[:port]` or `localhost[:port]`, without parsing.
fn local_host_fast(host: &[u8]) -> bool {
    let rest = host.strip_prefix(b"127.0.0.1").or_else(|| host.strip_prefix(b"localhost"));
    rest.is_some_and(|r| r.is_empty() || (r[0] == b':' && r[1..].iter().all(u8::is_ascii_digit)))
}

fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':').filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit())).map_or(host, |(h, _)| h)
}

fn is_loopback(name: &str) -> bool {
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn keys() -> Vec<ClientKey> {
        vec![
            ClientKey { name: "alice".into(), key: Secret::new("k-alice"), lane: Default::default() },
            ClientKey { name: "bob".into(), key: Secret::new("k-bob"), lane: Default::default() },
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
        assert_eq!(authenticate(&k, &headers(&[("x-goog-api-key", "k-bob")])), Ok(Some("bob")));
        let mut h = HeaderMap::new();
        key_from_query(&"/v1beta/models/m:generateContent?alt=sse&key=k-alice".parse().unwrap(), &mut h);
        assert_eq!(authenticate(&k, &h), Ok(Some("alice")));
    }

    #[test]
    fn rejects_missing_wrong_and_prefix_keys() {
        let k = keys();
        assert_eq!(authenticate(&k, &headers(&[])), Err(BadKey));
        assert_eq!(authenticate(&k, &headers(&[("x-api-key", "k-alic")])), Err(BadKey));
        assert_eq!(authenticate(&k, &headers(&[("x-api-key", "k-alice2")])), Err(BadKey));
        assert_eq!(authenticate(&k, &headers(&[("authorization", "Basic k-alice")])), Err(BadKey));
        assert_eq!(authenticate(&[], &headers(&[])), Ok(None));
    }

    #[test]
    fn keyless_mode_serves_local_clients_only() {
        let none: &[String] = &[];
        assert!(local_only(&headers(&[("host", "127.0.0.1:8787")]), none).is_ok());
        assert!(local_only(&headers(&[("host", "localhost:8787"), ("origin", "http://localhost:3000")]), none).is_ok());
        assert!(local_only(&headers(&[("host", "[::1]:8787")]), none).is_ok());
        assert!(local_only(&headers(&[]), none).is_ok());
        // DNS rebinding: a foreign name resolving to 127.0.0.1.
        assert!(local_only(&headers(&[("host", "evil.example:8787")]), none).is_err());
        // A cross-site page posting text/plain.
        assert!(local_only(&headers(&[("host", "127.0.0.1:8787"), ("origin", "https://evil.example")]), none).is_err());
        assert!(local_only(&headers(&[("host", "127.0.0.1:8787"), ("origin", "null")]), none).is_err());
        let allowed = vec!["https://app.example".to_string(), "gw.internal".to_string()];
        assert!(
            local_only(&headers(&[("host", "gw.internal:8787"), ("origin", "https://app.example")]), &allowed).is_ok()
        );
    }
}
