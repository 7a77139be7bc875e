// Compiled only under #[cfg(test)] (declared in mod.rs).
//! Classification table: real providers' capacity and request bodies.

use super::*;
use crate::classify::Rule;

fn now() -> Timestamp {
    "2026-11-29T12:00:00Z".parse().unwrap()
}

fn hdrs(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
    }
    h
}

fn codearts_rules() -> Rules {
    Rules {
        retry: vec![Rule {
            on_status: vec![400, 429],
            on_body_contains: vec!["TM.00001041".into(), "TPM limit".into(), "并发会话数已达上限".into()],
            delay: Some(std::time::Duration::from_secs(10)),
            max_attempts: Some(18),
            class: None,
        }],
        fatal: vec![Rule { on_status: vec![], on_body_contains: vec!["TM.00001005".into()], ..Default::default() }],
    }
}

#[test]
fn real_capacity_bodies_are_classified_without_rules() {
    let none = Rules::default();
    type Case<'a> = (u16, &'a [(&'a str, &'a str)], &'a str, Class);
    let cases: &[Case<'_>] = &[
        // A concurrency cap as 429 with a vendor code, no Retry-After.
        (429, &[], r#"{"error":{"code":"3009","message":"model concurrency limit exceeded"}}"#, Class::Capacity),
        // A TPM limit as 429.
        (429, &[], r#"{"error":{"message":"TPM limit exceeded: 500000 tokens per minute"}}"#, Class::Capacity),
        // A concurrency cap as 400, no rule: a 400 is the request's fault.
        (400, &[], r#"{"error_code":"TM.00001041","error_msg":"并发会话数已达上限(3个)"}"#, Class::Request),
        // A session limit as Anthropic's 429 rate_limit_error.
        (
            429,
            &[],
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"You've hit your session limit · resets 3:20am (America/New_York)"}}"#,
            Class::Capacity,
        ),
        // OpenAI billing: a 429 that must not be retried.
        (
            429,
            &[],
            r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
            Class::Entitlement,
        ),
        (529, &[], r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#, Class::Capacity),
        (
            503,
            &[],
            "<html><head><title>503 Service Temporarily Unavailable</title></head><body>nginx</body></html>",
            Class::Capacity,
        ),
        (500, &[], r#"{"error":{"message":"The server had an error"}}"#, Class::Transient),
        (500, &[], r#"{"error":{"message":"The engine is currently overloaded"}}"#, Class::Capacity),
        (502, &[], "Bad Gateway", Class::Transient),
        (504, &[], "", Class::Transient),
        (400, &[], r#"{"error":{"message":"maximum context length is 128000 tokens"}}"#, Class::Request),
        (
            400,
            &[],
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low"}}"#,
            Class::Entitlement,
        ),
        (404, &[], r#"{"error":{"message":"model gone","code":"model_not_found"}}"#, Class::Entitlement),
        (404, &[], r#"{"error":{"message":"no such route"}}"#, Class::Request),
        (401, &[], r#"{"error":{"message":"Incorrect API key"}}"#, Class::Auth),
        (403, &[], r#"{"error":{"message":"forbidden"}}"#, Class::Auth),
        (402, &[], "", Class::Entitlement),
        (409, &[], "", Class::Transient),
        (422, &[("x-should-retry", "true")], "", Class::Transient),
        (400, &[], r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#, Class::Capacity),
        (200, &[], r#"{"error":{"message":"concurrency limit"}}"#, Class::Capacity),
    ];
    for (status, h, body, want) in cases {
        let o = classify(StatusCode::from_u16(*status).unwrap(), &hdrs(h), body.as_bytes(), &none, now());
        assert_eq!(o.class, *want, "{status} {body}");
        assert!(o.summary.starts_with(&status.to_string()), "{}", o.summary);
    }
}

#[test]
fn operator_rules_win_over_builtin_and_fatal_wins_over_all() {
    let rules = codearts_rules();
    let busy = r#"{"error_code":"TM.00001041","error_msg":"并发会话数已达上限(3个)"}"#;
    let o = classify(StatusCode::BAD_REQUEST, &HeaderMap::new(), busy.as_bytes(), &rules, now());
    assert_eq!(o.class, Class::Capacity);
    assert!(o.concurrency || o.summary.contains("TM.00001041"));
    let rule = o.rule.unwrap();
    assert!(!rule.fatal);
    assert_eq!(rule.max_attempts, Some(18));

    let no_plan = r#"{"error_code":"TM.00001005","error_msg":"无正常可用套餐"}"#;
    let o = classify(StatusCode::BAD_REQUEST, &HeaderMap::new(), no_plan.as_bytes(), &rules, now());
    assert_eq!(o.class, Class::Request, "fatal keeps a non-retryable built-in class");
    assert!(o.rule.unwrap().fatal);
    // A fatal rule matching a capacity-looking answer makes it the
    // request's own fault: it cannot succeed anywhere.
    let o = classify(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), b"TM.00001005 busy", &rules, now());
    assert_eq!(o.class, Class::Request);
    assert!(!o.class.retryable());
}

#[test]
fn a_rule_says_what_the_answer_means_with_its_class() {
    let no_plan = r#"{"error_code":"TM.00001005","error_msg":"无正常可用套餐"}"#;
    let rules = Rules {
        retry: vec![Rule {
            on_body_contains: vec!["TM.00001005".into()],
            class: Some(Class::Entitlement),
            ..Default::default()
        }],
        fatal: vec![Rule {
            on_body_contains: vec!["content_policy".into()],
            class: Some(Class::Auth),
            ..Default::default()
        }],
    };
    let o = classify(StatusCode::BAD_REQUEST, &HeaderMap::new(), no_plan.as_bytes(), &rules, now());
    assert_eq!(o.class, Class::Entitlement, "this account cannot serve; another may");
    assert!(!o.rule.unwrap().fatal);
    let o = classify(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), b"content_policy", &rules, now());
    assert_eq!(o.class, Class::Auth);
    assert!(o.rule.unwrap().fatal);
}

#[test]
fn hints_and_projection_are_attached() {
    let body = r#"{"type":"error","error":{"type":"rate_limit_error","message":"You've hit your session limit · resets 3:20am (America/New_York)"}}"#;
    let o = classify(
        StatusCode::TOO_MANY_REQUESTS,
        &hdrs(&[("retry-after", "7")]),
        body.as_bytes(),
        &Rules::default(),
        now(),
    );
    assert_eq!(o.hints.retry_after, Some(std::time::Duration::from_secs(7)));
    assert_eq!(o.hints.projected_reset.unwrap().to_string(), "2026-11-30T08:20:00Z");
    assert!(o.summary.contains("session limit"));
}

#[test]
fn transport_failures_are_transient() {
    let o = classify_transport(&TransportFailure::Connection("connection refused".into()));
    assert_eq!(o.class, Class::Transient);
    assert_eq!(o.status, None);
    assert!(o.summary.contains("connection refused"));
}

#[test]
fn googles_quota_errors_are_read_from_the_body() {
    let per_minute = r#"{"error":{"code":429,"message":"You exceeded your current quota.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"31s"}]}}"#;
    let o = classify(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), per_minute.as_bytes(), &Rules::default(), now());
    assert_eq!(o.class, Class::Capacity);
    assert_eq!(o.hints.retry_after, Some(std::time::Duration::from_secs(31)));
    assert_eq!(o.hints.source, Some("retryInfo"));

    let per_day = per_minute.replace("PerMinute", "PerDay").replace("31s", "8s");
    let o = classify(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), per_day.as_bytes(), &Rules::default(), now());
    assert_eq!(o.class, Class::Entitlement, "a daily quota is not waited for");
    // Midnight Pacific after 2026-11-29T12:00Z (PST, UTC-8).
    assert_eq!(o.hints.projected_reset.unwrap().to_string(), "2026-11-30T08:00:00Z");

    let words = r#"{"error":{"code":429,"message":"Resource has been exhausted. Your quota will reset after 15h57m40s.","status":"RESOURCE_EXHAUSTED"}}"#;
    let o = classify(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), words.as_bytes(), &Rules::default(), now());
    assert_eq!(o.class, Class::Entitlement);
    assert_eq!(o.hints.projected_reset.unwrap().to_string(), "2026-11-30T03:57:40Z");
    let soon = words.replace("15h57m40s", "40s");
    let o = classify(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), soon.as_bytes(), &Rules::default(), now());
    assert_eq!((o.class, o.hints.retry_after), (Class::Capacity, Some(std::time::Duration::from_secs(40))));

    let bare = r#"{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}"#;
    let o = classify(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), bare.as_bytes(), &Rules::default(), now());
    assert_eq!((o.class, o.hints.retry_after), (Class::Capacity, None));
    let unavailable =
        r#"{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}"#;
    let o =
        classify(StatusCode::SERVICE_UNAVAILABLE, &HeaderMap::new(), unavailable.as_bytes(), &Rules::default(), now());
    assert_eq!(o.class, Class::Capacity);
    let denied = r#"{"error":{"code":403,"message":"Permission denied","status":"PERMISSION_DENIED"}}"#;
    let o = classify(StatusCode::FORBIDDEN, &HeaderMap::new(), denied.as_bytes(), &Rules::default(), now());
    assert_eq!(o.class, Class::Auth);
    let invalid = r#"{"error":{"code":400,"message":"Invalid JSON payload","status":"INVALID_ARGUMENT"}}"#;
    let o = classify(StatusCode::BAD_REQUEST, &HeaderMap::new(), invalid.as_bytes(), &Rules::default(), now());
    assert_eq!(o.class, Class::Request);
}
