"""One client holds thousands of idle connections; is a real client still
served? Starts the simulator and tidegate at its defaults (max_connections
10,000), opens IDLE (default 21,000) connections that never send a byte
(those beyond the cap are refused or displace older ones), then times
REQUESTS (default 20) fresh connections of a real client, one by one, and
counts how many of the idle sockets tidegate closed. Loopback only,
bounded in count and time.

Usage: python3 bench/idle_flood.py [--idle 21000] [--requests 20]
(after `cargo build --release`).
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import wait_port  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--idle", type=int, default=21000)
ap.add_argument("--requests", type=int, default=20)
ap.add_argument("--binary", default="target/release/tidegate")
args = ap.parse_args()

HOLDER = r"""
import socket, sys, time
port, n, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
socks = []
for _ in range(n):
    s = socket.socket(); s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    socks.append(s)
print("opened", flush=True)
sys.stdin.readline()          # hold them until told to count
closed = refused = 0
for s in socks:
    try:
        data = s.recv(64)
        if data == b"":
            closed += 1
        elif data.startswith(b"HTTP/1.1 503"):
            refused += 1
    except BlockingIOError:
        pass
    except OSError:
        closed += 1
print(closed, refused, flush=True)
"""
# Each process may hold fewer sockets than the open-file limit allows a
# single one (20,000 here): the idle ones are held by helper processes.
PER_HOLDER = 8000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


tmp = tempfile.mkdtemp(prefix="tidegate-idle-")
sim_port, gw_port = free_port(), free_port()
config = os.path.join(tmp, "tidegate.yaml")
with open(config, "w") as f:
    f.write(f"""listen: 127.0.0.1:{gw_port}
journal: {os.path.join(tmp, "journal.db")}
upstreams: [{{ name: sim, protocol: openai, base_url: "http://127.0.0.1:{sim_port}/v1" }}]
models: {{ gpt: {{ targets: [{{ upstream: sim }}] }} }}
""")
binary = os.path.abspath(args.binary)
procs = [
    subprocess.Popen([binary, "simulate", "--listen", f"127.0.0.1:{sim_port}"], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL),
    subprocess.Popen([binary, "serve", "--config", config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
]
try:
    wait_port(sim_port)
    wait_port(gw_port)
    started = time.time()
    holders = []
    left = args.idle
    while left > 0:
        n = min(PER_HOLDER, left)
        left -= n
        h = subprocess.Popen([sys.executable, "-c", HOLDER, str(gw_port), str(n), "600"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        h.stdout.readline()
        holders.append(h)
    time.sleep(3)
    print(f"{args.idle} idle connections opened by {len(holders)} processes in {time.time() - started:.1f}s")

    body = b'{"model":"gpt","messages":[{"role":"user","content":"hi"}]}'
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
               b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    times, statuses = [], []
    for _ in range(args.requests):
        t0 = time.time()
        c = socket.create_connection(("127.0.0.1", gw_port), timeout=10)
        c.sendall(request)
        answer = b""
        while True:
            try:
                chunk = c.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            answer += chunk
        c.close()
        times.append((time.time() - t0) * 1000)
        statuses.append(answer[9:12].decode(errors="replace") or "none")
    closed = refused = 0
    for h in holders:
        h.stdin.write("count\n")
        h.stdin.flush()
        c, r = map(int, h.stdout.readline().split())
        closed, refused = closed + c, refused + r
        h.stdin.close()
        h.wait(timeout=30)
    ok = statuses.count("200")
    print(f"real client: {ok}/{len(statuses)} answered 200 (statuses {sorted(set(statuses))}); "
          f"latency p50 {statistics.median(times):.1f} ms, max {max(times):.1f} ms")
    print(f"idle sockets: {refused} answered 503 when beyond the cap with none idle to give way, "
          f"{closed} closed to make room for a newer connection, of {args.idle}")
    sys.exit(0 if ok == len(statuses) and max(times) < 1000 else 1)
finally:
    for p in procs:
        p.terminate()
        p.wait(timeout=10)
