//! `/ui`: the dashboard, a static page built into the binary.
//!
//! The page itself holds no data and needs no key: it shows a login form,
//! keeps the admin key in the browser's session storage (never in a URL)
//! and reads `/admin/upstreams`, `/admin/stats` and `/admin/requests`,
//! which do need it. Nothing is fetched from anywhere else; the
//! content-security policy says so to the browser.

use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};

const INDEX: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/style.css");

fn file(content_type: &'static str, body: &'static str) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    resp
}

/// `GET /ui`.
pub async fn page() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/app.js`, `GET /ui/style.css`.
pub async fn asset(Path(name): Path<String>) -> Response {
    match name.as_str() {
        "app.js" => file("text/javascript; charset=utf-8", APP_JS),
        "style.css" => file("text/css; charset=utf-8", STYLE),
        _ => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}
