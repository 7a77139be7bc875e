//! The `tidegate` command line: `serve`, `check`, `simulate`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tidegate::config::{Config, DEFAULT_CONFIG};
use tidegate::logging::Clean;
use tidegate_simulate::{SimConfig, Simulator};

#[derive(Parser)]
#[command(name = "tidegate", version, about = "LLM gateway that absorbs provider capacity errors")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// See what tidegate does in 30 s, offline: the same burst straight at
    /// a faulty simulated provider and through tidegate, compared.
    Demo {
        /// Requests per burst.
        #[arg(long, default_value_t = 40)]
        requests: usize,
        /// Journal of the tidegate run (read it with `tidegate log --journal`).
        #[arg(long, default_value_os_t = std::env::temp_dir().join("tidegate-demo.db"))]
        journal: PathBuf,
    },
    /// Run the gateway (writes a commented default config if none exists).
    Serve {
        /// Config file.
        #[arg(long, short, default_value = "tidegate.yaml")]
        config: PathBuf,
        /// Runtime worker threads, overriding the config (0 = one per CPU).
        #[arg(long)]
        workers: Option<usize>,
        /// Listen address, overriding the config.
        #[arg(long)]
        listen: Option<SocketAddr>,
    },
    /// Make a running tidegate re-read its config (`POST /admin/reload`
    /// with the config's `admin_key`; without one, send it `SIGHUP`).
    Reload {
        /// Config file (for the address and the admin key).
        #[arg(long, short, default_value = "tidegate.yaml")]
        config: PathBuf,
        /// Base URL of the running tidegate, instead of the config's `listen`.
        #[arg(long)]
        url: Option<String>,
    },
    /// Exit 0 when a running tidegate answers `/healthz` with 200 (the
    /// container image's HEALTHCHECK: no curl needed in the image).
    Healthcheck {
        /// The health URL.
        #[arg(long, default_value = "http://127.0.0.1:8787/healthz")]
        url: String,
    },
    /// Validate a config file; prints each problem with its field path.
    Check {
        /// Config file.
        #[arg(long, short, default_value = "tidegate.yaml")]
        config: PathBuf,
    },
    /// Print recent requests from the journal as a table.
    Log {
        /// Config file (for the journal path).
        #[arg(long, short, default_value = "tidegate.yaml")]
        config: PathBuf,
        /// Journal file, instead of the one the config names.
        #[arg(long)]
        journal: Option<PathBuf>,
        /// Only this outcome (completed, incomplete, failed, cancelled, rejected).
        #[arg(long)]
        outcome: Option<String>,
        /// Only this far back (e.g. 1h, 30m) or since an RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
        /// At most this many rows, newest first.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Run the upstream simulator (OpenAI at /v1, Anthropic at /).
    Simulate {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: SocketAddr,
        /// A named fault scenario: healthy, capacity, overloaded, quirks.
        #[arg(long, conflicts_with = "config")]
        scenario: Option<String>,
        /// Simulator config (YAML, the shape of the scenario files).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Runtime worker threads (0 = one per CPU).
        #[arg(long, default_value_t = 0)]
        workers: usize,
        /// Serve chat completions only, as most OpenAI-compatible
        /// providers do (`/v1/responses` and `/v1/messages` answer 404).
        #[arg(long)]
        chat_only: bool,
        /// Write each request body received into this directory
        /// (`0001-chat-completions.json`, …): what clients really send.
        #[arg(long)]
        dump: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { requests, journal } => demo(requests, journal),
        Command::Serve { config, workers, listen } => serve(&config, workers, listen),
        Command::Check { config } => return check(&config),
        Command::Reload { config, url } => reload(&config, url),
        Command::Healthcheck { url } => healthcheck(&url),
        Command::Log { config, journal, outcome, since, limit } => log(&config, journal, outcome, since, limit),
        Command::Simulate { listen, scenario, config, workers, chat_only, dump } => {
            simulate(listen, scenario.as_deref(), config.as_deref(), workers, (chat_only, dump))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("tidegate: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn check(path: &Path) -> ExitCode {
    match Config::load(path) {
        Ok(config) => {
            println!(
                "{}: ok ({} upstreams, {} models, listening on {})",
                path.display(),
                config.upstreams.len(),
                config.models.len(),
                config.listen
            );
            for line in config.translation_report() {
                println!("{}: {}", path.display(), Clean(&line));
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            // A problem quotes what the file (or an environment variable
            // it names) says: escaped, like every value a person reads.
            for problem in err.problems() {
                eprintln!("{}: {}", path.display(), Clean(&problem.to_string()));
            }
            ExitCode::from(2)
        }
    }
}

/// One worker means a current-thread runtime: no work-stealing machinery
/// for a proxy pinned to one core. Otherwise a multi-thread runtime with
/// `workers` threads (0 = one per CPU).
fn log(
    config: &Path,
    journal: Option<PathBuf>,
    outcome: Option<String>,
    since: Option<String>,
    limit: u32,
) -> anyhow::Result<()> {
    let path = match journal {
        Some(path) => path,
        None => Config::load(config)
            .map_err(|e| anyhow::anyhow!("{}: {e} (or pass --journal FILE)", config.display()))?
            .journal
            .ok_or_else(|| anyhow::anyhow!("the journal is off in {}", config.display()))?,
    };
    if !path.exists() {
        anyhow::bail!("no journal at {} yet: start tidegate and send a request first", path.display());
    }
    let since_ms = match since.as_deref() {
        None => None,
        Some(text) => Some(
            tidegate::server::admin::parse_since(text)
                .ok_or_else(|| anyhow::anyhow!("--since {text:?}: use a duration like 1h or an RFC 3339 time"))?,
        ),
    };
    let query = tidegate::journal::Query { outcome, model: None, since_ms, limit };
    let rows = tidegate::journal::list(&path, &query).with_context(|| format!("cannot read {}", path.display()))?;
    println!(
        "{:<20} {:<10} {:>6} {:<18} {:<10} {:>8} {:>9}  {:<16} error / partial",
        "time (UTC)", "outcome", "status", "model", "client", "attempts", "total ms", "upstreams"
    );
    // Model names and error texts come from clients and providers: every
    // text field is escaped before it reaches the operator's terminal.
    let clean = |text: Option<&str>| Clean(text.unwrap_or("-")).to_string();
    for r in &rows {
        let time = jiff::Timestamp::from_millisecond(r.ts_ms).map(|t| t.strftime("%Y-%m-%d %H:%M:%S").to_string());
        let mut note =
            r.partial.as_ref().map(|p| format!("partial: {} chars · ", p.chars().count())).unwrap_or_default();
        note.extend(r.error.iter().flat_map(|e| e.chars().take(80)));
        println!(
            "{:<20} {:<10} {:>6} {:<18} {:<10} {:>8} {:>9.1}  {:<16} {}",
            time.unwrap_or_default(),
            clean(Some(&r.outcome)),
            r.status,
            clean(r.model.as_deref()),
            clean(r.client.as_deref()),
            r.n_attempts,
            r.total_ms,
            clean(Some(&r.targets)),
            Clean(&note),
        );
    }
    eprintln!("{} request(s) from {}", rows.len(), path.display());
    Ok(())
}

/// The async runtime: `workers` threads, or one per CPU this process may
/// use (its affinity and cgroup quota, as `available_parallelism` reads
/// them) when 0. One thread gets tokio's current-thread runtime: on one
/// core the multi-threaded scheduler only adds cross-thread wake-ups
/// (measured ~7% of throughput, bench/).
fn runtime(workers: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let workers = match workers {
        0 => std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get),
        n => n,
    };
    let mut builder = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if workers > 0 {
            b.worker_threads(workers);
        }
        b
    };
    builder.enable_all().build().context("cannot start the async runtime")
}

fn init_logging() -> tidegate::logging::FlushGuard {
    use std::io::IsTerminal;
    let (writer, guard) = tidegate::logging::BatchWriter::start(std::io::stderr());
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(writer).init();
    guard
}

fn serve(path: &Path, workers: Option<usize>, listen: Option<SocketAddr>) -> anyhow::Result<()> {
    let _guard = init_logging();
    if !path.exists() {
        std::fs::write(path, DEFAULT_CONFIG)
            .with_context(|| format!("cannot write a default config to {}", path.display()))?;
        tracing::info!(path = %path.display(), "no config found: wrote a commented default config; edit it to add your upstreams");
    }
    let mut config = Config::load(path).map_err(|err| {
        anyhow::anyhow!("{} is not valid (run `tidegate check --config {}`):\n{err}", path.display(), path.display())
    })?;
    if let Some(listen) = listen {
        if config.client_keys.is_empty() && !listen.ip().is_loopback() {
            anyhow::bail!("refusing to listen on {listen} without client_keys: add client_keys to {}", path.display());
        }
        config.listen = listen;
    }
    for u in &config.upstreams {
        // A local model server (or the simulator) usually needs no key.
        let local = match u.base_url.host() {
            Some(url::Host::Domain(d)) => d == "localhost",
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        };
        if u.api_key.is_empty() && !local {
            tracing::warn!(upstream = %u.name, "upstream has no api_key; the provider will reject requests");
        }
    }
    if config.client_keys.is_empty() {
        tracing::warn!("no client_keys configured: any local client may use this gateway");
    }
    // Each client connection and each upstream connection is a file
    // descriptor: raise the soft limit to the hard one (a soft 1024 runs out
    // long before max_connections).
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => {
            tracing::debug!(limit, "open file limit");
            reserve_descriptors(limit, config.max_connections);
        }
        Err(err) => tracing::warn!(error = %err, "cannot raise the open file limit"),
    }
    let rt = runtime(workers.unwrap_or(config.workers))?;
    let grace = config.shutdown_grace;
    rt.block_on(async {
        let mut running = tidegate::server::start_from(config, Some(path.to_path_buf())).await?;
        tracing::info!(addr = %running.addr, "tidegate listening");
        tokio::spawn(return_idle_memory());
        if let Some(listen) = listen {
            running.live().override_listen(listen);
        }
        tokio::spawn(reload_on_hangup(running.live()));
        tokio::select! {
            () = running.wait() => return Ok(()),
            () = shutdown_signal() => {}
        }
        tracing::info!(grace = ?grace, "shutting down: /healthz answers 503, in-flight requests finish (a second signal ends at once)");
        running.shutdown(grace, shutdown_signal()).await;
        tracing::info!("shut down");
        Ok(())
    })
}

fn demo(requests: usize, journal: PathBuf) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let options = tidegate_simulate::demo::Options { requests, progress: std::io::stderr().is_terminal(), journal };
    println!(
        "tidegate demo: a simulated provider with a 3-request cap per model (429 3009, no Retry-After),\n\
         200 + error frame stream refusals, random 529 overloaded and one Retry-After: 1.\n\
         The same burst of {requests} concurrent requests (OpenAI chat and Responses, Anthropic; streaming and not) goes\n\
         straight to it, then through tidegate.\n"
    );
    let report = runtime(0)?.block_on(tidegate_simulate::demo::run(&options))?;
    println!("\n{}", report.table());
    println!("every request of the tidegate run: tidegate log --journal {}", report.journal.display());
    if report.gateway.failed() > 0 {
        anyhow::bail!(
            "{} request(s) failed through tidegate: that is a bug, please report it",
            report.gateway.failed()
        );
    }
    Ok(())
}

