"""Journal cost: tidegate's saturated throughput with the journal on vs off,
same run, same machine (issue 7's target: on/off >= 0.95).

Both gateways (one runtime thread each) are pinned to CPU 0, the simulator
and wrk to CPU 1; the two are measured back to back, REPS pairs (11 by
default, alternating which goes first), and the figure is the median of
the pairs' ratios: a pair shares the machine's mood of the moment, which
on a shared VM moves throughput by more than the journal does. Afterwards the journal's rows are counted against the
requests wrk reports, so a journal that "keeps up" by dropping rows shows.

WRITER_CORES=0,1 lets the journal-on gateway's writer thread (only that
thread) run on either core: the figure for a deployment where the SQLite
writer does not share the proxy's one core. The default keeps it on CPU 0.

Usage: python3 bench/journal.py   (after bench/run.sh has built the binary)
"""

import os
import sqlite3
import subprocess
import sys
import time
import urllib.request
import json

sys.path.insert(0, os.path.dirname(__file__))
from run import BIN, BODY, TMP, cpu_seconds, med, start, stop, wait_port, write, wrk, wrk_rps  # noqa: E402

SIM, OFF, ON = 19020, 19021, 19022
REPS = int(os.environ.get("REPS", 11))


def measured(port, pid):
    """Saturated req/s, and the gateway's CPU microseconds per request
    (steal time and a slow neighbour inflate wall time, not this)."""
    before = cpu_seconds(pid)
    rps, total = wrk(port, BODY)
    return rps, (cpu_seconds(pid) - before) * 1e6 / max(total, 1), total


def main():
    sim_cfg = write("jsim.yaml", "record: false\nmodels:\n  bench: { chunks: 5 }\n")
    db = os.path.join(TMP, "journal-bench.db")
    cfg = """
listen: 127.0.0.1:{port}
journal: {journal}
admin_key: bench-admin
upstreams:
  - {{ name: sim, protocol: openai, base_url: "http://127.0.0.1:{sim}/v1" }}
models:
  bench: {{ targets: [{{ upstream: sim }}] }}
"""
    off = write("joff.yaml", cfg.format(port=OFF, journal='"off"', sim=SIM))
    on = write("jon.yaml", cfg.format(port=ON, journal=db, sim=SIM))
    env = {"RUST_LOG": "info", "NO_COLOR": "1"}
    procs = []
    results = {"off": [], "on": []}
    cpu = {"off": [], "on": []}
    try:
        procs.append(start([BIN, "simulate", "--listen", f"127.0.0.1:{SIM}", "--workers", "1", "--config", sim_cfg],
                           1, {"RUST_LOG": "warn"}, "jsim.log"))
        procs.append(start([BIN, "serve", "--config", off, "--workers", "1"], 0, env, "joff.log"))
        procs.append(start([BIN, "serve", "--config", on, "--workers", "1"], 0, env, "jon.log"))
        for port in (SIM, OFF, ON):
            wait_port(port)
        warm = urllib.request.Request(f"http://127.0.0.1:{ON}/v1/chat/completions", data=BODY.encode(),
                                      headers={"content-type": "application/json"})
        urllib.request.urlopen(warm).read()  # the writer thread exists from start; this proves it works
        pid = procs[-1].pid
        writer = next(tid for tid in os.listdir(f"/proc/{pid}/task")
                      if open(f"/proc/{pid}/task/{tid}/comm").read().strip().startswith("tidegate-journ"))
        cores = os.environ.get("WRITER_CORES")
        if cores:
            subprocess.run(["taskset", "-p", "-c", cores, writer], check=True, capture_output=True)
            print(f"journal writer thread {writer} may run on CPUs {cores}", file=sys.stderr)
        writer_before, sent_on = cpu_seconds(pid, writer), 0
        print(f"# journal on vs off ({REPS} reps, medians; files in {TMP})", file=sys.stderr)
        pids = {"off": procs[1].pid, "on": procs[2].pid}
        for rep in range(REPS):
            # off-on, then on-off: whatever the first of a pair suffers or
            # leaves behind (the writer finishing its last batch) falls on
            # each side equally often.
            order = (("off", OFF), ("on", ON)) if rep % 2 == 0 else (("on", ON), ("off", OFF))
            for name, port in order:
                rps, us, total = measured(port, pids[name])
                sent_on += total if name == "on" else 0
                results[name].append(rps)
                cpu[name].append(us)
        time.sleep(2)  # let the writer drain
        writer_us = (cpu_seconds(pid, writer) - writer_before) * 1e6 / max(sent_on, 1)
        req = urllib.request.Request(f"http://127.0.0.1:{ON}/admin/upstreams",
                                     headers={"authorization": "Bearer bench-admin"})
        dropped = json.load(urllib.request.urlopen(req)).get("journal_dropped_rows")
        # What the dashboard polls, against the journal this run filled
        # (about a million rows), while wrk keeps the gateway saturated.
        import threading
        load = threading.Thread(target=wrk_rps, args=(ON, BODY))
        load.start()
        time.sleep(0.5)
        reads = {}
        for path in ("/admin/stats", "/admin/upstreams", "/admin/requests?limit=50",
                     "/admin/requests?limit=50&outcome=failed", "/admin/requests?limit=50&since=1m"):
            times = []
            for _ in range(15):
                t0 = time.perf_counter()
                r = urllib.request.Request(f"http://127.0.0.1:{ON}{path}",
                                           headers={"authorization": "Bearer bench-admin"})
                urllib.request.urlopen(r).read()
                times.append((time.perf_counter() - t0) * 1000)
            reads[path] = med(times)
        load.join()
    finally:
        stop(procs)
    rows = sqlite3.connect(db).execute("SELECT count(*) FROM requests").fetchone()[0]
    off_rps, on_rps = med(results["off"]), med(results["on"])
    print(f"journal off: {off_rps:,.0f} req/s   (runs: {', '.join(f'{r:,.0f}' for r in results['off'])})")
    print(f"journal on:  {on_rps:,.0f} req/s   (runs: {', '.join(f'{r:,.0f}' for r in results['on'])})")
    per_rep = sorted(on / off for on, off in zip(results["on"], results["off"]))
    print(f"ratio on/off, median of the {REPS} back-to-back pairs: {med(per_rep):.3f}  (target >= 0.95)")
    print(f"  pairs: {', '.join(f'{r:.3f}' for r in per_rep)}; ratio of the medians: {on_rps / off_rps:.3f}")
    c_off, c_on = med(cpu["off"]), med(cpu["on"])
    print(f"gateway CPU per request: off {c_off:.2f} us, on {c_on:.2f} us (writer included)"
          f" -> throughput ratio on one dedicated core {c_off / c_on:.3f}")
    print(f"  of which the journal writer thread: {writer_us:.2f} us per request")
    print(f"journal rows: {rows:,}; rows dropped: {dropped}")
    print("dashboard reads under saturating load, median of 15:")
    for path, ms in reads.items():
        print(f"  {path:<45} {ms:8.2f} ms")


if __name__ == "__main__":
    main()
