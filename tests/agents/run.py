"""Real coding agents through tidegate, as the manual's "Coding agents"
section sets them up: OpenAI Codex CLI (`codex exec`, Responses API),
Claude Code (`claude -p`, Anthropic messages) and Gemini CLI (`gemini -p`,
the Gemini API: against `tidegate simulate --scenario gemini`, straight and
through tidegate, and through tidegate to a Claude model), against
`tidegate simulate --scenario capacity`, whose first answer to any model
name is "429 model concurrency limit exceeded" without Retry-After.

Checks: Codex pointed straight at the simulator gives up (the incident
tidegate exists for); Codex and Claude Code pointed at tidegate finish;
Claude Code finishes through a tidegate whose Claude models are served by
a (simulated) Amazon Bedrock upstream; Codex and Claude Code finish
through a tidegate whose only upstream serves chat completions (the same
capacity scenario, `--chat-only`: tidegate translates both ways, and the
first attempt's 429 3009 is retried). The request bodies the agents sent
are kept in target/agents/corpus (the conformance corpus's source,
tests/fixtures/corpus).
The agents come from npm (`@openai/codex`, `@anthropic-ai/claude-code`,
installed once under target/agents); the manual's Codex provider block is
read from the manual itself (docs/src/coding-agents.md), so the documented setup is what runs.

Usage: python tests/agents/run.py path/to/tidegate
"""

import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sdk"))
from procs import free_port, wait_healthy, wait_port  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contracts  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AGENTS = os.path.join(ROOT, "target", "agents")
PACKAGES = ["@openai/codex@0.171.0", "@anthropic-ai/claude-code@2.1.332", "@google/gemini-cli@0.61.0",
            "opencode-ai@1.18.33", "@qwen-code/qwen-code@0.24.4"]
AGENT_BINS = ("codex", "claude", "gemini", "opencode", "qwen")


def install():
    bins = [os.path.join(AGENTS, "node_modules", ".bin", b) for b in AGENT_BINS]
    if not all(os.path.exists(b) for b in bins):
        os.makedirs(AGENTS, exist_ok=True)
        subprocess.run(["npm", "install", "--prefix", AGENTS, "--no-audit", "--no-fund", "--silent", *PACKAGES],
                       check=True)
    return bins


def readme_gemini_settings():
    """The manual's ~/.gemini/settings.json for Gemini CLI."""
    block = re.search(r"```json\n(\{.*?)```", readme_section(), re.S).group(1)
    assert "gemini-api-key" in block, block
    return block


def readme_section():
    """The manual's "Coding agents" page (docs/src/coding-agents.md)."""
    return open(os.path.join(ROOT, "docs", "src", "coding-agents.md"), encoding="utf-8").read()


def codex_config(base_url):
    """The manual's ~/.codex/config.toml, pointed at `base_url`."""
    block = re.search(r"```toml\n(.*?)```", readme_section(), re.S).group(1)
    assert "wire_api = \"responses\"" in block, block
    return block.replace("http://127.0.0.1:8787/v1", base_url)


def codex_builtin_config(base_url):
    """The manual's config.toml for Codex's built-in OpenAI provider (its
    WebSocket transport), pointed at `base_url`."""
    block = next(b for b in re.findall(r"```toml\n(.*?)```", readme_section(), re.S) if "openai_base_url" in b)
    return block.replace("http://127.0.0.1:8787/v1", base_url)


def claude_env():
    """The variables the manual's Claude Code line sets."""
    line = next(l for l in readme_section().splitlines() if l.startswith("ANTHROPIC_BASE_URL="))
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def run(cmd, env, timeout=180):
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=env["HOME"])
        return out.returncode, out.stdout + out.stderr
    except subprocess.TimeoutExpired as e:
        return -1, f"no result in {timeout} s: {e.stdout or ''}{e.stderr or ''}"