fn simulate(
    listen: SocketAddr,
    scenario: Option<&str>,
    config: Option<&Path>,
    workers: usize,
    (chat_only, dump): (bool, Option<PathBuf>),
) -> anyhow::Result<()> {
    let _guard = init_logging();
    let mut sim_config = match (scenario, config) {
        (Some(name), _) => SimConfig::scenario(name)?,
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            SimConfig::from_yaml(&text)
                .map_err(|e| anyhow::anyhow!("{} is not a valid simulator config: {e}", path.display()))?
        }
        (None, None) => SimConfig::default(),
    };
    sim_config.chat_only |= chat_only;
    if let Some(dir) = dump {
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        sim_config.dump = Some(dir);
    }
    let rt = runtime(workers)?;
    rt.block_on(async {
        let sim = Simulator::start(listen, sim_config).with_context(|| format!("cannot listen on {listen}"))?;
        if let Some(name) = scenario {
            tracing::info!(scenario = name, "{}", sim.state.description());
        }
        tracing::info!(openai = %sim.openai_url(), anthropic = %sim.anthropic_url(), "simulator listening");
        tokio::select! {
            _ = sim.wait() => {}
            _ = shutdown_signal() => {}
        }
        Ok(())
    })
}

/// Grows the file descriptor table once, at start, to what
/// `max_connections` needs (a client and an upstream connection each, and
/// some). The kernel grows it by doubling as descriptors open, and in a
/// process with more than one thread each growth waits for an RCU grace
/// period inside `accept` (10–30 ms on the bench machine): a fresh
/// tidegate's first burst of 1,000 new streams stalled three times, at
/// 128, 256 and 512 open descriptors, and its time to first event p99 was
/// 22 ms against 3 ms for the next burst. The table never shrinks; growing
/// it once costs 8 bytes a descriptor (~170 KB for the default 10,000).
fn reserve_descriptors(limit: u64, max_connections: usize) {
    let want = (max_connections as u64).saturating_mul(2).saturating_add(1024).min(limit);
    let Ok(high) = libc::c_int::try_from(want.saturating_sub(1)) else { return };
    #[cfg(unix)]
    // SAFETY: F_DUPFD_CLOEXEC copies stderr onto the lowest free
    // descriptor at or above `high`, which is closed at once; no other
    // descriptor is touched, and a failure (no stderr) changes nothing.
    unsafe {
        let fd = libc::fcntl(2, libc::F_DUPFD_CLOEXEC, high);
        if fd >= 0 {
            libc::close(fd);
        }
    }
    #[cfg(not(unix))]
    let _ = high;
}

