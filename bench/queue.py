"""Backpressure benchmark: 10,000 requests waiting in one upstream queue.

Starts the simulator and tidegate (one runtime thread) with an upstream
limited to one concurrent request whose answer takes 60 s, fires 10,000
requests at it with oha, and measures tidegate's resident memory per waiting
request and its CPU use while they all wait (a queue that polls would burn
CPU here; tidegate's waiters sleep on a channel).

Usage: python3 bench/queue.py   (after bench/run.sh has built the binary)
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from run import BIN, cpu_seconds, start, status_kib, stop, wait_port, write  # noqa: E402

SIM, GW = 19010, 19012
N = int(os.environ.get("N", 10_000))


def rss_kib(pid):
    return status_kib(pid, "VmRSS")


def main():
    sim_cfg = write("queue-sim.yaml", "record: false\nmodels:\n  slow: { latency_ms: 60000 }\n")
    gw_cfg = write("queue-gw.yaml", f"""
listen: 127.0.0.1:{GW}
defaults: {{ deadline: 300s }}
upstreams:
  - {{ name: sim, protocol: openai, base_url: "http://127.0.0.1:{SIM}/v1", max_concurrent: 1, max_queue: 20000 }}
models:
  slow: {{ targets: [{{ upstream: sim }}] }}
""")
    procs = []
    try:
        procs.append(start([BIN, "simulate", "--listen", f"127.0.0.1:{SIM}", "--workers", "1", "--config", sim_cfg],
                           1, {"RUST_LOG": "warn"}, "queue-sim.log"))
        gw = start([BIN, "serve", "--config", gw_cfg, "--workers", "1"], 0, {"RUST_LOG": "warn"}, "queue-gw.log")
        procs.append(gw)
        wait_port(SIM)
        wait_port(GW)
        time.sleep(0.5)
        idle_rss = rss_kib(gw.pid)
        load = subprocess.Popen(["taskset", "-c", "1", "oha", "--no-tui", "-n", str(N), "-c", str(N), "-t", "120s",
                                 "-m", "POST", "-d", '{"model":"slow"}', "-H", "content-type: application/json",
                                 f"http://127.0.0.1:{GW}/v1/chat/completions"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(load)
        # Wait until the connections are in (RSS stops growing).
        last, stable = 0, 0
        for _ in range(120):
            time.sleep(0.5)
            now = rss_kib(gw.pid)
            stable = stable + 1 if now == last else 0
            last = now
            if stable >= 4:
                break
        full_rss = rss_kib(gw.pid)
        cpu0 = cpu_seconds(gw.pid)
        time.sleep(5)
        cpu1 = cpu_seconds(gw.pid)
        per_request = (full_rss - idle_rss) * 1024 / N
        print(f"| waiting requests | {N} |")
        print(f"|---|---:|")
        print(f"| tidegate RSS idle, MiB | {idle_rss / 1024:.1f} |")
        print(f"| tidegate RSS with {N} waiting, MiB | {full_rss / 1024:.1f} |")
        print(f"| memory per waiting request (connection + queue entry), KiB | {per_request / 1024:.1f} |")
        print(f"| CPU while they wait, % of one core (5 s) | {100 * (cpu1 - cpu0) / 5:.2f} |")
    finally:
        stop(procs)


if __name__ == "__main__":
    main()
