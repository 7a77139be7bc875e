// The official OpenAI JS SDK's responses.create against tidegate, run by
// tests/sdk/check.py (from target/sdk-js, where npm installed the SDK).
// Prints one "ok"/"FAIL" line per check; exits non-zero on any failure.
import OpenAI from "openai";
import { GoogleGenAI } from "@google/genai";

const [base, apiKey] = process.argv.slice(2);
const oa = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout: 20000 });
// Google's JS SDK (what Gemini CLI is built on), pointed at tidegate.
const gm = new GoogleGenAI({ apiKey, httpOptions: { baseUrl: base, timeout: 20000 } });
const assert = (cond, what) => {
  if (!cond) throw new Error(what);
};

// An OpenAI client whose HTTP requests and answers are recorded.
function counted(maxRetries) {
  const sent = [];
  const answered = [];
  const counting = async (url, init) => {
    sent.push(Date.now());
    const r = await fetch(url, init);
    answered.push([Date.now(), r.headers.get("retry-after-ms"), r.headers.get("x-should-retry")]);
    return r;
  };
  return [new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries, timeout: 20000, fetch: counting }), sent, answered];
}

const checks = {
  async js_openai_stops_on_a_stop_and_comes_back_as_told() {
    // A session limit hours away: no second request, though 3 are allowed.
    let [sdk, sent, answered] = counted(3);
    try {
      await sdk.responses.create({ model: "limit", input: "hello" });
      throw new Error("no exception");
    } catch (e) {
      assert(e instanceof OpenAI.RateLimitError && String(e.message).includes("session limit"), String(e));
    }
    assert(sent.length === 1 && answered[0][2] === "false", `${sent.length} requests after a stop`);
    // Capacity outlasting a 1 s deadline: exactly one more, no sooner than told.
    [sdk, sent, answered] = counted(1);
    try {
      await sdk.responses.create({ model: "busy", input: "hello" });
      throw new Error("no exception");
    } catch (e) {
      assert(e instanceof OpenAI.RateLimitError, String(e));
    }
    assert(sent.length === 2 && answered[0][2] === "true", `${sent.length} requests after a come-back`);
    const told = Number(answered[0][1]);
    const waited = sent[1] - answered[0][0];
    assert(told >= 1000 && waited >= told - 50, `told ${told} ms, came back after ${waited} ms`);
  },
  async js_gemini_generate_and_stream() {
    const r = await gm.models.generateContent({ model: "gem", contents: "hello" });
    assert(r.text === "tok0 tok1 tok2 tok3 tok4 ", JSON.stringify(r));
    let text = "";
    for await (const c of await gm.models.generateContentStream({ model: "gem", contents: "hello" })) text += c.text ?? "";
    assert(text === "tok0 tok1 tok2 tok3 tok4 ", text);
  },
  async js_gemini_capacity_absorbed_and_daily_quota_raised() {
    let text = "";
    for await (const c of await gm.models.generateContentStream({ model: "gem-busy", contents: "hello" })) {
      text += c.text ?? "";
    }
    assert(text.startsWith("tok0"), text);
    try {
      await gm.models.generateContent({ model: "gem-daily", contents: "hello" });
      throw new Error("no exception");
    } catch (e) {
      assert(e.status === 429 && String(e.message).includes("PerDay"), String(e));
    }
  },
  async js_responses_non_stream() {
    const r = await oa.responses.create({ model: "gpt", input: "hello" });
    assert(r.status === "completed" && r.output_text === "tok0 tok1 tok2 tok3 tok4 ", JSON.stringify(r));
  },
  async js_responses_stream() {
    let text = "";
    const kinds = [];
    for await (const event of await oa.responses.create({ model: "gpt", input: "hello", stream: true })) {
      kinds.push(event.type);
      if (event.type === "response.output_text.delta") text += event.delta;
    }
    assert(text === "tok0 tok1 tok2 tok3 tok4 ", text);
    assert(kinds.at(-1) === "response.completed", kinds.join());
  },
  async js_responses_capacity_absorbed() {
    const r = await oa.responses.create({ model: "busy-once-js", input: "hello" });
    assert(r.output_text.startsWith("tok0"), JSON.stringify(r));
    let text = "";
    for await (const event of await oa.responses.create({ model: "busy-once-js", input: "hello", stream: true })) {
      if (event.type === "response.output_text.delta") text += event.delta;
    }
    assert(text.startsWith("tok0"), text);
  },
  async js_responses_typed_errors() {
    try {
      await oa.responses.create({ model: "bad", input: 3 });
      throw new Error("no exception");
    } catch (e) {
      assert(e instanceof OpenAI.BadRequestError && e.message.includes("Invalid input"), String(e));
    }
  },
  async js_responses_mid_stream_failure_raises() {
    let text = "";
    try {
      for await (const event of await oa.responses.create({ model: "drop-responses", input: "hello", stream: true })) {
        assert(event.type !== "response.completed", "a broken stream looked complete");
        if (event.type === "response.output_text.delta") text += event.delta;
      }
      throw new Error(`stream ended silently after ${text}`);
    } catch (e) {
      assert(e instanceof OpenAI.APIError && String(e.message).includes("broke"), String(e));
    }
    assert(text === "tok0 tok1 ", text);
  },
};

let failed = 0;
for (const [name, check] of Object.entries(checks)) {
  try {
    await check();
    console.log(`ok   ${name}`);
  } catch (e) {
    failed += 1;
    console.log(`FAIL ${name}: ${e.stack ?? e}`);
  }
}
process.exit(failed ? 1 : 0);
