"""Runs the foundation benchmark and prints a table of medians with ratios.

Layout (2 cores): the proxy under test (nginx with one worker, or tidegate
with one runtime thread) is pinned to CPU 0; the simulator and the load
generator share CPU 1. "direct" sends the same load straight to the
simulator. Every figure is the median of REPS repetitions, and every ratio
compares numbers measured in this same run.
"""

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

QUICK = "--quick" in sys.argv
REPS = int(os.environ.get("REPS", 5)) if not QUICK else 1
DUR = "5s" if not QUICK else "2s"
BIN = os.path.abspath(os.environ.get("TIDEGATE_BIN", "target/release/tidegate"))
SIM, NGINX, GW = 19000, 19001, 19002
BODY = '{"model":"bench","messages":[{"role":"user","content":"hello"}]}'
SSE_BODY = '{"model":"sse","stream":true,"messages":[{"role":"user","content":"hello"}]}'
SLOW_BODY = '{"model":"slow","messages":[{"role":"user","content":"hello"}]}'
PATH = "/v1/chat/completions"
TMP = tempfile.mkdtemp(prefix="tidegate-bench-")


def wait_port(port):
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.025)
    raise RuntimeError(f"nothing listening on {port}")


def start(cmd, cpu, env=None, log="proc.log"):
    out = open(os.path.join(TMP, log), "w")
    return subprocess.Popen(["taskset", "-c", str(cpu)] + cmd, stdout=out, stderr=out,
                            env=dict(os.environ, **(env or {})))


def floor_cmd(bare_bin, port, upstream_port, name):
    """The floor (examples/bare_proxy.rs --journal: the bare proxy plus the
    body read whole, its model read, a request id and tidegate's journal
    row) on `port`, with a fresh journal file `name` under TMP."""
    journal = os.path.join(TMP, name)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(journal + suffix):
            os.remove(journal + suffix)
    return [bare_bin, f"127.0.0.1:{port}", f"127.0.0.1:{upstream_port}", "--journal", journal]


def stop(procs):
    """SIGTERM every process, then kill what has not ended within 5 s."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()


def sim_stats(port):
    """The simulator's `/sim/stats` (refusals, requests per model, …)."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/sim/stats")
    v = json.loads(conn.getresponse().read())
    conn.close()
    return v


def write(name, text):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def status_kib(pid, field):
    """A memory figure from /proc/PID/status (VmHWM: peak, VmRSS: now)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def nginx_conf(name, port, upstream, access_log):
    """nginx as a plain reverse proxy: 1 worker, upstream keep-alive,
    `proxy_buffering off`; `access_log` a file, or "off" (nginx at its best)."""
    return write(name, f"""
worker_processes 1;
worker_rlimit_nofile 65536;
pid {TMP}/{name}.pid;
error_log {TMP}/{name}-error.log warn;
events {{ worker_connections 16384; }}
http {{
  access_log {access_log};
  upstream up {{ server 127.0.0.1:{upstream}; keepalive 1024; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      tcp_nodelay on;
    }}
  }}
}}
""")


def one_upstream_config(dirname, port, upstream):
    """A tidegate config at its defaults in TMP/`dirname`: listening on
    `port`, model `bench` on one OpenAI-protocol upstream. Returns its path."""
    cwd = os.path.join(TMP, dirname)
    os.makedirs(cwd, exist_ok=True)
    cfg = os.path.join(cwd, "tidegate.yaml")
    with open(cfg, "w") as f:
        f.write(f"listen: 127.0.0.1:{port}\nupstreams:\n"
                f'  - {{ name: up, protocol: openai, base_url: "http://127.0.0.1:{upstream}/v1" }}\n'
                "models:\n  bench: { targets: [{ upstream: up }] }\n")
    return cfg


def rss_peak_kib(pid):
    return status_kib(pid, "VmHWM")


def cpu_ns(pid):
    """Time on CPU of every thread of `pid`, in seconds, from the
    scheduler's nanosecond counters (/proc/PID/task/*/schedstat): the
    10 ms ticks of /proc/PID/stat are ±5% over a few seconds at 500 req/s."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total / 1e9


def switches_and_ticks(pid):
    """Context switches of every thread of `pid` (voluntary and not, from
    /proc/PID/task/*/status) and the process's user and kernel time in
    seconds (/proc/PID/stat, every thread, 10 ms ticks)."""
    switches = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                switches += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except (FileNotFoundError, ProcessLookupError):
            pass
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return switches, int(fields[11]) / tick, int(fields[12]) / tick


