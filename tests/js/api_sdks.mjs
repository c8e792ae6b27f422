// SPDX-License-Identifier: BSD-2-Clause
// Drive sluice with the real SDKs of the APIs it governs besides chat
// (tests/e2e/test_api_sdks.py): the Anthropic SDK (messages.stream and
// messages.create), the Vercel AI SDK with @ai-sdk/anthropic (X-Api-Key),
// and the OpenAI SDK's Responses API.
// Usage: node api_sdks.mjs SCENARIO ORIGIN API_KEY [EXTRA_HEADERS_JSON]
//   ORIGIN is http://127.0.0.1:PORT (no path).
// Prints one JSON document: what the SDK saw, for the test to check exactly.
import Anthropic from "@anthropic-ai/sdk";
import { createAnthropic } from "@ai-sdk/anthropic";
import { generateText, streamText } from "ai";
import OpenAI from "openai";

// The AI SDK's warnings go to stdout, which is this script's answer.
globalThis.AI_SDK_LOG_WARNINGS = false;

const [scenario, origin, apiKey, extra] = process.argv.slice(2);
const headers = extra ? JSON.parse(extra) : {};

function err(e) {
  return {
    name: e?.constructor?.name ?? null,
    status: e?.status ?? e?.statusCode ?? null,
    type: e?.error?.error?.type ?? e?.type ?? null,
    code: e?.error?.error?.code ?? e?.code ?? null,
    message: e?.message ?? String(e),
    retryAfter: e?.headers?.get?.("retry-after") ?? e?.responseHeaders?.["retry-after"] ?? null,
  };
}

async function caught(f) {
  try {
    await f();
    return null;
  } catch (e) {
    return err(e);
  }
}

const messages = [{ role: "user", content: "hello" }];
const out = {};

if (scenario === "anthropic") {
  const client = new Anthropic({ baseURL: origin, apiKey, maxRetries: 0, timeout: 20000,
                                 defaultHeaders: headers });
  const stream = client.messages.stream({ model: "claude-x", max_tokens: 64, messages });
  out.events = [];
  for await (const ev of stream) {
    out.events.push(ev.type);
    if (ev.type === "message_start") out.startModel = ev.message.model;
  }
  const final = await stream.finalMessage();
  out.final = { model: final.model, text: final.content[0].text, usage: final.usage,
                stop: final.stop_reason };
  const { data: msg, response } = await client.messages
    .create({ model: "claude-x", max_tokens: 64, messages }).withResponse();
  out.created = { model: msg.model, text: msg.content[0].text, usage: msg.usage };
  out.sluiceModel = response.headers.get("x-sluice-model");
  out.unknown = await caught(() =>
    client.messages.create({ model: "nope", max_tokens: 8, messages }));
  out.badKey = await caught(() =>
    new Anthropic({ baseURL: origin, apiKey: "sk-nobody", maxRetries: 0 })
      .messages.create({ model: "claude-x", max_tokens: 8, messages }));
} else if (scenario === "anthropic-cut") {
  // The runner dies mid-stream: the SDK raises the API's error, after the
  // text that arrived.
  const client = new Anthropic({ baseURL: origin, apiKey, maxRetries: 0, timeout: 20000,
                                 defaultHeaders: headers });
  out.text = "";
  out.error = await caught(async () => {
    const stream = client.messages.stream({ model: "claude-x", max_tokens: 64, messages });
    for await (const ev of stream)
      if (ev.type === "content_block_delta") out.text += ev.delta.text;
  });
} else if (scenario === "anthropic-full") {
  const client = new Anthropic({ baseURL: origin, apiKey, maxRetries: 0, timeout: 20000 });
  out.error = await caught(() =>
    client.messages.create({ model: "claude-x", max_tokens: 8, messages }));
} else if (scenario === "ai-sdk") {
  const provider = createAnthropic({ baseURL: origin + "/v1", apiKey, headers });
  const s = streamText({ model: provider("claude-x"), prompt: "hello", maxRetries: 0,
                         maxOutputTokens: 64 });
  out.parts = [];
  for await (const t of s.textStream) out.parts.push(t);
  out.usage = await s.usage;
  out.responseModel = (await s.response).modelId;
  const g = await generateText({ model: provider("claude-x"), prompt: "hello", maxRetries: 0,
                                 maxOutputTokens: 64 });
  out.text = g.text;
  out.genUsage = g.usage;
  out.genModel = g.response.modelId;
} else if (scenario === "responses-cut") {
  const client = new OpenAI({ baseURL: origin + "/v1", apiKey, maxRetries: 0, timeout: 20000,
                              defaultHeaders: headers });
  // The SDK hands the error event to its user (it throws on none of the
  // Responses API's events); the cut after it is a network error.
  out.text = "";
  out.errors = [];
  out.error = await caught(async () => {
    const stream = await client.responses.create({ model: "gpt-x", input: "hello",
                                                   stream: true });
    for await (const ev of stream) {
      if (ev.type === "response.output_text.delta") out.text += ev.delta;
      if (ev.type === "error") out.errors.push(ev);
    }
  });
} else if (scenario === "chat-cut") {
  const client = new OpenAI({ baseURL: origin + "/v1", apiKey, maxRetries: 0, timeout: 20000,
                              defaultHeaders: headers });
  out.text = "";
  out.error = await caught(async () => {
    const stream = await client.chat.completions.create({ model: "gpt-x", messages,
                                                          stream: true });
    for await (const c of stream) out.text += c.choices[0]?.delta?.content ?? "";
  });
} else if (scenario === "responses-chain") {
  // A conversation chained by previous_response_id, streamed, turn by turn.
  const client = new OpenAI({ baseURL: origin + "/v1", apiKey, maxRetries: 0, timeout: 20000,
                              defaultHeaders: headers });
  out.turns = [];
  let prev;
  for (let i = 0; i < 6; i++) {
    const r = await caught(async () => {
      const stream = await client.responses.create({
        model: "gpt-x", input: "turn " + i, stream: true,
        ...(prev ? { previous_response_id: prev } : {}) });
      for await (const ev of stream) {
        if (ev.type === "response.created") out.turns.push({ id: ev.response.id,
                                                            model: ev.response.model });
        if (ev.type === "response.completed") prev = ev.response.id;
      }
    });
    if (r) out.turns.push({ error: r });
  }
  out.retrieved = await caught(() => client.responses.retrieve(prev));
} else {
  throw new Error("unknown scenario " + scenario);
}

process.stdout.write(JSON.stringify(out) + "\n");
