// Compiled only under #[cfg(test)] (declared in mod.rs).
//! Decision tables, including every case seed 003 pins.

use std::time::Duration;

use super::*;
#[allow(unused_imports)]
use crate::classify::Rule;
use crate::classify::{Hints, Outcome, RuleMatch, Rules};
use crate::record::WaitSource;

fn outcome(class: Class) -> Outcome {
    Outcome {
        class,
        status: Some(429),
        hints: Hints::default(),
        summary: String::new(),
        rule: None,
        concurrency: false,
    }
}

fn situation<'a>(o: &'a Outcome, p: &'a Policy, attempts: u32) -> Situation<'a> {
    Situation {
        outcome: o,
        attempts,
        policy: p,
        remaining: Duration::from_secs(120),
        budget_ok: true,
        chained: false,
        other_target_ready: false,
        other_target_left: false,
        others_in_flight: false,
        jitter: 0.5,
    }
}

fn rule(status: &[u16], body: &[&str], delay: Option<u64>, attempts: Option<u32>) -> Rule {
    Rule {
        on_status: status.to_vec(),
        on_body_contains: body.iter().map(|s| s.to_string()).collect(),
        delay: delay.map(Duration::from_secs),
        max_attempts: attempts,
    }
}

#[test]
fn seed_003_rule_semantics() {
    let tm = r#"{"error_code":"TM.00001041","error_msg":"并发会话数已达上限(3个)"}"#;
    let cases: &[(&str, Rules, u16, &str, bool)] = &[
        ("nil policy never matches", Rules::default(), 400, tm, false),
        (
            "attempts=1 disables",
            Rules { retry: vec![rule(&[400], &["TM.00001041"], Some(1), Some(1))], ..Default::default() },
            400,
            tm,
            false,
        ),
        (
            "status mismatch",
            Rules { retry: vec![rule(&[429], &["TM.00001041"], None, Some(5))], ..Default::default() },
            400,
            tm,
            false,
        ),
        (
            "body mismatch must not retry",
            Rules { retry: vec![rule(&[400], &["TM.00001041"], None, Some(5))], ..Default::default() },
            400,
            r#"{"error_code":"TM.00001005","error_msg":"无正常可用套餐"}"#,
            false,
        ),
        (
            "empty substring never matches",
            Rules { retry: vec![rule(&[400], &[""], None, Some(5))], ..Default::default() },
            400,
            tm,
            false,
        ),
        (
            "several signals: any matches",
            Rules {
                retry: vec![rule(&[400, 429], &["TPM limit", "TM.00001041"], None, Some(5))],
                ..Default::default()
            },
            400,
            tm,
            true,
        ),
        (
            "several signals: second status",
            Rules {
                retry: vec![rule(&[400, 429], &["TPM limit", "TM.00001041"], None, Some(5))],
                ..Default::default()
            },
            429,
            "TPM limit exceeded",
            true,
        ),
        (
            "status only",
            Rules { retry: vec![rule(&[400], &[], None, Some(5))], ..Default::default() },
            400,
            "anything",
            true,
        ),
        (
            "error frame without a status: matched by body alone",
            Rules { retry: vec![rule(&[400], &["TM.00001041"], None, Some(5))], ..Default::default() },
            200,
            tm,
            true,
        ),
        (
            "error frame without a status: a status-only rule does not match",
            Rules { retry: vec![rule(&[400], &[], None, Some(5))], ..Default::default() },
            200,
            tm,
            false,
        ),
    ];
    for (name, rules, status, body, want) in cases {
        let m = rules.find(*status, body);
        assert_eq!(m.is_some(), *want, "{name}");
    }
}

#[test]
fn rule_delay_and_attempts_drive_the_decision() {
    let p = Policy::default();
    let mut o = outcome(Class::Capacity);
    o.rule = Some(RuleMatch { fatal: false, index: 0, delay: Some(Duration::from_secs(10)), max_attempts: Some(18) });
    assert_eq!(
        decide(&situation(&o, &p, 1)),
        Decision::Retry { wait: Duration::from_secs(10), source: WaitSource::Rule }
    );
    // The rule's 18 attempts override the policy's 6.
    assert!(matches!(decide(&situation(&o, &p, 7)), Decision::Retry { .. }));
    assert_eq!(decide(&situation(&o, &p, 18)), Decision::GiveUp(GiveUp::Exhausted));
    // No delay in the rule ("invalid delay falls back"): backoff.
    o.rule = Some(RuleMatch { fatal: false, index: 0, delay: None, max_attempts: Some(18) });
    assert!(matches!(decide(&situation(&o, &p, 1)), Decision::Retry { source: WaitSource::Backoff, .. }));
    // A provider hint beats the rule's delay.
    o.hints.retry_after = Some(Duration::from_secs(2));
    o.hints.source = Some("retry-after");
    assert_eq!(
        decide(&situation(&o, &p, 1)),
        Decision::Retry { wait: Duration::from_secs(2), source: WaitSource::Provider("retry-after") }
    );
}