class Syscalls:
    """Counts the system calls of `pid` (every thread) while in a `with`
    block, with `perf stat` on the `raw_syscalls:sys_enter` tracepoint;
    `count` stays None where perf is missing or not allowed."""

    def __init__(self, pid):
        self.pid, self.count, self.proc = pid, None, None

    def __enter__(self):
        self.out = os.path.join(TMP, f"syscalls-{self.pid}.csv")
        try:
            self.proc = subprocess.Popen(["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p", str(self.pid),
                                          "-o", self.out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.2)  # perf attached before the load starts
        except FileNotFoundError:
            self.proc = None
        return self

    def __exit__(self, *exc):
        if self.proc is None:
            return False
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait()
        try:
            with open(self.out) as f:
                for line in f:
                    parts = line.split(",")
                    if len(parts) > 2 and parts[2] == "raw_syscalls:sys_enter" and parts[0].isdigit():
                        self.count = int(parts[0])
        except FileNotFoundError:
            pass
        return False


class AnonPeak:
    """Samples RssAnon of `pid` every 20 ms while in a `with` block: the
    peak of private memory, which VmHWM mixes with code pages mapped from
    the binary."""

    def __init__(self, pid):
        import threading
        self.pid, self.peak, self.stop = pid, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.wait(0.02):
            self.peak = max(self.peak, status_kib(self.pid, "RssAnon"))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, status_kib(self.pid, "RssAnon"))


def nginx_worker_pid(master):
    out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else master


def wrk(port, body):
    """Saturated load for DUR with 64 connections: (req/s, requests sent)."""
    script = write("post.lua", 'wrk.method = "POST"\nwrk.body = %s\nwrk.headers["Content-Type"] = "application/json"\n'
                   % json.dumps(body))
    out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", "-c64", "-d", DUR, "-s", script,
                          f"http://127.0.0.1:{port}{PATH}"], capture_output=True, text=True).stdout
    rps = float(next(l for l in out.splitlines() if l.startswith("Requests/sec")).split()[1])
    total = int(next(l for l in out.splitlines() if "requests in" in l).split()[0])
    errors = [l for l in out.splitlines() if "Non-2xx" in l or "Socket errors" in l]
    if errors:
        print(f"  warning: port {port}: {errors}", file=sys.stderr)
    return rps, total


def wrk_rps(port, body):
    return wrk(port, body)[0]


