"""Chaos soak: two tidegate replicas sharing Redis, in front of a faulty
simulated provider, under mixed traffic from several keys, while the config
is reloaded every minute, Redis is restarted twice and one replica is
stopped and started again. Loopback only, bounded in time (--minutes) and
in requests (each worker stops at the end time; every request has a
timeout).

Usage: python3 bench/soak.py [--minutes 30] [--workers 24] [--binary PATH]
(bench/soak.sh builds the release binary and installs redis-server first.)

Traffic: chat completions, the Responses API and Anthropic messages,
streaming and not, with tools, from four client keys, round robin over the
replicas that are up (a load balancer's view: a connection refused or a
503 "shutting_down" moves the request to the other replica, as a balancer
would, and both attempts are counted as sent).

Faults (the simulator's config below): 429 "3009" over a concurrency cap
without Retry-After, 529 overloaded, 503, HTTP 200 + an error frame for
streams, 400 "TM.00001041" (absorbed by a retry rule), an HTML page under
200, an empty stream, a stream dropped mid-way (resumed), and a provider
error event mid-stream (the one failure the client must see: unavoidable,
counted apart).

Report (printed and written to target/soak-report.md): requests sent vs
rows journaled (both replicas' journals, matched by request id), failures
other than the unavoidable ones, RSS and open file descriptors of each
replica at the start, middle and end, and the most requests the simulated
provider saw in flight for the upstream declared `max_concurrent: 3`, with
Redis up and while it was down.
"""

import argparse
import http.client
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--minutes", type=float, default=30.0)
ap.add_argument("--workers", type=int, default=24)
ap.add_argument("--binary", default="target/release/tidegate")
ap.add_argument("--report", default="target/soak-report.md")
ap.add_argument("--replicas", type=int, default=2)
ap.add_argument("--store", choices=["redis", "cluster"], default="redis",
                help="cluster: six redis-servers (three masters, one replica each); "
                     "the Redis faults kill the master of the capped upstream's slot instead")
args = ap.parse_args()

BIN = os.path.abspath(args.binary)
TMP = tempfile.mkdtemp(prefix="tidegate-soak-")
DURATION = args.minutes * 60
KEYS = ["soak-key-1", "soak-key-2", "soak-key-3", "soak-key-4"]
ADMIN = "soak-admin-key"
CAP = 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, seconds=20):
    end = time.time() + seconds
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


SIM, REDIS = free_port(), free_port()
PORTS = [free_port() for _ in range(args.replicas)]
NODES = [free_port() for _ in range(6)] if args.store == "cluster" else []
BUSES = [free_port() for _ in range(6)] if args.store == "cluster" else []

SIM_CONFIG = f"""
description: soak faults
seed: 11
default:
  latency_ms: 80
  chunks: 6
  chunk_delay_ms: 15
models:
  busy-gpt:
    latency_ms: 120
    reject_over: 4
    fail_rate: 0.08
    fail_with:
      status: 529
      body: '{{"type":"error","error":{{"type":"overloaded_error","message":"Overloaded"}}}}'
  backup-gpt:
    fail_rate: 0.05
    fail_with:
      status: 503
      body: '{{"error":{{"message":"The server is overloaded","type":"server_error"}}}}'
  capped-gpt:
    latency_ms: 200
    reject_over: {CAP}
  busy-claude:
    latency_ms: 120
    reject_over: 3
    over_limit:
      status: 429
      body: '{{"type":"error","error":{{"type":"rate_limit_error","message":"Number of concurrent connections has exceeded your rate limit."}}}}'
    over_limit_stream:
      mode: error_frame
      body: '{{"type":"error","error":{{"type":"overloaded_error","message":"concurrency limit reached: 3 sessions max"}}}}'
    fail_rate: 0.05
    fail_with:
      status: 529
      body: '{{"type":"error","error":{{"type":"overloaded_error","message":"Overloaded"}}}}'
  glm:
    latency_ms: 100
    reject_over: 3
    over_limit:
      status: 400
      body: '{{"error_code":"TM.00001041","error_msg":"The number of concurrent sessions exceeds the limit: 3 sessions max"}}'
    over_limit_stream:
      mode: error_frame
      body: '{{"error_code":"TM.00001041","error_msg":"The number of concurrent sessions exceeds the limit: 3 sessions max"}}'
  odd-html:
    fail_rate: 0.2
    fail_with:
      status: 200
      content_type: text/html
      body: '<html><body>Please log in</body></html>'
  odd-empty:
    fail_rate: 0.2
    fail_with:
      mode: empty_stream
  dropper:
    chunks: 8
    fail_rate: 0.1
    fail_with:
      mode: drop_after
      status: 3
  broken-gpt:
    fail_rate: 0.05
    fail_with:
      mode: error_mid_stream
      status: 4
      body: '{{"error":{{"message":"internal error mid-stream","type":"server_error"}}}}'
"""


