//! Amazon Bedrock as an Anthropic upstream.
//!
//! The client's Messages body goes as is, except that `model` moves into
//! the URL (`/model/{id}/invoke`, `/invoke-with-response-stream` for a
//! stream), `stream` is dropped (the URL says it), `anthropic_version`
//! becomes `bedrock-2023-05-31` and an `anthropic-beta` header becomes the
//! body's `anthropic_beta`. Requests are signed with AWS Signature V4 by
//! the `aws-sigv4` crate. Errors (`ThrottlingException`, …) are rewritten
//! into the Anthropic error of the same meaning, so classification, the
//! journal and a client that gets the final error all read them as
//! Anthropic's own.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use bytes::Bytes;
use http::HeaderMap;
use http_body_util::Full;
use percent_encoding::utf8_percent_encode;

use super::PATH_LABEL;
use crate::config::BedrockConfig;
use crate::protocol::ErrorKind;

/// `anthropic_version` Bedrock requires in the body.
pub const ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";

/// SigV4 service name of `bedrock-runtime`.
const SERVICE: &str = "bedrock";

/// A Bedrock upstream's region and credentials.
pub struct Bedrock {
    region: String,
    identity: Identity,
}

impl Bedrock {
    /// From the validated config (credentials resolved from the config or
    /// the standard AWS environment variables at load).
    pub fn new(config: &BedrockConfig) -> Self {
        let credentials = Credentials::new(
            config.access_key_id.expose(),
            config.secret_access_key.expose(),
            config.session_token.as_ref().map(|t| t.expose().to_owned()),
            None,
            "tidegate-config",
        );
        Self { region: config.region.clone(), identity: credentials.into() }
    }

    /// The path for `model` (a model id, inference profile or ARN).
    pub fn path(model: &str, stream: bool) -> String {
        let verb = if stream { "invoke-with-response-stream" } else { "invoke" };
        format!("/model/{}/{verb}", utf8_percent_encode(model, PATH_LABEL))
    }

    /// Signs `req` (whose body is `body`) as of `time`.
    pub fn sign(&self, req: &mut http::Request<Full<Bytes>>, body: &[u8], time: SystemTime) -> Result<(), SignError> {
        sign_request(req, body, &["host", "content-type"], &self.identity, &self.region, SERVICE, time)
    }
}

/// A request SigV4 could not sign (the credentials or the request's
/// shape; the message never holds a key).
#[derive(Debug, thiserror::Error)]
#[error("cannot sign: {0}")]
pub struct SignError(String);

/// Signs `req` with SigV4: the listed headers (those present), the method,
/// URI and body hash; adds `x-amz-date`, `authorization` and, with a
/// session token, `x-amz-security-token`. The simulator verifies with the
/// same function.
pub fn sign_request(
    req: &mut http::Request<Full<Bytes>>,
    body: &[u8],
    headers: &[&str],
    identity: &Identity,
    region: &str,
    service: &str,
    time: SystemTime,
) -> Result<(), SignError> {
    let params = v4::SigningParams::builder()
        .identity(identity)
        .region(region)
        .name(service)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| SignError(e.to_string()))?
        .into();
    let instructions = {
        let uri = req.uri().to_string();
        let signed = headers.iter().filter_map(|name| {
            let value = req.headers().get(*name)?.to_str().ok()?;
            Some((*name, value))
        });
        let signable = SignableRequest::new(req.method().as_str(), &uri, signed, SignableBody::Bytes(body))
            .map_err(|e| SignError(e.to_string()))?;
        let (instructions, _signature) = sign(signable, &params).map_err(|e| SignError(e.to_string()))?.into_parts();
        instructions
    };
    instructions.apply_to_request_http1x(req);
    Ok(())
}

/// An identity from plain keys (tests and the simulator).
pub fn identity(key_id: &str, secret: &str, token: Option<&str>) -> Identity {
    Credentials::new(key_id, secret, token.map(str::to_owned), None, "tidegate").into()
}

