// Compiled only under #[cfg(test)] (declared in mod.rs).
//! Decision tables, including every case of an operator's rule: status,
//! body substrings, delay, attempts, and a fatal rule.

use std::time::Duration;

use super::*;
use crate::classify::{Classified, Hints, Rule, RuleMatch, Rules};
use crate::record::WaitSource;

fn outcome(class: Class) -> Classified {
    Classified {
        class,
        status: Some(429),
        hints: Hints::default(),
        summary: String::new(),
        rule: None,
        concurrency: false,
        model_scoped: false,
    }
}

fn situation<'a>(o: &'a Classified, p: &'a Policy, attempts: u32) -> Situation<'a> {
    Situation {
        outcome: o,
        attempts,
        target_attempts: attempts,
        policy: p,
        remaining: Duration::from_secs(120),
        budget_wait: Duration::ZERO,
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
        class: None,
    }
}

#[test]
fn operator_rules_match_by_status_and_body_and_bound_their_attempts() {
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
    o.rule = Some(RuleMatch {
        fatal: false,
        index: 0,
        delay: Some(Duration::from_secs(10)),
        max_attempts: Some(18),
        class: None,
    });
    assert_eq!(
        decide(&situation(&o, &p, 1)),
        Decision::Retry { wait: Duration::from_secs(10), source: WaitSource::Rule }
    );
    // The rule's 18 attempts override the policy's 6.
    assert!(matches!(decide(&situation(&o, &p, 7)), Decision::Retry { .. }));
    assert_eq!(decide(&situation(&o, &p, 18)), Decision::GiveUp(GiveUp::Exhausted));
    // No delay in the rule ("invalid delay falls back"): backoff.
    o.rule = Some(RuleMatch { fatal: false, index: 0, delay: None, max_attempts: Some(18), class: None });
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
    // Capacity has no attempt limit: the deadline ends it.
    assert!(matches!(decide(&situation(&cap, &p, 60)), Decision::Retry { .. }));
    // Transient failures get max_attempts per target.
    let broken = outcome(Class::Transient);
    assert!(matches!(decide(&situation(&broken, &p, 5)), Decision::Retry { .. }));
    assert_eq!(decide(&situation(&broken, &p, 6)), Decision::GiveUp(GiveUp::Exhausted));
    let mut s = situation(&cap, &p, 1);
    s.chained = true;
    assert_eq!(decide(&s), Decision::GiveUp(GiveUp::Chained));

    let mut no = outcome(Class::Capacity);
    no.hints.should_retry = Some(false);
    assert_eq!(decide(&situation(&no, &p, 1)), Decision::GiveUp(GiveUp::ProviderSaidNo));

    // A hint longer than the time left ends the request at once, saying how long.
    let mut long = outcome(Class::Capacity);
    long.hints.retry_after = Some(Duration::from_secs(300));
    long.hints.source = Some("retry-after");
    let mut s = situation(&long, &p, 1);
    s.remaining = Duration::from_secs(30);
    assert_eq!(
        decide(&s),
        Decision::GiveUp(GiveUp::BeyondDeadline {
            wait: Duration::from_secs(300),
            source: WaitSource::Provider("retry-after")
        })
    );
    // The budget does not delay a wait the provider asked for.
    s.remaining = Duration::from_secs(600);
    s.budget_wait = Duration::from_secs(500);
    assert_eq!(
        decide(&s),
        Decision::Retry { wait: Duration::from_secs(300), source: WaitSource::Provider("retry-after") }
    );
}

#[test]
fn the_budget_paces_blind_retries_and_ends_them_only_at_the_deadline() {
    let p = Policy::default();
    let cap = outcome(Class::Capacity);
    // (budget wait, time left) → decision; backoff at attempt 1 is 500 ms.
    let cases: &[(u64, u64, Decision)] = &[
        // Room now: the backoff.
        (0, 30_000, Decision::Retry { wait: Duration::from_millis(500), source: WaitSource::Backoff }),
        // No room for 3 s: wait for it, said to be the budget's wait.
        (3_000, 30_000, Decision::Retry { wait: Duration::from_secs(3), source: WaitSource::Budget }),
        // A budget wait shorter than the backoff changes nothing.
        (200, 30_000, Decision::Retry { wait: Duration::from_millis(500), source: WaitSource::Backoff }),
        // The next free retry is too late to start before the deadline
        // (with base_delay to spare): the request ends now, saying whose
        // wait it was and how long.
        (
            29_800,
            30_000,
            Decision::GiveUp(GiveUp::BeyondDeadline {
                wait: Duration::from_millis(29_800),
                source: WaitSource::Budget,
            }),
        ),
    ];
    for (budget, left, want) in cases {
        let s = Situation {
            budget_wait: Duration::from_millis(*budget),
            remaining: Duration::from_millis(*left),
            ..situation(&cap, &p, 1)
        };
        assert_eq!(&decide(&s), want, "budget {budget} ms, {left} ms left");
    }
}

