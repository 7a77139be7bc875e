//! `tidegate demo`: what tidegate does, in one command, offline.
//!
//! Starts the simulator with the `capacity` scenario (a 3-request cap
//! answered `429 3009` without `Retry-After`, a `200` + error frame stream
//! refusal, random `529 overloaded`, one `Retry-After: 1`), fires the same
//! burst of concurrent requests — chat completions, the Responses API and
//! Anthropic messages, streaming and not — once
//! straight at it and once through an in-process tidegate (each run against
//! a fresh simulator, so both meet the same faults), and compares the two.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::{SimConfig, Simulator};
use tidegate::config::Config;
use tidegate::journal;

/// Longest any one demo request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How big a demo to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Requests per burst (half OpenAI, half Anthropic; half of each streaming).
    pub requests: usize,
    /// Draw progress bars on stderr (only when it is a terminal).
    pub progress: bool,
    /// Where tidegate's journal goes (kept afterwards for `tidegate log`).
    pub journal: PathBuf,
}

/// One burst's results.
#[derive(Debug, Default)]
pub struct Run {
    /// Requests answered in full.
    pub succeeded: usize,
    /// Requests that failed, by what the client saw.
    pub failures: BTreeMap<String, usize>,
    /// Latency of each succeeded request.
    pub latencies: Vec<Duration>,
    /// Whole burst, first request sent to last answer.
    pub wall: Duration,
}

impl Run {
    /// Requests that failed.
    pub fn failed(&self) -> usize {
        self.failures.values().sum()
    }

    fn percentile(&self, p: f64) -> Option<Duration> {
        let mut v = self.latencies.clone();
        v.sort();
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        v.get(i).copied()
    }
}

/// What tidegate did behind the scenes, from its journal.
#[derive(Debug, Default)]
pub struct Behind {
    /// Upstream refusals and failures absorbed (attempts beyond the first).
    pub retries: u64,
    /// Requests that waited in an upstream's queue for a free slot.
    pub queued: usize,
    /// Median queue wait of those.
    pub queue_p50: Duration,
    /// Requests answered by another target than the first one tried.
    pub failovers: usize,
    /// Journal rows read (one per request).
    pub rows: usize,
}

/// The demo's outcome.
#[derive(Debug)]
pub struct Report {
    /// Requests per burst.
    pub requests: usize,
    /// Straight at the simulator.
    pub direct: Run,
    /// Through tidegate.
    pub gateway: Run,
    /// tidegate's own account.
    pub behind: Behind,
    /// The journal of the tidegate run.
    pub journal: PathBuf,
}

