"""Many concurrent token streams (run by bench/streams.sh).

N streams, one connection each, opened evenly over one second (N new
streams per second), each EVENTS (100) chat chunks (SSE) written by the
upstream on a fixed schedule: N = 1,000 with an event every 50 ms and
N = 5,000 every 250 ms, 20,000 events per second offered either way. (At
50,000 a second, 20 and 100 ms apart, this 2-core machine saturates
nginx's core and the generators' one: even the direct run's events were
35 ms late, and time figures measure the saturation. INTERVALS=20,100
EVENTS=200 runs that.) Through nginx at its
best (1 worker, `access_log off`, upstream keep-alive, `proxy_buffering
off`), the bare hyper proxy (examples/bare_proxy.rs, its pool never handing
out a connection whose answer is still streaming), and tidegate at its
defaults (journal on, no flags, no RUST_LOG); "direct" is the load straight
to the upstream (the floor of the time figures). Proxies pinned to CPU 0,
the upstream and the load generator (both examples/streams.rs) to CPU 1.

Per run: CPU per event (the proxy's CPU time over the run, every thread,
divided by the events relayed), time to first event p50/p99 (request
written → first event read), each event's delay from the upstream's write
to the client's read p50/p99, and memory per open stream (peak private
memory, RssAnon, during the run minus before it, over N; each proxy is
started fresh for each run, so memory an earlier run left in its
allocator does not hide this one's). Medians of REPS (3) interleaved
repetitions; ratios against nginx in the same run.
ONLY=1000 or 5000 runs one size. BASELINE_BIN=path adds a column for an
older tidegate build, interleaved with the rest (an A/B in one run).
"""

import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import run  # noqa: E402  (helpers: start, stop, wait_port, cpu_ns, AnonPeak, status_kib, nginx_conf, TMP, BIN)

REPS = int(os.environ.get("REPS", 3))
INTERVALS = [int(x) for x in os.environ.get("INTERVALS", "50,250").split(",")]
SIZES = list(zip([1000, 5000], INTERVALS))
EVENTS, RAMP_MS = int(os.environ.get("EVENTS", 100)), 1000
UP, NGINX, BARE, GW = 19600, 19601, 19602, 19603
STREAMS_BIN = os.path.abspath("target/release/examples/streams")
BARE_BIN = os.path.abspath("target/release/examples/bare_proxy")
BASELINE_BIN = os.environ.get("BASELINE_BIN")


