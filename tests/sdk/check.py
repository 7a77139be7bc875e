"""Real clients nobody here wrote: the official OpenAI, Anthropic and
Google (`google-genai`) Python SDKs against a running tidegate in front of
`tidegate simulate`.

Usage: python tests/sdk/check.py path/to/tidegate

Starts both processes on free loopback ports, runs each check, prints one
line per check and a closing "N passed, N failed" line; exits non-zero on
any failure.
"""

import datetime
import os
import subprocess
import sys
import tempfile
import time
import traceback

import json

import anthropic
import openai
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from procs import free_port, wait_healthy, wait_port

CLIENT_KEY = "sdk-check-client-key"


def reset_in_five_hours():
    """A session limit's reset written as "7:35am", five hours from now in
    UTC (a fixed "3:20am" is minutes away for an hour of every day)."""
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=5)
    return f"{at.hour % 12 or 12}:{at.minute:02d}{'am' if at.hour < 12 else 'pm'}"


def main():
    binary = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="tidegate-sdk-")
    sim_port, gw_port, chat_port = free_port(), free_port(), free_port()
    account = os.path.join(tmp, "vertex-sa.json")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "tests", "fixtures", "google-test-key.pem")) as f:
        key = f.read()
    with open(account, "w") as f:
        json.dump({"type": "service_account", "project_id": "proj", "private_key": key,
                   "client_email": "sdk@proj.iam.gserviceaccount.com",
                   "token_uri": f"http://127.0.0.1:{sim_port}/token"}, f)
    config = os.path.join(tmp, "tidegate.yaml")
    with open(config, "w") as f:
        f.write(f"""
listen: 127.0.0.1:{gw_port}
journal: {os.path.join(tmp, "journal.db")}
client_keys: [{{ name: sdk, key: {CLIENT_KEY} }}]
upstreams:
  - {{ name: sim-openai, protocol: openai, base_url: "http://127.0.0.1:{sim_port}/v1", api_key: up }}
  - {{ name: sim-anthropic, protocol: anthropic, base_url: "http://127.0.0.1:{sim_port}", api_key: up }}
  - {{ name: sim-bedrock, kind: bedrock, region: us-east-1, base_url: "http://127.0.0.1:{sim_port}",
       aws_access_key_id: AKIDSDK, aws_secret_access_key: sdk-secret }}
  - {{ name: sim-vertex, kind: vertex, region: us-east5, project: proj, base_url: "http://127.0.0.1:{sim_port}",
       credentials_file: "{account}" }}
  - {{ name: sim-azure, kind: azure, base_url: "http://127.0.0.1:{sim_port}", api_key: az-key, api_version: 2024-10-21 }}
  - {{ name: sim-chat-only, protocol: openai-chat, base_url: "http://127.0.0.1:{chat_port}/v1", api_key: up }}
  - {{ name: sim-gemini, protocol: gemini, base_url: "http://127.0.0.1:{sim_port}", api_key: up }}
  - {{ name: sim-limit-openai, protocol: openai, base_url: "http://127.0.0.1:{sim_port}/v1", api_key: up }}
  - {{ name: sim-limit-anthropic, protocol: anthropic, base_url: "http://127.0.0.1:{sim_port}", api_key: up }}
models:
  gpt: {{ targets: [{{ upstream: sim-openai, model: sim-gpt }}] }}
  claude: {{ targets: [{{ upstream: sim-anthropic, model: sim-claude }}] }}
  busy: {{ targets: [{{ upstream: sim-openai, model: sim-busy }}], deadline: 1s }}
  drop: {{ targets: [{{ upstream: sim-openai, model: sim-drop }}] }}
  drop-claude: {{ targets: [{{ upstream: sim-anthropic, model: sim-drop-claude }}] }}
  slow: {{ targets: [{{ upstream: sim-openai, model: sim-slow }}] }}
  slow-claude: {{ targets: [{{ upstream: sim-anthropic, model: sim-slow-claude }}] }}
  busy-once: {{ targets: [{{ upstream: sim-openai, model: sim-busy-once }}] }}
  bad: {{ targets: [{{ upstream: sim-openai, model: sim-bad }}] }}
  drop-responses: {{ targets: [{{ upstream: sim-openai, model: sim-drop-responses }}] }}
  busy-once-js: {{ targets: [{{ upstream: sim-openai, model: sim-busy-once-js }}] }}
  claude-bedrock: {{ targets: [{{ upstream: sim-anthropic, model: sim-overloaded }}, {{ upstream: sim-bedrock, model: "anthropic.sim-claude-v1:0" }}] }}
  claude-vertex: {{ targets: [{{ upstream: sim-anthropic, model: sim-overloaded-2 }}, {{ upstream: sim-vertex, model: "sim-claude@20250101" }}] }}
  gpt-azure: {{ targets: [{{ upstream: sim-openai, model: sim-down }}, {{ upstream: sim-azure, model: sim-azure-deployment }}] }}
  x-chat: {{ targets: [{{ upstream: sim-chat-only, model: glm }}] }}
  x-anthropic: {{ targets: [{{ upstream: sim-anthropic, model: sim-claude }}] }}
  claude-failover: {{ targets: [{{ upstream: sim-anthropic, model: sim-overloaded }}, {{ upstream: sim-chat-only, model: glm }}] }}
  gem: {{ targets: [{{ upstream: sim-gemini, model: sim-gemini }}] }}
  gem-busy: {{ targets: [{{ upstream: sim-gemini, model: sim-gemini-busy }}] }}
  gem-daily: {{ targets: [{{ upstream: sim-gemini, model: sim-gemini-daily }}] }}
  gem-on-claude: {{ targets: [{{ upstream: sim-anthropic, model: sim-claude }}] }}
  limit: {{ targets: [{{ upstream: sim-limit-openai, model: sim-limit }}] }}
  limit-claude: {{ targets: [{{ upstream: sim-limit-anthropic, model: sim-limit }}] }}
  busy-claude: {{ targets: [{{ upstream: sim-anthropic, model: sim-busy }}], deadline: 1s }}
defaults:
  retry: {{ base_delay: 50ms, max_delay: 100ms }}
  stream_keepalive_after: 300ms
  stream_keepalive_every: 300ms
""")
    sim_config = os.path.join(tmp, "sim.yaml")
    with open(sim_config, "w") as f:
        f.write(f"""
clouds:
  aws: {{ access_key_id: AKIDSDK, secret_access_key: sdk-secret, region: us-east-1 }}
  google: {{ credentials_file: "{account}" }}
  azure_key: az-key
""" + """
models:
  sim-overloaded: { status: 529, error_body: '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}' }
  sim-overloaded-2: { status: 529, error_body: '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}' }
  sim-down: { status: 503, error_body: '{"error":{"message":"The server is overloaded","type":"server_error"}}' }
  sim-drop: { drop_after: 3 }
  sim-drop-claude: { drop_after: 4 }
  sim-drop-responses: { drop_after: 6 }
  sim-slow: { first_chunk_delay_ms: 1500 }
  sim-slow-claude: { first_chunk_delay_ms: 1500 }
  sim-busy-once:
    script:
      - status: 429
        body: '{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}'
      - mode: error_frame
        body: '{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}'
  sim-busy-once-js:
    script:
      - status: 429
        body: '{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}'
      - mode: error_frame
        body: '{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}'
  sim-gemini-busy:
    script:
      - &minute
        status: 429
        body: '{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1s"}]}}'
      - *minute
  sim-gemini-daily:
    status: 429
    error_body: '{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"30s"}]}}'
  sim-bad:
    status: 400
    error_body: '{"error":{"message":"Invalid input: expected a string or an array","type":"invalid_request_error","param":"input","code":null}}'
  sim-limit:
    busy_for_ms: 86400000
    busy_with:
      status: 429
      body: '{"type":"error","error":{"type":"rate_limit_error","message":"You have hit your session limit, resets 3:20am"}}'
      headers: { retry-after: "18000" }
  sim-busy:
    status: 429
    error_body: '{"error":{"code":"3009","message":"model concurrency limit exceeded"}}'
""".replace("resets 3:20am", f"resets {reset_in_five_hours()}"))
    env = dict(os.environ, RUST_LOG="warn")
    procs = []
    try:
        sim = subprocess.Popen([binary, "simulate", "--listen", f"127.0.0.1:{sim_port}", "--config", sim_config], env=env)
        procs.append(sim)
        wait_port(sim_port, sim, "simulator")
        chat = subprocess.Popen([binary, "simulate", "--listen", f"127.0.0.1:{chat_port}", "--chat-only"], env=env)
        procs.append(chat)
        wait_port(chat_port, chat, "simulator (chat only)")
        gw = subprocess.Popen([binary, "serve", "--config", config], env=env)
        procs.append(gw)
        wait_healthy(f"http://127.0.0.1:{gw_port}/healthz", gw, "tidegate")
        return run_checks(f"http://127.0.0.1:{gw_port}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()


def run_checks(base):
    oa = openai.OpenAI(base_url=f"{base}/v1", api_key=CLIENT_KEY, max_retries=0, timeout=20)
    an = anthropic.Anthropic(base_url=base, api_key=CLIENT_KEY, max_retries=0, timeout=20)
    msgs = [{"role": "user", "content": "hello"}]

    def openai_text(stream, seen=None):
        """Concatenated delta text of an OpenAI stream; `seen` collects it
        as it arrives, for streams expected to raise part-way."""
        text = ""
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                if seen is not None:
                    seen.append(chunk.choices[0].delta.content)
        return text

    def openai_non_stream():
        r = oa.chat.completions.create(model="gpt", messages=msgs)
        assert r.model == "sim-gpt", r.model
        assert r.choices[0].message.content.startswith("tok0"), r

    def openai_stream():
        text = openai_text(oa.chat.completions.create(model="gpt", messages=msgs, stream=True))
        assert text == "tok0 tok1 tok2 tok3 tok4 ", repr(text)

    # Every alias, in config order: each is served on every endpoint.
    aliases = ["gpt", "claude", "busy", "drop", "drop-claude", "slow", "slow-claude", "busy-once", "bad",
               "drop-responses", "busy-once-js", "claude-bedrock", "claude-vertex", "gpt-azure", "x-chat",
               "x-anthropic", "claude-failover", "gem", "gem-busy", "gem-daily", "gem-on-claude", "limit",
               "limit-claude", "busy-claude"]

    def openai_models():
        ids = [m.id for m in oa.models.list()]
        assert ids == aliases, ids

    def openai_typed_errors():
        try:
            oa.chat.completions.create(model="nope", messages=msgs)
            raise AssertionError("no exception")
        except openai.NotFoundError as e:
            assert "tidegate" in e.message and "gpt" in e.message, e.message
        bad = openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0)
        try:
            bad.chat.completions.create(model="gpt", messages=msgs)
            raise AssertionError("no exception")
        except openai.AuthenticationError as e:
            assert "tidegate" in e.message, e.message

    def openai_comes_back_when_told_and_not_before():
        # tidegate retries inside the 1 s deadline, then answers 429 "come
        # back" (x-should-retry: true, retry-after-ms): an SDK allowed one
        # retry sends exactly one more request, no sooner than told.
        sdk, sent, answered = counted(openai.OpenAI, base_url=f"{base}/v1", max_retries=1)
        try:
            sdk.chat.completions.create(model="busy", messages=msgs)
            raise AssertionError("no exception")
        except openai.RateLimitError as e:
            assert "tidegate" in e.message and "3009" in e.message, e.message
            assert e.response.headers.get("x-should-retry") == "true"
            assert int(e.response.headers["retry-after"]) >= 1
        came_back_once_as_told(sent, answered)

    def counted(sdk_class, **kw):
        """An SDK client whose HTTP requests and answers are recorded (each
        SDK's own httpx client class: which httpx it uses is its business)."""
        sent, answered = [], []
        hooks = {"request": [lambda r: sent.append(time.time())],
                 "response": [lambda r: answered.append((time.time(), r.headers))]}
        module = openai if sdk_class is openai.OpenAI else anthropic
        http = module.DefaultHttpxClient(event_hooks=hooks)
        return sdk_class(api_key=CLIENT_KEY, timeout=20, http_client=http, **kw), sent, answered

    def sdks_stop_at_once_on_a_limit_hours_away():
        # A session limit hours away: tidegate says stop (x-should-retry:
        # false); SDKs allowed 3 retries send no second request.
        calls = [
            (openai.OpenAI, dict(base_url=f"{base}/v1"), openai.RateLimitError,
             lambda c: c.chat.completions.create(model="limit", messages=msgs)),
            (anthropic.Anthropic, dict(base_url=base), anthropic.RateLimitError,
             lambda c: c.messages.create(model="limit-claude", max_tokens=10, messages=msgs)),
        ]
        for sdk_class, kw, error, call in calls:
            sdk, sent, answered = counted(sdk_class, max_retries=3, **kw)
            started = time.time()
            try:
                call(sdk)
                raise AssertionError("no exception")
            except error as e:
                assert "session limit" in e.message and "reset" in e.message, e.message
            assert len(sent) == 1, f"{sdk_class.__name__}: {len(sent)} requests after tidegate said stop"
            assert answered[0][1].get("x-should-retry") == "false"
            assert time.time() - started < 2, "answered at once"

    def anthropic_comes_back_when_told():
        sdk, sent, answered = counted(anthropic.Anthropic, base_url=base, max_retries=1)
        try:
            sdk.messages.create(model="busy-claude", max_tokens=10, messages=msgs)
            raise AssertionError("no exception")
        except anthropic.RateLimitError as e:
            assert "tidegate" in e.message, e.message
        came_back_once_as_told(sent, answered)

    def came_back_once_as_told(sent, answered):
        assert len(sent) == 2, f"{len(sent)} requests: the SDK did not come back exactly once"
        told = int(answered[0][1]["retry-after-ms"]) / 1000
        waited = sent[1] - answered[0][0]
        assert answered[0][1].get("x-should-retry") == "true"
        assert told >= 1 and waited >= told - 0.05, f"told {told:.2f}s, came back after {waited:.2f}s"

    def openai_mid_stream_failure_raises():
        seen = []
        try:
            text = openai_text(oa.chat.completions.create(model="drop", messages=msgs, stream=True), seen)
            raise AssertionError(f"stream ended silently after {text!r}")
        except openai.APIError as e:
            assert "broke" in str(e.message), e.message
        text = "".join(seen)
        assert text == "tok0 tok1 ", repr(text)

    def openai_keepalive_comments_parse():
        text = openai_text(oa.chat.completions.create(model="slow", messages=msgs, stream=True))
        assert text == "tok0 tok1 tok2 tok3 tok4 ", repr(text)

    def responses_non_stream():
        r = oa.responses.create(model="gpt", input="hello")
        assert r.model == "sim-gpt", r.model
        assert r.status == "completed", r
        assert r.output_text == "tok0 tok1 tok2 tok3 tok4 ", repr(r.output_text)

    def responses_stream():
        deltas, kinds = "", []
        for event in oa.responses.create(model="gpt", input="hello", stream=True):
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas += event.delta
        assert deltas == "tok0 tok1 tok2 tok3 tok4 ", repr(deltas)
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds

    def responses_capacity_absorbed():
        # A 429 without Retry-After, then a 200 stream holding only
        # response.failed: the SDK, allowed no retries, sees one answer.
        r = oa.responses.create(model="busy-once", input="hello")
        assert r.output_text.startswith("tok0"), r
        with oa.responses.stream(model="busy-once", input="hello") as s:
            final = s.get_final_response()
        assert final.status == "completed" and final.output_text.startswith("tok0"), final

    def responses_typed_errors():
        try:
            oa.responses.create(model="bad", input=3)
            raise AssertionError("no exception")
        except openai.BadRequestError as e:
            assert "Invalid input" in e.message, e.message
        try:
            oa.responses.create(model="nope", input="hi")
            raise AssertionError("no exception")
        except openai.NotFoundError as e:
            assert "tidegate" in e.message, e.message

    def responses_mid_stream_failure_raises():
        text = ""
        try:
            for event in oa.responses.create(model="drop-responses", input="hello", stream=True):
                assert event.type != "response.completed", "a broken stream looked complete"
                if event.type == "response.output_text.delta":
                    text += event.delta
            raise AssertionError(f"stream ended silently after {text!r}")
        except openai.APIError as e:
            assert "broke" in str(e.message), e.message
        assert text == "tok0 tok1 ", repr(text)

    def anthropic_mid_stream_failure_raises():
        text = ""
        try:
            with an.messages.stream(model="drop-claude", max_tokens=32, messages=msgs) as s:
                for t in s.text_stream:
                    text += t
            raise AssertionError(f"stream ended silently after {text!r}")
        except anthropic.APIError as e:
            assert "broke" in str(e), e
        assert text == "tok0 ", repr(text)

    def anthropic_keepalive_comments_parse():
        with an.messages.stream(model="slow-claude", max_tokens=32, messages=msgs) as s:
            text = "".join(s.text_stream)
        assert text == "tok0 tok1 tok2 tok3 tok4 ", repr(text)

    def anthropic_non_stream():
        r = an.messages.create(model="claude", max_tokens=32, messages=msgs)
        assert r.model == "sim-claude", r.model
        assert r.content[0].text.startswith("tok0"), r

    def anthropic_stream():
        with an.messages.stream(model="claude", max_tokens=32, messages=msgs) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        assert text == "tok0 tok1 tok2 tok3 tok4 ", repr(text)
        assert final.stop_reason == "end_turn", final

    def anthropic_typed_errors():
        try:
            an.messages.create(model="nope", max_tokens=8, messages=msgs)
            raise AssertionError("no exception")
        except anthropic.NotFoundError as e:
            assert "tidegate" in e.message and "claude" in e.message, e.message
        bad = anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0)
        try:
            bad.messages.create(model="claude", max_tokens=8, messages=msgs)
            raise AssertionError("no exception")
        except anthropic.AuthenticationError as e:
            assert "tidegate" in e.message, e.message

    def anthropic_models():
        ids = [m.id for m in an.models.list()]
        assert ids == aliases, ids

    # Translation: each SDK with a tool against a target of another
    # protocol (x-chat: a chat-completions-only provider; x-anthropic: an
    # Anthropic one); the simulator calls the first tool it is offered.
    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}

    def chat_sdk_to_anthropic_target_with_a_tool():
        tools = [{"type": "function", "function": {"name": "read_file", "description": "reads", "parameters": schema}}]
        r = oa.chat.completions.create(model="x-anthropic", messages=msgs, tools=tools)
        call = r.choices[0].message.tool_calls[0]
        assert (call.function.name, json.loads(call.function.arguments)) == ("read_file", {"path": "tok0"}), r
        assert r.choices[0].finish_reason == "tool_calls" and r.usage.completion_tokens == 5, r
        stream = oa.chat.completions.create(model="x-anthropic", messages=msgs, tools=tools, stream=True,
                                            stream_options={"include_usage": True})
        text, args, name, usage = "", "", None, None
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for tc in choice.delta.tool_calls or []:
                    name = tc.function.name or name
                    args += tc.function.arguments or ""
        assert text == "tok0 tok1 tok2 tok3 tok4 " and name == "read_file", (text, name)
        assert json.loads(args) == {"path": "tok0"} and usage.completion_tokens == 5, (args, usage)

    def responses_sdk_to_other_protocols_with_a_tool():
        tools = [{"type": "function", "name": "read_file", "description": "reads", "parameters": schema}]
        for alias in ("x-chat", "x-anthropic"):
            r = oa.responses.create(model=alias, input="hello", tools=tools, store=False)
            calls = [o for o in r.output if o.type == "function_call"]
            assert r.status == "completed" and r.output_text == "tok0 tok1 tok2 tok3 tok4 ", (alias, r)
            assert [(c.name, json.loads(c.arguments)) for c in calls] == [("read_file", {"path": "tok0"})], r
            done = None
            for event in oa.responses.create(model=alias, input="hello", tools=tools, store=False, stream=True):
                if event.type == "response.completed":
                    done = event.response
            calls = [o for o in done.output if o.type == "function_call"]
            assert done.output_text == "tok0 tok1 tok2 tok3 tok4 ", (alias, done)
            assert [(c.name, json.loads(c.arguments)) for c in calls] == [("read_file", {"path": "tok0"})], done

    def anthropic_sdk_to_chat_target_with_a_tool():
        tools = [{"name": "read_file", "description": "reads", "input_schema": schema}]
        r = an.messages.create(model="x-chat", max_tokens=64, messages=msgs, tools=tools)
        use = [b for b in r.content if b.type == "tool_use"]
        assert r.stop_reason == "tool_use" and [(u.name, u.input) for u in use] == [("read_file", {"path": "tok0"})], r
        with an.messages.stream(model="x-chat", max_tokens=64, messages=msgs, tools=tools) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        use = [b for b in final.content if b.type == "tool_use"]
        assert text == "tok0 tok1 tok2 tok3 tok4 " and final.stop_reason == "tool_use", final
        assert [(u.name, u.input) for u in use] == [("read_file", {"path": "tok0"})], final

    def anthropic_sdk_fails_over_from_529_to_a_chat_target():
        r = an.messages.create(model="claude-failover", max_tokens=32, messages=msgs)
        assert r.content[0].text == "tok0 tok1 tok2 tok3 tok4 " and r.stop_reason == "end_turn", r
        with an.messages.stream(model="claude-failover", max_tokens=32, messages=msgs) as s:
            text = "".join(s.text_stream)
        assert text == "tok0 tok1 tok2 tok3 tok4 ", repr(text)

    def anthropic_fails_over_to(alias, model):
        # The first target answers 529; the same request goes to the cloud.
        r = an.messages.create(model=alias, max_tokens=32, messages=msgs)
        assert r.model == model and r.content[0].text == "tok0 tok1 tok2 tok3 tok4 ", r
        with an.messages.stream(model=alias, max_tokens=32, messages=msgs) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        assert text == "tok0 tok1 tok2 tok3 tok4 ", repr(text)
        assert final.stop_reason == "end_turn" and final.model == model, final

    def anthropic_via_bedrock():
        anthropic_fails_over_to("claude-bedrock", "anthropic.sim-claude-v1:0")

    def anthropic_via_vertex():
        anthropic_fails_over_to("claude-vertex", "sim-claude@20250101")

    def openai_via_azure():
        r = oa.chat.completions.create(model="gpt-azure", messages=msgs)
        assert r.model == "sim-azure-deployment", r.model
        text = openai_text(oa.chat.completions.create(model="gpt-azure", messages=msgs, stream=True))
        assert text == "tok0 tok1 tok2 tok3 tok4 ", repr(text)

    def async_clients_read_the_401_of_a_large_body():
        # An 8 MiB prompt with a wrong key: httpx's AsyncClient (under
        # AsyncOpenAI and AsyncAnthropic) must read the 401, not a reset.
        import asyncio
        big = [{"role": "user", "content": "x" * (8 * 1024 * 1024)}]

        async def both():
            bad_oa = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0, timeout=20)
            bad_an = anthropic.AsyncAnthropic(base_url=base, api_key="wrong", max_retries=0, timeout=20)
            for _ in range(3):
                try:
                    await bad_oa.chat.completions.create(model="gpt", messages=big)
                    raise AssertionError("no exception")
                except openai.AuthenticationError as e:
                    assert "tidegate" in e.message, e.message
                try:
                    await bad_an.messages.create(model="claude", max_tokens=8, messages=big)
                    raise AssertionError("no exception")
                except anthropic.AuthenticationError as e:
                    assert "tidegate" in e.message, e.message
            await bad_oa.close()
            await bad_an.close()

        asyncio.run(both())

    gm = genai.Client(api_key=CLIENT_KEY, http_options=genai_types.HttpOptions(base_url=base, timeout=20_000))

    def gemini_generate():
        r = gm.models.generate_content(model="gem", contents="hello")
        assert r.text == "tok0 tok1 tok2 tok3 tok4 ", r.text
        assert r.usage_metadata.prompt_token_count == 10, r.usage_metadata

    def gemini_stream():
        text = "".join(c.text or "" for c in gm.models.generate_content_stream(model="gem", contents="hello"))
        assert text == "tok0 tok1 tok2 tok3 tok4 ", text

    def gemini_capacity_absorbed():
        # Two per-minute quota refusals (RetryInfo 1s): waited out, never raised.
        t0 = time.monotonic()
        text = "".join(c.text or "" for c in gm.models.generate_content_stream(model="gem-busy", contents="hello"))
        assert text.startswith("tok0"), text
        assert time.monotonic() - t0 >= 1.9, "retryDelay honoured"

    def gemini_daily_quota_answered_at_once():
        t0 = time.monotonic()
        try:
            gm.models.generate_content(model="gem-daily", contents="hello")
            raise AssertionError("no exception")
        except genai_errors.ClientError as e:
            assert e.code == 429, e
            assert e.status == "RESOURCE_EXHAUSTED", e
            assert "quota" in (e.message or ""), e.message
        assert time.monotonic() - t0 < 3, "a daily quota is not waited for"

    def gemini_typed_errors():
        bad = genai.Client(api_key="wrong", http_options=genai_types.HttpOptions(base_url=base, timeout=20_000))
        try:
            bad.models.generate_content(model="gem", contents="hello")
            raise AssertionError("no exception")
        except genai_errors.ClientError as e:
            assert e.code == 401 and e.status == "UNAUTHENTICATED", e
        try:
            gm.models.generate_content(model="nope", contents="hello")
            raise AssertionError("no exception")
        except genai_errors.ClientError as e:
            assert e.code == 404 and "gem" in e.message, e
        names = [m.name for m in gm.models.list()]
        assert "models/gem" in names, names

    def gemini_sdk_to_claude_target_with_a_tool():
        tool = genai_types.Tool(function_declarations=[genai_types.FunctionDeclaration(
            name="read_file", description="reads",
            parameters=genai_types.Schema(type="OBJECT", properties={"path": genai_types.Schema(type="STRING")}))])
        config = genai_types.GenerateContentConfig(tools=[tool], automatic_function_calling=genai_types.AutomaticFunctionCallingConfig(disable=True))
        r = gm.models.generate_content(model="gem-on-claude", contents="read it", config=config)
        calls = r.function_calls or []
        assert calls and calls[0].name == "read_file" and calls[0].args == {"path": "tok0"}, r
        n = gm.models.count_tokens(model="gem-on-claude", contents="four score and seven years ago")
        assert n.total_tokens > 0, n

    checks = [gemini_generate, gemini_stream, gemini_capacity_absorbed, gemini_daily_quota_answered_at_once,
              gemini_typed_errors, gemini_sdk_to_claude_target_with_a_tool,
              openai_non_stream, openai_stream, openai_models, openai_typed_errors, openai_comes_back_when_told_and_not_before, sdks_stop_at_once_on_a_limit_hours_away,
              anthropic_comes_back_when_told,
              openai_mid_stream_failure_raises, openai_keepalive_comments_parse,
              responses_non_stream, responses_stream, responses_capacity_absorbed, responses_typed_errors,
              responses_mid_stream_failure_raises,
              anthropic_non_stream, anthropic_stream, anthropic_typed_errors, anthropic_models,
              anthropic_mid_stream_failure_raises, anthropic_keepalive_comments_parse,
              anthropic_via_bedrock, anthropic_via_vertex, openai_via_azure,
              async_clients_read_the_401_of_a_large_body,
              chat_sdk_to_anthropic_target_with_a_tool, responses_sdk_to_other_protocols_with_a_tool,
              anthropic_sdk_to_chat_target_with_a_tool, anthropic_sdk_fails_over_from_529_to_a_chat_target]
    passed = failed = 0
    for check in checks:
        try:
            check()
            passed += 1
            print(f"ok   {check.__name__}")
        except Exception:
            failed += 1
            print(f"FAIL {check.__name__}")
            traceback.print_exc()
    js_passed, js_failed = run_js_checks(base)
    passed, failed = passed + js_passed, failed + js_failed
    print(f"sdk: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def run_js_checks(base):
    """The OpenAI JS SDK's checks (tests/sdk/responses.mjs), run from
    target/sdk-js where `npm install` put the SDK; (passed, failed)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    js = os.path.join(root, "target", "sdk-js")
    if not os.path.isdir(os.path.join(js, "node_modules", "openai")):
        print("FAIL js checks: no target/sdk-js/node_modules/openai (npm install --prefix target/sdk-js, as .ci/run does)")
        return 0, 1
    import shutil
    shutil.copy(os.path.join(root, "tests", "sdk", "responses.mjs"), os.path.join(js, "responses.mjs"))
    out = subprocess.run(["node", os.path.join(js, "responses.mjs"), base, CLIENT_KEY],
                         capture_output=True, text=True, timeout=120)
    print(out.stdout, end="")
    if out.stderr.strip():
        print(out.stderr[-2000:])
    lines = out.stdout.splitlines()
    passed = sum(1 for l in lines if l.startswith("ok "))
    failed = sum(1 for l in lines if l.startswith("FAIL"))
    if out.returncode != 0 and failed == 0:
        failed = 1
    return passed, failed


if __name__ == "__main__":
    sys.exit(main())
