//! Shared test harness: a real simulator and a real gateway on loopback.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod grammar;

use std::collections::HashMap;
use std::time::Duration;

use tidegate::config::Config;
use tidegate::server::{self, Running};
use tidegate_simulate::{Behavior, Fault, SimConfig, Simulator};

/// The upstream key tests configure; must never reach a client or a log.
pub const UPSTREAM_KEY: &str = "sk-upstream-secret-123";

/// Starts a recording simulator with per-model behaviours.
pub fn sim(models: &[(&str, Behavior)]) -> Simulator {
    let config = SimConfig {
        default: Behavior::default(),
        models: models.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<HashMap<_, _>>(),
        record: true,
        seed: 7,
        ..Default::default()
    };
    Simulator::start("127.0.0.1:0".parse().unwrap(), config).unwrap()
}

/// A model whose first request is refused `429` with `Retry-After: secs`
/// (a provider's own wait), then answered normally.
pub fn rate_limited_once(secs: &str) -> Behavior {
    let body = r#"{"error":{"message":"Rate limit reached","type":"requests"}}"#;
    Behavior { script: vec![Fault::new(429, body).header("retry-after", secs)], ..Default::default() }
}

/// Upstreams `sim-openai` and `sim-anthropic` pointing at `sim`, plus the
/// given extra top-level YAML and models.
pub fn yaml(sim: &Simulator, top: &str, upstream_extra: &str, models: &str) -> String {
    // Fast retries unless the test sets its own defaults.
    let fast = "defaults:\n  retry: { base_delay: 10ms, max_delay: 50ms }";
    let top = if top.contains("defaults:") { top.to_string() } else { format!("{fast}\n{top}") };
    let top = if top.contains("journal:") { top } else { format!("journal: \"off\"\n{top}") };
    format!(
        "listen: 127.0.0.1:0\n{top}\nupstreams:\n  - name: sim-openai\n    protocol: openai\n    base_url: {}\n    api_key: {UPSTREAM_KEY}\n{upstream_extra}\n  - name: sim-anthropic\n    protocol: anthropic\n    base_url: {}\n    api_key: {UPSTREAM_KEY}\n{upstream_extra}\nmodels:\n  gpt:\n    targets: [{{ upstream: sim-openai, model: real-gpt }}]\n  claude:\n    targets: [{{ upstream: sim-anthropic }}]\n{models}\n",
        sim.openai_url(),
        sim.anthropic_url()
    )
}

/// Starts a gateway from YAML text (no environment lookups).
pub async fn gateway(yaml: &str) -> Running {
    let config = Config::parse(yaml, &|_| None).unwrap_or_else(|e| panic!("test config invalid: {e}\n{yaml}"));
    server::start(config).await.unwrap()
}

/// A plain HTTP client with a short overall timeout so no test hangs.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap()
}

pub fn url(gw: &Running, path: &str) -> String {
    format!("http://{}{}", gw.addr, path)
}

/// A tidegate as its own process (for signals and SIGKILL): `config` gets
/// the address to listen on and a fresh directory, and returns the config
/// text; the process is killed and reaped when dropped.
pub struct Process {
    pub child: std::process::Child,
    pub addr: String,
    pub dir: tempfile::TempDir,
}

impl Process {
    pub fn spawn(config: impl FnOnce(&str, &std::path::Path) -> String) -> Process {
        Self::spawn_logging("warn", config)
    }

    /// [`Process::spawn`] logging at `level` (`RUST_LOG`) to
    /// `stderr.log` in its directory.
    pub fn spawn_logging(level: &str, config: impl FnOnce(&str, &std::path::Path) -> String) -> Process {
        let dir = tempfile::tempdir().unwrap();
        let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
        let path = dir.path().join("tidegate.yaml");
        std::fs::write(&path, config(&addr, dir.path())).unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_tidegate"))
            .args(["serve", "--config"])
            .arg(&path)
            .env("RUST_LOG", level)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("stderr.log")).unwrap())
            .spawn()
            .unwrap();
        Process { child, addr, dir }
    }

    /// `http://addr`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An admin endpoint's JSON, with the admin key tests configure (`adm`).