/// The Messages body as Bedrock takes it (see the module docs); `None` if
/// it is not a JSON object.
pub fn body(original: &[u8], client: &HeaderMap) -> Option<Bytes> {
    let betas: Vec<&str> = client
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|b| !b.is_empty())
        .collect();
    let beta = (!betas.is_empty()).then(|| serde_json::to_string(&betas).unwrap_or_default());
    let version = serde_json::to_string(ANTHROPIC_VERSION).unwrap_or_default();
    let mut add = vec![("anthropic_version", version.as_str())];
    if let Some(beta) = &beta {
        add.push(("anthropic_beta", beta.as_str()));
    }
    super::rewrap(original, &["model", "stream"], &add)
}

/// The error kind of a Bedrock exception, by its name
/// (`ThrottlingException` or `throttlingException` in streams).
fn kind_of(exception: &str) -> ErrorKind {
    let name = exception.to_ascii_lowercase();
    match name.trim_end_matches("exception") {
        "throttling" | "servicequotaexceeded" | "toomanyrequests" => ErrorKind::RateLimit,
        "serviceunavailable" | "modelnotready" => ErrorKind::Overloaded,
        "validation" => ErrorKind::InvalidRequest,
        "accessdenied" => ErrorKind::Permission,
        "unrecognizedclient"
        | "invalidsignature"
        | "expiredtoken"
        | "incompletesignature"
        | "missingauthenticationtoken" => ErrorKind::Authentication,
        "resourcenotfound" => ErrorKind::NotFound,
        _ => ErrorKind::Api,
    }
}

/// The Anthropic error for a Bedrock exception; the message keeps the
/// exception's name (`ThrottlingException: Too many requests…`).
pub fn anthropic_error(exception: &str, message: &str) -> Bytes {
    super::anthropic_error(kind_of(exception), exception, message)
}

