"""What one hostile request costs the gateway, tidegate (TIDEGATE_BIN, the
release build by default) beside BASELINE_BIN (an older build) when given,
same run, medians. Run by bench/bounds.sh.

- distinct client-chosen type names: a Responses request with N items of
  N distinct unknown types (each dropped and declared) to a chat-only
  target, for N = 10k, 20k, 40k, 80k: seconds per request, and the
  x-tidegate-dropped header's size;
- another client's small request while two 0.8 MiB such bodies are in
  flight: its latency;
- kept conversations: RSS after a 2,500-turn chain of kept responses
  (each turn continues the previous one), and after four requests of
  2,000,000 one-byte items (store left at its default, true).

Prints one line a figure, `bounds <case> <build>: …`.
"""

import http.client
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import run  # noqa: E402

REPS = int(os.environ.get("REPS", 3))
# The older build's header of declared drops grew past http.client's
# 64 KiB line limit (httpx refuses 16 KiB): read it anyway, to measure it.
http.client._MAXLINE = 1 << 26
SIM, GW = 19300, 19310
BIN = run.BIN
BASELINE = os.environ.get("BASELINE_BIN")


def post(port, path, body, timeout=600):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body=body, headers={"content-type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    headers = dict(resp.getheaders())
    conn.close()
    return resp.status, headers, data


def unknown_items(n):
    items = [{"type": f"made_up_type_{i:06d}"} for i in range(n)] + [{"role": "user", "content": "hi"}]
    return json.dumps({"model": "m", "store": False, "input": items})


def gateway(binary, name):
    config = run.write(name + ".yaml", (
        f"listen: 127.0.0.1:{GW}\njournal: \"off\"\nupstreams:\n"
        f"  - {{ name: chat, protocol: openai-chat, base_url: \"http://127.0.0.1:{SIM}/v1\", api_key: k }}\n"
        "models:\n  m:\n    targets: [{ upstream: chat, model: glm }]\n"))
    proc = run.start([binary, "serve", "--config", config], 0, log=name + ".log")
    run.wait_port(GW)
    return proc


def measure(binary, label):
    proc = gateway(binary, label.replace(" ", "-"))
    try:
        post(GW, "/v1/responses", unknown_items(100))
        for n in (10_000, 20_000, 40_000, 80_000):
            body = unknown_items(n)
            times, header = [], 0
            for _ in range(REPS):
                t = time.perf_counter()
                status, headers, _ = post(GW, "/v1/responses", body)
                times.append(time.perf_counter() - t)
                header = len(headers.get("x-tidegate-dropped", ""))
            print(f"bounds types-{n // 1000}k {label}: {statistics.median(times):.3f} s a request "
                  f"(status {status}), x-tidegate-dropped {header} bytes", flush=True)
        # Another client's small request behind two 0.8 MiB bodies.
        heavy = unknown_items(40_000)
        waits = []
        for _ in range(REPS):
            threads = [threading.Thread(target=post, args=(GW, "/v1/responses", heavy)) for _ in range(2)]
            for th in threads:
                th.start()
            time.sleep(0.02)
            t = time.perf_counter()
            post(GW, "/v1/chat/completions", '{"model":"m","messages":[{"role":"user","content":"hi"}]}')
            waits.append(time.perf_counter() - t)
            for th in threads:
                th.join()
        print(f"bounds neighbour {label}: a small request waited {statistics.median(waits) * 1000:.0f} ms "
              "behind two 0.8 MiB bodies", flush=True)
    finally:
        run.stop([proc])
    # Kept conversations on a fresh process (the figures above leave the
    # allocator holding what their bodies took).
    proc = gateway(binary, label.replace(" ", "-") + "-kept")
    try:
        post(GW, "/v1/responses", '{"model":"m","store":false,"input":"hi"}')
        start = run.status_kib(proc.pid, "VmRSS")
        previous = None
        for _ in range(2500):
            body = {"model": "m", "input": "turn"}
            if previous:
                body["previous_response_id"] = previous
            _, _, data = post(GW, "/v1/responses", json.dumps(body))
            previous = json.loads(data).get("id")
        chain = run.status_kib(proc.pid, "VmRSS")
        ones = '{"model":"m","input":[' + "1," * 2_000_000 + '{"role":"user","content":"hi"}]}'
        for _ in range(4):
            post(GW, "/v1/responses", ones)
        end = run.status_kib(proc.pid, "VmRSS")
        print(f"bounds kept {label}: RSS {start / 1024:.0f} MiB at start, {chain / 1024:.0f} after a 2,500-turn "
              f"chain, {end / 1024:.0f} after four 2M-item requests (bound: 64 MiB kept)", flush=True)
    finally:
        run.stop([proc])


def main():
    sim = run.start([BIN, "simulate", "--listen", f"127.0.0.1:{SIM}"], 1, log="sim.log")
    run.wait_port(SIM)
    try:
        measure(BIN, "tidegate")
        if BASELINE:
            measure(os.path.abspath(BASELINE), "baseline")
    finally:
        run.stop([sim])


if __name__ == "__main__":
    main()
