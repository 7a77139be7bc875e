//! The same model on another cloud's quota: Bedrock, Vertex AI and Azure
//! OpenAI targets beside the provider's own API, against the simulator's
//! cloud endpoints (which check a SigV4 signature, a bearer token issued
//! for a signed JWT, an `api-key`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use tidegate::protocol::Protocol;
use tidegate_simulate::{AwsKey, Behavior, Clouds, Fault, GoogleAccount, SimConfig, Simulator};

const AWS_KEY_ID: &str = "AKIDTIDEGATETEST";
const AWS_SECRET: &str = "wJalrXUtnFEMI/tidegate/secret+KEY";
const AWS_TOKEN: &str = "session-token-of-the-test";
const AZURE_KEY: &str = "azure-key-0123456789";
const EMAIL: &str = "tidegate-test@proj-1.iam.gserviceaccount.com";
const OVERLOADED: &str = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;

/// A simulator whose cloud endpoints insist on the test credentials;
/// `models` as in `common::sim`, the Google account's key file in `dir`.
fn cloud_sim(models: &[(&str, Behavior)], dir: &std::path::Path, token_ttl_s: u64) -> Simulator {
    let key_file = dir.join("sim-account.json");
    let config = SimConfig {
        models: models.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        record: true,
        clouds: Clouds {
            aws: Some(AwsKey {
                access_key_id: AWS_KEY_ID.into(),
                secret_access_key: AWS_SECRET.into(),
                region: "us-east-1".into(),
            }),
            google: Some(GoogleAccount { credentials_file: key_file.display().to_string(), token_ttl_s }),
            azure_key: Some(AZURE_KEY.into()),
        },
        ..Default::default()
    };
    // The account file names the token endpoint, which needs the port:
    // bind first, then write the file, then start on that address.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    write_account(&key_file, &format!("http://{port}/token"), EMAIL);
    Simulator::start(port, config).unwrap()
}

/// A service-account key file for the test key, naming `token_uri`.
fn write_account(path: &std::path::Path, token_uri: &str, email: &str) {
    let key =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/google-test-key.pem")).unwrap();
    let json = serde_json::json!({
        "type": "service_account", "project_id": "proj-1", "private_key_id": "k1", "private_key": key,
        "client_email": email, "client_id": "1", "token_uri": token_uri,
    });
    std::fs::write(path, json.to_string()).unwrap();
}

