"""Per-core efficiency with the defaults a user runs (issue: "at nginx's
speed, streams included"). Run by bench/core.sh.

The reference is nginx at its best: 1 worker, `access_log off`, upstream
keep-alive, `proxy_buffering off`. The main column is tidegate as a user
runs it: `tidegate serve --config F`, no flags, no RUST_LOG, the journal on
(its default file). Extra columns price each cost: `--workers 1`,
`--workers 1` + `RUST_LOG=warn`, and the journal off. With BASELINE_BIN, an
older build with the same defaults is another column. Every proxy is
pinned to CPU 0; the upstream (examples/upstream.rs, a minimal hyper
server, not tidegate) and the load generators share CPU 1. Medians of REPS
interleaved repetitions, ratios against nginx measured in the same run.
"""

import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import run  # noqa: E402  (helpers: start, stop, wait_port, write, wrk, oha, cpu_ns, AnonPeak, rss, TMP)

REPS = int(os.environ.get("REPS", 3))
DUR = os.environ.get("DUR", "5s")
# The 500 req/s figures move most between runs on a shared machine: more,
# shorter interleaved repetitions.
LOW_REPS = int(os.environ.get("LOW_REPS", max(REPS, 7)))
LOW_DUR = os.environ.get("LOW_DUR", "3s")
UP, NGINX, GW = 19100, 19101, 19110
BODY = '{"model":"bench","messages":[{"role":"user","content":"hello"}]}'
SSE = '{"model":"bench","stream":true,"messages":[{"role":"user","content":"hello"}]}'
SLOW = '{"model":"slow","messages":[{"role":"user","content":"hello"}]}'
UPSTREAM_BIN = os.path.abspath("target/release/examples/upstream")
BARE_BIN = os.path.abspath("target/release/examples/bare_proxy")
BARE, FLOOR = 19102, 19103


def cpu_per_request(pid, port, res):
    """CPU µs per request of process `pid` under 500 req/s for LOW_DUR, the
    latency percentiles of that run (ms), and into `res` what the CPU went
    to: system calls and context switches per request (the same count for
    two proxies means the difference is their own code), user and kernel
    time per request."""
    before = run.cpu_ns(pid)
    switches, user, kernel = run.switches_and_ticks(pid)
    with run.Syscalls(pid) as calls:
        d = run.oha(port, BODY, "-z", LOW_DUR, "-q", "500", "--latency-correction", "-c", "32")
    used = run.cpu_ns(pid) - before
    switches2, user2, kernel2 = run.switches_and_ticks(pid)
    n = max(sum(d.get("statusCodeDistribution", {}).values()), 1)
    res.setdefault("switches", []).append((switches2 - switches) / n)
    res.setdefault("user", []).append((user2 - user) * 1e6 / n)
    res.setdefault("kernel", []).append((kernel2 - kernel) * 1e6 / n)
    if calls.count is not None:
        res.setdefault("syscalls", []).append(calls.count / n)
    return used * 1e6 / n, d["latencyPercentiles"]["p50"] * 1000, d["latencyPercentiles"]["p99"] * 1000


