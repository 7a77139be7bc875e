"""Shared state cost: one replica's saturated throughput with limits in
Redis (`state: redis://…`) vs in memory, same build, same run; then the
acquire/release latency of a lease through Redis next to a plain PING.

Both gateways (one runtime thread) on CPU 0; redis-server, the simulator
and wrk on CPU 1. Measured in alternation, REPS times, medians.

Usage: python3 bench/shared.py   (after bench/run.sh built the binary;
needs redis-server: apt install redis-server)
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from run import BIN, BODY, TMP, med, start, stop, wait_port, write, wrk_rps  # noqa: E402

SIM, MEM, SHARED, REDIS = 19040, 19041, 19042, 19043
REPS = int(os.environ.get("REPS", 5))


def main():
    sim_cfg = write("ssim.yaml", "record: false\nmodels:\n  bench: { chunks: 5 }\n")
    cfg = """
listen: 127.0.0.1:{port}
journal: "off"
{state}
upstreams:
  - {{ name: sim, protocol: openai, base_url: "http://127.0.0.1:{sim}/v1", max_concurrent: 1000 }}
models:
  bench: {{ targets: [{{ upstream: sim }}] }}
"""
    mem = write("smem.yaml", cfg.format(port=MEM, state="", sim=SIM))
    shared = write("sshared.yaml", cfg.format(port=SHARED, state=f"state: redis://127.0.0.1:{REDIS}/0", sim=SIM))
    env = {"RUST_LOG": "info", "NO_COLOR": "1"}
    procs = []
    results = {"memory": [], "redis": []}
    try:
        procs.append(start(["redis-server", "--port", str(REDIS), "--save", "", "--appendonly", "no"], 1, log="redis.log"))
        procs.append(start([BIN, "simulate", "--listen", f"127.0.0.1:{SIM}", "--workers", "1", "--config", sim_cfg],
                           1, {"RUST_LOG": "warn"}, "ssim.log"))
        procs.append(start([BIN, "serve", "--config", mem, "--workers", "1"], 0, env, "smem.log"))
        procs.append(start([BIN, "serve", "--config", shared, "--workers", "1"], 0, env, "sshared.log"))
        for port in (REDIS, SIM, MEM, SHARED):
            wait_port(port)
        print(f"# shared state: redis vs memory ({REPS} reps, medians; files in {TMP})", file=sys.stderr)
        for rep in range(REPS):
            for name, port in (("memory", MEM), ("redis", SHARED)):
                results[name].append(wrk_rps(port, BODY))
        latency = subprocess.run(["taskset", "-c", "0", "target/release/examples/shared_latency",
                                  f"redis://127.0.0.1:{REDIS}/0", "5000"], capture_output=True, text=True).stdout
    finally:
        stop(procs)
    m, r = med(results["memory"]), med(results["redis"])
    print(f"state in memory: {m:,.0f} req/s   (runs: {', '.join(f'{x:,.0f}' for x in results['memory'])})")
    print(f"state in Redis:  {r:,.0f} req/s   (runs: {', '.join(f'{x:,.0f}' for x in results['redis'])})")
    print(f"ratio redis/memory: {r / m:.3f}")
    print(latency)


if __name__ == "__main__":
    main()
