"""What a Bedrock target costs over an Anthropic one (issue: "streaming
through a Bedrock target adds no more than 0.1 ms per event"). Run by
bench/clouds.sh.

One tidegate with its defaults (journal on), pinned to CPU 0, in front of
`tidegate simulate` (CPU 1) reached two ways: as an Anthropic upstream
(plain SSE through) and as a Bedrock upstream (SigV4-signed request;
event-stream frames decoded, CRC-checked and re-emitted as SSE). The same
200-event stream is read to its end N times per alias, aliases
interleaved, REPS repetitions, medians. Reported per event:
- tidegate CPU (utime + stime of the process, /proc) — what tidegate itself
  spends decoding and re-emitting;
- wall time of the whole stream at the client — includes the simulator's
  own SSE → event-stream framing on the other core, so it is an upper
  bound of what the decoding adds.
"""

import http.client
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import run  # noqa: E402  (helpers: start, stop, wait_port, write, cpu_seconds, TMP)

REPS = int(os.environ.get("REPS", 5))
N = int(os.environ.get("N", 500))
SIM, GW = 19200, 19201
CHUNKS = 200


def stream(alias):
    """Reads one stream to its end; (events, seconds)."""
    body = f'{{"model":"{alias}","max_tokens":8,"stream":true,"messages":[{{"role":"user","content":"hi"}}]}}'
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", GW, timeout=30)
    conn.request("POST", "/v1/messages", body, {"content-type": "application/json", "anthropic-version": "2023-06-01"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{alias}: {resp.status} {resp.read()[:300]!r}")
    events = 0
    while True:
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"event:"):
            events += 1
    conn.close()
    return events, time.perf_counter() - started


def main():
    sim_cfg = run.write("sim-clouds.yaml", f"default: {{ chunks: {CHUNKS} }}\n")
    gw_cfg = run.write("gw-clouds.yaml", (
        f"listen: 127.0.0.1:{GW}\njournal: {os.path.join(run.TMP, 'journal.db')}\nupstreams:\n"
        f'  - {{ name: anthropic, protocol: anthropic, base_url: "http://127.0.0.1:{SIM}", api_key: k }}\n'
        f'  - {{ name: bedrock, kind: bedrock, region: us-east-1, base_url: "http://127.0.0.1:{SIM}",\n'
        "       aws_access_key_id: AKIDBENCH, aws_secret_access_key: bench-secret }\n"
        "models:\n"
        "  via-anthropic: { targets: [{ upstream: anthropic, model: m }] }\n"
        '  via-bedrock: { targets: [{ upstream: bedrock, model: "anthropic.m-v1:0" }] }\n'
    ))
    procs = []
    try:
        procs.append(run.start([run.BIN, "simulate", "--listen", f"127.0.0.1:{SIM}", "--config", sim_cfg], 1,
                               {"RUST_LOG": "warn"}, "sim.log"))
        run.wait_port(SIM)
        gw = run.start([run.BIN, "serve", "--config", gw_cfg], 0, {}, "gw.log")
        procs.append(gw)
        run.wait_port(GW)
        for alias in ("via-anthropic", "via-bedrock"):
            for _ in range(10):  # warm-up: connections, pools, token caches
                stream(alias)
        results = {"via-anthropic": [], "via-bedrock": []}
        for rep in range(REPS):
            for alias in results:
                before = run.cpu_seconds(gw.pid)
                walls, events = [], 0
                for _ in range(N):
                    n, wall = stream(alias)
                    events += n
                    walls.append(wall)
                cpu = run.cpu_seconds(gw.pid) - before
                per_stream = events / N
                results[alias].append((cpu * 1e6 / events, statistics.median(walls) * 1e3 / per_stream, per_stream))
            print(f"rep {rep + 1}/{REPS}: " + ", ".join(
                f"{a}: {r[-1][0]:.2f} µs CPU/event, {r[-1][1] * 1000:.2f} µs wall/event" for a, r in results.items()),
                file=sys.stderr)
    finally:
        run.stop(procs)
    med = {a: (statistics.median(x[0] for x in r), statistics.median(x[1] for x in r), r[0][2])
           for a, r in results.items()}
    a, b = med["via-anthropic"], med["via-bedrock"]
    print(f"\nstream of {a[2]:.0f} events, N={N} streams per alias per rep, medians of {REPS} interleaved reps")
    print(f"{'':34}{'anthropic':>12}{'bedrock':>12}{'added':>12}")
    print(f"{'tidegate CPU per event (µs)':34}{a[0]:12.2f}{b[0]:12.2f}{b[0] - a[0]:12.2f}")
    print(f"{'wall per event at the client (µs)':34}{a[1] * 1000:12.2f}{b[1] * 1000:12.2f}{(b[1] - a[1]) * 1000:12.2f}")
    print(f"goal: added ≤ 100 µs per event; added CPU = {b[0] - a[0]:.2f} µs, added wall = {(b[1] - a[1]) * 1000:.2f} µs")


if __name__ == "__main__":
    main()
