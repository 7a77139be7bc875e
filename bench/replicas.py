"""Many replicas on one store, measured (run by bench/replicas.sh).

N tidegate replicas (4, 8, 16: real `tidegate serve` processes at their
defaults plus the config below) share one Redis, or a Redis Cluster of
three masters each with a replica (six `redis-server`s), in front of one
simulated provider with three accounts:

- `cap`: 16 sessions at once, 800 ms an answer, refused over (429 3009).
  The replicas are told `max_concurrent: 16`. A fan-out of 20x the cap
  (320 requests at once, spread round robin over the replicas). Reported:
  over-cap (requests the provider refused for its cap: goal 0), makespan
  against the ideal (20 rounds of 800 ms = 16 s; goal <= 1.15 with no
  fault).
- `learn`: the same cap, not told: the replicas learn it (adaptive, from
  the refusals). 32 requests first (learning), then 320 with the others.
  Reported: refusals-after-learning (the provider's refusals in the
  second part: goal <= the cap).
- `rate`: no cap, 50 ms an answer; the replicas are told `rpm: 240`. 300
  requests at once. Reported: rpm-overshoot, the share of the limit sent
  beyond it over any minute: the arrivals at the provider replayed
  through a token bucket of 240 a minute (full at the start, as
  tidegate's), with 0.25 s of refill as tolerance for the network's
  jitter; the most non-conforming arrivals within any 60 s, as a
  percentage of 240 (goal <= 1%).

Faults, 2 s into the fan-out: `none`; `stop` (Redis killed, restarted
empty 10 s later, on one server); `pause` (SIGSTOP 3 s, then SIGCONT: on
the cluster, all three masters); `kill-node` (the cluster's master that
holds the `cap` upstream's slot is killed; its replica is promoted).
Every case also reports failures (client requests not answered 200) and
sent against journaled (the replicas' journals, after a SIGTERM each).

Ends with one line per case, readable by a script:
`replicas <N> <store> <fault>: over-cap 0, rpm-overshoot X%, makespan Y× ideal, refusals-after-learning Z, failures W`
(followed by `, sent S, journaled J`).

Environment: REPLICAS="4 8 16", STORES="redis cluster", FAULTS="none
stop pause kill-node" (a fault a store cannot have is skipped).
"""

import http.client
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
import run  # noqa: E402

CAP, ROUNDS, LATENCY_MS = 16, 20, 800
RPM, RATE_N, RATE_LATENCY_MS = 240, 300, 50
WARM = 2 * CAP
FAULT_AT = 2.0
ADMIN = "bench-admin"
BASE = 19500
SIM = BASE
GW0 = BASE + 1  # up to 16 replicas
REDIS = BASE + 40
NODES = [BASE + 50 + i for i in range(6)]
BUS = [BASE + 60 + i for i in range(6)]

SIM_CONFIG = f"""
record: false
arrivals: true
models:
  cap: {{ latency_ms: {LATENCY_MS} }}
  learn: {{ latency_ms: {LATENCY_MS} }}
  rate: {{ latency_ms: {RATE_LATENCY_MS} }}
accounts:
  k-cap: {{ max_in_flight: {CAP} }}
  k-learn: {{ max_in_flight: {CAP} }}
"""


def replica_config(port, state, journal):
    base = f"http://127.0.0.1:{SIM}/v1"
    return (f"listen: 127.0.0.1:{port}\njournal: \"{journal}\"\nadmin_key: {ADMIN}\nstate: {state}\n"
            "upstreams:\n"
            f"  - {{ name: cap, protocol: openai, base_url: \"{base}\", api_key: k-cap, max_concurrent: {CAP} }}\n"
            f"  - {{ name: learn, protocol: openai, base_url: \"{base}\", api_key: k-learn }}\n"
            f"  - {{ name: rate, protocol: openai, base_url: \"{base}\", api_key: k-rate, rpm: {RPM} }}\n"
            "models:\n"
            "  cap: { targets: [{ upstream: cap }] }\n"
            "  learn: { targets: [{ upstream: learn }] }\n"
            "  rate: { targets: [{ upstream: rate }] }\n")