#[test]
fn a_backoff_longer_than_the_time_left_is_clipped_to_one_last_attempt() {
    let p = Policy { max_attempts: 6, base_delay: Duration::from_millis(500), max_delay: Duration::from_secs(30) };
    let cap = outcome(Class::Capacity);
    // Attempt 8: backoff up to 30 s; 4 s left → wait 3.5 s, then one last
    // attempt with base_delay to spare.
    let s = Situation { remaining: Duration::from_secs(4), jitter: 1.0, ..situation(&cap, &p, 8) };
    assert_eq!(decide(&s), Decision::Retry { wait: Duration::from_millis(3500), source: WaitSource::Backoff });
    // After that last attempt less than base_delay is left: the end, and
    // the wait is tidegate's own, never attributed to the provider.
    let s = Situation { remaining: Duration::from_millis(400), jitter: 1.0, ..situation(&cap, &p, 9) };
    match decide(&s) {
        Decision::GiveUp(GiveUp::BeyondDeadline { source, .. }) => assert_eq!(source, WaitSource::Backoff),
        other => panic!("{other:?}"),
    }
    // A rule's delay is the operator's: honoured, or the end.
    let mut ruled = outcome(Class::Capacity);
    ruled.rule = Some(RuleMatch {
        fatal: false,
        index: 0,
        delay: Some(Duration::from_secs(10)),
        max_attempts: None,
        class: None,
    });
    let s = Situation { remaining: Duration::from_secs(4), ..situation(&ruled, &p, 1) };
    assert_eq!(
        decide(&s),
        Decision::GiveUp(GiveUp::BeyondDeadline { wait: Duration::from_secs(10), source: WaitSource::Rule })
    );
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
    // Alone (a concurrency refusal to a single request): back off, do not
    // hammer.
    assert!(matches!(decide(&s), Decision::Retry { source: WaitSource::Backoff, .. }));
    s.others_in_flight = true;
    assert_eq!(decide(&s), Decision::Requeue);
    // Capacity refusals have no attempt limit: still requeued.
    let s6 = Situation { attempts: 6, target_attempts: 6, ..s.clone() };
    assert_eq!(decide(&s6), Decision::Requeue);
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
    // A target that used its attempts (transient) is left for the others;
    // the last one ends the request.
    let broken = outcome(Class::Transient);
    let s = Situation { other_target_ready: true, other_target_left: true, ..situation(&broken, &p, 6) };
    assert_eq!(decide(&s), Decision::LeaveTarget);
    let s = Situation { other_target_left: false, ..situation(&broken, &p, 6) };
    assert_eq!(decide(&s), Decision::GiveUp(GiveUp::Exhausted));
    // Attempts count per target: 12 in all, 2 here, go on.
    let s = Situation { attempts: 12, target_attempts: 2, ..situation(&broken, &p, 12) };
    assert!(matches!(decide(&s), Decision::Retry { .. }));
}

#[test]
fn a_fatal_rule_stops_everywhere_and_a_declared_entitlement_moves_on() {
    let p = Policy::default();
    let mut fatal = outcome(Class::Request);
    fatal.rule = Some(RuleMatch { fatal: true, index: 0, delay: None, max_attempts: None, class: Some(Class::Auth) });
    fatal.class = Class::Auth;
    let s = Situation { other_target_ready: true, other_target_left: true, ..situation(&fatal, &p, 1) };
    assert_eq!(decide(&s), Decision::GiveUp(GiveUp::NotRetryable), "no other target after a fatal rule");
    let mut declared = outcome(Class::Entitlement);
    declared.rule =
        Some(RuleMatch { fatal: false, index: 0, delay: None, max_attempts: None, class: Some(Class::Entitlement) });
    let s = Situation { other_target_ready: true, other_target_left: true, ..situation(&declared, &p, 1) };
    assert_eq!(decide(&s), Decision::NextTarget, "this account cannot serve; another may");
}
