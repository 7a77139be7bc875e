"""The deployment files, checked (run by .ci/run; README "Deploying").

No container engine runs on this machine (podman installs, but crun cannot
set the container's rlimits inside the sandbox: "setrlimit RLIMIT_NOFILE:
Operation not permitted"), so the image is not built here. What is checked:

1. every Kubernetes manifest against the 1.31 API schemas, strictly
   (kubernetes-validate: an unknown or misspelt field fails);
2. the compose file with compose-spec (the Compose specification's parser);
3. that the files agree: the ConfigMap holds deploy/tidegate.yaml, the
   container port is the config's, the grace period covers preStop and
   shutdown_grace, readiness and HEALTHCHECK use /healthz, the image runs
   as a non-root user from a multi-stage build, four replicas or more
   (Kubernetes and compose) share one Redis;
4. the config and the image's commands as written, on this machine: four
   `tidegate serve --config deploy/tidegate.yaml` sharing one redis-server
   (the environment a container gets), `tidegate healthcheck` on each, a
   request through each, shared state up, a clean exit on SIGTERM.

Usage: python tests/deploy/check.py path/to/tidegate
"""

import json
import time
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request

import compose_spec
import kubernetes_validate
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sdk"))
from procs import free_port, wait_healthy, wait_port  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")
passed, failed = 0, 0


def check(ok, what):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + what)
    if ok:
        passed += 1
    else:
        failed += 1


def duration_s(text):
    m = re.fullmatch(r"(\d+)(ms|s|m)", text)
    n = int(m.group(1))
    return {"ms": n / 1000, "s": n, "m": n * 60}[m.group(2)]


def manifests():
    docs = []
    for name in sorted(os.listdir(os.path.join(DEPLOY, "k8s"))):
        with open(os.path.join(DEPLOY, "k8s", name)) as f:
            docs += [(name, d) for d in yaml.safe_load_all(f) if d]
    return docs