STATE = (f"redis://127.0.0.1:{REDIS}" if args.store == "redis"
         else "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in NODES[:3]) + "/")


def gateway_config(port, journal, variant):
    # The variant changes what a reload can change: a delay and a weight.
    max_delay = "2s" if variant % 2 == 0 else "3s"
    weight = 1 + variant % 3
    keys = ", ".join(f"{{ name: k{i + 1}, key: {k} }}" for i, k in enumerate(KEYS))
    sim = f"http://127.0.0.1:{SIM}"
    return f"""
listen: 127.0.0.1:{port}
journal: {journal}
admin_key: {ADMIN}
state: {STATE}
client_keys: [{keys}]
defaults:
  deadline: 90s
  retry: {{ base_delay: 100ms, max_delay: {max_delay} }}
upstreams:
  - {{ name: oa-main, protocol: openai, base_url: "{sim}/v1", api_key: up-secret-1 }}
  - {{ name: oa-backup, protocol: openai, base_url: "{sim}/v1", api_key: up-secret-2 }}
  - {{ name: oa-capped, protocol: openai, base_url: "{sim}/v1", api_key: up-secret-3, max_concurrent: {CAP} }}
  - {{ name: an-main, protocol: anthropic, base_url: "{sim}", api_key: up-secret-4 }}
  - {{ name: oa-odd, protocol: openai, base_url: "{sim}/v1", api_key: up-secret-6 }}
  - {{ name: oa-flaky, protocol: openai, base_url: "{sim}/v1", api_key: up-secret-7 }}
  - name: quirky
    protocol: openai
    base_url: "{sim}/v1"
    api_key: up-secret-5
    retry:
      - {{ on_status: [400], on_body_contains: ["TM.00001041"], delay: 500ms, max_attempts: 60 }}
models:
  chat:
    strategy: balance
    targets:
      - {{ upstream: oa-main, model: busy-gpt, weight: {weight} }}
      - {{ upstream: oa-backup, model: backup-gpt }}
  capped: {{ targets: [{{ upstream: oa-capped, model: capped-gpt }}] }}
  claude: {{ targets: [{{ upstream: an-main, model: busy-claude }}] }}
  glm: {{ targets: [{{ upstream: quirky, model: glm }}] }}
  odd:
    targets:
      - {{ upstream: oa-odd, model: odd-html }}
      - {{ upstream: oa-odd, model: odd-empty }}
      - {{ upstream: oa-backup, model: backup-gpt }}
  dropper: {{ targets: [{{ upstream: oa-flaky, model: dropper }}] }}
  broken: {{ targets: [{{ upstream: oa-flaky, model: broken-gpt }}] }}
"""


TOOLS_OPENAI = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                 "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
TOOLS_RESPONSES = [{"type": "function", "name": "read_file", "description": "Read a file",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]
TOOLS_ANTHROPIC = [{"name": "read_file", "description": "Read a file",
                    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]


def request_kinds():
    """(weight, label, path, body, stream, unavoidable_possible)."""
    msgs = [{"role": "user", "content": "soak: summarise the repo"}]
    kinds = []
    for alias in ["chat", "capped", "glm", "odd"]:
        for stream in (False, True):
            kinds.append((3, f"chat/{alias}", "/v1/chat/completions",
                          {"model": alias, "messages": msgs, "tools": TOOLS_OPENAI, "stream": stream}, stream))
    for stream in (False, True):
        kinds.append((2, "responses/chat", "/v1/responses",
                      {"model": "chat", "input": "soak", "tools": TOOLS_RESPONSES, "stream": stream, "store": False},
                      stream))
        kinds.append((3, "messages/claude", "/v1/messages",
                      {"model": "claude", "max_tokens": 256, "messages": msgs, "tools": TOOLS_ANTHROPIC,
                       "stream": stream}, stream))
    kinds.append((2, "chat/dropper", "/v1/chat/completions",
                  {"model": "dropper", "messages": msgs, "stream": True}, True))
    kinds.append((1, "chat/broken", "/v1/chat/completions",
                  {"model": "broken", "messages": msgs, "stream": True}, True))
    return kinds


TERMINAL = {"/v1/chat/completions": b"data: [DONE]", "/v1/responses": b"response.completed",
            "/v1/messages": b"message_stop"}


class Replica:
    def __init__(self, index):
        self.index = index
        self.port = PORTS[index]
        self.config = os.path.join(TMP, f"gw{index}.yaml")
        self.journal = os.path.join(TMP, f"journal{index}.db")
        self.log = open(os.path.join(TMP, f"gw{index}.log"), "ab")
        self.proc = None
        self.up = False
        self.write_config(0)

    def write_config(self, variant):
        with open(self.config, "w") as f:
            f.write(gateway_config(self.port, self.journal, variant))

    def start(self):
        self.proc = subprocess.Popen([BIN, "serve", "--config", self.config], stdout=self.log, stderr=self.log,
                                     env={**os.environ, "RUST_LOG": "warn"})
        if not wait_port(self.port):
            raise SystemExit(f"replica {self.index} did not start; see {self.log.name}")
        self.up = True

    def stop(self):
        self.up = False
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)

    def sample(self):
        """(RSS KiB, open fds) of the process now."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
            return rss, len(os.listdir(f"/proc/{self.proc.pid}/fd"))
        except (OSError, StopIteration):
            return None, None


class Redis:
    def __init__(self):
        self.dir = os.path.join(TMP, "redis")
        os.makedirs(self.dir, exist_ok=True)
        self.proc = None
        self.up = False

    def start(self):
        self.proc = subprocess.Popen(["redis-server", "--port", str(REDIS), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.dir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_port(REDIS):
            raise SystemExit("redis-server did not start")
        self.up = True

    def stop(self):
        self.up = False
        self.proc.terminate()
        self.proc.wait(timeout=20)


class Cluster:
    """Six redis-servers in one cluster; `stop` kills the master that
    holds the capped upstream's slot (its replica is promoted), `start`
    brings that node back (it rejoins as a replica)."""

    def __init__(self):
        self.procs = {}
        self.victim = None
        self.up = False

    def _node(self, port, bus):
        d = os.path.join(TMP, f"node-{port}")
        os.makedirs(d, exist_ok=True)
        self.procs[port] = (subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--cluster-enabled", "yes", "--cluster-node-timeout", "2000", "--cluster-port", str(bus),
             "--dir", d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), bus)
        if not wait_port(port):
            raise SystemExit("a cluster node did not start")

    def start(self):
        if not self.procs:
            for port, bus in zip(NODES, BUSES):
                self._node(port, bus)
            subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in NODES],
                            "--cluster-replicas", "1", "--cluster-yes"], check=True, stdout=subprocess.DEVNULL)
            end = time.time() + 30
            while time.time() < end:
                info = subprocess.run(["redis-cli", "-p", str(NODES[0]), "cluster", "info"], capture_output=True,
                                      text=True).stdout
                if "cluster_state:ok" in info:
                    break
                time.sleep(0.1)
        elif self.victim:
            self._node(self.victim, self.procs[self.victim][1])
            self.victim = None
        self.up = True

    def master_of(self, key):
        live = [p for p, (proc, _) in self.procs.items() if proc.poll() is None]
        slot = int(subprocess.run(["redis-cli", "-p", str(live[0]), "cluster", "keyslot", key], capture_output=True,
                                  text=True).stdout.strip())
        nodes = subprocess.run(["redis-cli", "-p", str(live[0]), "cluster", "nodes"], capture_output=True,
                               text=True).stdout
        for line in nodes.splitlines():
            parts = line.split()
            if "master" not in parts[2] or "fail" in parts[2]:
                continue
            for r in parts[8:]:
                lo, _, hi = r.partition("-")
                if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                    return int(parts[1].split(":")[1].split("@")[0])
        return live[0]

    def stop(self, everything=False):
        self.up = False
        if everything:
            for proc, _ in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            return
        self.victim = self.master_of("tidegate:{oa-capped}:leases")
        proc, _ = self.procs[self.victim]
        proc.kill()
        proc.wait()


lock = threading.Lock()
sent = []          # (request id or None, label, replica, verdict, detail)
stop_at = 0.0
replicas = []
START = [0.0]


def one_request(kind, key, replica):
    """Sends one request; returns (id, verdict, detail). verdict: ok,
    unavoidable, draining, refused (no connection), failure."""
    _, label, path, body, stream = kind
    conn = http.client.HTTPConnection("127.0.0.1", replica.port, timeout=120)
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    if path == "/v1/messages":
        headers["anthropic-version"] = "2023-06-01"
    try:
        conn.request("POST", path, json.dumps(body), headers)
        resp = conn.getresponse()
    except (ConnectionRefusedError, ConnectionResetError, BrokenPipeError) as e:
        conn.close()
        return None, "refused", repr(e)
    except Exception as e:  # noqa: BLE001 - everything else is a failure to report
        conn.close()
        return None, "failure", f"before the answer: {e!r}"
    rid = resp.getheader("x-tidegate-request-id")
    try:
        data = resp.read()
    except Exception as e:  # noqa: BLE001
        conn.close()
        return rid, "failure", f"body cut: {e!r}"
    conn.close()
    if resp.status == 503 and b"shutting_down" in data:
        return rid, "draining", ""
    if resp.status != 200 and b"circuit breaker is open" in data:
        return rid, "breaker", f"{resp.status}: {data[:200]!r}"
    if resp.status != 200:
        return rid, "failure", f"{resp.status}: {data[:200]!r}"
    if stream:
        if TERMINAL[path] in data and b"error" not in data.split(TERMINAL[path])[0][-400:]:
            return rid, "ok", ""
        if label == "chat/broken" and b"internal error mid-stream" in data:
            return rid, "unavoidable", "provider error event mid-stream"
        return rid, "failure", f"stream without its end: {data[-300:]!r}"
    try:
        json.loads(data)
    except ValueError:
        return rid, "failure", f"not JSON: {data[:200]!r}"
    return rid, "ok", ""


def worker(seed):
    rng = random.Random(seed)
    kinds = request_kinds()
    weights = [k[0] for k in kinds]
    turn = seed
    while time.time() < stop_at:
        kind = rng.choices(kinds, weights)[0]
        key = KEYS[rng.randrange(len(KEYS))]
        for _ in range(4):
            up = [r for r in replicas if r.up] or replicas
            replica = up[turn % len(up)]
            turn += 1
            rid, verdict, detail = one_request(kind, key, replica)
            if verdict == "refused":
                time.sleep(0.2)
                continue
            with lock:
                sent.append((rid, kind[1], replica.index, verdict, detail))
            if verdict != "draining":
                break
        else:
            with lock:
                sent.append((None, kind[1], -1, "failure", "no replica accepted the connection"))


def get_json(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def main():
    global stop_at
    with open(os.path.join(TMP, "sim.yaml"), "w") as f:
        f.write(SIM_CONFIG)
    redis = Redis() if args.store == "redis" else Cluster()
    redis.start()
    sim_log = open(os.path.join(TMP, "sim.log"), "ab")
    sim = subprocess.Popen([BIN, "simulate", "--listen", f"127.0.0.1:{SIM}", "--config",
                            os.path.join(TMP, "sim.yaml")], stdout=sim_log, stderr=sim_log)
    wait_port(SIM)
    replicas.extend([Replica(i) for i in range(args.replicas)])
    for r in replicas:
        r.start()
    started = time.time()
    START[0] = started
    stop_at = started + DURATION
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.workers)]
    for t in threads:
        t.start()

    samples = {i: [] for i in range(args.replicas)}  # (elapsed, rss, fds)
    capped = {"up": 0, "down": 0}  # most in flight at once for the capped upstream
    events = []
    reloads = {"ok": 0, "failed": 0}
    schedule = [(DURATION / 3, "redis"), (DURATION / 2, "replica"), (2 * DURATION / 3, "redis")]
    next_reload = started + 60
    next_sample = started
    variant = 0
    while time.time() < stop_at:
        now = time.time()
        if schedule and now - started >= schedule[0][0]:
            _, what = schedule.pop(0)
            if what == "redis":
                redis.stop()
                events.append(f"{now - started:.0f}s: " + ("Redis stopped" if args.store == "redis" else
                              f"cluster master {redis.victim} killed (its replica takes over)"))
                phase_end = time.time() + 10
                while time.time() < phase_end:
                    record_caps(capped, "down")
                    time.sleep(1)
                redis.start()
                events.append(f"{time.time() - started:.0f}s: " + ("Redis started again" if args.store == "redis"
                              else "the killed node started again (rejoins as a replica)"))
            else:
                r = replicas[1]
                before = time.time()
                r.stop()
                events.append(f"{before - started:.0f}s: replica 1 stopped (SIGTERM, drained in "
                              f"{time.time() - before:.1f}s)")
                time.sleep(3)
                r.start()
                events.append(f"{time.time() - started:.0f}s: replica 1 started again")
        if now >= next_reload:
            variant += 1
            for r in replicas:
                r.write_config(variant)
                if not r.up:
                    continue
                req = urllib.request.Request(f"http://127.0.0.1:{r.port}/admin/reload", method="POST",
                                             headers={"authorization": f"Bearer {ADMIN}"})
                try:
                    with urllib.request.urlopen(req, timeout=10) as resp:
                        reloads["ok" if resp.status == 200 else "failed"] += 1
                except Exception:  # noqa: BLE001
                    reloads["failed"] += 1
            next_reload += 60
        if now >= next_sample:
            for r in replicas:
                if r.up:
                    rss, fds = r.sample()
                    samples[r.index].append((now - started, rss, fds))
            next_sample += 10
        record_caps(capped, "up" if redis.up else "down")
        time.sleep(1)

    for t in threads:
        t.join(timeout=150)
    for r in replicas:
        rss, fds = r.sample()
        samples[r.index].append((time.time() - started, rss, fds))
    for r in replicas:
        r.stop()
    sim.terminate()
    redis.stop(everything=True) if args.store == "cluster" else redis.stop()
    report(samples, capped, events, reloads, time.time() - started)


def record_caps(capped, phase):
    try:
        stats = get_json(f"http://127.0.0.1:{SIM}/sim/stats?reset=1")
    except Exception:  # noqa: BLE001
        return
    most = stats["models"].get("capped-gpt", {}).get("max_in_flight", 0)
    capped[phase] = max(capped[phase], most)
    if most > CAP:
        capped.setdefault("over", []).append((round(time.time() - START[0]), phase, most))


def journaled():
    ids = {}
    for r in replicas:
        db = sqlite3.connect(f"file:{r.journal}?mode=ro", uri=True)
        for hi, lo, outcome in db.execute("SELECT id, id_lo, outcome FROM requests"):
            hi, lo = hi & (2**64 - 1), lo & (2**64 - 1)
            h = f"{hi:016x}{lo:016x}"
            ids[f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"] = outcome
        db.close()
    return ids


def report(samples, capped, events, reloads, elapsed):
    rows = journaled()
    with_id = [s for s in sent if s[0]]
    missing = [s for s in with_id if s[0] not in rows]
    verdicts = {}
    for s in sent:
        verdicts[s[3]] = verdicts.get(s[3], 0) + 1
    failures = [s for s in sent if s[3] == "failure"]
    by_label = {}
    for s in failures:
        by_label[s[1]] = by_label.get(s[1], 0) + 1

    def at(series, frac):
        if not series:
            return "-"
        _, rss, fds = series[min(len(series) - 1, int(frac * (len(series) - 1)))]
        return f"{rss / 1024:.1f} MiB, {fds} fds" if rss else "-"

    lines = [
        f"# Chaos soak: {elapsed / 60:.1f} minutes, {args.workers} workers, {args.replicas} replicas + "
        + ("Redis" if args.store == "redis" else "a Redis Cluster (3 masters, 3 replicas)"),
        "",
        "| what | figure |",
        "|---|---:|",
        f"| requests sent (answered by a replica) | {len(with_id)} |",
        f"| rows journaled (every replica) | {len(rows)} |",
        f"| sent but not journaled | {len(missing)} |",
        f"| succeeded | {verdicts.get('ok', 0)} |",
        f"| refused while draining, resent to the other replica | {verdicts.get('draining', 0)} |",
        f"| unavoidable (provider error event mid-stream) | {verdicts.get('unavoidable', 0)} |",
        f"| answered at once behind an open circuit breaker (`Retry-After`: the probe's time) | "
        f"{verdicts.get('breaker', 0)} |",
        f"| **failures other than those** | **{len(failures)}** |",
        f"| config reloads (ok / failed) | {reloads['ok']} / {reloads['failed']} |",
        f"| most in flight at the `max_concurrent: {CAP}` upstream, Redis up / down | "
        f"{capped['up']} / {capped['down']} |",
    ]
    for i in (0, 1):
        lines.append(f"| replica {i}: start / middle / end | {at(samples[i], 0)} · {at(samples[i], 0.5)} · "
                     f"{at(samples[i], 1)} |")
    lines += ["", "Events: " + "; ".join(events)]
    if capped.get("over"):
        lines += ["", "Seconds with more than the cap in flight (elapsed s, Redis, most): "
                  + ", ".join(map(str, capped["over"][:20]))]
    if by_label:
        lines += ["", "Failures by request kind: " + ", ".join(f"{k} {v}" for k, v in sorted(by_label.items()))]
        for s in failures[:10]:
            lines.append(f"- {s[1]} on replica {s[2]} ({s[0]}): {s[4][:300]}")
    if missing:
        lines += ["", "Not journaled (first 5): " + ", ".join(str(s[0]) for s in missing[:5])]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    with open(args.report, "w") as f:
        f.write(text)
    print(f"logs and journals in {TMP}")
    ok = not failures and not missing and capped["up"] <= CAP
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