/// An HTTP error answer from Bedrock as the Anthropic error it stands for
/// (`x-amzn-ErrorType` names the exception, the body holds `message`);
/// `None` when it already is one.
pub fn error_body(headers: &HeaderMap, body: &[u8]) -> Option<Bytes> {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    if parsed.as_ref().is_some_and(|v| v.get("type").and_then(|t| t.as_str()) == Some("error")) {
        return None;
    }
    let named = headers
        .get("x-amzn-errortype")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(':').next().unwrap_or(v).trim().to_owned())
        .or_else(|| parsed.as_ref()?.get("__type")?.as_str().map(|t| t.rsplit('#').next().unwrap_or(t).to_owned()));
    let message = parsed
        .as_ref()
        .and_then(|v| v.get("message").or_else(|| v.get("Message")))
        .and_then(|m| m.as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
    let exception = named.filter(|n| !n.is_empty()).unwrap_or_else(|| "BedrockError".into());
    Some(anthropic_error(&exception, &message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(stamp: &str) -> SystemTime {
        let ts: jiff::Timestamp = stamp.parse().unwrap();
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(ts.as_second() as u64)
    }

    /// Vectors from AWS's SigV4 test suite (`aws-signing-test-suite/v4`,
    /// the same suite the crate tests with) and the documented IAM
    /// `ListUsers` example: each request signed by [`sign_request`] must
    /// carry exactly the published `Authorization` header.
    #[test]
    fn signer_matches_the_published_vectors() {
        let key = identity("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None);
        let token = "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267";
        let with_token = identity("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", Some(token));
        let scope = "AKIDEXAMPLE/20150830/us-east-1/service/aws4_request";
        let cases: [(&str, &str, &str, &Identity, &str, &str, &str); 6] = [
            (
                "get-vanilla",
                "GET",
                "https://example.amazonaws.com/",
                &key,
                "service",
                "host;x-amz-date",
                "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
            ),
            (
                "post-vanilla",
                "POST",
                "https://example.amazonaws.com/",
                &key,
                "service",
                "host;x-amz-date",
                "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
            ),
            (
                "post-vanilla-query",
                "POST",
                "https://example.amazonaws.com/?Param1=value1",
                &key,
                "service",
                "host;x-amz-date",
                "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11",
            ),
            (
                "get-vanilla-query-order-key-case",
                "GET",
                "https://example.amazonaws.com/?Param2=value2&Param1=value1",
                &key,
                "service",
                "host;x-amz-date",
                "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
            ),
            (
                "get-vanilla-with-session-token",
                "GET",
                "https://example.amazonaws.com/",
                &with_token,
                "service",
                "host;x-amz-date;x-amz-security-token",
                "07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8",
            ),
            (
                "iam-list-users",
                "GET",
                "https://iam.amazonaws.com/?Action=ListUsers&Version=2010-05-08",
                &key,
                "iam",
                "content-type;host;x-amz-date",
                "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7",
            ),
        ];
        for (name, method, uri, who, service, signed, signature) in cases {
            let mut req = http::Request::new(Full::new(Bytes::new()));
            *req.method_mut() = method.parse().unwrap();
            *req.uri_mut() = uri.parse().unwrap();
            let host = req.uri().host().unwrap().to_owned();
            req.headers_mut().insert("host", host.parse().unwrap());
            if service == "iam" {
                req.headers_mut()
                    .insert("content-type", "application/x-www-form-urlencoded; charset=utf-8".parse().unwrap());
            }
            sign_request(
                &mut req,
                b"",
                &["host", "content-type"],
                who,
                "us-east-1",
                service,
                at("2015-08-30T12:36:00Z"),
            )
            .unwrap();
            let scope = if service == "iam" { scope.replace("/service/", "/iam/") } else { scope.to_owned() };
            let expected =
                format!("AWS4-HMAC-SHA256 Credential={scope}, SignedHeaders={signed}, Signature={signature}");
            assert_eq!(req.headers()["authorization"], expected.as_str(), "{name}");
            assert_eq!(req.headers()["x-amz-date"], "20150830T123600Z", "{name}");
        }
    }

    #[test]
    fn body_moves_model_to_the_url_and_sets_the_version() {
        let mut client = HeaderMap::new();
        client.insert("anthropic-beta", "a-2025, b-2026".parse().unwrap());
        let original =
            br#"{"model":"claude","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"model"}]}"#;
        let out = body(original, &client).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"max_tokens":5,"messages":[{"role":"user","content":"model"}],
                "anthropic_version":"bedrock-2023-05-31","anthropic_beta":["a-2025","b-2026"]})
        );
        assert_eq!(
            Bedrock::path("anthropic.claude-3-5-sonnet-20240620-v1:0", true),
            "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/invoke-with-response-stream"
        );
        assert_eq!(
            Bedrock::path("arn:aws:bedrock:us-east-1:1:inference-profile/us.x", false),
            "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fus.x/invoke"
        );
    }

    #[test]
    fn errors_read_as_their_anthropic_equivalents() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-amzn-errortype",
            "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/".parse().unwrap(),
        );
        let out = error_body(&h, br#"{"message":"Too many requests, please wait before trying again."}"#).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(v["error"]["message"], "ThrottlingException: Too many requests, please wait before trying again.");
        for (name, kind) in [
            ("ServiceUnavailableException", "overloaded_error"),
            ("ModelNotReadyException", "overloaded_error"),
            ("AccessDeniedException", "permission_error"),
            ("ValidationException", "invalid_request_error"),
            ("UnrecognizedClientException", "authentication_error"),
            ("InvalidSignatureException", "authentication_error"),
            ("ModelStreamErrorException", "api_error"),
        ] {
            let body = String::from_utf8_lossy(&anthropic_error(name, "x")).into_owned();
            assert!(body.contains(&format!(r#""type":"{kind}""#)), "{name}");
        }
        assert!(error_body(&HeaderMap::new(), br#"{"type":"error","error":{"type":"x"}}"#).is_none());
    }
}
