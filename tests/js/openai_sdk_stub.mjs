// SPDX-License-Identifier: BSD-2-Clause
// The real OpenAI Node SDK straight against sluice-stub's /v1/responses and
// /v1/embeddings (tests/e2e/test_stub_runner.py): the stub's events and
// objects must parse as the SDK's users get them.
// Usage: node openai_sdk_stub.mjs BASE_URL
// Prints one JSON document: what the SDK saw, for the test to check exactly.
import OpenAI from "openai";

const [baseURL] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "x", maxRetries: 0, timeout: 20000,
                            defaultHeaders: { "X-Stub-Events": "3", "X-Stub-Interval-Ms": "0" } });
const out = {};

async function caught(f) {
  try {
    await f();
    return null;
  } catch (e) {
    return { name: e.constructor.name, status: e.status ?? null, message: e.message ?? null };
  }
}

const stream = await client.responses.create({ model: "m1", input: "hello", stream: true });
out.events = [];
let first;
for await (const ev of stream) {
  out.events.push([ev.type, ev.sequence_number]);
  if (ev.type === "response.completed") first = ev.response;
}
out.first = { id: first.id, usage: first.usage, text: first.output[0].content[0].text };

const second = await client.responses.create({ model: "m1", input: "next",
                                               previous_response_id: first.id });
out.second = { id: second.id, previous: second.previous_response_id,
               outputText: second.output_text };
const got = await client.responses.retrieve(second.id);
out.retrieved = got.id === second.id && got.output_text === second.output_text;
out.items = [];
for await (const it of client.responses.inputItems.list(second.id)) out.items.push(it);
out.missing = await caught(() => client.responses.create({ model: "m1", input: "x",
                                                           previous_response_id: "resp_nope" }));
await client.responses.delete(second.id);
out.afterDelete = await caught(() => client.responses.retrieve(second.id));

// The SDK asks for base64 by default and decodes it to floats.
const emb = await client.embeddings.create({ model: "e", input: ["ab", "cde"] });
out.embeddings = emb.data.map((d) => Array.from(d.embedding));

console.log(JSON.stringify(out));
