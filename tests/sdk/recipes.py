"""The README's recipes, run for real against `tidegate simulate --scenario
capacity` and `tidegate serve --config examples/try.yaml`: its curl lines,
the Python recipe (tests/sdk/recipe.py) and the JavaScript recipe
(tests/sdk/recipe.mjs, when target/sdk-js has the SDKs installed). The
coding agents' setup is run by tests/agents/run.py.

Usage: python tests/sdk/recipes.py path/to/tidegate
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

from procs import free_port, wait_healthy, wait_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JS = os.path.join(ROOT, "target", "sdk-js")


def readme_curls():
    """The curl commands of the README's "Try it offline" section."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text.split("## Try it offline", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    commands = []
    for block in blocks:
        joined = block.replace("\\\n", " ")
        commands += [line.strip() for line in joined.splitlines() if line.strip().startswith("curl ")]
    return commands


def main():
    binary = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="tidegate-recipes-")
    sim_port, gw_port = free_port(), free_port()
    env = dict(os.environ, TRY_SIM=f"127.0.0.1:{sim_port}", TRY_LISTEN=f"127.0.0.1:{gw_port}",
               TRY_JOURNAL=os.path.join(tmp, "try.db"))
    logs = open(os.path.join(tmp, "log.txt"), "w")
    sim = subprocess.Popen([binary, "simulate", "--scenario", "capacity", "--listen", f"127.0.0.1:{sim_port}"],
                           stdout=logs, stderr=logs)
    gw = subprocess.Popen([binary, "serve", "--config", os.path.join(ROOT, "examples", "try.yaml")],
                          env=env, stdout=logs, stderr=logs, cwd=tmp)
    base = f"http://127.0.0.1:{gw_port}"
    failed = 0
    try:
        wait_port(sim_port, sim, "simulator")
        wait_healthy(f"{base}/healthz", gw, "tidegate")
        runs = []
        curls = readme_curls()
        if len(curls) < 3:
            raise RuntimeError(f"expected the README's curl recipes, found {curls}")
        for cmd in curls:
            runs.append((f"README: {cmd[:60]}...", ["bash", "-c", cmd.replace("127.0.0.1:8787", f"127.0.0.1:{gw_port}")], 1))
        runs.append(("python recipe (openai + anthropic SDKs)", [sys.executable, os.path.join(ROOT, "tests", "sdk", "recipe.py")], 6))
        if os.path.isdir(os.path.join(JS, "node_modules", "openai")):
            shutil.copy(os.path.join(ROOT, "tests", "sdk", "recipe.mjs"), os.path.join(JS, "recipe.mjs"))
            runs.append(("javascript recipe (openai + @anthropic-ai/sdk)", ["node", os.path.join(JS, "recipe.mjs")], 6))
        else:
            print("skip javascript recipe: no target/sdk-js/node_modules (npm install --prefix target/sdk-js tests/sdk)")
        for name, cmd, want in runs:
            home = tempfile.mkdtemp(prefix="home-", dir=tmp)
            run_env = dict(os.environ, TIDEGATE_URL=base, HOME=home)
            try:
                out = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=120)
                hits = out.stdout.count("tok0")
                ok = out.returncode == 0 and hits >= want
                detail = "" if ok else f": rc={out.returncode} answers={hits}/{want}\n{out.stdout[-800:]}{out.stderr[-800:]}"
            except subprocess.TimeoutExpired:
                ok, detail = False, ": no result in 120 s"
            failed += 0 if ok else 1
            print(f"{'ok  ' if ok else 'FAIL'} {name}{detail}")
        print(f"{len(runs) - failed} passed, {failed} failed")
    finally:
        for p in (gw, sim):
            p.terminate()
            p.wait(timeout=10)
    if failed:
        print(open(os.path.join(tmp, "log.txt")).read()[-3000:])
        sys.exit(1)


if __name__ == "__main__":
    main()