def cpu_seconds(pid, tid=None):
    """utime + stime of the whole process (all threads), or of its thread
    `tid`, in seconds."""
    with open(f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def oha(port, body, *args):
    cmd = ["taskset", "-c", "1", "oha", "--no-tui", "--output-format", "json", "-m", "POST", "-d", body,
           "-H", "content-type: application/json", *args, f"http://127.0.0.1:{port}{PATH}"]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def per_event_latency(port, reps):
    """Median over events of (arrival − the simulator's send stamp), in ms,
    for a 200-event stream, over `reps` streams."""
    import http.client
    body = '{"model":"chunks200","stream":true,"messages":[{"role":"user","content":"hello"}]}'
    samples = []
    for _ in range(reps):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", PATH, body, {"content-type": "application/json"})
        resp = conn.getresponse()
        ts = None
        while True:
            line = resp.readline()
            if not line:
                break
            if line.startswith(b": ts="):
                ts = int(line[5:].strip())
            elif line.startswith(b"data:") and ts is not None:
                samples.append(time.time_ns() / 1000 - ts)
                ts = None
        conn.close()
    return statistics.median(samples) / 1000 if samples else float("nan")


def med(values):
    return statistics.median(values)


def main():
    sim_cfg = write("sim.yaml", """
record: false
models:
  bench: { chunks: 5 }
  sse: { chunks: 20, chunk_delay_ms: 2 }
  slow: { latency_ms: 200, chunks: 5 }
  chunks200: { chunks: 200, chunk_delay_ms: 2, stamp: true }
""")
    gw_cfg = write("tidegate.yaml", f"""
listen: 127.0.0.1:{GW}
journal: "off"
upstreams:
  - {{ name: sim, protocol: openai, base_url: "http://127.0.0.1:{SIM}/v1" }}
models:
  bench: {{ targets: [{{ upstream: sim }}] }}
  sse: {{ targets: [{{ upstream: sim }}] }}
  slow: {{ targets: [{{ upstream: sim }}] }}
  chunks200: {{ targets: [{{ upstream: sim }}] }}
""")
    nginx_cfg = nginx_conf("nginx.conf", NGINX, SIM, f"{TMP}/nginx-access.log")

    write("baseline.yaml", open(gw_cfg).read().replace(f"listen: 127.0.0.1:{GW}", f"listen: 127.0.0.1:{GW + 1}"))
    # JOURNAL=1 adds this build with the journal on as another column (the
    # main columns run with `journal: off`).
    write("journal.yaml", open(gw_cfg).read()
          .replace(f"listen: 127.0.0.1:{GW}", f"listen: 127.0.0.1:{GW + 2}")
          .replace('journal: "off"', f"journal: {TMP}/journal.db"))
    # OTEL=1 adds this build with OpenTelemetry export on (to an endpoint
    # that answers 404: every span is built, batched and sent all the same).
    write("otel.yaml", open(gw_cfg).read()
          .replace(f"listen: 127.0.0.1:{GW}", f"listen: 127.0.0.1:{GW + 3}")
          .replace("upstreams:", f'otel: {{ endpoint: "http://127.0.0.1:{SIM}/otlp" }}\nupstreams:', 1))
    log_env = {"RUST_LOG": os.environ.get("RUST_LOG", "info"), "NO_COLOR": "1"}
    procs = []
    try:
        procs.append(start([BIN, "simulate", "--listen", f"127.0.0.1:{SIM}", "--workers", "1",
                            "--config", sim_cfg], 1, {"RUST_LOG": "warn"}, "sim.log"))
        wait_port(SIM)
        nginx = start(["nginx", "-c", nginx_cfg, "-g", "daemon off;"], 0, log="nginx.log")
        procs.append(nginx)
        gw = start([BIN, "serve", "--config", gw_cfg, "--workers", "1"], 0, log_env, "tidegate.log")
        procs.append(gw)
        wait_port(NGINX)
        wait_port(GW)
        targets = {"direct": SIM, "nginx": NGINX, "tidegate": GW}
        # BASELINE_BIN=/path/to/an/older/tidegate adds it as a fifth column,
        # measured in the same run (e.g. to price a change on the hot path).
        baseline = os.environ.get("BASELINE_BIN")
        if baseline:
            procs.append(start([baseline, "serve", "--config", gw_cfg.replace("tidegate.yaml", "baseline.yaml"),
                                "--workers", "1"], 0, log_env, "baseline.log"))
            wait_port(GW + 1)
            targets["baseline"] = GW + 1
        if os.environ.get("JOURNAL"):
            procs.append(start([BIN, "serve", "--config", gw_cfg.replace("tidegate.yaml", "journal.yaml"),
                                "--workers", "1"], 0, log_env, "journal.log"))
            wait_port(GW + 2)
            targets["journal"] = GW + 2
        if os.environ.get("OTEL"):
            procs.append(start([BIN, "serve", "--config", gw_cfg.replace("tidegate.yaml", "otel.yaml"),
                                "--workers", "1"], 0, log_env, "otel.log"))
            wait_port(GW + 3)
            targets["otel"] = GW + 3
        results = {name: {} for name in targets}
        ulimit_ok = True

        print(f"# tidegate foundation bench ({REPS} reps, medians; logs in {TMP})", file=sys.stderr)
        for name, port in targets.items():  # warm-up: pools, caches
            oha(port, BODY, "-n", "2000", "-c", "16")

        print("- saturated throughput (wrk, 64 connections)", file=sys.stderr)
        for rep in range(REPS):
            for name, port in targets.items():
                results[name].setdefault("rps", []).append(wrk_rps(port, BODY))

        print("- latency at 500 req/s (oha, open loop, latency-corrected)", file=sys.stderr)
        for rep in range(REPS):
            for name, port in targets.items():
                d = oha(port, BODY, "-z", DUR, "-q", "500", "--latency-correction", "-c", "32")
                results[name].setdefault("p50", []).append(d["latencyPercentiles"]["p50"] * 1000)
                results[name].setdefault("p99", []).append(d["latencyPercentiles"]["p99"] * 1000)

        print("- SSE, 20 chunks (oha, one at a time)", file=sys.stderr)
        for rep in range(REPS):
            for name, port in targets.items():
                d = oha(port, SSE_BODY, "-n", "60", "-c", "1")
                results[name].setdefault("ttfb", []).append(d["firstBytePercentiles"]["p50"] * 1000)
                results[name].setdefault("sse_total", []).append(d["latencyPercentiles"]["p50"] * 1000)

        print("- per-event latency, 200-event SSE stream", file=sys.stderr)
        for rep in range(REPS):
            for name, port in targets.items():
                results[name].setdefault("event", []).append(per_event_latency(port, 3))

        print("- 1000 concurrent slow requests (200 ms upstream)", file=sys.stderr)
        for name, port in targets.items():
            d = oha(port, SLOW_BODY, "-n", "5000", "-c", "1000")
            codes = d.get("statusCodeDistribution", {})
            results[name]["slow_ok"] = [codes.get("200", 0)]
            results[name]["slow_fail"] = [5000 - codes.get("200", 0)]
        results["nginx"]["rss"] = [rss_peak_kib(nginx_worker_pid(nginx.pid)) / 1024]
        results["tidegate"]["rss"] = [rss_peak_kib(gw.pid) / 1024]
        results["direct"]["rss"] = [float("nan")]
        for extra in ("baseline", "journal", "otel"):
            if extra in results:
                results[extra]["rss"] = [float("nan")]
    finally:
        stop(procs)

    m = {name: {k: med(v) for k, v in r.items()} for name, r in results.items()}
    d, n, t = m["direct"], m["nginx"], m["tidegate"]
    rows = [
        ("throughput, req/s", "rps", "{:.0f}"),
        ("latency p50 @500/s, ms", "p50", "{:.3f}"),
        ("latency p99 @500/s, ms", "p99", "{:.3f}"),
        ("SSE first byte p50, ms", "ttfb", "{:.3f}"),
        ("SSE total p50, ms", "sse_total", "{:.3f}"),
        ("SSE per-event latency (200 events), ms", "event", "{:.3f}"),
        ("1000 slow: succeeded /5000", "slow_ok", "{:.0f}"),
        ("peak RSS, MiB", "rss", "{:.1f}"),
    ]
    print(f"| metric | direct | nginx | tidegate | tidegate/nginx |")
    print(f"|---|---:|---:|---:|---:|")
    for label, key, fmt in rows:
        ratio = t[key] / n[key] if n[key] else float("nan")
        print(f"| {label} | {fmt.format(d[key])} | {fmt.format(n[key])} | {fmt.format(t[key])} | {ratio:.2f} |")
    print()
    print("Added by the proxy hop (proxy minus direct, medians):")
    print(f"| added | nginx | tidegate | tidegate − nginx |")
    print(f"|---|---:|---:|---:|")
    for label, key in [("p50 @500/s, ms", "p50"), ("p99 @500/s, ms", "p99"), ("SSE first byte, ms", "ttfb"),
                       ("SSE total, ms", "sse_total"), ("SSE per event, ms", "event")]:
        an, at = n[key] - d[key], t[key] - d[key]
        print(f"| {label} | {an:.3f} | {at:.3f} | {at - an:+.3f} |")
    verdicts = [
        ("throughput ≥ 0.8× nginx", t["rps"] >= 0.8 * n["rps"]),
        ("added p50 within 0.1 ms of nginx's", (t["p50"] - d["p50"]) - (n["p50"] - d["p50"]) <= 0.1),
        ("p99 no worse than nginx's", t["p99"] <= n["p99"]),
        ("1000 slow requests all succeed", t["slow_fail"] == 0),
        ("peak RSS ≤ 2× nginx's", t["rss"] <= 2 * n["rss"]),
        ("SSE added first byte ≤ 0.5 ms", t["ttfb"] - d["ttfb"] <= 0.5),
    ]
    if "baseline" in m:
        b = m["baseline"]
        print()
        print(f"Baseline binary, same run: throughput {b['rps']:.0f} req/s = {b['rps'] / n['rps']:.2f}× nginx; "
              f"this build {t['rps'] / n['rps']:.2f}× nginx ({100 * (t['rps'] / b['rps'] - 1):+.1f}% vs baseline)")
    if "otel" in m:
        o = m["otel"]
        print()
        print(f"OpenTelemetry on vs off, same run: {o['rps']:.0f} vs {t['rps']:.0f} req/s = {o['rps'] / t['rps']:.3f}; "
              f"added p50 {o['p50'] - t['p50']:+.3f} ms")
    if "journal" in m:
        j = m["journal"]
        print()
        print(f"Journal on vs off, same run: {j['rps']:.0f} vs {t['rps']:.0f} req/s = {j['rps'] / t['rps']:.3f}")
    print()
    for label, ok in verdicts:
        print(f"- [{'x' if ok else ' '}] {label}")


if __name__ == "__main__":
    main()
