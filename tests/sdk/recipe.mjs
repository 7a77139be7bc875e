// The README's JavaScript recipe, run for real by tests/sdk/recipes.py.
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const TIDEGATE = process.env.TIDEGATE_URL ?? "http://127.0.0.1:8787";
const apiKey = process.env.TIDEGATE_KEY ?? "unused";

// OpenAI SDK: baseURL includes /v1.
const openai = new OpenAI({ baseURL: `${TIDEGATE}/v1`, apiKey });
const reply = await openai.chat.completions.create({ model: "demo-gpt", messages: [{ role: "user", content: "hi" }] });
console.log("openai:", reply.choices[0].message.content);
let text = "";
const stream = await openai.chat.completions.create({ model: "demo-gpt", stream: true, messages: [{ role: "user", content: "hi" }] });
for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
console.log("openai stream:", text);
// The Responses API, JSON and stream.
const response = await openai.responses.create({ model: "demo-gpt", input: "hi" });
console.log("responses:", response.output_text);
let deltas = "";
for await (const event of await openai.responses.create({ model: "demo-gpt", input: "hi", stream: true })) {
  if (event.type === "response.output_text.delta") deltas += event.delta;
}
console.log("responses stream:", deltas);

// Anthropic SDK: baseURL without /v1.
const claude = new Anthropic({ baseURL: TIDEGATE, apiKey });
const message = await claude.messages.create({ model: "demo-claude", max_tokens: 64, messages: [{ role: "user", content: "hi" }] });
console.log("anthropic:", message.content[0].text);
const s = claude.messages.stream({ model: "demo-claude", max_tokens: 64, messages: [{ role: "user", content: "hi" }] });
let streamed = "";
s.on("text", (t) => (streamed += t));
await s.finalMessage();
console.log("anthropic stream:", streamed);