def main():
    template = (
        "listen: 127.0.0.1:{port}\nupstreams:\n"
        f'  - {{ name: up, protocol: openai, base_url: "http://127.0.0.1:{UP}/v1" }}\n'
        "models:\n  bench: { targets: [{ upstream: up }] }\n  slow: { targets: [{ upstream: up }] }\n"
    )
    nginx_cfg = run.nginx_conf("nginx-core.conf", NGINX, UP, "off")

    columns = [
        ("defaults", run.BIN, [], {}, ""),
        ("--workers 1", run.BIN, ["--workers", "1"], {}, ""),
        ("workers 1 + warn", run.BIN, ["--workers", "1"], {"RUST_LOG": "warn"}, ""),
        ("journal off", run.BIN, [], {}, 'journal: "off"\n'),
    ]
    if os.environ.get("BASELINE_BIN"):
        columns.append(("baseline defaults", os.path.abspath(os.environ["BASELINE_BIN"]), [], {}, ""))
    procs, targets, pids = [], {"direct": UP, "nginx": NGINX}, {}
    only = os.environ.get("ONLY")  # e.g. ONLY=defaults: skip the extra columns
    if only:
        columns = [c for c in columns if c[0] in only.split(",")]
    try:
        procs.append(run.start([UPSTREAM_BIN, f"127.0.0.1:{UP}"], 1, log="upstream.log"))
        run.wait_port(UP)
        nginx = run.start(["nginx", "-c", nginx_cfg, "-g", "daemon off;"], 0, log="nginx-core.log")
        procs.append(nginx)
        run.wait_port(NGINX)
        # The floor under tidegate: the same stack (tokio current-thread,
        # hyper server, hyper-util's pooled client) forwarding and nothing else.
        bare = run.start([BARE_BIN, f"127.0.0.1:{BARE}", f"127.0.0.1:{UP}"], 0, log="bare.log")
        procs.append(bare)
        run.wait_port(BARE)
        targets["bare hyper proxy"] = BARE
        pids["bare hyper proxy"] = bare.pid
        # The floor: the bare proxy plus what no gateway with a journal can
        # skip (the body read whole, its model read, a request id, one
        # journal row in tidegate's own writer). FLOOR=0 leaves it out.
        if os.environ.get("FLOOR", "1") != "0":
            floor = run.start(run.floor_cmd(BARE_BIN, FLOOR, UP, "floor-journal.db"), 0, log="floor.log")
            procs.append(floor)
            run.wait_port(FLOOR)
            targets["floor"] = FLOOR
            pids["floor"] = floor.pid
        for i, (name, binary, args, env, extra) in enumerate(columns):
            port = GW + i
            cwd = os.path.join(run.TMP, f"col{i}")
            os.makedirs(cwd, exist_ok=True)
            cfg = os.path.join(cwd, "tidegate.yaml")
            with open(cfg, "w") as f:
                f.write(extra + template.replace("{port}", str(port)))
            # A user's environment: no RUST_LOG unless the column sets one.
            base_env = {k: v for k, v in os.environ.items() if k != "RUST_LOG"}
            out = open(os.path.join(run.TMP, f"col{i}.log"), "w")
            p = subprocess.Popen(["taskset", "-c", "0", binary, "serve", "--config", cfg, *args], cwd=cwd,
                                 stdout=out, stderr=out, env=dict(base_env, **env))
            procs.append(p)
            run.wait_port(port)
            targets[name] = port
            pids[name] = p.pid
        time.sleep(0.5)
        pids["nginx"] = run.nginx_worker_pid(nginx.pid)
        print(f"# per-core bench ({REPS} reps, medians; logs in {run.TMP})", file=sys.stderr)
        for port in targets.values():
            run.oha(port, BODY, "-n", "2000", "-c", "16")
        res = {n: {} for n in targets}
        print("- saturated throughput, 64 connections", file=sys.stderr)
        for _ in range(REPS):
            for n, port in targets.items():
                res[n].setdefault("rps", []).append(run.wrk_rps(port, BODY))
        print(f"- 500 req/s: CPU per request, latency ({LOW_REPS} reps)", file=sys.stderr)
        for _ in range(LOW_REPS):
            for n, port in targets.items():
                if n == "direct":
                    d = run.oha(port, BODY, "-z", LOW_DUR, "-q", "500", "--latency-correction", "-c", "32")
                    res[n].setdefault("p50", []).append(d["latencyPercentiles"]["p50"] * 1000)
                    res[n].setdefault("p99", []).append(d["latencyPercentiles"]["p99"] * 1000)
                    continue
                cpu, p50, p99 = cpu_per_request(pids[n], port, res[n])
                res[n].setdefault("cpu", []).append(cpu)
                res[n].setdefault("p50", []).append(p50)
                res[n].setdefault("p99", []).append(p99)
        print("- SSE, 20 chunks back to back", file=sys.stderr)
        for _ in range(REPS):
            for n, port in targets.items():
                d = run.oha(port, SSE, "-n", "300", "-c", "1")
                res[n].setdefault("ttfb", []).append(d["firstBytePercentiles"]["p50"] * 1000)
                res[n].setdefault("total", []).append(d["latencyPercentiles"]["p50"] * 1000)
        print("- 1000 concurrent slow requests (200 ms upstream)", file=sys.stderr)
        for n, port in targets.items():
            if n == "direct":
                continue
            with run.AnonPeak(pids[n]) as anon:
                d = run.oha(port, SLOW, "-n", "3000", "-c", "1000")
            res[n]["slow_ok"] = [d.get("statusCodeDistribution", {}).get("200", 0)]
            res[n]["rss"] = [run.rss_peak_kib(pids[n]) / 1024]
            res[n]["anon"] = [anon.peak / 1024]
    finally:
        run.stop(procs)

    m = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in res.items()}
    d, ng = m["direct"], m["nginx"]
    names = [n for n in m if n not in ("direct",)]
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))

    def row(label, f):
        print(f"| {label} | " + " | ".join(f(m[n]) for n in names) + " |")

    bare = m["bare hyper proxy"]
    row("saturated req/s", lambda x: f"{x['rps']:.0f}")
    row("  × nginx", lambda x: f"{x['rps'] / ng['rps']:.2f}")
    row("  × bare proxy", lambda x: f"{x['rps'] / bare['rps']:.2f}")
    row("CPU µs per request, saturated (1 / req/s)", lambda x: f"{1e6 / x['rps']:.1f}")
    row("  over the bare proxy's", lambda x: f"{1e6 / x['rps'] - 1e6 / bare['rps']:+.1f}")
    row("CPU µs per request @500/s", lambda x: f"{x['cpu']:.1f}")
    row("  × nginx", lambda x: f"{x['cpu'] / ng['cpu']:.2f}")
    row("  user / kernel µs (10 ms ticks)", lambda x: f"{x['user']:.0f} / {x['kernel']:.0f}")
    row("  system calls / context switches per request",
        lambda x: (f"{x['syscalls']:.2f}" if "syscalls" in x else "–") + f" / {x['switches']:.2f}")
    row("added p50 / p99 @500/s, ms", lambda x: f"{x['p50'] - d['p50']:.3f} / {x['p99'] - d['p99']:.3f}")
    row("SSE 20 chunks: added TTFB / total, ms", lambda x: f"{x['ttfb'] - d['ttfb']:.3f} / {x['total'] - d['total']:.3f}")
    row("1000 slow: ok of 3000", lambda x: f"{x['slow_ok']:.0f}")
    row("peak RSS, MiB", lambda x: f"{x['rss']:.1f}")
    row("  × nginx", lambda x: f"{x['rss'] / ng['rss']:.2f}")
    row("  of which private (RssAnon peak), MiB", lambda x: f"{x['anon']:.1f}")


if __name__ == "__main__":
    main()
