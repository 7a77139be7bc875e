"""Instructions per request, counted (run by bench/instructions.sh).

CPU time on this shared 2-core machine moves by ±30% between runs for the
same build; an instruction count does not. Each proxy runs under
valgrind's callgrind (nginx at its best: one process, `access_log off`;
the bare hyper proxy; tidegate at its defaults, journal on), takes WARM
(500) requests, has its counters zeroed, takes N (2000) more plain chat
requests from oha (4 connections), and has its counters dumped: the
instructions executed in user space by every thread of the process,
divided by N. Kernel work (the same syscalls per request for all three)
is not counted, and an instruction is not a nanosecond (cache misses are
not counted either), so this measures the work each proxy's own code
does per request, which is what a change to tidegate's request path
moves. Deterministic to a few tenths of a percent (the journal writer's
batch sizes vary with timing).

A second phase counts the stream open path the same way: STREAMS (400)
streams, each on a connection of its own (examples/streams.rs, as
bench/streams.sh, 2 events 1 ms apart, opened over 4 s, after 100 to
warm up), per stream: accept, request, upstream connect, the handshake
hold, two events, `[DONE]`, the journal row, both connections closed.
"""

import glob
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import run  # noqa: E402  (helpers: start, stop, wait_port, nginx_conf, TMP, BIN, BODY)

WARM, N = int(os.environ.get("WARM", 500)), int(os.environ.get("N", 2000))
STREAMS = int(os.environ.get("STREAMS", 400))
STREAM_EVENTS = int(os.environ.get("STREAM_EVENTS", 2))  # more: the per-event path weighs in
STREAM_GAP_MS = int(os.environ.get("STREAM_GAP_MS", 1))  # 20: tokens as a model sends them
UP, NGINX, BARE, GW, FLOOR = 19700, 19701, 19702, 19703, 19704
UPSTREAM_BIN = os.path.abspath("target/release/examples/upstream")
BARE_BIN = os.path.abspath("target/release/examples/bare_proxy")
STREAMS_BIN = os.path.abspath("target/release/examples/streams")


def plain(port, n):
    run.oha(port, run.BODY, "-n", str(n), "-c", "4")


def streams(port, n):
    subprocess.run(["taskset", "-c", "1", STREAMS_BIN, "load", f"127.0.0.1:{port}", str(n), str(n * 10)],
                   check=True, capture_output=True)


def counted(name, cmd, port, cwd, load=plain, warm=WARM, n=N):
    """Instructions per request of `cmd` (listening on `port`), by thread."""
    out = os.path.join(run.TMP, f"cg-{name}")
    log = open(os.path.join(run.TMP, f"cg-{name}.log"), "w")
    p = subprocess.Popen(["taskset", "-c", "0", "valgrind", "--tool=callgrind", "--separate-threads=yes",
                          f"--callgrind-out-file={out}.%p", *cmd], cwd=cwd, stdout=log, stderr=log)
    try:
        run.wait_port(port)
        load(port, warm)
        # Journal rows gather for up to a second before their batch is
        # written: the warm-up's (with the writer's first open of the
        # file) are waited out, or that one-time work is counted.
        time.sleep(1.5)
        subprocess.run(["callgrind_control", "-z", str(p.pid)], check=True, capture_output=True)
        load(port, n)
        # And the counted requests' rows written before the count is read.
        time.sleep(1.5)
        subprocess.run(["callgrind_control", "-d", str(p.pid)], check=True, capture_output=True)
        time.sleep(0.5)
    finally:
        run.stop([p])
    threads = {}
    for f in sorted(glob.glob(f"{out}.{p.pid}.1*")):
        with open(f) as fh:
            total = next((int(line.split()[1]) for line in fh if line.startswith("summary:")), 0)
        threads[f.rsplit("-", 1)[-1] if "-" in os.path.basename(f) else "1"] = total / n
    return threads


def phase(upstream_cmd, load, warm, n):
    """One phase: the upstream, then each proxy in turn; counts by proxy."""
    cfg = run.one_upstream_config("tidegate-cg", GW, UP)
    cwd = os.path.dirname(cfg)
    nginx_cfg = run.nginx_conf("nginx-cg.conf", NGINX, UP, "off")
    upstream = run.start(upstream_cmd, 1, log="upstream-cg.log")
    more = dict(load=load, warm=warm, n=n)
    try:
        run.wait_port(UP)
        rows = {
            "nginx": counted("nginx", ["nginx", "-c", nginx_cfg, "-g", "daemon off; master_process off;"], NGINX,
                             run.TMP, **more),
            "bare hyper proxy": counted("bare", [BARE_BIN, f"127.0.0.1:{BARE}", f"127.0.0.1:{UP}"], BARE, run.TMP,
                                        **more),
        }
        if os.environ.get("FLOOR", "1") != "0":
            # The bare proxy plus the body read whole, its model read, a
            # request id and tidegate's journal row (examples/bare_proxy.rs).
            rows["floor"] = counted("floor", run.floor_cmd(BARE_BIN, FLOOR, UP, "floor-cg.db"), FLOOR, run.TMP, **more)
        rows["tidegate"] = counted("tidegate", [run.BIN, "serve", "--config", cfg], GW, cwd, **more)
        if os.environ.get("BASELINE_BIN"):
            # An older build with the same config (its own journal file).
            base = os.path.join(run.TMP, "baseline-cg")
            os.makedirs(base, exist_ok=True)
            rows["baseline"] = counted("baseline", [os.path.abspath(os.environ["BASELINE_BIN"]), "serve", "--config",
                                                    cfg], GW, base, **more)
    finally:
        run.stop([upstream])
        time.sleep(0.5)
    return rows


def table(title, rows):
    total = {name: sum(t.values()) for name, t in rows.items()}
    ng, bare = total["nginx"], total["bare hyper proxy"]
    print(f"\n{title}\n")
    print("| | " + " | ".join(rows) + " |")
    print("|---|" + "---:|" * len(rows))
    print("| instructions | " + " | ".join(f"{total[n]:,.0f}" for n in rows) + " |")
    print("| × nginx | " + " | ".join(f"{total[n] / ng:.2f}" for n in rows) + " |")
    print("| × bare proxy | " + " | ".join(f"{total[n] / bare:.2f}" for n in rows) + " |")
    threads = sorted(rows["tidegate"].items(), key=lambda kv: -kv[1])
    print("\ntidegate by thread (the runtime's, the journal writer's, ...): "
          + ", ".join(f"{v:,.0f}" for _, v in threads if v >= 1))
    print(f"tidegate's own work: {total['tidegate'] - bare:,.0f} instructions over the bare proxy's")
    if "floor" in total:
        print(f"the floor (model read, request id, journal row): {total['floor'] - bare:,.0f} over the bare proxy's; "
              f"tidegate {total['tidegate'] - total['floor']:,.0f} over the floor's")


def main():
    only = os.environ.get("ONLY")  # plain or streams
    if only in (None, "plain"):
        rows = phase([UPSTREAM_BIN, f"127.0.0.1:{UP}"], plain, WARM, N)
        table(f"Instructions per plain chat request, user space, every thread ({N} requests after {WARM})", rows)
    if only in (None, "streams"):
        rows = phase([STREAMS_BIN, "upstream", f"127.0.0.1:{UP}", str(STREAM_EVENTS), str(STREAM_GAP_MS)],
                     streams, 100, STREAMS)
        table(f"Instructions per stream on a new connection ({STREAM_EVENTS} events {STREAM_GAP_MS} ms apart; "
              f"{STREAMS} streams "
              "after 100)", rows)


if __name__ == "__main__":
    main()