def load(port, n):
    out = subprocess.run(["taskset", "-c", "1", STREAMS_BIN, "load", f"127.0.0.1:{port}", str(n), str(RAMP_MS)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(name, port, pid, n):
    """One run through `port` (proxy `pid`, None for direct)."""
    if pid is None:
        return load(port, n)
    before_mem = run.status_kib(pid, "RssAnon")
    before_cpu = run.cpu_ns(pid)
    with run.AnonPeak(pid) as anon:
        r = load(port, n)
    r["cpu_us_per_event"] = (run.cpu_ns(pid) - before_cpu) * 1e6 / max(r["events"], 1)
    r["kib_per_stream"] = (anon.peak - before_mem) / n
    if r["done"] != n:
        print(f"  warning: {name}: {r['done']} of {n} streams ended with [DONE]", file=sys.stderr)
    # Let closed connections settle before the next column.
    time.sleep(2)
    return r


def fresh_proxy(name, cfg, nginx_cfg, env):
    """A fresh proxy (its memory figure is its own run's, not what an
    earlier run left in its allocator): (process, pid measured, port)."""
    if name == "nginx":
        p = run.start(["nginx", "-c", nginx_cfg, "-g", "daemon off;"], 0, log="nginx.log")
        port = NGINX
    elif name == "bare hyper proxy":
        p = run.start([BARE_BIN, f"127.0.0.1:{BARE}", f"127.0.0.1:{UP}"], 0, log="bare.log")
        port = BARE
    else:
        out = open(os.path.join(run.TMP, "tidegate.log"), "a")
        binary = BASELINE_BIN if name == "baseline" else run.BIN
        p = subprocess.Popen(["taskset", "-c", "0", binary, "serve", "--config", cfg], cwd=os.path.dirname(cfg),
                             stdout=out, stderr=out, env=env)
        port = GW
    run.wait_port(port)
    time.sleep(0.3)
    pid = run.nginx_worker_pid(p.pid) if name == "nginx" else p.pid
    return p, pid, port


def main():
    only = os.environ.get("ONLY")
    sizes = [s for s in SIZES if not only or str(s[0]) == only]
    cfg = run.one_upstream_config("tidegate", GW, UP)
    nginx_cfg = run.nginx_conf("nginx-streams.conf", NGINX, UP, "off")
    env = {k: v for k, v in os.environ.items() if k != "RUST_LOG"}
    names = ["direct", "nginx", "bare hyper proxy", "tidegate"] + (["baseline"] if BASELINE_BIN else [])
    results = {}
    for n, interval in sizes:
        upstream = run.start([STREAMS_BIN, "upstream", f"127.0.0.1:{UP}", str(EVENTS), str(interval)], 1,
                             log=f"upstream-{n}.log")
        try:
            run.wait_port(UP)
            print(f"# {n} streams × {EVENTS} events {interval} ms apart ({REPS} reps; logs in {run.TMP})",
                  file=sys.stderr)
            load(UP, 100)  # warm-up
            res = {name: [] for name in names}
            for rep in range(REPS):
                for name in names:
                    if name == "direct":
                        r = measure(name, UP, None, n)
                    else:
                        p, pid, port = fresh_proxy(name, cfg, nginx_cfg, env)
                        try:
                            load(port, 100)  # warm-up: connections, code paths
                            r = measure(name, port, pid, n)
                        finally:
                            run.stop([p])
                    print(f"  rep {rep + 1} {name}: {json.dumps(r)}", file=sys.stderr)
                    res[name].append(r)
            results[n] = res
        finally:
            run.stop([upstream])
            time.sleep(1)

    for n, interval in sizes:
        res = results[n]
        m = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in res.items()}
        ng, bare = m["nginx"], m["bare hyper proxy"]
        print(f"\n{n} streams × {EVENTS} events, {interval} ms apart, {n} new per second (medians of {REPS})\n")
        names = list(m)
        print("| | " + " | ".join(names) + " |")
        print("|---|" + "---:|" * len(names))

        def row(label, f):
            print(f"| {label} | " + " | ".join(f(name, m[name]) for name in names) + " |")

        proxy = lambda f: lambda name, x: "–" if name == "direct" else f(x)  # noqa: E731
        row("streams ended with [DONE]", lambda _, x: f"{x['done']:.0f}")
        row("CPU µs per event", proxy(lambda x: f"{x['cpu_us_per_event']:.2f}"))
        row("  × nginx", proxy(lambda x: f"{x['cpu_us_per_event'] / ng['cpu_us_per_event']:.2f}"))
        # The machine drifts between reps: each rep's ratio, then their median.
        ratio = lambda name, i: res[name][i]["cpu_us_per_event"] / res["nginx"][i]["cpu_us_per_event"]  # noqa: E731
        row("  × nginx, median of each rep's", lambda name, _: "–" if name == "direct" else
            f"{statistics.median(ratio(name, i) for i in range(REPS)):.2f}")
        row("time to first event p50 / p99, ms", lambda _, x: f"{x['ttfe_p50']:.2f} / {x['ttfe_p99']:.2f}")
        row("event delay p50 / p99, ms", lambda _, x: f"{x['delay_p50']:.2f} / {x['delay_p99']:.2f}")
        row("memory per open stream, KiB", proxy(lambda x: f"{x['kib_per_stream']:.1f}"))
        row("  × bare proxy", proxy(lambda x: f"{x['kib_per_stream'] / bare['kib_per_stream']:.2f}"))
        t = m["tidegate"]
        print(f"\ngoals (tidegate): CPU/event ×{t['cpu_us_per_event'] / ng['cpu_us_per_event']:.2f} nginx (≤ 1.15); "
              f"TTFE p50 {t['ttfe_p50'] - ng['ttfe_p50']:+.2f} ms vs nginx (≤ +5), "
              f"p99 ×{t['ttfe_p99'] / ng['ttfe_p99']:.2f} (≤ 2); "
              f"delay p99 {t['delay_p99'] - ng['delay_p99']:+.2f} ms vs nginx (≤ +10); "
              f"memory/stream ×{t['kib_per_stream'] / bare['kib_per_stream']:.2f} bare (≤ 1.15)")


if __name__ == "__main__":
    main()
