# The README's Python recipe, run for real by tests/sdk/recipes.py.
import os

import anthropic
from openai import OpenAI

TIDEGATE = os.environ.get("TIDEGATE_URL", "http://127.0.0.1:8787")

# OpenAI SDK: base_url includes /v1.
client = OpenAI(base_url=f"{TIDEGATE}/v1", api_key=os.environ.get("TIDEGATE_KEY", "unused"))
reply = client.chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": "hi"}])
print("openai:", reply.choices[0].message.content)
stream = client.chat.completions.create(model="demo-gpt", stream=True, messages=[{"role": "user", "content": "hi"}])
print("openai stream:", "".join(c.choices[0].delta.content or "" for c in stream if c.choices))
# The Responses API, JSON and stream.
print("responses:", client.responses.create(model="demo-gpt", input="hi").output_text)
events = client.responses.create(model="demo-gpt", input="hi", stream=True)
print("responses stream:", "".join(e.delta for e in events if e.type == "response.output_text.delta"))

# Anthropic SDK: base_url without /v1.
claude = anthropic.Anthropic(base_url=TIDEGATE, api_key=os.environ.get("TIDEGATE_KEY", "unused"))
message = claude.messages.create(model="demo-claude", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
print("anthropic:", message.content[0].text)
with claude.messages.stream(model="demo-claude", max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as s:
    print("anthropic stream:", "".join(s.text_stream))