/// Runs both bursts and reads tidegate's journal.
pub async fn run(options: &Options) -> anyhow::Result<Report> {
    let n = options.requests.max(2);
    let scenario = SimConfig::scenario("capacity")?;
    let bar = |label: &str| {
        let bar = ProgressBar::with_draw_target(
            Some(n as u64),
            if options.progress { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() },
        );
        let style = ProgressStyle::with_template("{prefix:>18} [{bar:30}] {pos}/{len} answered  {msg}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_prefix(label.to_owned());
        bar
    };

    let sim = Simulator::start(loopback(), scenario.clone()).context("cannot start the simulator")?;
    let aim = |openai_base: String, anthropic_base: String| Aim {
        openai_base,
        anthropic_base,
        openai_model: "demo-gpt".into(),
        anthropic_model: "demo-claude".into(),
    };
    let direct = burst(n, &aim(sim.openai_url(), sim.anthropic_url()), bar("straight to it")).await;
    if options.progress {
        eprintln!(); // a finished bar stays; the next one starts below it
    }
    drop(sim);

    let sim = Simulator::start(loopback(), scenario).context("cannot start the simulator")?;
    let _ = std::fs::remove_file(&options.journal);
    let gateway = tidegate::server::start(gateway_config(&sim, &options.journal)?).await?;
    let base = format!("http://{}", gateway.addr);
    let through = burst(n, &aim(format!("{base}/v1"), base), bar("through tidegate")).await;
    if options.progress {
        eprintln!();
    }
    if let Some(journal) = gateway.live().load().sink.journal.clone() {
        let _ = tokio::task::spawn_blocking(move || journal.flush(Duration::from_secs(2))).await;
    }
    let behind = read_journal(&options.journal, n).await;
    drop(gateway);
    Ok(Report { requests: n, direct, gateway: through, behind, journal: options.journal.clone() })
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// The README's "try it offline" config, which the demo runs as is, with
/// its own simulator address, port and journal filled in.
pub const TRY_CONFIG: &str = include_str!("../../examples/try.yaml");

fn gateway_config(sim: &Simulator, journal: &std::path::Path) -> anyhow::Result<Config> {
    let sim_addr = sim.addr.to_string();
    let journal = journal.display().to_string();
    let lookup = |name: &str| match name {
        "TRY_LISTEN" => Some("127.0.0.1:0".to_owned()),
        "TRY_SIM" => Some(sim_addr.clone()),
        "TRY_JOURNAL" => Some(journal.clone()),
        _ => None,
    };
    Config::parse(TRY_CONFIG, &lookup).map_err(|e| anyhow::anyhow!("examples/try.yaml: {e}"))
}

/// Where a burst goes: base URLs as the SDKs take them and the model each
/// protocol's requests name.
#[derive(Debug, Clone)]
pub struct Aim {
    /// OpenAI base URL, with `/v1`.
    pub openai_base: String,
    /// Anthropic base URL, without `/v1`.
    pub anthropic_base: String,
    /// `model` of the OpenAI requests.
    pub openai_model: String,
    /// `model` of the Anthropic requests.
    pub anthropic_model: String,
}

/// Fires `n` requests at once (odd: Anthropic messages; even: OpenAI, chat
/// completions and the Responses API in turn; half of each streaming) and
/// waits for every answer, in full. The scenario tests use it too.
pub async fn burst(n: usize, aim: &Aim, bar: ProgressBar) -> Run {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let api = match i % 4 {
            0 => Api::Chat,
            2 => Api::Responses,
            _ => Api::Messages,
        };
        let stream = (i / 4) % 2 == 1;
        let (url, model) = match api {
            Api::Messages => (format!("{}/v1/messages", aim.anthropic_base), aim.anthropic_model.clone()),
            Api::Chat => (format!("{}/chat/completions", aim.openai_base), aim.openai_model.clone()),
            Api::Responses => (format!("{}/responses", aim.openai_base), aim.openai_model.clone()),
        };
        let client = client.clone();
        tasks.spawn(async move {
            let began = Instant::now();
            let ask = Ask { i, api, stream, model: &model };
            let outcome = tokio::time::timeout(REQUEST_TIMEOUT, one(&client, &url, ask))
                .await
                .unwrap_or_else(|_| Err("no answer in 60 s".into()));
            (outcome, began.elapsed())
        });
    }
    let mut run = Run::default();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((Ok(()), took)) => {
                run.succeeded += 1;
                run.latencies.push(took);
            }
            Ok((Err(why), _)) => *run.failures.entry(why).or_default() += 1,
            Err(_) => *run.failures.entry("demo task failed".into()).or_default() += 1,
        }
        bar.set_message(format!("{} failed", run.failed()));
        bar.inc(1);
    }
    run.wall = start.elapsed();
    bar.finish();
    run
}

/// The API a burst request speaks.
#[derive(Debug, Clone, Copy)]
enum Api {
    Chat,
    Responses,
    Messages,
}

/// One request of a burst.
struct Ask<'a> {
    i: usize,
    api: Api,
    stream: bool,
    model: &'a str,
}