pub async fn admin_json(gw: &Running, path: &str) -> serde_json::Value {
    client().get(url(gw, path)).bearer_auth("adm").send().await.unwrap().json().await.unwrap()
}

/// Waits (bounded) until `cond` holds.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..200 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// A normal OpenAI request that must succeed: used after every error case
/// to prove the gateway still serves.
pub async fn assert_serves(gw: &Running) {
    let resp = client()
        .post(url(gw, "/v1/chat/completions"))
        .body(r#"{"model":"gpt","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "gateway no longer serves normally");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["model"], "real-gpt");
}

/// POSTs `body` to `path` with one extra header (e.g. `x-tidegate-deadline`).
/// POSTs `body` to `path`.
pub async fn post(gw: &Running, path: &str, body: &str) -> reqwest::Response {
    client().post(url(gw, path)).body(body.to_string()).send().await.unwrap()
}

pub async fn post_with(gw: &Running, path: &str, header: (&str, &str), body: &str) -> reqwest::Response {
    client().post(url(gw, path)).header(header.0, header.1).body(body.to_string()).send().await.unwrap()
}

/// A real `redis-server` on a free loopback port, stopped when dropped;
/// `stop` and `restart` simulate an outage on the same port.
pub struct Redis {
    pub port: u16,
    child: Option<std::process::Child>,
    dir: tempfile::TempDir,
}

impl Redis {
    pub fn start() -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut r = Redis { port, child: None, dir: tempfile::tempdir().unwrap() };
        r.restart();
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn restart(&mut self) {
        ensure_redis_server();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run redis-server ({e}), and installing it failed (see above)"));
        self.child = Some(child);
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not listen on {}", self.port);
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the server without closing its sockets (SIGSTOP): a store
    /// that is slow, not gone; `resume` lets it go on.
    #[allow(dead_code)]
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    #[allow(dead_code)]
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, which: &str) {
        let pid = self.child.as_ref().expect("redis-server running").id().to_string();
        let status = std::process::Command::new("kill").args([which, &pid]).status().unwrap();
        assert!(status.success(), "kill {which} {pid}");
    }

    /// A plain connection for looking at the shared keys.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
    }
}