/// After a burst, the memory its thousands of connections used is free in
/// the allocator but not returned to the system (glibc keeps it), so a
/// gateway's RSS would stay at its highest burst forever. Every 30 s,
/// this hands free memory back (`malloc_trim`), off the request path.
async fn return_idle_memory() {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(30));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        every.tick().await;
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            // SAFETY: malloc_trim only returns free memory to the system;
            // it takes the allocator's own locks and touches no live data.
            let _ = tokio::task::spawn_blocking(|| unsafe { libc::malloc_trim(0) }).await;
        }
    }
}

/// `SIGHUP` re-reads the config; a refused one is logged with its
/// problems and the running config stays.
async fn reload_on_hangup(live: std::sync::Arc<tidegate::gateway::Live>) {
    #[cfg(unix)]
    {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the config");
            if let Err(err) = live.reload().await {
                tracing::error!("config reload refused; the running config stays:\n{err}");
            }
        }
    }
    #[cfg(not(unix))]
    drop(live);
}

/// `tidegate reload`: asks the running gateway to re-read its config.
fn reload(path: &Path, url: Option<String>) -> anyhow::Result<()> {
    let config = Config::load(path).map_err(|err| anyhow::anyhow!("{} is not valid:\n{err}", path.display()))?;
    let Some(admin) = config.admin_key.as_ref() else {
        anyhow::bail!(
            "{} has no admin_key: send the running tidegate SIGHUP instead (kill -HUP <pid>)",
            path.display()
        );
    };
    let base = url.unwrap_or_else(|| format!("http://{}", config.listen));
    let target = format!("{}/admin/reload", base.trim_end_matches('/'));
    let (status, body) = http_call(http::Method::POST, &target, Some(admin.expose()))?;
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    if status.is_success() {
        println!("reloaded: {}", v["changes"]);
        return Ok(());
    }
    let problems = v["problems"].as_array().map(|p| p.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join("\n"));
    anyhow::bail!("reload refused ({status}); the running config stays:\n{}", problems.unwrap_or_default())
}

