"""Account pools and session affinity, measured (run by bench/affinity.sh).

A simulated provider with three accounts, each capped at 4 requests at
once (tidegate is not told: it learns), and a prompt cache per account
(a prefix the same account saw within 5 minutes is read cached; an
uncached prompt costs 40 ms per 1,000 tokens to read, a cached one a
tenth). tidegate at its defaults with one upstream of three `accounts:`.

1. Sessions: 20 coding-agent sessions × 10 turns at once, each turn
   sending the whole conversation again (a 12 KB system prompt shared by
   all, a 2 KB task, then 1 KB answer + 1 KB follow-up per turn), each
   session naming itself the way Claude Code does
   (`x-claude-code-session-id`). Measured with `affinity: session` (the
   default) and `affinity: off`, alternating, REPS times: the share of
   prompt tokens the provider read cached (from the answers' usage)
   against the ideal (every turn's previous prompt cached, the shared
   system prompt cached for every session but each account's first), and
   the time all 200 turns took.
2. Fan-out: 20 requests at once to a fresh tidegate (caps not yet
   learned), 500 ms each: the makespan against the pool's capacity
   (ceil(20 / 12) × 0.5 s), and the refusals it took to learn.
"""

import http.client
import json
import math
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import run  # noqa: E402  (helpers: start, stop, wait_port, write, TMP)

REPS = int(os.environ.get("REPS", 3))
SESSIONS, TURNS = 20, 10
SIM, GW = 19400, 19401
CAP, ACCOUNTS = 4, 3
SYSTEM = "You are a careful coding agent. " * 384  # ~12 KB


def sim_config(latency_ms):
    accounts = "".join(f"  key-{i}: {{ max_in_flight: {CAP} }}\n" for i in range(ACCOUNTS))
    return (
        f"default: {{ latency_ms: {latency_ms}, chunks: 20 }}\n"
        f"accounts:\n{accounts}"
        "prompt_cache: { ttl_ms: 300000, uncached_ms_per_1k_tokens: 40 }\n"
    )


def gw_config(affinity):
    accounts = "".join(f"      - {{ name: acct{i}, api_key: key-{i} }}\n" for i in range(ACCOUNTS))
    return (
        f"listen: 127.0.0.1:{GW}\n"
        f"journal: {run.TMP}/affinity-{affinity}.db\n"
        "upstreams:\n"
        f"  - name: plan\n    protocol: openai\n    base_url: http://127.0.0.1:{SIM}/v1\n    accounts:\n{accounts}"
        f"models:\n  coder: {{ targets: [{{ upstream: plan }}], affinity: {affinity} }}\n"
    )


def parallel(f, items):
    """f over items, one thread each (bench/queue.py shadows the standard
    `queue`, so no concurrent.futures here); results in order."""
    out = [None] * len(items)
    errors = []

    def work(k, item):
        try:
            out[k] = f(item)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k, item)) for k, item in enumerate(items)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def post(body, headers):
    conn = http.client.HTTPConnection("127.0.0.1", GW, timeout=120)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers=dict({"content-type": "application/json"}, **headers))
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"{resp.status}: {data[:300]!r}")
    return json.loads(data)


def session(n):
    """One session's 10 turns, in order; its prompt and cached tokens per turn."""
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"task {n}: " + "fix the failing test in module x. " * 60}]
    usage = []
    for t in range(TURNS):
        answer = post({"model": "coder", "messages": messages},
                      {"x-claude-code-session-id": f"bench-session-{n}"})
        u = answer["usage"]
        usage.append((u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]))
        messages.append({"role": "assistant", "content": f"turn {t}: " + "done, next step. " * 60})
        messages.append({"role": "user", "content": f"follow-up {t}: " + "now run the suite. " * 55})
    return usage


def ideal_share(all_usage):
    prompts = [[p for p, _ in s] for s in all_usage]
    total = sum(sum(s) for s in prompts)
    system = len(json.dumps({"role": "system", "content": SYSTEM})) // 4
    cached = sum(sum(s[:-1]) for s in prompts) + (SESSIONS - ACCOUNTS) * system
    return cached / total


def start(latency_ms, affinity):
    """The simulator (CPU 1) and tidegate (CPU 0), both listening."""
    run.write("sim.yaml", sim_config(latency_ms))
    run.write("gw.yaml", gw_config(affinity))
    sim = run.start([run.BIN, "simulate", "--listen", f"127.0.0.1:{SIM}", "--config",
                     os.path.join(run.TMP, "sim.yaml")], 1, log="sim.log")
    run.wait_port(SIM)
    gw = run.start([run.BIN, "serve", "--config", os.path.join(run.TMP, "gw.yaml")], 0, log="gw.log")
    run.wait_port(GW)
    return sim, gw


def sessions_run(affinity):
    sim, gw = start(100, affinity)
    try:
        started = time.monotonic()
        all_usage = parallel(session, list(range(SESSIONS)))
        took = time.monotonic() - started
    finally:
        run.stop([gw, sim])
    total = sum(p for s in all_usage for p, _ in s)
    cached = sum(c for s in all_usage for _, c in s)
    return cached / total, ideal_share(all_usage), took


def fan_out():
    sim, gw = start(500, "session")
    try:
        def one(i):
            post({"model": "coder", "messages": [{"role": "user", "content": f"request {i}"}]}, {})
        times = []
        for wave in range(2):
            started = time.monotonic()
            parallel(one, list(range(wave * 20, wave * 20 + 20)))
            times.append(time.monotonic() - started)
        refused = run.sim_stats(SIM)["rejected"]
    finally:
        run.stop([gw, sim])
    return times, refused


def main():
    results = {"session": [], "off": []}
    for _ in range(REPS):
        for affinity in ("session", "off"):
            results[affinity].append(sessions_run(affinity))
    med = {a: [statistics.median(x[i] for x in r) for i in range(3)] for a, r in results.items()}
    on, off = med["session"], med["off"]
    print(f"sessions: {SESSIONS} × {TURNS} turns over {ACCOUNTS} accounts (cap {CAP} each, learned), medians of {REPS}")
    print("| affinity | cached share of prompt tokens | ideal | total time, s |")
    print("|---|---:|---:|---:|")
    print(f"| session | {on[0]:.3f} | {on[1]:.3f} | {on[2]:.2f} |")
    print(f"| off | {off[0]:.3f} | {off[1]:.3f} | {off[2]:.2f} |")
    print(f"affinity on/off: cached share ×{on[0] / off[0]:.2f}, uncached prompt tokens "
          f"×{(1 - on[0]) / (1 - off[0]):.2f}, time ×{on[2] / off[2]:.2f}; on vs ideal ×{on[0] / on[1]:.3f}")
    fans = [fan_out() for _ in range(REPS)]
    first = statistics.median(f[0][0] for f in fans)
    second = statistics.median(f[0][1] for f in fans)
    refused = statistics.median(f[1] for f in fans)
    ideal = math.ceil(20 / (CAP * ACCOUNTS)) * 0.5
    print(f"fan-out of 20 × 0.5 s over the pool (capacity {CAP * ACCOUNTS}): ideal {ideal:.2f} s; "
          f"fresh (learning) {first:.2f} s = ×{first / ideal:.2f}, learned {second:.2f} s = ×{second / ideal:.2f}; "
          f"refusals in all (both waves) {refused:.0f}")


if __name__ == "__main__":
    main()