/// One request; `Err` says what the client saw go wrong.
async fn one(client: &Client<HttpConnector, Full<Bytes>>, url: &str, ask: Ask<'_>) -> Result<(), String> {
    let Ask { i, api, stream, model } = ask;
    let body = match api {
        Api::Chat => format!(
            r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"demo request {i}"}}]}}"#
        ),
        Api::Responses => format!(r#"{{"model":"{model}","stream":{stream},"input":"demo request {i}"}}"#),
        Api::Messages => format!(
            r#"{{"model":"{model}","max_tokens":64,"stream":{stream},"messages":[{{"role":"user","content":"demo request {i}"}}]}}"#
        ),
    };
    let request = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header("anthropic-version", "2023-06-01")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("bad request: {e}"))?;
    let response = client.request(request).await.map_err(|_| "connection failed".to_string())?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(|_| "answer cut off".to_string())?.to_bytes();
    let text = String::from_utf8_lossy(&body);
    if !status.is_success() {
        return Err(format!("HTTP {} {}", status.as_u16(), gist(&text)));
    }
    if !stream && text.contains(r#""status":"failed""#) {
        return Err(format!("200 + failed response {}", gist(&text)));
    }
    if stream {
        let end = match api {
            Api::Chat => "[DONE]",
            Api::Responses => "response.completed",
            Api::Messages => "message_stop",
        };
        if text.contains("\"error") || text.contains("event: error") {
            return Err(format!("200 + error frame {}", gist(&text)));
        }
        if !text.contains(end) {
            return Err("stream ended early".into());
        }
    }
    Ok(())
}

/// A few words of an error body, for grouping failures.
fn gist(body: &str) -> String {
    let lower = body.to_ascii_lowercase();
    let words = [
        ("concurren", "(concurrency limit)"),
        ("overloaded", "(overloaded)"),
        ("rate limit", "(rate limit)"),
        ("queue", "(queue full)"),
    ];
    words.iter().find(|(w, _)| lower.contains(w)).map_or_else(String::new, |(_, label)| (*label).to_owned())
}

/// Reads the tidegate run's journal (its writer is asynchronous: waits,
/// bounded, until every request's row is there).
async fn read_journal(path: &std::path::Path, n: usize) -> Behind {
    let query = journal::Query { outcome: None, model: None, since_ms: None, limit: n as u32 * 2 };
    let mut rows = Vec::new();
    for _ in 0..100 {
        rows = journal::list(path, &query).unwrap_or_default();
        if rows.len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut waits: Vec<f64> = rows.iter().map(|r| r.queue_ms).filter(|ms| *ms >= 5.0).collect();
    waits.sort_by(f64::total_cmp);
    Behind {
        retries: rows.iter().map(|r| u64::from(r.n_attempts.saturating_sub(1))).sum(),
        queued: waits.len(),
        queue_p50: waits.get(waits.len() / 2).map_or(Duration::ZERO, |ms| Duration::from_secs_f64(ms / 1000.0)),
        failovers: rows.iter().filter(|r| r.targets.contains(',')).count(),
        rows: rows.len(),
    }
}

impl Report {
    /// The side-by-side summary printed at the end.
    pub fn table(&self) -> String {
        let ms = |d: Option<Duration>| d.map_or_else(|| "-".to_owned(), |d| format!("{:.0} ms", d.as_secs_f64() * 1e3));
        let (d, g, b) = (&self.direct, &self.gateway, &self.behind);
        let mut out = String::new();
        let mut row = |what: &str, direct: String, through: String| {
            let _ = writeln!(out, "  {what:<42} {direct:>14} {through:>18}");
        };
        row("", "straight to it".into(), "through tidegate".into());
        row("succeeded", format!("{}/{}", d.succeeded, self.requests), format!("{}/{}", g.succeeded, self.requests));
        row("failed", d.failed().to_string(), g.failed().to_string());
        let mut reasons: Vec<&String> = d.failures.keys().chain(g.failures.keys()).collect();
        reasons.sort();
        reasons.dedup();
        for why in reasons {
            let count = |r: &Run| r.failures.get(why).map_or_else(|| "-".to_owned(), |c| c.to_string());
            row(&format!("  {why}"), count(d), count(g));
        }
        row("latency p50 (succeeded)", ms(d.percentile(0.5)), ms(g.percentile(0.5)));
        row("latency p95 (succeeded)", ms(d.percentile(0.95)), ms(g.percentile(0.95)));
        row("whole burst", ms(Some(d.wall)), ms(Some(g.wall)));
        row("upstream refusals absorbed", "-".into(), b.retries.to_string());
        row("requests that queued for a slot", "-".into(), format!("{} (p50 {})", b.queued, ms(Some(b.queue_p50))));
        row("requests moved to another target", "-".into(), b.failovers.to_string());
        out
    }
}
