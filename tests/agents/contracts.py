"""What each real coding agent does with tidegate's final answers (docs/src/giving-up.md and coding-agents.md:
"When tidegate gives up"), through one tidegate in front of one simulator
whose model names pick the fault:

- `*-limit-*`: every request refused 429, "You've hit your session limit
  · resets <five hours from now>", `Retry-After: 18000`. tidegate
  gives up at once; the agent must exit within 60 s, its output naming the
  limit and when it resets, and the simulator must have seen exactly the
  attempts tidegate journaled — and tidegate exactly one request per turn
  the agent started (no retries of the agent's own on top).
- `*-busy-*`: refused "429 model concurrency limit exceeded" (no
  Retry-After) for 20 s after the first request: the turn finishes.
- `*-flaky-*`: the first request answered `500`: the turn finishes.

Per agent: Codex CLI (Responses API), Claude Code (Anthropic messages),
Gemini CLI (Gemini API), opencode (its `openai` provider: Responses API)
and Qwen Code (chat completions), each given nothing but a base URL.
"""

import datetime
import json
import os
import sqlite3
import subprocess
import time
import urllib.request

from procs import free_port, wait_healthy, wait_port


def reset_in_five_hours():
    """A session limit's reset written as "7:35am", five hours from now in
    UTC (a fixed "3:20am" is minutes away for an hour of every day)."""
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=5)
    return f"{at.hour % 12 or 12}:{at.minute:02d}{'am' if at.hour < 12 else 'pm'}"


LIMIT_BODY = json.dumps({"type": "error", "error": {"type": "rate_limit_error",
                         "message": f"You've hit your session limit \u00b7 resets {reset_in_five_hours()}"}})

# Each agent's model names: (model prefix, short name). Claude Code asks a
# claude-* model, Gemini CLI a gemini-* one, the others gpt-*.
AGENTS = {
    "codex": ("gpt", "codex"),
    "claude": ("claude", "cc"),
    "gemini": ("gemini", "gcli"),
    "opencode": ("gpt", "oc"),
    "qwen": ("gpt", "qwen"),
}


def model(agent, fault):
    prefix, short = AGENTS[agent]
    return f"{prefix}-{fault}-{short}"


def simulator_config(path):
    models = {}
    for agent in AGENTS:
        models[model(agent, "limit")] = {
            "busy_for_ms": 86_400_000,
            "busy_with": {"status": 429, "body": LIMIT_BODY, "headers": {"retry-after": "18000"}},
        }
        models[model(agent, "busy")] = {"busy_for_ms": 20_000}
        models[model(agent, "flaky")] = {
            "script": [{"status": 500, "body": '{"error":{"message":"internal error","type":"server_error"}}'}]
        }
    config = {"description": "final answers per agent", "default": {"latency_ms": 50, "chunks": 8,
                                                                      "chunk_delay_ms": 10},
              "models": models}
    with open(path, "w") as f:
        json.dump(config, f)  # JSON is YAML


def tidegate_config(path, port, sim_port, journal):
    """One upstream per agent and fault (a session limit benches its whole
    account, as it should: it is the account's limit), each model name an
    alias of its own."""
    upstreams, models = [], []
    for agent, (prefix, _) in AGENTS.items():
        protocol, base = {"gpt": ("openai", "/v1"), "claude": ("anthropic", ""), "gemini": ("gemini", "")}[prefix]
        for fault in ("limit", "busy", "flaky"):
            upstreams.append(f'  - {{ name: {agent}-{fault}, protocol: {protocol}, '
                             f'base_url: "http://127.0.0.1:{sim_port}{base}", api_key: k }}')
            models.append(f'  {model(agent, fault)}: {{ targets: [{{ upstream: {agent}-{fault} }}] }}')
    # opencode's small model (session titles), answered normally: not
    # counted with the turn's requests.
    models.append('  gpt-title-oc: { targets: [{ upstream: opencode-flaky }] }')
    with open(path, "w") as f:
        f.write(f"listen: 127.0.0.1:{port}\njournal: {journal}\nupstreams:\n" + "\n".join(upstreams)
                + "\nmodels:\n" + "\n".join(models) + "\n")


def journaled(journal, name, settle=8.0):
    """(requests, attempts) tidegate journaled for model `name`, once the
    writer has caught up (the count stops changing)."""
    deadline, last = time.time() + settle, None
    while time.time() < deadline:
        try:
            with sqlite3.connect(journal, timeout=2) as db:
                row = db.execute("SELECT COUNT(*), COALESCE(SUM(n_attempts), 0) FROM requests_view WHERE model = ?",
                                 (name,)).fetchone()
        except sqlite3.Error:
            row = None
        if row is not None and row == last and row[0] > 0:
            return row
        last = row
        time.sleep(0.7)
    return last or (0, 0)


