"""Capacity scheduled to a provider's limit (run by bench/schedule.sh).

A simulated provider with a hard concurrency cap C = 3 that tidegate is not
told (it learns it), 0.5 s per answer, more refused `429 model concurrency
limit exceeded` (no Retry-After). 60 requests sent at once to tidegate at
its defaults; the makespan against the ideal (60 × 0.5 s / C = 10 s) and
the refusals: the first wave's (before any answer taught the limit) and
those provoked after it. Three setups, REPS times each, medians:

- plain: the cap as above;
- linger: the provider frees a slot 300 ms after its answer (a session
  counted late), tidegate told `slot_release_delay: 300ms` (ideal
  60 × 0.8 s / C);
- replicas: two tidegates sharing Redis, 30 requests each.

ADAPTIVE_MAX=N sets the upstreams' adaptive_max (default: none); ONLY=plain
(or linger, replicas) runs one setup.
"""

import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import run  # noqa: E402  (helpers: start, stop, wait_port, write, TMP, BIN)

REPS = int(os.environ.get("REPS", 3))
N, C, ANSWER_S, LINGER_S = 60, 3, 0.5, 0.3
SIM, GW1, GW2, REDIS = 19500, 19501, 19502, 19503


def post(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "hi"}]}), headers={"content-type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status


def burst(ports):
    """N requests at once over `ports`; (makespan, statuses, refusals in
    the first wave, refusals after it)."""
    statuses = []
    lock = threading.Lock()

    def one(port):
        s = post(port)
        with lock:
            statuses.append(s)

    threads = [threading.Thread(target=one, args=(ports[i % len(ports)],)) for i in range(N)]
    started = time.monotonic()
    for t in threads:
        t.start()
    # The first wave's refusals come back at once; the first answer takes
    # ANSWER_S: what was refused before then was refused before anything
    # could have been learned.
    time.sleep(ANSWER_S * 0.8)
    first = run.sim_stats(SIM)["rejected"]
    for t in threads:
        t.join()
    took = time.monotonic() - started
    return took, statuses, first, run.sim_stats(SIM)["rejected"] - first


def setup(linger, replicas):
    run.write("sim.yaml", f"default: {{ latency_ms: {int(ANSWER_S * 1000)}, chunks: 5, reject_over: {C}, "
                          f"linger_ms: {int(linger * 1000)} }}\n")
    sim = run.start([run.BIN, "simulate", "--listen", f"127.0.0.1:{SIM}", "--config",
                     os.path.join(run.TMP, "sim.yaml")], 1, log="sim.log")
    run.wait_port(SIM)
    procs, ports = [sim], [GW1, GW2][:replicas]
    redis = None
    if replicas > 1:
        redis = subprocess.Popen(["redis-server", "--port", str(REDIS), "--save", "", "--appendonly", "no"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run.wait_port(REDIS)
    for k, port in enumerate(ports):
        extra = f"    slot_release_delay: {int(linger * 1000)}ms\n" if linger else ""
        if os.environ.get("ADAPTIVE_MAX"):
            extra += f"    adaptive_max: {os.environ['ADAPTIVE_MAX']}\n"
        state = f"state: redis://127.0.0.1:{REDIS}/0\n" if redis else ""
        run.write(f"gw{k}.yaml", f"listen: 127.0.0.1:{port}\njournal: {run.TMP}/schedule-{k}.db\n{state}"
                                 f"upstreams:\n  - name: plan\n    protocol: openai\n"
                                 f"    base_url: http://127.0.0.1:{SIM}/v1\n{extra}"
                                 "models:\n  m: { targets: [{ upstream: plan }] }\n")
        procs.append(run.start([run.BIN, "serve", "--config", os.path.join(run.TMP, f"gw{k}.yaml")], 0,
                               log=f"gw{k}.log"))
        run.wait_port(port)
    return procs, ports, redis


def measure(linger, replicas):
    procs, ports, redis = setup(linger, replicas)
    try:
        return burst(ports)
    finally:
        run.stop(procs)
        if redis:
            redis.terminate()
            redis.wait()


def main():
    print(f"{N} requests at once, provider cap {C} (learned), {ANSWER_S} s each; medians of {REPS}")
    print("| setup | ideal, s | makespan, s | ×ideal | refusals, first wave | refusals after | failed |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    setups = (("plain", 0, 1), ("linger 300 ms + slot_release_delay", LINGER_S, 1), ("two replicas, Redis", 0, 2))
    only = os.environ.get("ONLY")
    for name, linger, replicas in setups:
        if only and only not in name:
            continue
        runs = [measure(linger, replicas) for _ in range(REPS)]
        ideal = N * (ANSWER_S + linger) / C
        took = statistics.median(r[0] for r in runs)
        first = statistics.median(r[2] for r in runs)
        after = statistics.median(r[3] for r in runs)
        failed = max(sum(1 for s in r[1] if s != 200) for r in runs)
        print(f"| {name} | {ideal:.1f} | {took:.2f} | ×{took / ideal:.2f} | {first:.0f} | {after:.0f} | {failed} |")


if __name__ == "__main__":
    main()
