//! The Gemini API through tidegate: Gemini clients to a Gemini upstream
//! (Google AI Studio, Vertex AI), Google's capacity signals read right
//! (RetryInfo, per-minute and per-day quotas, "200 + error" streams),
//! tidegate's own errors in Google's shape, and translation both ways.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use tokio::time::Instant;

use common::*;
use serde_json::{Value, json};
use tidegate_simulate::{Behavior, Fault, FaultMode, Simulator};

const GEN: &str = "/v1beta/models/gem:generateContent";
const STREAM: &str = "/v1beta/models/gem:streamGenerateContent?alt=sse";

fn quota(quota_id: &str, delay: &str) -> String {
    json!({"error": {"code": 429, "message": "You exceeded your current quota, please check your plan and billing details.",
        "status": "RESOURCE_EXHAUSTED", "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
                "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                "quotaId": quota_id}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}]}})
    .to_string()
}

/// Upstream `ai` (Gemini, at the simulator) and `anth` (Anthropic, the
/// same simulator), with aliases `gem` (→ gemini-real), `claude-t`
/// (Anthropic target, for Gemini clients), and `extra`.
fn config(sim: &Simulator, top: &str, extra: &str) -> String {
    let journal = if top.contains("journal:") { "" } else { "journal: \"off\"\n" };
    format!(
        "listen: 127.0.0.1:0\n{journal}admin_key: adm\ndefaults:\n  retry: {{ base_delay: 10ms, max_delay: 50ms }}\n{top}\nupstreams:\n  - {{ name: ai, protocol: gemini, base_url: \"{}\", api_key: {UPSTREAM_KEY} }}\n  - {{ name: anth, protocol: anthropic, base_url: \"{}\", api_key: {UPSTREAM_KEY} }}\nclient_keys:\n  - {{ name: dev, key: k-dev }}\nmodels:\n  gem:\n    targets: [{{ upstream: ai, model: gemini-real }}]\n  claude-t:\n    targets: [{{ upstream: anth, model: claude-real }}]\n{extra}\n",
        sim.gemini_url(),
        sim.anthropic_url()
    )
}

fn ask(text: &str) -> Value {
    json!({"contents": [{"role": "user", "parts": [{"text": text}]}], "generationConfig": {"maxOutputTokens": 64}})
}

async fn gpost(gw: &tidegate::server::Running, path: &str, body: &Value) -> reqwest::Response {
    client().post(url(gw, path)).header("x-goog-api-key", "k-dev").json(body).send().await.unwrap()
}

/// The `data:` chunks of a Gemini SSE answer, as JSON.
fn chunks(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .flat_map(|e| e.lines())
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

fn text_of(chunks: &[Value]) -> String {
    chunks
        .iter()
        .flat_map(|c| c["candidates"][0]["content"]["parts"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["text"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn gemini_clients_reach_a_gemini_upstream_with_its_own_key_in_its_own_paths() {
    let sim = sim(&[("gemini-real", Behavior { chunks: 3, ..Default::default() })]);
    let gw = gateway(&config(&sim, "", "")).await;
    let resp = gpost(&gw, GEN, &ask("hi")).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["candidates"][0]["content"]["parts"][0]["text"], "tok0 tok1 tok2 ");
    // A stream, the key in the query as Google's REST examples send it.
    let resp = client()
        .post(url(&gw, "/v1beta/models/gem:streamGenerateContent?alt=sse&key=k-dev"))
        .json(&ask("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let got = chunks(&resp.text().await.unwrap());
    assert_eq!(text_of(&got), "tok0 tok1 tok2 ");
    assert_eq!(got.last().unwrap()["candidates"][0]["finishReason"], "STOP");
    // Without alt=sse: Google's other framing, one JSON array streamed.
    let resp = gpost(&gw, "/v1beta/models/gem:streamGenerateContent", &ask("hi")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let array: Vec<Value> = resp.json().await.unwrap();
    assert_eq!(text_of(&array), "tok0 tok1 tok2 ");
    assert_eq!(array.last().unwrap()["candidates"][0]["finishReason"], "STOP");
    // Embeddings and token counts pass through to a Gemini target.
    let resp = gpost(&gw, "/v1beta/models/gem:embedContent", &json!({"content": {"parts": [{"text": "hi"}]}})).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.unwrap()["embedding"]["values"][0], 0.25);
    let resp = gpost(&gw, "/v1beta/models/gem:countTokens", &ask("hi")).await;
    assert_eq!(resp.json::<Value>().await.unwrap()["totalTokens"], 10);
    let received = sim.state.received();
    assert_eq!(received[2].query.as_deref(), Some("alt=sse"), "the upstream is always asked for SSE");
    assert_eq!(received[3].path, "/v1beta/models/gemini-real:embedContent");
    assert_eq!(received[4].path, "/v1beta/models/gemini-real:countTokens");
    let received = &received[..2];
    assert_eq!(received[0].path, "/v1beta/models/gemini-real:generateContent");
    assert_eq!(received[1].path, "/v1beta/models/gemini-real:streamGenerateContent");
    assert_eq!(received[1].query.as_deref(), Some("alt=sse"));
    for r in received {
        assert_eq!(r.headers["x-goog-api-key"], UPSTREAM_KEY, "the upstream's key, never the client's");
        assert!(r.headers.get("authorization").is_none());
        assert_eq!(r.body, serde_json::to_vec(&ask("hi")).unwrap(), "the client's bytes, as they are");
    }
    // A wrong key: Google's shape, and nothing sent.
    let resp = client().post(url(&gw, GEN)).header("x-goog-api-key", "nope").json(&ask("hi")).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["status"], "UNAUTHENTICATED");
    assert_eq!(v["error"]["code"], 401);
    // An unknown model: NOT_FOUND, naming what there is.
    let resp = gpost(&gw, "/v1beta/models/nope:generateContent", &ask("hi")).await;
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["status"], "NOT_FOUND");
    assert!(v["error"]["message"].as_str().unwrap().contains("gem"), "{v}");
    // Not JSON: INVALID_ARGUMENT.
    let resp = client().post(url(&gw, GEN)).header("x-goog-api-key", "k-dev").body("[1").send().await.unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.json::<Value>().await.unwrap()["error"]["status"], "INVALID_ARGUMENT");
    assert_eq!(sim.state.received().len(), 5);
    // The model list, in Google's shape.
    let list: Value = client()
        .get(url(&gw, "/v1beta/models"))
        .header("x-goog-api-key", "k-dev")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = list["models"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"models/gem") && names.contains(&"models/claude-t"), "{names:?}");
    let one: Value = client().get(url(&gw, "/v1beta/models/gem?key=k-dev")).send().await.unwrap().json().await.unwrap();
    assert_eq!(one["name"], "models/gem");
}

#[tokio::test]
async fn per_minute_quotas_are_waited_out_as_retry_info_says() {
    let busy = Fault::new(429, &quota("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "1s"));
    let bare = Fault::new(
        429,
        r#"{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}"#,
    );
    let unavailable =
        Fault::new(503, r#"{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}"#);
    let script = vec![busy, bare, unavailable];
    let sim = sim(&[("gemini-real", Behavior { script, ..Default::default() })]);
    let gw = gateway(&config(&sim, "", "")).await;
    let started = Instant::now();
    let resp = gpost(&gw, STREAM, &ask("hi")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-attempts"], "4");
    assert_eq!(text_of(&chunks(&resp.text().await.unwrap())), "tok0 tok1 tok2 tok3 tok4 ");
    let received = sim.state.received();
    assert_eq!(received.len(), 4);
    let gap = received[1].at - received[0].at;
    assert!(gap >= Duration::from_millis(950), "retryDelay 1s honoured (waited {gap:?})");
    assert!(started.elapsed() < Duration::from_secs(8));
}

#[tokio::test]
async fn a_daily_quota_fails_over_at_once_and_alone_is_answered_at_once_with_its_reset() {
    let daily = quota("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "20s");
    let always = Behavior { status: Some(429), error_body: daily.clone(), ..Default::default() };
    let sim = sim(&[("gemini-spent", always)]);
    let extra = "  spent:\n    targets: [{ upstream: ai, model: gemini-spent }]\n  spent-then-claude:\n    targets: [{ upstream: ai, model: gemini-spent }, { upstream: anth, model: claude-real }]";
    let gw = gateway(&config(&sim, "", extra)).await;
    // With another target: served there, translated, at once.
    let started = Instant::now();
    let resp = gpost(&gw, "/v1beta/models/spent-then-claude:generateContent", &ask("hi")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-upstream"], "anth");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["candidates"][0]["content"]["parts"][0]["text"], "tok0 tok1 tok2 tok3 tok4 ");
    assert!(started.elapsed() < Duration::from_secs(2), "a daily quota is not waited for");
    // Alone: the provider's answer at once (Gemini CLI stops on it, as it should).
    let started = Instant::now();
    let resp = gpost(&gw, "/v1beta/models/spent:generateContent", &ask("hi")).await;
    assert_eq!(resp.status(), 429);
    assert!(started.elapsed() < Duration::from_secs(2));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        v["error"]["details"][0]["violations"][0]["quotaId"],
        "GenerateRequestsPerDayPerProjectPerModel-FreeTier"
    );
    // And an OpenAI client of the same alias hears the reason and the reset.
    let resp = client()
        .post(url(&gw, "/v1/chat/completions"))
        .bearer_auth("k-dev")
        .json(&json!({"model": "spent", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    let v: Value = resp.json().await.unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("exceeded your current quota"), "{message}");
    let gemini_attempts = sim.state.received().iter().filter(|r| r.path.contains("gemini-spent")).count();
    assert_eq!(gemini_attempts, 3, "one attempt per request: entitlement is not retried");
}

#[tokio::test]
async fn tidegates_own_refusals_tell_gemini_clients_when_to_come_back() {
    let busy = Fault::new(429, &quota("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "2s"));
    let always = Behavior { script: vec![busy; 50], ..Default::default() };
    let sim = sim(&[("gemini-real", always)]);
    let gw = gateway(&config(&sim, "", "")).await;
    let resp = client()
        .post(url(&gw, GEN))
        .header("x-goog-api-key", "k-dev")
        .header("x-tidegate-deadline", "1s")
        .json(&ask("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["status"], "RESOURCE_EXHAUSTED");
    let details = v["error"]["details"].as_array().unwrap();
    let retry = details.iter().find(|d| d["@type"] == "type.googleapis.com/google.rpc.RetryInfo").expect("RetryInfo");
    let secs: f64 = retry["retryDelay"].as_str().unwrap().trim_end_matches('s').parse().unwrap();
    assert!((1.0..=300.0).contains(&secs), "a wait Gemini CLI honours: {retry}");
    assert!(v["error"]["message"].as_str().unwrap().starts_with("tidegate:"), "{v}");
}

#[tokio::test]
async fn a_stream_that_fails_before_its_first_byte_is_retried_and_one_that_breaks_is_told_in_geminis_shape() {
    let frame = Fault {
        mode: FaultMode::ErrorFrame,
        ..Fault::new(200, r#"{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}"#)
    };
    let malformed = Fault {
        mode: FaultMode::ErrorFrame,
        ..Fault::new(200, r#"{"candidates":[{"finishReason":"MALFORMED_FUNCTION_CALL","index":0}]}"#)
    };
    let sim = sim(&[
        ("gemini-real", Behavior { script: vec![frame, malformed], chunks: 2, ..Default::default() }),
        (
            "breaks",
            Behavior {
                script: vec![Fault {
                    mode: FaultMode::ErrorMidStream,
                    ..Fault::new(
                        2,
                        r#"{"error":{"code":500,"message":"Internal error encountered.","status":"INTERNAL"}}"#,
                    )
                }],
                ..Default::default()
            },
        ),
    ]);
    let extra = "  breaks:\n    targets: [{ upstream: ai, model: breaks }]";
    let dir = tempfile::tempdir().unwrap();
    let top = format!("journal: {}", dir.path().join("j.db").display());
    let gw = gateway(&config(&sim, &top, extra)).await;
    let resp = gpost(&gw, STREAM, &ask("hi")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-attempts"], "3");
    let got = chunks(&resp.text().await.unwrap());
    assert_eq!(text_of(&got), "tok0 tok1 ");
    assert!(
        got.iter().all(|c| c.get("error").is_none() && c["candidates"][0]["finishReason"] != "MALFORMED_FUNCTION_CALL")
    );
    // Broken after two chunks: they are delivered, then Google's error chunk.
    let resp = gpost(&gw, "/v1beta/models/breaks:streamGenerateContent?alt=sse", &ask("hi")).await;
    assert_eq!(resp.status(), 200);
    let got = chunks(&resp.text().await.unwrap());
    assert_eq!(text_of(&got), "tok0 tok1 ");
    assert!(got.last().unwrap()["error"]["message"].as_str().is_some(), "{got:?}");
    let mut last = Value::Null;
    for _ in 0..100 {
        last = admin_json(&gw, "/admin/requests").await["requests"][0].clone();
        if last["outcome"].is_string() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(last["outcome"], "incomplete", "{last}");
}

#[tokio::test]
async fn gemini_clients_run_on_claude_and_claude_clients_on_gemini() {
    let sim = sim(&[]);
    let extra = "  on-gemini:\n    targets: [{ upstream: ai, model: gemini-real }]";
    let gw = gateway(&config(&sim, "", extra)).await;
    // A Gemini client with a tool on an Anthropic target: the call comes
    // back as a functionCall, its id kept for the response.
    let schema = json!({"type": "OBJECT", "properties": {"path": {"type": "STRING"}}, "required": ["path"]});
    let mut body = ask("read it");
    body["systemInstruction"] = json!({"parts": [{"text": "be brief"}]});
    body["tools"] =
        json!([{"functionDeclarations": [{"name": "read_file", "description": "reads", "parameters": schema}]}]);
    let resp = gpost(&gw, "/v1beta/models/claude-t:streamGenerateContent?alt=sse", &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-translated"], "gemini>anthropic");
    let got = chunks(&resp.text().await.unwrap());
    let call = got
        .iter()
        .flat_map(|c| c["candidates"][0]["content"]["parts"].as_array().cloned().unwrap_or_default())
        .find_map(|p| p.get("functionCall").cloned())
        .unwrap_or_else(|| panic!("no function call in {got:?}"));
    assert_eq!(call["name"], "read_file");
    assert_eq!(call["args"]["path"], "tok0");
    assert!(got.last().unwrap()["usageMetadata"]["promptTokenCount"].as_u64().is_some());
    let sent: Value = serde_json::from_slice(&sim.state.received().last().unwrap().body).unwrap();
    assert_eq!(sent["model"], "claude-real");
    assert!(sent["system"].to_string().contains("be brief"), "{sent}");
    assert_eq!(sent["tools"][0]["input_schema"]["properties"]["path"]["type"], "string");
    // The tool's result goes back; the answer is text.
    body["contents"].as_array_mut().unwrap().push(json!({"role": "model", "parts": [{"functionCall": call}]}));
    body["contents"].as_array_mut().unwrap().push(
        json!({"role": "user", "parts": [{"functionResponse": {"name": "read_file", "id": call["id"], "response": {"output": "hello"}}}]}),
    );
    let resp = gpost(&gw, "/v1beta/models/claude-t:generateContent", &body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["candidates"][0]["content"]["parts"][0]["text"], "tok0 tok1 tok2 tok3 tok4 ");
    let sent: Value = serde_json::from_slice(&sim.state.received().last().unwrap().body).unwrap();
    let result = &sent["messages"][2]["content"][0];
    assert_eq!((result["type"].as_str(), result["tool_use_id"].as_str()), (Some("tool_result"), call["id"].as_str()));

    // An Anthropic client on a Gemini target, streamed.
    let resp = client()
        .post(url(&gw, "/v1/messages"))
        .header("x-api-key", "k-dev")
        .json(&json!({"model": "on-gemini", "max_tokens": 50, "stream": true, "system": "be brief",
            "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-translated"], "anthropic>gemini");
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("event: message_start") && text.trim_end().ends_with(r#"data: {"type":"message_stop"}"#),
        "{text}"
    );
    let last = sim.state.received().last().cloned().unwrap();
    assert_eq!(last.path, "/v1beta/models/gemini-real:streamGenerateContent");
    let sent: Value = serde_json::from_slice(&last.body).unwrap();
    assert_eq!(sent["systemInstruction"]["parts"][0]["text"], "be brief");
    assert_eq!(sent["generationConfig"]["maxOutputTokens"], 50);
    assert!(sent.get("model").is_none(), "the model is in the path");
    // A chat client, whole answer: usage read from usageMetadata.
    let resp = client()
        .post(url(&gw, "/v1/chat/completions"))
        .bearer_auth("k-dev")
        .json(&json!({"model": "on-gemini", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "tok0 tok1 tok2 tok3 tok4 ");
    assert_eq!(v["usage"]["prompt_tokens"], 10);
    // countTokens with no Gemini target: an estimate, in Gemini's shape.
    let resp = gpost(&gw, "/v1beta/models/claude-t:countTokens", &ask("four score and seven")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-tidegate-estimate"], "characters/4");
    assert!(resp.json::<Value>().await.unwrap()["totalTokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn gemini_models_on_vertex_are_reached_with_the_same_body() {
    let sim = sim(&[]);
    let top = "";
    let extra_upstream = format!(
        "  - {{ name: vx, kind: vertex, protocol: gemini, region: us-central1, project: p1, base_url: \"{}\", token_command: \"echo ya29.test\" }}",
        sim.gemini_url()
    );
    let text = config(&sim, top, "  on-vertex:\n    targets: [{ upstream: vx, model: gemini-2.5-pro }]")
        .replace("client_keys:", &format!("{extra_upstream}\nclient_keys:"));
    let gw = gateway(&text).await;
    let resp = gpost(&gw, "/v1beta/models/on-vertex:streamGenerateContent?alt=sse", &ask("hi")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(text_of(&chunks(&resp.text().await.unwrap())), "tok0 tok1 tok2 tok3 tok4 ");
    let last = sim.state.received().last().cloned().unwrap();
    assert_eq!(
        last.path,
        "/v1/projects/p1/locations/us-central1/publishers/google/models/gemini-2.5-pro:streamGenerateContent"
    );
    assert_eq!(last.headers["authorization"], "Bearer ya29.test");
    assert_eq!(last.body, serde_json::to_vec(&ask("hi")).unwrap());
}