def static_checks():
    docs = manifests()
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, "1.31.0", strict=True)
            check(True, f"k8s/{name}: {doc['kind']} {doc['metadata']['name']} valid (1.31, strict)")
        except Exception as e:  # the validator's own error types
            check(False, f"k8s/{name}: {doc['kind']}: {str(e).splitlines()[0]}")
    with open(os.path.join(DEPLOY, "compose.yaml")) as f:
        compose_text = f.read()
    try:
        compose = compose_spec.PyCompose.from_yaml(compose_text)
        check(True, f"compose.yaml valid (services {compose.service_names()})")
    except ValueError as e:
        check(False, f"compose.yaml: {e}")

    with open(os.path.join(DEPLOY, "tidegate.yaml")) as f:
        config_text = f.read()
    config = yaml.safe_load(config_text)
    by_kind = {d["kind"] + "/" + d["metadata"]["name"]: d for _, d in docs}
    cm = by_kind["ConfigMap/tidegate-config"]
    check(cm["data"]["tidegate.yaml"] == config_text, "the ConfigMap holds deploy/tidegate.yaml as is")
    port = int(config["listen"].rsplit(":", 1)[1])
    pod = by_kind["Deployment/tidegate"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    check(c["ports"][0]["containerPort"] == port, f"container port {port} is the config's listen port")
    check(c["readinessProbe"]["httpGet"]["path"] == "/healthz", "readiness follows /healthz (503 while draining)")
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    grace = duration_s(config["shutdown_grace"])
    check(pod["terminationGracePeriodSeconds"] > sleep + grace,
          f"grace period {pod['terminationGracePeriodSeconds']}s > preStop {sleep}s + shutdown_grace {grace}s")
    check(pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0, "pods run as non-root")
    check(by_kind["Deployment/tidegate"]["spec"]["replicas"] >= 4, "four replicas or more")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    check(env.get("TIDEGATE_STATE", "").startswith("redis://redis:"), "replicas share the redis Service")
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")["mountPath"]

    with open(os.path.join(ROOT, "Dockerfile")) as f:
        dockerfile = f.read()
    froms = re.findall(r"^FROM ", dockerfile, re.M)
    check(len(froms) >= 2, "the Dockerfile is multi-stage")
    user = re.search(r"^USER (\S+)", dockerfile, re.M)
    check(user is not None and not user.group(1).startswith(("0", "root")), "the image runs as a non-root user")
    check(re.search(r'HEALTHCHECK[\s\S]*"tidegate", "healthcheck", "--url", "http://127.0.0.1:%d/healthz"' % port,
                    dockerfile) is not None, "HEALTHCHECK calls tidegate healthcheck on /healthz")
    check(f'"{mount}/tidegate.yaml"' in dockerfile, f"the image reads its config from {mount}/tidegate.yaml")

    services = yaml.safe_load(compose_text)["services"]
    gates = [s for n, s in services.items() if n.startswith("tidegate")]
    check(len(gates) == 1 and gates[0].get("deploy", {}).get("replicas", 1) >= 4,
          "compose: one tidegate service of four replicas or more")
    gate = gates[0] if gates else {}
    balancer = services.get("balancer", {})
    check("8787:8787" in balancer.get("ports", []) and "server tidegate:8787"
          in yaml.safe_load(compose_text)["configs"]["balancer"]["content"],
          "compose: a balancer on :8787 in front of every replica")
    check("./tidegate.yaml:/etc/tidegate/tidegate.yaml:ro" in gate.get("volumes", []),
          "compose: the replicas mount deploy/tidegate.yaml read-only")
    check(gate.get("environment", {}).get("TIDEGATE_STATE", "").endswith("redis://redis:6379/0}")
          and "redis" in services, "compose: the replicas share the one redis service")


def http(method, url, body=None, headers=None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def shared_soon(port):
    """Whether every upstream of the replica on `port` reports shared state
    within 5 s (the connection to Redis is made lazily)."""
    for _ in range(100):
        status, body = http("GET", f"http://127.0.0.1:{port}/admin/upstreams", None,
                            {"authorization": "Bearer adm-deploy"})
        if status == 200 and all(u["shared"] for u in json.loads(body)["upstreams"]):
            return True
        time.sleep(0.05)
    return False


def run_as_written(binary):
    """The container's command and config on this machine."""
    if not shutil.which("redis-server"):
        check(False, "redis-server is needed for the run (installed by .ci/run)")
        return
    tmp = tempfile.mkdtemp(prefix="tidegate-deploy-")
    procs = []
    try:
        redis_port, sim_port = free_port(), free_port()
        procs.append(subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                                       "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL))
        sim = subprocess.Popen([binary, "simulate", "--listen", f"127.0.0.1:{sim_port}", "--scenario", "healthy"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(sim)
        wait_port(redis_port, procs[0], "redis-server")
        wait_port(sim_port, sim, "simulator")
        replicas = []
        for name in ("a", "b", "c", "d"):
            port = free_port()
            os.makedirs(os.path.join(tmp, name))
            env = dict(os.environ, TIDEGATE_ADMIN_KEY="adm-deploy", TIDEGATE_CLIENT_KEY="client-deploy",
                       OPENAI_API_KEY="sk-test", ANTHROPIC_API_KEY="sk-ant-test",
                       OPENAI_BASE_URL=f"http://127.0.0.1:{sim_port}/v1",
                       ANTHROPIC_BASE_URL=f"http://127.0.0.1:{sim_port}",
                       TIDEGATE_STATE=f"redis://127.0.0.1:{redis_port}/0", RUST_LOG="warn")
            # The container's ENTRYPOINT, with the port the host has free
            # and the journal where the image's WORKDIR would be.
            cfg = os.path.join(tmp, name, "tidegate.yaml")
            with open(os.path.join(DEPLOY, "tidegate.yaml")) as f:
                text = f.read().replace("/var/lib/tidegate/", os.path.join(tmp, name) + "/")
            with open(cfg, "w") as f:
                f.write(text)
            p = subprocess.Popen([binary, "serve", "--config", cfg, "--listen", f"127.0.0.1:{port}"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(p)
            replicas.append((name, port, p))
        for name, port, p in replicas:
            wait_healthy(f"http://127.0.0.1:{port}/healthz", p, f"replica {name}")
            hc = subprocess.run([binary, "healthcheck", "--url", f"http://127.0.0.1:{port}/healthz"])
            check(hc.returncode == 0, f"replica {name}: the image's HEALTHCHECK command passes")
            status, body = http("POST", f"http://127.0.0.1:{port}/v1/chat/completions",
                                json.dumps({"model": "gpt-4o", "messages": []}).encode(),
                                {"authorization": "Bearer client-deploy", "content-type": "application/json"})
            check(status == 200, f"replica {name}: a request through the deploy config ({status})")
            check(shared_soon(port), f"replica {name}: limits shared through Redis")
        name, port, p = replicas[0]
        p.send_signal(signal.SIGTERM)
        check(p.wait(timeout=40) == 0, f"replica {name}: SIGTERM (the container's stop signal) ends it cleanly")
        hc = subprocess.run([binary, "healthcheck", "--url", f"http://127.0.0.1:{port}/healthz"],
                            stderr=subprocess.DEVNULL)
        check(hc.returncode != 0, f"replica {name}: HEALTHCHECK fails once it is gone")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    binary = os.path.abspath(sys.argv[1])
    static_checks()
    run_as_written(binary)
    print(f"deploy: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