/// A chat completion of `model` at `base`, with an optional
/// `x-tidegate-deadline`.
#[allow(dead_code)]
pub async fn ask_chat(base: &str, model: &str, deadline: Option<&str>) -> reqwest::Response {
    let mut req = client()
        .post(format!("{base}/v1/chat/completions"))
        .body(format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#));
    if let Some(d) = deadline {
        req = req.header("x-tidegate-deadline", d);
    }
    req.send().await.unwrap()
}

/// A chat-only provider (stores nothing) and a replica's config that
/// reaches it for model `m` with shared state `state`: what a translated
/// Responses conversation kept in the store is tested with.
#[allow(dead_code)]
pub fn chat_only_replica(state: &str, admin: &str) -> (Simulator, String) {
    let chat = Simulator::start(
        "127.0.0.1:0".parse().unwrap(),
        SimConfig { chat_only: true, record: true, ..Default::default() },
    )
    .unwrap();
    let config = format!(
        "listen: 127.0.0.1:0\njournal: \"off\"\nadmin_key: {admin}\nstate: {state}\n\
         upstreams:\n  - {{ name: chat, protocol: openai-chat, base_url: \"{}\", api_key: k }}\n\
         models:\n  m: {{ targets: [{{ upstream: chat }}] }}\n",
        chat.openai_url()
    );
    (chat, config)
}

/// One Responses turn of model `m` on `gw`, continuing `previous`.
#[allow(dead_code)]
pub async fn responses_turn(gw: &Running, input: &str, previous: Option<&str>) -> reqwest::Response {
    let mut body = serde_json::json!({"model": "m", "input": input});
    if let Some(p) = previous {
        body["previous_response_id"] = p.into();
    }
    client().post(url(gw, "/v1/responses")).json(&body).send().await.unwrap()
}

/// A Redis Cluster of three masters (no replicas) on loopback, made of
/// Debian's `redis-server` with `cluster-enabled yes` and joined by
/// `redis-cli --cluster create`; stopped when dropped.
#[allow(dead_code)]
pub struct RedisCluster {
    pub ports: Vec<u16>,
    children: Vec<std::process::Child>,
    _dir: tempfile::TempDir,
}

#[allow(dead_code)]
impl RedisCluster {
    pub fn start() -> RedisCluster {
        ensure_redis_server();
        let dir = tempfile::tempdir().unwrap();
        let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (mut ports, mut children) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            // A port and a bus port (`--cluster-port`: not port + 10000,
            // which may be out of range or in use), tried again if the
            // server does not come up on them (another process took one).
            let started = (0..5).find_map(|_| {
                let (port, bus) = (free(), free());
                let node_dir = dir.path().join(port.to_string());
                std::fs::create_dir_all(&node_dir).unwrap();
                let mut child = std::process::Command::new("redis-server")
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                    .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                    .args(["--cluster-port", &bus.to_string()])
                    .arg("--dir")
                    .arg(&node_dir)
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap_or_else(|e| panic!("cannot run redis-server ({e})"));
                for _ in 0..500 {
                    if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                        return Some((port, child));
                    }
                    if child.try_wait().ok().flatten().is_some() {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = child.kill();
                let _ = child.wait();
                None
            });
            let (port, child) = started.expect("a cluster node did not start in 5 tries");
            ports.push(port);
            children.push(child);
        }
        let cluster = RedisCluster { ports, children, _dir: dir };
        let nodes: Vec<String> = cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = std::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e})"));
        assert!(created.success(), "redis-cli --cluster create failed");
        // Every node must agree before a client can rely on the slot map.
        for port in &cluster.ports {
            let ok = (0..500).any(|_| {
                let info =
                    std::process::Command::new("redis-cli").args(["-p", &port.to_string(), "cluster", "info"]).output();
                let ok = info.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"));
                if !ok {
                    std::thread::sleep(Duration::from_millis(20));
                }
                ok
            });
            assert!(ok, "the cluster's node {port} never reported cluster_state:ok");
        }
        cluster
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}/", nodes.join(","))
    }

    /// The node that serves `key`'s slot (each node's `myself` line of
    /// `CLUSTER NODES` lists its slot ranges).
    pub fn node_of(&self, key: &str) -> u16 {
        let cli = |port: u16, args: &[&str]| {
            let out = std::process::Command::new("redis-cli").arg("-p").arg(port.to_string()).args(args).output();
            String::from_utf8_lossy(&out.unwrap().stdout).to_string()
        };
        let slot: u16 = cli(self.ports[0], &["cluster", "keyslot", key]).trim().parse().unwrap();
        for port in &self.ports {
            let nodes = cli(*port, &["cluster", "nodes"]);
            let Some(me) = nodes.lines().find(|l| l.contains("myself")) else { continue };
            for range in me.split_whitespace().skip(8) {
                let (start, end) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(start), Ok(end)) = (start.parse::<u16>(), end.parse::<u16>())
                    && (start..=end).contains(&slot)
                {
                    return *port;
                }
            }
        }
        panic!("no node serves slot {slot}");
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Installs Debian's `redis-server` once if it is not on PATH, so `cargo
/// test` passes on a fresh machine by itself (as root, like CI; otherwise
/// the failure says what to install).
fn ensure_redis_server() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        // `redis-cli` makes the cluster of `tests/cluster.rs`.
        let found = ["redis-server", "redis-cli"]
            .iter()
            .all(|tool| std::process::Command::new(tool).arg("--version").output().is_ok());
        if found {
            return;
        }
        eprintln!("redis-server or redis-cli not found: installing Debian's redis-server and redis-tools for the shared-state tests");
        let status = std::process::Command::new("sh")
            .args([
                "-c",
                "(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools) >&2",
            ])
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("could not install redis-server (needs root and Debian's package mirror): install it by hand");
        }
    });
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}