#[test]
fn decisions_by_class_and_situation() {
    let p = Policy::default();
    for class in [Class::Request, Class::Auth, Class::Entitlement] {
        assert_eq!(decide(&situation(&outcome(class), &p, 1)), Decision::GiveUp(GiveUp::NotRetryable));
    }
    let cap = outcome(Class::Capacity);
    assert!(matches!(decide(&situation(&cap, &p, 1)), Decision::Retry { source: WaitSource::Backoff, .. }));
    assert_eq!(decide(&situation(&cap, &p, 6)), Decision::GiveUp(GiveUp::Exhausted));
    let mut s = situation(&cap, &p, 1);
    s.chained = true;
    assert_eq!(decide(&s), Decision::GiveUp(GiveUp::Chained));
    let mut s = situation(&cap, &p, 1);
    s.budget_ok = false;
    assert_eq!(decide(&s), Decision::GiveUp(GiveUp::BudgetSpent));

    let mut no = outcome(Class::Capacity);
    no.hints.should_retry = Some(false);
    assert_eq!(decide(&situation(&no, &p, 1)), Decision::GiveUp(GiveUp::ProviderSaidNo));

    // A hint longer than the time left ends the request at once, saying how long.
    let mut long = outcome(Class::Capacity);
    long.hints.retry_after = Some(Duration::from_secs(300));
    long.hints.source = Some("retry-after");
    let mut s = situation(&long, &p, 1);
    s.remaining = Duration::from_secs(30);
    assert_eq!(decide(&s), Decision::GiveUp(GiveUp::BeyondDeadline { wait: Duration::from_secs(300) }));
    // The budget does not cut a wait the provider asked for.
    s.remaining = Duration::from_secs(600);
    s.budget_ok = false;
    assert!(matches!(decide(&s), Decision::Retry { .. }));
}

#[test]
fn backoff_grows_with_full_jitter_and_is_capped() {
    let p = Policy { max_attempts: 10, base_delay: Duration::from_millis(500), max_delay: Duration::from_secs(4) };
    assert_eq!(backoff(1, &p, 0.9), Duration::from_millis(500));
    assert_eq!(backoff(2, &p, 0.0), Duration::from_millis(500));
    assert_eq!(backoff(2, &p, 1.0), Duration::from_millis(1000));
    assert_eq!(backoff(3, &p, 0.5), Duration::from_millis(1250));
    assert_eq!(backoff(10, &p, 1.0), Duration::from_secs(4));
    assert_eq!(backoff(60, &p, 1.0), Duration::from_secs(4));
    // Different jitter, different waits: retries of many clients spread out.
    assert_ne!(backoff(4, &p, 0.1), backoff(4, &p, 0.7));
}

#[test]
fn concurrency_refusals_requeue_only_when_others_hold_slots() {
    let p = Policy::default();
    let mut o = outcome(Class::Capacity);
    o.concurrency = true;
    let mut s = situation(&o, &p, 1);
    // Alone (seed 000: 3009 for a single request): back off, do not hammer.
    assert!(matches!(decide(&s), Decision::Retry { source: WaitSource::Backoff, .. }));
    s.others_in_flight = true;
    assert_eq!(decide(&s), Decision::Requeue);
    // Attempts still count.
    let s6 = Situation { attempts: 6, ..s.clone() };
    assert_eq!(decide(&s6), Decision::GiveUp(GiveUp::Exhausted));
    // A provider's explicit wait is honoured instead.
    o.hints.retry_after = Some(Duration::from_secs(1));
    let s = Situation { outcome: &o, others_in_flight: true, ..situation(&o, &p, 1) };
    assert!(matches!(decide(&s), Decision::Retry { .. }));
}

#[test]
fn other_targets_are_tried_before_waiting() {
    let p = Policy::default();
    let cap = outcome(Class::Capacity);
    let s = Situation { other_target_ready: true, other_target_left: true, ..situation(&cap, &p, 1) };
    assert_eq!(decide(&s), Decision::NextTarget);
    // All others cooling down: back off here.
    let s = Situation { other_target_ready: false, other_target_left: true, ..situation(&cap, &p, 1) };
    assert!(matches!(decide(&s), Decision::Retry { .. }));
    // Auth on this target: skip to any target left, even one cooling down.
    let auth = outcome(Class::Auth);
    let s = Situation { other_target_left: true, ..situation(&auth, &p, 1) };
    assert_eq!(decide(&s), Decision::NextTarget);
    assert_eq!(decide(&situation(&auth, &p, 1)), Decision::GiveUp(GiveUp::NotRetryable));
    // A request error stops whatever else is available.
    let req = outcome(Class::Request);
    let s = Situation { other_target_ready: true, other_target_left: true, ..situation(&req, &p, 1) };
    assert_eq!(decide(&s), Decision::GiveUp(GiveUp::NotRetryable));
    // Attempts bound failover too.
    let s = Situation { other_target_ready: true, other_target_left: true, ..situation(&cap, &p, 6) };
    assert_eq!(decide(&s), Decision::GiveUp(GiveUp::Exhausted));
}