class Store:
    """One redis-server, or a cluster of six (three masters, one replica
    each), on fixed loopback ports, each in its own directory."""

    def __init__(self, kind):
        self.kind = kind
        self.procs = {}

    def url(self):
        if self.kind == "redis":
            return f"redis://127.0.0.1:{REDIS}/0"
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in NODES[:3]) + "/"

    def _server(self, port, extra=()):
        d = os.path.join(run.TMP, f"redis-{port}")
        if os.path.exists(d):
            subprocess.run(["rm", "-rf", d], check=True)
        os.makedirs(d)
        log = open(os.path.join(d, "log"), "w")
        p = subprocess.Popen(["taskset", "-c", "1", "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no", "--dir", d, *extra], stdout=log, stderr=log)
        self.procs[port] = p
        run.wait_port(port)

    def start(self):
        if self.kind == "redis":
            self._server(REDIS)
            return
        for port, bus in zip(NODES, BUS):
            self._server(port, ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
                                "--cluster-port", str(bus)])
        subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in NODES],
                        "--cluster-replicas", "1", "--cluster-yes"], check=True, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in cli(p, "cluster", "info") for p in NODES) and len(self.masters()) == 3:
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not come up")

    def masters(self):
        """Ports of the masters that are up, by the first live node's view."""
        for p in NODES:
            if p in self.procs and self.procs[p].poll() is None:
                out = cli(p, "cluster", "nodes")
                return [int(line.split()[1].split(":")[1].split("@")[0]) for line in out.splitlines()
                        if "master" in line.split()[2] and "fail" not in line.split()[2]]
        return []

    def master_of(self, key):
        slot = int(cli(NODES[0], "cluster", "keyslot", key).strip())
        for line in cli(NODES[0], "cluster", "nodes").splitlines():
            parts = line.split()
            if "master" not in parts[2]:
                continue
            for r in parts[8:]:
                lo, _, hi = r.partition("-")
                if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                    return int(parts[1].split(":")[1].split("@")[0])
        raise RuntimeError(f"no master holds slot {slot}")

    def fault(self, fault, log):
        if fault == "stop":
            self.procs[REDIS].kill()
            self.procs[REDIS].wait()
            log.append((time.monotonic(), "redis killed"))
            time.sleep(10)
            self._server(REDIS)
            log.append((time.monotonic(), "redis restarted empty"))
        elif fault == "pause":
            ports = [REDIS] if self.kind == "redis" else self.masters()
            for p in ports:
                self.procs[p].send_signal(signal.SIGSTOP)
            log.append((time.monotonic(), f"SIGSTOP {ports}"))
            time.sleep(3)
            for p in ports:
                self.procs[p].send_signal(signal.SIGCONT)
            log.append((time.monotonic(), "SIGCONT"))
        elif fault == "kill-node":
            victim = self.master_of("tidegate:{cap}:leases")
            self.procs[victim].kill()
            self.procs[victim].wait()
            log.append((time.monotonic(), f"master {victim} killed"))

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()


def cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=10).stdout