/// Upstreams `direct` (Anthropic API), `bedrock`, `vertex`, `azure` and
/// `openai` at `sim`; `secret` is Bedrock's secret key.
fn clouds_yaml(sim: &Simulator, dir: &std::path::Path, secret: &str, top: &str, models: &str) -> String {
    let base = sim.anthropic_url();
    let key_file = dir.join("tidegate-account.json");
    if !key_file.exists() {
        write_account(&key_file, &format!("{base}/token"), EMAIL);
    }
    format!(
        "listen: 127.0.0.1:0\njournal: \"off\"\ndefaults: {{ retry: {{ base_delay: 10ms, max_delay: 50ms }} }}\n{top}
upstreams:
  - {{ name: direct, protocol: anthropic, base_url: \"{base}\", api_key: {UPSTREAM_KEY} }}
  - {{ name: bedrock-east, kind: bedrock, region: us-east-1, base_url: \"{base}\",
       aws_access_key_id: {AWS_KEY_ID}, aws_secret_access_key: \"{secret}\", aws_session_token: {AWS_TOKEN} }}
  - {{ name: vertex-eu, kind: vertex, region: europe-west1, project: proj-1, base_url: \"{base}\",
       credentials_file: \"{}\" }}
  - {{ name: openai, protocol: openai, base_url: \"{base}/v1\", api_key: {UPSTREAM_KEY} }}
  - {{ name: azure-prod, kind: azure, base_url: \"{base}\", api_key: {AZURE_KEY}, api_version: 2024-10-21 }}
models:
{models}
",
        key_file.display()
    )
}

async fn messages(gw: &tidegate::server::Running, model: &str, stream: bool) -> reqwest::Response {
    let body = serde_json::json!({"model": model, "max_tokens": 16, "stream": stream,
        "messages": [{"role": "user", "content": "hi"}]});
    client()
        .post(url(gw, "/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "tools-2024-04-04")
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn post_json(gw: &tidegate::server::Running, path: &str, body: serde_json::Value) -> reqwest::Response {
    client().post(url(gw, path)).json(&body).send().await.unwrap()
}

fn concat(frames: Vec<bytes::Bytes>) -> String {
    frames.iter().map(|f| String::from_utf8_lossy(f).into_owned()).collect()
}

#[tokio::test]
async fn an_overloaded_anthropic_fails_over_to_bedrock_event_for_event() {
    let dir = tempfile::tempdir().unwrap();
    let bedrock_model = "anthropic.claude-sonnet-v1:0";
    let sim = cloud_sim(
        &[("claude-direct", Behavior { status: Some(529), error_body: OVERLOADED.into(), ..Default::default() })],
        dir.path(),
        3600,
    );
    let models = format!(
        "  claude:\n    targets: [{{ upstream: direct, model: claude-direct }}, {{ upstream: bedrock-east, model: \"{bedrock_model}\" }}]"
    );
    let gw = gateway(&clouds_yaml(&sim, dir.path(), AWS_SECRET, "", &models)).await;

    // Stream: exactly the events a direct Anthropic upstream would send.
    let resp = messages(&gw, "claude", true).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-upstream"], "bedrock-east");
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.unwrap();
    assert_eq!(text, concat(tidegate_simulate::sse_frames(Protocol::Anthropic, bedrock_model, 5)));

    // JSON: the message as Bedrock returns it.
    let resp = messages(&gw, "claude", false).await;
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["content"][0]["text"], "tok0 tok1 tok2 tok3 tok4 ");

    // What Bedrock got: model in the URL, its envelope, a SigV4 signature
    // (the simulator verified it), no Anthropic key.
    let received = sim.state.received();
    let to_bedrock: Vec<_> = received.iter().filter(|r| r.path.starts_with("/model/")).collect();
    assert_eq!(to_bedrock.len(), 2);
    assert_eq!(to_bedrock[0].path, "/model/anthropic.claude-sonnet-v1%3A0/invoke-with-response-stream");
    assert_eq!(to_bedrock[1].path, "/model/anthropic.claude-sonnet-v1%3A0/invoke");
    let body: serde_json::Value = serde_json::from_slice(&to_bedrock[0].body).unwrap();
    assert_eq!(body["anthropic_version"], "bedrock-2023-05-31");
    assert_eq!(body["anthropic_beta"], serde_json::json!(["tools-2024-04-04"]));
    assert!(body.get("model").is_none() && body.get("stream").is_none(), "{body}");
    let headers = &to_bedrock[0].headers;
    let auth = headers["authorization"].to_str().unwrap();
    assert!(auth.starts_with(&format!("AWS4-HMAC-SHA256 Credential={AWS_KEY_ID}/")), "{auth}");
    assert!(auth.contains("/us-east-1/bedrock/aws4_request"), "{auth}");
    assert_eq!(headers["x-amz-security-token"], AWS_TOKEN);
    assert_eq!(headers["accept"], "application/vnd.amazon.eventstream");
    assert!(headers.get("x-api-key").is_none() && headers.get("anthropic-version").is_none());
    assert!(!format!("{headers:?}").contains(AWS_SECRET));
    // The direct target was tried first, then left to cool after its 529.
    assert_eq!(received.iter().filter(|r| r.path == "/v1/messages").count(), 1);
}

#[tokio::test]
async fn a_wrong_secret_is_an_auth_failure_and_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let sim = cloud_sim(&[], dir.path(), 3600);
    let models = "  claude:\n    targets: [{ upstream: bedrock-east, model: m1 }]\n  safe:\n    targets: [{ upstream: bedrock-east, model: m1 }, { upstream: direct }]";
    let gw = gateway(&clouds_yaml(&sim, dir.path(), "not-the-secret", "", models)).await;
    let resp = messages(&gw, "claude", false).await;
    assert_eq!(resp.status(), 403);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error", "an Anthropic error body: {v}");
    assert_eq!(v["error"]["type"], "authentication_error");
    assert!(v["error"]["message"].as_str().unwrap().starts_with("InvalidSignatureException: "), "{v}");
    assert_eq!(sim.state.received().len(), 1, "an auth failure is not retried");
    // With another target, the request fails over instead.
    let resp = messages(&gw, "safe", true).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-upstream"], "direct");
}

#[tokio::test]
async fn bedrock_throttling_is_retried_before_content_and_ends_the_stream_honestly_after() {
    let dir = tempfile::tempdir().unwrap();
    let throttled = r#"{"type":"error","error":{"type":"rate_limit_error","message":"Too many tokens, please wait before trying again."}}"#;
    let sim = cloud_sim(
        &[
            // In-stream throttlingException before any content, then a 429
            // ThrottlingException, then a clean stream.
            (
                "early",
                Behavior {
                    script: vec![
                        Fault::error_frame(throttled),
                        Fault::new(429, r#"{"message":"Too many requests, please wait before trying again."}"#).header(
                            "x-amzn-errortype",
                            "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/",
                        ),
                    ],
                    ..Default::default()
                },
            ),
            // Two words, then serviceUnavailableException mid-stream.
            ("late", Behavior { script: vec![Fault::error_mid_stream(5, OVERLOADED)], ..Default::default() }),
        ],
        dir.path(),
        3600,
    );
    let models =
        "  early:\n    targets: [{ upstream: bedrock-east }]\n  late:\n    targets: [{ upstream: bedrock-east }]";
    let gw = gateway(&clouds_yaml(&sim, dir.path(), AWS_SECRET, "", models)).await;

    let resp = messages(&gw, "early", true).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), concat(tidegate_simulate::sse_frames(Protocol::Anthropic, "early", 5)));
    assert_eq!(sim.state.received().len(), 3, "two throttled attempts, then the answer");

    let resp = messages(&gw, "late", true).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("tok0 ") && text.contains("tok1 "), "{text}");
    assert!(text.trim_end().ends_with(r#""message":"serviceUnavailableException: Overloaded"}}"#), "{text}");
    assert!(
        text.contains("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\""),
        "{text}"
    );
    assert!(!text.contains("message_stop"), "a broken stream is not reported finished: {text}");
    assert_eq!(sim.state.received().len(), 4, "content had started: no retry");
}

#[tokio::test]
async fn vertex_gets_a_token_for_a_signed_jwt_refreshes_it_before_expiry_and_fails_over() {
    let dir = tempfile::tempdir().unwrap();
    let quota = r#"[{"error":{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model with base model: anthropic-claude.","status":"RESOURCE_EXHAUSTED"}}]"#;
    // Tokens live 21 s: gcp_auth takes a new one 20 s before expiry, so
    // after a second the next request gets a fresh token.
    let sim = cloud_sim(
        &[
            ("claude-direct", Behavior { status: Some(529), error_body: OVERLOADED.into(), ..Default::default() }),
            ("claude-v@20250101", Behavior { script: vec![Fault::new(429, quota)], ..Default::default() }),
        ],
        dir.path(),
        21,
    );
    let models = "  claude:\n    targets: [{ upstream: direct, model: claude-direct }, { upstream: vertex-eu, model: \"claude-v@20250101\" }]";
    let gw = gateway(&clouds_yaml(&sim, dir.path(), AWS_SECRET, "", models)).await;
    let resp = messages(&gw, "claude", true).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-upstream"], "vertex-eu");
    assert_eq!(
        resp.text().await.unwrap(),
        concat(tidegate_simulate::sse_frames(Protocol::Anthropic, "claude-v@20250101", 5))
    );
    let resp = messages(&gw, "claude", false).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(sim.state.token_grants.load(std::sync::atomic::Ordering::SeqCst), 1, "the token is cached");

    let received = sim.state.received();
    let to_vertex: Vec<_> = received.iter().filter(|r| r.path.starts_with("/v1/projects/")).collect();
    // RESOURCE_EXHAUSTED was capacity: retried on Vertex (the direct
    // target is cooling after its 529).
    assert_eq!(to_vertex.len(), 3, "{:?}", received.iter().map(|r| &r.path).collect::<Vec<_>>());
    assert_eq!(
        to_vertex[0].path,
        "/v1/projects/proj-1/locations/europe-west1/publishers/anthropic/models/claude-v@20250101:streamRawPredict"
    );
    assert!(to_vertex[2].path.ends_with(":rawPredict"));
    let body: serde_json::Value = serde_json::from_slice(&to_vertex[0].body).unwrap();
    assert_eq!(body["anthropic_version"], "vertex-2023-10-16");
    assert_eq!(body["stream"], true);
    assert!(body.get("model").is_none());
    assert!(to_vertex[0].headers["authorization"].to_str().unwrap().starts_with("Bearer ya29.sim-0-"));

    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(messages(&gw, "claude", false).await.status(), 200);
    assert_eq!(sim.state.token_grants.load(std::sync::atomic::Ordering::SeqCst), 2, "refreshed before expiry");
    let last = sim.state.received().last().unwrap().headers["authorization"].to_str().unwrap().to_owned();
    assert!(last.starts_with("Bearer ya29.sim-1-"), "{last}");
}

#[tokio::test]
async fn a_vertex_account_the_token_endpoint_refuses_fails_over_as_auth() {
    let dir = tempfile::tempdir().unwrap();
    let sim = cloud_sim(&[], dir.path(), 3600);
    // tidegate's key file names another account: its JWT is refused.
    write_account(&dir.path().join("tidegate-account.json"), &format!("{}/token", sim.anthropic_url()), "other@x.iam");
    let models = "  claude:\n    targets: [{ upstream: vertex-eu, model: v1 }, { upstream: direct }]";
    let gw = gateway(&clouds_yaml(&sim, dir.path(), AWS_SECRET, "", models)).await;
    let resp = messages(&gw, "claude", false).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-upstream"], "direct");
    assert!(sim.state.received().iter().all(|r| !r.path.starts_with("/v1/projects/")), "no call without a token");
}

#[tokio::test]
async fn an_openai_alias_fails_over_to_an_azure_deployment_honouring_its_headers() {
    let dir = tempfile::tempdir().unwrap();
    let filtered = r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation"}}}"#;
    let limited = r#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation have exceeded call rate limit. Please retry after 1 second."}}"#;
    let sim = cloud_sim(
        &[
            ("gpt-direct", Behavior { status: Some(503), error_body: "overloaded".into(), ..Default::default() }),
            (
                "gpt-4o-prod",
                Behavior {
                    script: vec![Fault::new(429, limited).header("retry-after-ms", "300").header("retry-after", "1")],
                    ..Default::default()
                },
            ),
            ("filtered-dep", Behavior { status: Some(400), error_body: filtered.into(), ..Default::default() }),
        ],
        dir.path(),
        3600,
    );
    let models = "  gpt:\n    targets: [{ upstream: openai, model: gpt-direct }, { upstream: azure-prod, model: gpt-4o-prod }]\n  filtered:\n    targets: [{ upstream: azure-prod, model: filtered-dep }]";
    let gw = gateway(&clouds_yaml(&sim, dir.path(), AWS_SECRET, "", models)).await;
    let resp = post_json(
        &gw,
        "/v1/chat/completions",
        serde_json::json!({"model": "gpt", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-upstream"], "azure-prod");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["model"], "gpt-4o-prod");
    let received = sim.state.received();
    let to_azure: Vec<_> = received.iter().filter(|r| r.path.starts_with("/openai/")).collect();
    assert_eq!(to_azure.len(), 2);
    assert_eq!(to_azure[0].path, "/openai/deployments/gpt-4o-prod/chat/completions");
    assert_eq!(to_azure[0].headers["api-key"], AZURE_KEY);
    assert!(to_azure[0].headers.get("authorization").is_none());
    // retry-after-ms (300 ms) was honoured, not retry-after (1 s).
    let waited = to_azure[1].at - to_azure[0].at;
    assert!(waited >= Duration::from_millis(290) && waited < Duration::from_millis(900), "{waited:?}");

    // The content filter is the request's fault: returned as is, once.
    let before = sim.state.received().len();
    let resp = post_json(
        &gw,
        "/v1/chat/completions",
        serde_json::json!({"model": "filtered", "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(resp.status(), 400);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "content_filter");
    assert_eq!(sim.state.received().len(), before + 1);
}

#[tokio::test]
async fn azure_v1_and_endpoints_a_cloud_does_not_serve() {
    let dir = tempfile::tempdir().unwrap();
    let sim = cloud_sim(&[], dir.path(), 3600);
    let text = clouds_yaml(
        &sim,
        dir.path(),
        AWS_SECRET,
        "",
        "  gpt:\n    targets: [{ upstream: azure-prod }]\n  claude:\n    targets: [{ upstream: bedrock-east }]",
    )
    .replace(", api_version: 2024-10-21", "");
    let gw = gateway(&text).await;
    let resp = post_json(
        &gw,
        "/v1/chat/completions",
        serde_json::json!({"model": "gpt", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    assert_eq!(sim.state.received()[0].path, "/openai/v1/chat/completions");
    // Bedrock serves messages only: count_tokens is an estimate, said to
    // be one, and nothing is sent.
    let resp = post_json(
        &gw,
        "/v1/messages/count_tokens",
        serde_json::json!({"model": "claude", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-estimate"], "characters/4");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["input_tokens"], 5, "{v}");
    assert_eq!(sim.state.received().len(), 1);
}

#[test]
fn each_kind_is_checked_with_field_paths() {
    let problems = |text: &str, env: &[(&str, &str)]| -> Vec<String> {
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let lookup = move |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        match tidegate::config::Config::parse(text, &lookup) {
            Ok(_) => Vec::new(),
            Err(e) => e.problems(),
        }
    };
    let wrap =
        |upstream: &str| format!("upstreams:\n  - {upstream}\nmodels:\n  m:\n    targets: [{{ upstream: u }}]\n");
    let got = problems(&wrap("{ name: u, kind: bedrock }"), &[]);
    assert_eq!(
        got,
        [
            "upstreams[0].region: missing (or set AWS_REGION)",
            "upstreams[0].aws_access_key_id: missing (or set AWS_ACCESS_KEY_ID)",
            "upstreams[0].aws_secret_access_key: missing (or set AWS_SECRET_ACCESS_KEY)",
        ]
    );
    // The standard AWS variables fill in what the file leaves out.
    let env = [("AWS_REGION", "eu-west-3"), ("AWS_ACCESS_KEY_ID", "AKID"), ("AWS_SECRET_ACCESS_KEY", "s")];
    assert!(problems(&wrap("{ name: u, kind: bedrock }"), &env).is_empty());
    let config = tidegate::config::Config::parse(&wrap("{ name: u, kind: bedrock }"), &|n| {
        env.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())
    })
    .unwrap();
    assert_eq!(config.upstreams[0].base_url.as_str(), "https://bedrock-runtime.eu-west-3.amazonaws.com/");
    assert!(!format!("{config:?}").contains("AKID"), "credentials are secrets in Debug output");

    let got = problems(
        &wrap(
            "{ name: u, kind: bedrock, region: us-east-1, aws_access_key_id: a, aws_secret_access_key: b, project: p, api_key: k }",
        ),
        &[],
    );
    assert_eq!(
        got,
        [
            "upstreams[0].project: only applies to kind vertex (this upstream is bedrock)",
            "upstreams[0].api_key: bedrock upstreams are not reached with an api_key (set aws_access_key_id and aws_secret_access_key)",
        ]
    );
    let got = problems(&wrap("{ name: u, kind: vertex, credentials_file: /nonexistent/key.json }"), &[]);
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0], "upstreams[0].region: missing (us-east5, europe-west1, global, ...)");
    assert_eq!(got[1], "upstreams[0].project: missing (the Google Cloud project id)");
    assert!(got[2].starts_with("upstreams[0].credentials_file: cannot read /nonexistent/key.json"), "{got:?}");
    let got = problems(&wrap("{ name: u, kind: azure, api_key: k, deployment: d, region: x }"), &[]);
    assert_eq!(
        got,
        [
            "upstreams[0].region: only applies to kind bedrock or vertex (this upstream is azure)",
            "upstreams[0].base_url: missing (https://<resource>.openai.azure.com)",
        ]
    );
    let got = problems(
        &wrap(
            "{ name: u, kind: bedrock, protocol: openai, region: r, aws_access_key_id: a, aws_secret_access_key: b }",
        ),
        &[],
    );
    assert_eq!(got, ["upstreams[0].protocol: kind bedrock speaks anthropic, not openai"]);
    let got = problems(&wrap("{ name: u, kind: sagemaker }"), &[]);
    assert_eq!(got, ["upstreams[0].kind: \"sagemaker\" is not one of anthropic, bedrock, vertex, openai, azure"]);
    // An alias may mix kinds and protocols: a client of either protocol
    // reaches the other target translated.
    let mixed = "upstreams:\n  - { name: a, kind: bedrock, region: r, aws_access_key_id: a, aws_secret_access_key: b }\n  - { name: z, kind: azure, base_url: \"https://x.openai.azure.com\", api_key: k }\nmodels:\n  m:\n    targets: [{ upstream: a }, { upstream: z }]\n";
    assert_eq!(problems(mixed, &[]), Vec::<String>::new());
}