def main():
    binary = os.path.abspath(sys.argv[1])
    bins = install()
    codex, claude, gemini = bins[:3]
    tmp = tempfile.mkdtemp(prefix="tidegate-agents-")
    sim_port, gw_port, cloud_port = free_port(), free_port(), free_port()
    chat_port, chat_gw_port = free_port(), free_port()
    corpus = os.path.join(AGENTS, "corpus")
    logs = open(os.path.join(tmp, "log.txt"), "w")
    env = dict(os.environ, TRY_SIM=f"127.0.0.1:{sim_port}", TRY_LISTEN=f"127.0.0.1:{gw_port}",
               TRY_JOURNAL=os.path.join(tmp, "try.db"))
    sim = subprocess.Popen([binary, "simulate", "--scenario", "capacity", "--listen", f"127.0.0.1:{sim_port}",
                            "--dump", corpus], stdout=logs, stderr=logs)
    chat_sim = subprocess.Popen([binary, "simulate", "--scenario", "capacity", "--chat-only",
                                 "--listen", f"127.0.0.1:{chat_port}"], stdout=logs, stderr=logs)
    gw = subprocess.Popen([binary, "serve", "--config", os.path.join(ROOT, "examples", "try.yaml")],
                          env=env, stdout=logs, stderr=logs, cwd=tmp)
    def serve(name, port, upstream, models):
        """A tidegate on `port` with one upstream and its models (YAML flow lines)."""
        path = os.path.join(tmp, f"{name}.yaml")
        with open(path, "w") as f:
            f.write(f'listen: 127.0.0.1:{port}\njournal: "off"\nupstreams:\n  - {upstream}\nmodels:\n  {models}\n')
        return subprocess.Popen([binary, "serve", "--config", path], stdout=logs, stderr=logs, cwd=tmp)

    cloud = serve("bedrock", cloud_port,
                  f'{{ name: bedrock, kind: bedrock, region: us-east-1, base_url: "http://127.0.0.1:{sim_port}", '
                  'aws_access_key_id: AKIDAGENTS, aws_secret_access_key: agents-secret }',
                  '"claude-*": { targets: [{ upstream: bedrock }] }')
    chat_gw = serve("chat-only", chat_gw_port,
                    f'{{ name: plan, protocol: openai-chat, base_url: "http://127.0.0.1:{chat_port}/v1", api_key: k }}',
                    '"*": { targets: [{ upstream: plan }] }')
    # Gemini: a simulated Google AI Studio (`--scenario gemini`: six bare
    # 429 RESOURCE_EXHAUSTED per model, gemini-quota's per-minute quota
    # with RetryInfo 20s), a tidegate in front of it, and a tidegate whose
    # every model is a Claude model (the capacity simulator) for Gemini CLI.
    gem_port, gem_gw_port, gem_claude_port = free_port(), free_port(), free_port()
    gem_sim = subprocess.Popen([binary, "simulate", "--scenario", "gemini", "--listen", f"127.0.0.1:{gem_port}"],
                               stdout=logs, stderr=logs)
    gem_gw = serve("gemini", gem_gw_port,
                   f'{{ name: ai-studio, protocol: gemini, base_url: "http://127.0.0.1:{gem_port}", api_key: k }}',
                   '"*": { targets: [{ upstream: ai-studio }] }')
    gem_claude = serve("gemini-on-claude", gem_claude_port,
                       f'{{ name: claude, protocol: anthropic, base_url: "http://127.0.0.1:{sim_port}", api_key: k }}',
                       '"*": { targets: [{ upstream: claude, model: claude-sonnet-4-5 }] }')
    results = []
    try:
        wait_port(sim_port, sim, "simulator")
        wait_healthy(f"http://127.0.0.1:{gw_port}/healthz", gw, "tidegate")
        wait_healthy(f"http://127.0.0.1:{cloud_port}/healthz", cloud, "tidegate (bedrock)")
        wait_port(chat_port, chat_sim, "simulator (chat only)")
        wait_healthy(f"http://127.0.0.1:{chat_gw_port}/healthz", chat_gw, "tidegate (chat only)")
        wait_port(gem_port, gem_sim, "simulator (gemini)")
        wait_healthy(f"http://127.0.0.1:{gem_gw_port}/healthz", gem_gw, "tidegate (gemini)")
        wait_healthy(f"http://127.0.0.1:{gem_claude_port}/healthz", gem_claude, "tidegate (gemini on claude)")

        def agent_env(name):
            home = tempfile.mkdtemp(prefix=f"{name}-", dir=tmp)
            return dict(os.environ, HOME=home, CODEX_HOME=os.path.join(home, ".codex"), DISABLE_TELEMETRY="1",
                        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", NO_COLOR="1")

        def codex_run(name, base_url):
            e = agent_env(name)
            os.makedirs(e["CODEX_HOME"])
            with open(os.path.join(e["CODEX_HOME"], "config.toml"), "w") as f:
                f.write(codex_config(base_url))
            e["TIDEGATE_KEY"] = "any-key-tidegate-has-no-client-keys-here"
            return run([codex, "exec", "--skip-git-repo-check", "say hi"], e)

        # The incident: Codex straight at the provider quits on the 429.
        rc, out = codex_run("codex-direct", f"http://127.0.0.1:{sim_port}/v1")
        ok = rc != 0 and "429" in out
        results.append(("codex straight at the simulator gives up on the 429", ok, out))

        rc, out = codex_run("codex-tidegate", f"http://127.0.0.1:{gw_port}/v1")
        results.append(("codex exec through tidegate finishes", rc == 0 and "tok0" in out, out))

        e = agent_env("claude")
        e.update({k: v.replace("127.0.0.1:8787", f"127.0.0.1:{gw_port}") for k, v in claude_env().items()})
        rc, out = run([claude, "-p", "say hi"], e)
        results.append(("claude -p through tidegate finishes", rc == 0 and "tok0" in out, out))

        e = agent_env("claude-bedrock")
        e.update({k: v.replace("127.0.0.1:8787", f"127.0.0.1:{cloud_port}") for k, v in claude_env().items()})
        rc, out = run([claude, "-p", "say hi"], e)
        results.append(("claude -p through tidegate to a Bedrock upstream finishes", rc == 0 and "tok0" in out, out))

        # Codex's built-in provider: the Responses WebSocket, through a
        # tidegate logging its sockets; the capacity simulator's first
        # answer is 429 3009.
        ws_port = free_port()
        ws_yaml = os.path.join(tmp, "codex-ws.yaml")
        with open(ws_yaml, "w") as f:
            f.write(f'listen: 127.0.0.1:{ws_port}\njournal: "off"\nupstreams:\n  - {{ name: sim, protocol: openai, '
                    f'base_url: "http://127.0.0.1:{sim_port}/v1", api_key: k }}\nmodels:\n  "*": {{ targets: [{{ upstream: sim }}] }}\n')
        ws_log_path = os.path.join(tmp, "codex-ws.log")
        ws_log = open(ws_log_path, "w")
        ws_gw = subprocess.Popen([binary, "serve", "--config", ws_yaml], stdout=ws_log, stderr=ws_log, cwd=tmp,
                                 env=dict(os.environ, RUST_LOG="tidegate=debug"))
        try:
            wait_healthy(f"http://127.0.0.1:{ws_port}/healthz", ws_gw, "tidegate (codex websocket)")
            e = agent_env("codex-websocket")
            os.makedirs(e["CODEX_HOME"])
            with open(os.path.join(e["CODEX_HOME"], "config.toml"), "w") as f:
                # A model name of its own: the simulator refuses its first request.
                f.write(codex_builtin_config(f"http://127.0.0.1:{ws_port}/v1").replace(
                    'model = "gpt-5.1-codex"', 'model = "gpt-5.1-codex-ws"'))
            e["OPENAI_API_KEY"] = "any-key-tidegate-has-no-client-keys-here"
            rc, out = run([codex, "exec", "--skip-git-repo-check", "say hi"], e)
        finally:
            ws_gw.terminate()
            ws_gw.wait(timeout=10)
            ws_log.close()
        seen = open(ws_log_path, encoding="utf-8").read()
        sockets, retried = seen.count("responses websocket opened"), seen.count("retrying")
        ok = rc == 0 and "tok0" in out and sockets >= 1 and retried >= 1
        ok = ok and "falling back from websockets" not in out.lower() and "reconnecting" not in out.lower()
        results.append((f"codex exec with the built-in OpenAI provider over a WebSocket through tidegate finishes, "
                        f"its 429 3009 retried ({sockets} socket(s), {retried} retry), no fallback to HTTP", ok, out))

        rc, out = codex_run("codex-chat-only", f"http://127.0.0.1:{chat_gw_port}/v1")
        results.append(("codex exec through tidegate to a chat-completions-only provider finishes",
                         rc == 0 and "tok0" in out, out))

        e = agent_env("claude-chat-only")
        e.update({k: v.replace("127.0.0.1:8787", f"127.0.0.1:{chat_gw_port}") for k, v in claude_env().items()})
        rc, out = run([claude, "-p", "say hi"], e)
        results.append(("claude -p through tidegate to a chat-completions-only provider finishes",
                         rc == 0 and "tok0" in out, out))

        def gemini_run(name, base_url, model, timeout=120):
            e = agent_env(name)
            # 0.61 exits 41 unless the API-key auth type is chosen in settings.
            os.makedirs(os.path.join(e["HOME"], ".gemini"))
            with open(os.path.join(e["HOME"], ".gemini", "settings.json"), "w") as f:
                f.write(readme_gemini_settings())
            e.update(GEMINI_API_KEY="any-key", GOOGLE_GEMINI_BASE_URL=base_url, GEMINI_CLI_TRUST_WORKSPACE="true")
            return run([gemini, "-m", model, "-p", "say hi"], e, timeout=timeout)

        # Straight at the provider: Gemini CLI backs off from each bare 429
        # itself (5 s, 10 s, 20 s, ...): the turn is not done in 45 s.
        rc, out = gemini_run("gemini-direct", f"http://127.0.0.1:{gem_port}", "gemini-2.5-pro", timeout=45)
        attempts = out.count("failed with status 429")
        results.append((f"gemini -p straight at the simulator has not finished in 45 s ({attempts} 429s seen)",
                        rc != 0 and attempts >= 2 and "tok0" not in out, out))
        rc, out = gemini_run("gemini-tidegate", f"http://127.0.0.1:{gem_gw_port}", "gemini-2.5-pro")
        results.append(("gemini -p through tidegate finishes on the model asked for, never seeing a 429",
                         rc == 0 and "tok0" in out and "429" not in out, out))
        rc, out = gemini_run("gemini-quota", f"http://127.0.0.1:{gem_gw_port}", "gemini-quota")
        results.append(("gemini -p through tidegate waits out a per-minute quota (RetryInfo 20s) for it",
                         rc == 0 and "tok0" in out and "429" not in out, out))
        rc, out = gemini_run("gemini-claude", f"http://127.0.0.1:{gem_claude_port}", "gemini-2.5-pro")
        results.append(("gemini -p through tidegate to a Claude model (translated, a tool call included) finishes",
                         rc == 0 and "tok0" in out, out))
        results += contracts.check(binary, bins, tmp, logs, agent_env, run, codex_config, claude_env,
                                   readme_gemini_settings)
    finally:
        for p in (gem_claude, gem_gw, gem_sim, chat_gw, chat_sim, cloud, gw, sim):
            p.terminate()
            p.wait(timeout=10)
    failed = 0
    for name, ok, out in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
        if not ok:
            failed += 1
            print("    " + out[-1500:].replace("\n", "\n    "))
        else:
            said = [l for l in out.splitlines()
                    if "tok0" in l or "ERROR" in l or ("limit" in l and "reset" in l.lower())][-1:]
            print(f"    said: {said[0].strip()[:160] if said else ''}")
    print(f"agents: {len(results) - failed} passed, {failed} failed")
    if failed:
        print(open(os.path.join(tmp, "log.txt")).read()[-3000:])
        sys.exit(1)


if __name__ == "__main__":
    main()
