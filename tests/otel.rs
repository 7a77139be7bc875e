//! OpenTelemetry export against an OTLP/HTTP receiver written here with the
//! `opentelemetry-proto` types (no collector package is installable from
//! this machine's registries): one span per request, one per attempt, every
//! attribute checked, the client's `traceparent` continued and each
//! attempt's sent upstream, and no key anywhere in what is exported.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tidegate_simulate::{Behavior, Fault};

#[derive(Default)]
struct Received {
    requests: Vec<ExportTraceServiceRequest>,
}

async fn traces(State(state): State<Arc<Mutex<Received>>>, body: Bytes) -> &'static str {
    let request = ExportTraceServiceRequest::decode(body).unwrap();
    state.lock().unwrap().requests.push(request);
    ""
}

/// Starts the OTLP/HTTP receiver; returns its base URL and what it got.
async fn receiver() -> (String, Arc<Mutex<Received>>) {
    let state = Arc::new(Mutex::new(Received::default()));
    let app = axum::Router::new().route("/v1/traces", axum::routing::post(traces)).with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), state)
}

fn attrs(span: &Span) -> HashMap<String, String> {
    span.attributes
        .iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.clone()) {
                Some(Value::StringValue(s)) => s,
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => format!("{d}"),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

#[tokio::test]
async fn a_request_and_its_attempts_are_exported_with_genai_attributes() {
    let (otlp, got) = receiver().await;
    let overloaded = r#"{"error":{"message":"Overloaded","type":"overloaded_error"}}"#;
    let sim = sim(&[("real-gpt", Behavior { script: vec![Fault::new(529, overloaded)], ..Default::default() })]);
    let top = format!(
        "client_keys: [{{ name: alice, key: k-alice }}]\notel: {{ endpoint: \"{otlp}\", service_name: gw-test, export_every: 100ms, headers: {{ x-collector-token: tok-secret }} }}"
    );
    let gw = gateway(&yaml(&sim, &top, "", "")).await;
    let resp = client()
        .post(url(&gw, "/v1/chat/completions"))
        .bearer_auth("k-alice")
        .header("traceparent", format!("00-{TRACE}-{PARENT}-01"))
        .body(r#"{"model":"gpt","messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let request_id = resp.headers()["x-tidegate-request-id"].to_str().unwrap().to_owned();
    resp.bytes().await.unwrap();

    let mut spans: Vec<Span> = Vec::new();
    let mut service = String::new();
    for _ in 0..100 {
        {
            let r = got.lock().unwrap();
            spans = r
                .requests
                .iter()
                .flat_map(|e| &e.resource_spans)
                .flat_map(|rs| &rs.scope_spans)
                .flat_map(|s| s.spans.clone())
                .collect();
            if let Some(resource) =
                r.requests.first().and_then(|e| e.resource_spans.first()).and_then(|rs| rs.resource.clone())
            {
                service = resource
                    .attributes
                    .iter()
                    .find(|kv| kv.key == "service.name")
                    .map(|kv| format!("{:?}", kv.value))
                    .unwrap_or_default();
            }
        }
        if spans.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(spans.len(), 3, "one request span and two attempt spans: {spans:#?}");
    assert!(service.contains("gw-test"), "service.name: {service}");
    let request = spans.iter().find(|s| s.kind == 2).expect("a SERVER span");
    assert_eq!(hex(&request.trace_id), TRACE, "the client's trace continues");
    assert_eq!(hex(&request.parent_span_id), PARENT);
    assert_eq!(request.name, "chat gpt");
    let a = attrs(request);
    let want = [
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.provider.name", "openai"),
        ("gen_ai.system", "openai"),
        ("gen_ai.request.model", "gpt"),
        ("gen_ai.response.model", "real-gpt"),
        ("http.request.method", "POST"),
        ("http.response.status_code", "200"),
        ("tidegate.request_id", request_id.as_str()),
        ("tidegate.outcome", "completed"),
        ("tidegate.client", "alice"),
        ("tidegate.upstream", "sim-openai"),
        ("tidegate.attempts", "2"),
        ("tidegate.stream", "false"),
    ];
    for (k, v) in want {
        assert_eq!(a.get(k).map(String::as_str), Some(v), "{k} in {a:#?}");
    }
    assert!(a.get("gen_ai.usage.output_tokens").is_some_and(|n| n.parse::<u64>().unwrap() > 0), "{a:#?}");
    assert!(a["gen_ai.usage.input_tokens"].parse::<u64>().unwrap() > 0);
    assert!(a.contains_key("tidegate.queue_wait_ms") && a.contains_key("tidegate.ttfb_ms"));

    let mut attempts: Vec<&Span> = spans.iter().filter(|s| s.kind == 3).collect();
    attempts.sort_by_key(|s| s.start_time_unix_nano);
    assert_eq!(attempts.len(), 2);
    for s in &attempts {
        assert_eq!(hex(&s.trace_id), TRACE);
        assert_eq!(s.parent_span_id, request.span_id, "attempts are children of the request");
        assert!(
            s.start_time_unix_nano >= request.start_time_unix_nano
                && s.end_time_unix_nano <= request.end_time_unix_nano
        );
        assert_eq!(s.name, "attempt sim-openai");
    }
    let (first, second) = (attrs(attempts[0]), attrs(attempts[1]));
    assert_eq!(first["tidegate.verdict"], "retry_same");
    assert_eq!(first["http.response.status_code"], "529");
    assert_eq!(first["tidegate.class"], "capacity");
    assert_eq!(first["error.type"], "capacity");
    assert!(first.contains_key("tidegate.wait_ms"));
    assert_eq!(first["gen_ai.request.model"], "real-gpt");
    assert_eq!(first["tidegate.attempt"], "1");
    assert_eq!(second["tidegate.verdict"], "ok");
    assert_eq!(second["http.response.status_code"], "200");
    assert!(!second.contains_key("error.type"));

    // Each attempt's traceparent reached the upstream: same trace, the
    // attempt's span as parent.
    let sent: Vec<String> = sim
        .state
        .received()
        .iter()
        .map(|r| r.headers.get("traceparent").unwrap().to_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = attempts.iter().map(|s| format!("00-{TRACE}-{}-01", hex(&s.span_id))).collect();
    assert_eq!(sent, expected);

    let everything = format!("{:?}", got.lock().unwrap().requests);
    for secret in ["k-alice", UPSTREAM_KEY, "tok-secret"] {
        assert!(!everything.contains(secret), "{secret} was exported");
    }
}

#[tokio::test]
async fn without_otel_the_clients_traceparent_passes_through_untouched() {
    let sim = sim(&[]);
    let gw = gateway(&yaml(&sim, "", "", "")).await;
    let parent = format!("00-{TRACE}-{PARENT}-01");
    let resp = client()
        .post(url(&gw, "/v1/chat/completions"))
        .header("traceparent", &parent)
        .body(r#"{"model":"gpt"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let received = sim.state.received();
    assert_eq!(received[0].headers["traceparent"].to_str().unwrap(), parent);
}
