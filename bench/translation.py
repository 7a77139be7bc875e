"""What translation costs over pass-through (issue: "≤ 5 µs of CPU per
streamed event and ≤ 50 µs per 10 KB request body added"). Run by
bench/translation.sh.

One tidegate with its defaults (journal on), pinned to CPU 0, in front of
`tidegate simulate` (CPU 1), with one alias on an `openai` upstream. The
same upstream answers are asked for two ways, interleaved, REPS
repetitions, medians:
- pass-through: a chat-completions client (the bytes go through);
- translated: an Anthropic client, whose request is translated to chat
  completions and whose answer comes back as Anthropic events;
- the same Anthropic request passed through to an `anthropic` upstream
  (the simulator's messages endpoint): the same client bytes, not
  translated — the reference that isolates translation from what an
  Anthropic client costs anyway (its own headers, its own answer).
Two loads:
- streams of 200 chunk events (small body): tidegate CPU (utime + stime,
  /proc) per upstream event;
- non-stream requests with a 10 KB body (a conversation of 20 turns and
  a tool): tidegate CPU per request — the request's translation, the
  answer's, and reading the answer whole instead of relaying it.
"""

import http.client
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
import run  # noqa: E402  (helpers: start, stop, wait_port, write, cpu_seconds, TMP)

REPS = int(os.environ.get("REPS", 9))
N = int(os.environ.get("N", 600))
M = int(os.environ.get("M", 6000))
SIM, GW = 19300, 19301
CHUNKS = 200


def turns(n):
    """A conversation of `n` turns, ~10 KB, as messages both protocols read alike."""
    out = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        out.append({"role": role, "content": f"turn {i}: " + "lorem ipsum dolor sit amet " * 17})
    out.append({"role": "user", "content": "and now?"})
    return out


SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "line": {"type": "integer"}}}


def body(client, stream, big):
    messages = turns(20) if big else [{"role": "user", "content": "hi"}]
    if client == "chat":
        v = {"model": "m", "stream": stream, "max_tokens": 64, "messages": messages}
        if big:
            v["tools"] = [{"type": "function", "function": {"name": "no_such_tool_today", "parameters": SCHEMA}}]
    else:
        v = {"model": "m", "stream": stream, "max_tokens": 64, "messages": messages}
        if big:
            v["tools"] = [{"name": "no_such_tool_today", "input_schema": SCHEMA}]
    return json.dumps(v)


def ask(client, payload, stream):
    path = "/v1/chat/completions" if client == "chat" else "/v1/messages"
    if client == "anthropic-native":
        client = "anthropic"
    conn = http.client.HTTPConnection("127.0.0.1", GW, timeout=30)
    conn.request("POST", path, payload, {"content-type": "application/json", "anthropic-version": "2023-06-01"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"{client}: {resp.status} {data[:300]!r}")
    if stream and not (data.rstrip().endswith(b"[DONE]") or b"message_stop" in data):
        raise RuntimeError(f"{client}: stream did not finish: {data[-300:]!r}")
    return len(data)


def main():
    # The tool is never called (the simulator calls only the first tool of
    # a request whose name it knows: none here), so both answers are text.
    sim_cfg = run.write("sim-translation.yaml", f"default: {{ chunks: {CHUNKS} }}\nmodels:\n  small: {{ chunks: 8 }}\n")
    gw_cfg = run.write("gw-translation.yaml", (
        f"listen: 127.0.0.1:{GW}\njournal: {os.path.join(run.TMP, 'journal.db')}\nupstreams:\n"
        f'  - {{ name: chat, protocol: openai, base_url: "http://127.0.0.1:{SIM}/v1", api_key: k }}\n'
        f'  - {{ name: anth, protocol: anthropic, base_url: "http://127.0.0.1:{SIM}", api_key: k }}\n'
        "models:\n  m: { targets: [{ upstream: chat }] }\n  s: { targets: [{ upstream: chat, model: small }] }\n"
        "  am: { targets: [{ upstream: anth, model: m }] }\n  as: { targets: [{ upstream: anth, model: small }] }\n"
    ))
    procs = []
    results = {}
    try:
        procs.append(run.start([run.BIN, "simulate", "--listen", f"127.0.0.1:{SIM}", "--config", sim_cfg], 1,
                               {"RUST_LOG": "warn"}, "sim.log"))
        run.wait_port(SIM)
        gw = run.start([run.BIN, "serve", "--config", gw_cfg], 0, {}, "gw.log")
        procs.append(gw)
        run.wait_port(GW)
        loads = {
            ("stream", "chat"): body("chat", True, False),
            ("stream", "anthropic"): body("anthropic", True, False),
            ("10KB", "chat"): body("chat", False, True).replace('"model": "m"', '"model": "s"'),
            ("10KB", "anthropic"): body("anthropic", False, True).replace('"model": "m"', '"model": "s"'),
            ("stream", "anthropic-native"): body("anthropic", True, False).replace('"model": "m"', '"model": "am"'),
            ("10KB", "anthropic-native"): body("anthropic", False, True).replace('"model": "m"', '"model": "as"'),
        }
        print(f"10 KB bodies: chat {len(loads[('10KB', 'chat')])} B, anthropic {len(loads[('10KB', 'anthropic')])} B",
              file=sys.stderr)
        for (load, client), payload in loads.items():
            for _ in range(20):
                ask(client, payload, load == "stream")
        results = {k: [] for k in loads}
        for rep in range(REPS):
            for (load, client), payload in loads.items():
                count = N if load == "stream" else M
                before = run.cpu_seconds(gw.pid)
                for _ in range(count):
                    ask(client, payload, load == "stream")
                cpu = run.cpu_seconds(gw.pid) - before
                unit = count * (CHUNKS + 2) if load == "stream" else count
                results[(load, client)].append(cpu * 1e6 / unit)
            print(f"rep {rep + 1}/{REPS}: " + ", ".join(f"{k[0]}/{k[1]}: {v[-1]:.2f} µs" for k, v in results.items()),
                  file=sys.stderr)
    finally:
        run.stop(procs)
    med = {k: statistics.median(v) for k, v in results.items()}
    s_pass, s_tr, s_nat = med[("stream", "chat")], med[("stream", "anthropic")], med[("stream", "anthropic-native")]
    b_pass, b_tr, b_nat = med[("10KB", "chat")], med[("10KB", "anthropic")], med[("10KB", "anthropic-native")]
    # Added per rep (each rep's loads ran back to back), then the median.
    def added(load, ref):
        return statistics.median(t - r for t, r in zip(results[(load, "anthropic")], results[(load, ref)]))
    print(f"\nmedians of {REPS} interleaved reps; tidegate defaults, journal on")
    print(f"{'':44}{'chat pass':>10}{'anth pass':>10}{'translated':>11}{'added/chat':>11}{'added/anth':>11}")
    print(f"{'stream: CPU per upstream event (µs)':44}{s_pass:10.2f}{s_nat:10.2f}{s_tr:11.2f}"
          f"{added('stream', 'chat'):11.2f}{added('stream', 'anthropic-native'):11.2f}")
    print(f"{'10 KB request, JSON answer: CPU/request (µs)':44}{b_pass:10.1f}{b_nat:10.1f}{b_tr:11.1f}"
          f"{added('10KB', 'chat'):11.1f}{added('10KB', 'anthropic-native'):11.1f}")
    print(f"goals: ≤ 5 µs per event, ≤ 50 µs per 10 KB request (added over the same Anthropic request passed "
          f"through: {added('stream', 'anthropic-native'):.2f}, {added('10KB', 'anthropic-native'):.1f})")

if __name__ == "__main__":
    main()