/// One plain-HTTP call, for the commands that talk to a running tidegate:
/// status and body.
fn http_call(
    method: http::Method,
    url: &str,
    bearer: Option<&str>,
) -> anyhow::Result<(http::StatusCode, bytes::Bytes)> {
    let uri: http::Uri = url.parse().with_context(|| format!("not a URL: {url}"))?;
    let mut request = http::Request::builder().method(method).uri(uri);
    if let Some(key) = bearer {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let request = request.body(http_body_util::Empty::<bytes::Bytes>::new())?;
    runtime(1)?.block_on(async {
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http::<http_body_util::Empty<bytes::Bytes>>();
        let call = client.request(request);
        let response = tokio::time::timeout(std::time::Duration::from_secs(5), call)
            .await
            .with_context(|| format!("no answer from {url} within 5 s"))?
            .with_context(|| format!("cannot reach tidegate at {url}"))?;
        let status = response.status();
        let body = http_body_util::BodyExt::collect(response.into_body()).await?.to_bytes();
        anyhow::Ok((status, body))
    })
}

/// `tidegate healthcheck`: 0 when `/healthz` answers 200.
fn healthcheck(url: &str) -> anyhow::Result<()> {
    let (status, body) = http_call(http::Method::GET, url, None)?;
    if status.is_success() {
        return Ok(());
    }
    anyhow::bail!("{url} answered {status}: {}", String::from_utf8_lossy(&body).trim())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