def asked(sim_port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{sim_port}/sim/stats", timeout=5) as r:
        return json.load(r).get("asked", {}).get(name, 0)


def check(binary, bins, tmp, logs, agent_env, run, codex_config, claude_env, gemini_settings):
    """Runs every agent against every fault; returns (name, ok, output) rows."""
    codex, claude, gemini, opencode, qwen = bins
    sim_port, gw_port = free_port(), free_port()
    sim_config, gw_config = os.path.join(tmp, "contracts-sim.yaml"), os.path.join(tmp, "contracts.yaml")
    journal = os.path.join(tmp, "contracts.db")
    simulator_config(sim_config)
    tidegate_config(gw_config, gw_port, sim_port, journal)
    sim = subprocess.Popen([binary, "simulate", "--config", sim_config, "--listen", f"127.0.0.1:{sim_port}"],
                           stdout=logs, stderr=logs)
    gw = subprocess.Popen([binary, "serve", "--config", gw_config], stdout=logs, stderr=logs, cwd=tmp)
    base = f"http://127.0.0.1:{gw_port}"

    def codex_turn(name):
        e = agent_env(f"codex-{name}")
        os.makedirs(e["CODEX_HOME"])
        with open(os.path.join(e["CODEX_HOME"], "config.toml"), "w") as f:
            f.write(codex_config(f"{base}/v1"))
        e["TIDEGATE_KEY"] = "any"
        return run([codex, "exec", "--skip-git-repo-check", "-m", name, "say hi"], e)

    def claude_turn(name):
        e = agent_env(f"claude-{name}")
        e.update({k: v.replace("http://127.0.0.1:8787", base) for k, v in claude_env().items()})
        return run([claude, "-p", "--model", name, "say hi"], e)

    def gemini_turn(name):
        e = agent_env(f"gemini-{name}")
        os.makedirs(os.path.join(e["HOME"], ".gemini"))
        with open(os.path.join(e["HOME"], ".gemini", "settings.json"), "w") as f:
            f.write(gemini_settings())
        e.update(GEMINI_API_KEY="any", GOOGLE_GEMINI_BASE_URL=base, GEMINI_CLI_TRUST_WORKSPACE="true")
        return run([gemini, "-m", name, "-p", "say hi"], e)

    def opencode_turn(name):
        e = agent_env(f"opencode-{name}")
        os.makedirs(os.path.join(e["HOME"], ".config", "opencode"))
        with open(os.path.join(e["HOME"], ".config", "opencode", "opencode.json"), "w") as f:
            json.dump({"provider": {"openai": {"options": {"baseURL": f"{base}/v1", "apiKey": "any"},
                                               "models": {name: {"name": name},
                                                          "gpt-title-oc": {"name": "gpt-title-oc"}}}},
                       "model": f"openai/{name}", "small_model": "openai/gpt-title-oc",
                       "autoupdate": False, "share": "disabled"}, f)
        return run([opencode, "run", "say hi"], e)

    def qwen_turn(name):
        e = agent_env(f"qwen-{name}")
        os.makedirs(os.path.join(e["HOME"], ".qwen"))
        with open(os.path.join(e["HOME"], ".qwen", "settings.json"), "w") as f:
            json.dump({"security": {"auth": {"selectedType": "openai"}}}, f)
        e.update(OPENAI_BASE_URL=f"{base}/v1", OPENAI_API_KEY="any", OPENAI_MODEL=name)
        return run([qwen, "-p", "say hi"], e)

    turns = {"codex": codex_turn, "claude": claude_turn, "gemini": gemini_turn, "opencode": opencode_turn,
             "qwen": qwen_turn}
    results = []
    try:
        wait_port(sim_port, sim, "simulator (contracts)")
        wait_healthy(f"{base}/healthz", gw, "tidegate (contracts)")
        for agent in AGENTS:
            turn = turns[agent]
            name = model(agent, "limit")
            started = time.time()
            rc, out = turn(name)
            took = time.time() - started
            requests, attempts = journaled(journal, name)
            seen = asked(sim_port, name)
            low = out.lower()
            names_it = "limit" in low and ("reset" in low or "try again at" in low)
            # One turn, one request: the agent did not retry tidegate's answer.
            ok = rc != 0 and took < 60 and names_it and seen == attempts and requests == 1
            results.append((f"{agent}: a session limit hours away ends the turn in {took:.1f} s naming it; "
                            f"tidegate saw {requests} request(s), the provider {seen} = tidegate's {attempts} "
                            f"attempt(s)", ok, out))
            for fault, what in (("busy", "20 s at capacity"), ("flaky", "a transient 500")):
                name = model(agent, fault)
                started = time.time()
                rc, out = turn(name)
                took = time.time() - started
                results.append((f"{agent}: a turn through {what} finishes ({took:.1f} s)",
                                rc == 0 and "tok0" in out, out))
    finally:
        for p in (gw, sim):
            p.terminate()
            p.wait(timeout=10)
    return results
