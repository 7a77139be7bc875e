//! Every named simulator scenario, with tidegate in front configured as
//! the README's recipe says: the burst that fails straight at it succeeds
//! through tidegate, and the caps the scenario declares are never exceeded.

#![allow(clippy::unwrap_used)]

mod common;

use common::{UPSTREAM_KEY, gateway};
use indicatif::ProgressBar;
use tidegate_simulate::demo::{Aim, Run, burst};
use tidegate_simulate::{SimConfig, Simulator};

/// The burst's models: OpenAI requests name `models.0`, Anthropic ones
/// `models.1` (through tidegate: aliases `o-…` and `a-…` for them).
fn aim(openai_base: String, anthropic_base: String, models: (&str, &str)) -> Aim {
    Aim { openai_base, anthropic_base, openai_model: models.0.into(), anthropic_model: models.1.into() }
}

/// The scenario's simulator; the burst straight at it; the same burst
/// through tidegate with `upstream_extra` on both upstreams.
async fn both_ways(scenario: &str, models: (&str, &str), upstream_extra: &str, n: usize) -> (Run, Run, Simulator) {
    let (gpt, claude) = models;
    let direct_sim = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::scenario(scenario).unwrap()).unwrap();
    let direct =
        burst(n, &aim(direct_sim.openai_url(), direct_sim.anthropic_url(), models), ProgressBar::hidden()).await;
    let sim = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::scenario(scenario).unwrap()).unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:0\njournal: \"off\"\ndefaults:\n  retry: {{ base_delay: 20ms, max_delay: 200ms, max_attempts: 12 }}\n\
         upstreams:\n  - name: sim-openai\n    protocol: openai\n    base_url: {}\n    api_key: {UPSTREAM_KEY}\n{upstream_extra}\n\
         \x20 - name: sim-anthropic\n    protocol: anthropic\n    base_url: {}\n    api_key: {UPSTREAM_KEY}\n{upstream_extra}\n\
         models:\n  o-{gpt}:\n    targets: [{{ upstream: sim-openai, model: {gpt} }}]\n  a-{claude}:\n    targets: [{{ upstream: sim-anthropic, model: {claude} }}]\n",
        sim.openai_url(),
        sim.anthropic_url()
    );
    let gw = gateway(&yaml).await;
    let base = format!("http://{}", gw.addr);
    let aliases = (format!("o-{gpt}"), format!("a-{claude}"));
    let through = burst(n, &aim(format!("{base}/v1"), base, (&aliases.0, &aliases.1)), ProgressBar::hidden()).await;
    (direct, through, sim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_scenario_passes_everything_through() {
    let (direct, through, _sim) = both_ways("healthy", ("m-openai", "m-anthropic"), "", 12).await;
    assert_eq!(direct.succeeded, 12, "{direct:?}");
    assert_eq!(through.succeeded, 12, "{through:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overloaded_scenario_is_absorbed() {
    let (direct, through, _sim) = both_ways("overloaded", ("m-openai", "m-anthropic"), "", 30).await;
    assert!(direct.failures.keys().any(|k| k.starts_with("HTTP 529")), "{direct:?}");
    assert_eq!(through.succeeded, 30, "{through:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_scenario_cap_is_learned_and_never_left_exceeded() {
    // Undeclared cap: tidegate learns it from the 429 3009 answers.
    let (direct, through, sim) = both_ways("capacity", ("demo-gpt", "demo-claude"), "", 16).await;
    assert!(direct.failed() >= 8, "16 at once against a cap of 3 per model: {direct:?}");
    assert_eq!(through.succeeded, 16, "{through:?}");
    assert!(sim.state.rejected.load(std::sync::atomic::Ordering::SeqCst) > 0, "the cap was hit and absorbed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_scenario_with_declared_cap_queues_instead_of_hitting_it() {
    let (_direct, through, sim) =
        both_ways("capacity", ("demo-gpt", "demo-claude"), "    max_concurrent: 3\n", 16).await;
    assert_eq!(through.succeeded, 16, "{through:?}");
    assert_eq!(sim.state.rejected.load(std::sync::atomic::Ordering::SeqCst), 0, "nothing over the cap was sent");
    assert!(sim.state.max_in_flight_of("demo-gpt") <= 3 && sim.state.max_in_flight_of("demo-claude") <= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quirks_scenario_needs_and_honours_retry_rules() {
    let rules = "    retry: [{ on_status: [400], on_body_contains: [\"TM.00001041\"], delay: 50ms, max_attempts: 30 }]\n    fatal: [{ on_body_contains: [\"TM.00001005\"] }]";
    let (direct, through, _sim) = both_ways("quirks", ("glm", "glm"), rules, 16).await;
    assert!(direct.failures.keys().any(|k| k.starts_with("HTTP 400")), "{direct:?}");
    assert!(direct.failures.keys().any(|k| k.starts_with("200 + error frame")), "{direct:?}");
    assert_eq!(through.succeeded, 16, "{through:?}");
    // Without the rule, a 400 is a request error: passed on after one attempt.
    let (_, without, _) = both_ways("quirks", ("glm", "glm"), "", 16).await;
    assert!(without.failed() > 0, "a 400 is not retried on wording alone: {without:?}");
    // no-plan: the fatal rule stops at once.
    let (_, no_plan, _) = both_ways("quirks", ("no-plan", "no-plan"), rules, 2).await;
    assert_eq!(no_plan.failed(), 2, "{no_plan:?}");
}