def admin_upstreams(port):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/admin/upstreams",
                                 headers={"authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())["upstreams"]


def wait_joined(ports, n):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if all(all(u["shared"] and u["shared_replicas"] == n for u in admin_upstreams(p)) for p in ports):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the replicas did not all join the store")


def post(port, model):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=150)
        conn.request("POST", "/v1/chat/completions", body=body, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp.status
    except OSError as e:
        return f"error {e}"


def fan_out(ports, jobs, start_at):
    """jobs: [(model, count)]; every request a thread, released together at
    `start_at`, round robin over `ports`. Returns {model: [(status, end)]}."""
    results = {m: [] for m, _ in jobs}
    lock = threading.Lock()
    go = threading.Event()
    threads = []

    def one(port, model):
        go.wait()
        status = post(port, model)
        with lock:
            results[model].append((status, time.monotonic()))

    k = 0
    for model, count in jobs:
        for _ in range(count):
            t = threading.Thread(target=one, args=(ports[k % len(ports)], model), daemon=True)
            k += 1
            t.start()
            threads.append(t)
    delay = start_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    go.set()
    return threads, results


def overshoot(arrivals_ms):
    """The most arrivals within any 60 s that a token bucket of RPM a
    minute (full at first) would not have taken, as % of RPM."""
    if not arrivals_ms:
        return 0.0
    arrivals = sorted(arrivals_ms)
    rate = RPM / 60000.0
    tokens, last, late = float(RPM), arrivals[0], []
    tolerance = rate * 250
    for at in arrivals:
        tokens = min(RPM, tokens + (at - last) * rate)
        last = at
        if tokens >= 1 - tolerance:
            tokens -= 1
        else:
            late.append(at)
    most, lo = 0, 0
    for hi in range(len(late)):
        while late[hi] - late[lo] >= 60000:
            lo += 1
        most = max(most, hi - lo + 1)
    return 100.0 * most / RPM


def journaled(dirs):
    rows = 0
    for d in dirs:
        path = os.path.join(d, "journal.db")
        if os.path.exists(path):
            db = sqlite3.connect(path)
            rows += db.execute("SELECT count(*) FROM requests").fetchone()[0]
            db.close()
    return rows


def case(n, kind, fault):
    store = Store(kind)
    procs, dirs = [], []
    log = []
    try:
        store.start()
        procs.append(run.start([run.BIN, "simulate", "--listen", f"127.0.0.1:{SIM}", "--config",
                                run.write("replicas-sim.yaml", SIM_CONFIG)], 1, {"RUST_LOG": "warn"},
                               f"sim-{n}-{kind}-{fault}.log"))
        ports = [GW0 + i for i in range(n)]
        for i, port in enumerate(ports):
            d = os.path.join(run.TMP, f"r{n}-{kind}-{fault}-{i}")
            os.makedirs(d, exist_ok=True)
            dirs.append(d)
            cfg = os.path.join(d, "tidegate.yaml")
            with open(cfg, "w") as f:
                f.write(replica_config(port, store.url(), os.path.join(d, "journal.db")))
            procs.append(run.start([run.BIN, "serve", "--config", cfg], i % 2, {"RUST_LOG": "warn"},
                                   f"gw-{n}-{kind}-{fault}-{i}.log"))
        run.wait_port(SIM)
        for p in ports:
            run.wait_port(p)
        wait_joined(ports, n)
        # Learning: the replicas find the `learn` account's cap.
        threads, warm = fan_out(ports, [("learn", WARM)], time.monotonic())
        for t in threads:
            t.join(150)
        learned_from = run.sim_stats(SIM)["accounts"].get("k-learn", {}).get("over_cap", 0)
        start = time.monotonic() + 0.5
        threads, results = fan_out(ports, [("cap", ROUNDS * CAP), ("learn", ROUNDS * CAP), ("rate", RATE_N)], start)
        if fault != "none":
            time.sleep(max(0.0, start + FAULT_AT - time.monotonic()))
            store.fault(fault, log)
        for t in threads:
            t.join(max(1.0, start + 150 - time.monotonic()))
        stats = run.sim_stats(SIM)
        with urllib.request.urlopen(f"http://127.0.0.1:{SIM}/sim/arrivals", timeout=10) as r:
            arrivals = json.loads(r.read())
    finally:
        run.stop(procs)
        store.stop()
    accounts = stats["accounts"]
    over_cap = accounts.get("k-cap", {}).get("over_cap", 0)
    after_learning = accounts.get("k-learn", {}).get("over_cap", 0) - learned_from
    ends = [end for _, end in results["cap"]]
    makespan = (max(ends) - start) / (ROUNDS * LATENCY_MS / 1000.0) if ends else float("nan")
    everything = warm["learn"] + results["cap"] + results["learn"] + results["rate"]
    failures = sum(1 for status, _ in everything if status != 200)
    sent = len(everything)
    rows = journaled(dirs)
    for at, what in log:
        print(f"#   {at - start:6.2f} s  {what}", file=sys.stderr)
    return (f"replicas {n} {kind} {fault}: over-cap {over_cap}, rpm-overshoot {overshoot(arrivals.get('rate', [])):.1f}%, "
            f"makespan {makespan:.2f}× ideal, refusals-after-learning {after_learning}, failures {failures}, "
            f"sent {sent}, journaled {rows}")


def main():
    counts = [int(x) for x in os.environ.get("REPLICAS", "4 8 16").split()]
    stores = os.environ.get("STORES", "redis cluster").split()
    faults = os.environ.get("FAULTS", "none stop pause kill-node").split()
    possible = {"redis": ["none", "stop", "pause"], "cluster": ["none", "pause", "kill-node"]}
    lines = []
    print(f"# replicas bench: {run.BIN}, files in {run.TMP}", file=sys.stderr)
    for n in counts:
        for kind in stores:
            for fault in faults:
                if fault not in possible[kind]:
                    continue
                line = case(n, kind, fault)
                print(line, file=sys.stderr, flush=True)
                lines.append(line)
    print()
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
