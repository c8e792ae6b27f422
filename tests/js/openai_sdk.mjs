// SPDX-License-Identifier: BSD-2-Clause
// Drive sluice with the real OpenAI Node SDK (tests/e2e/test_sdk.py).
// Usage: node openai_sdk.mjs BASE_URL API_KEY
// Prints one JSON document: what the SDK saw, for the test to check exactly.
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
// X-Stub-Model: the stub names its model in every event, as vLLM does.
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 20000,
                            defaultHeaders: { "X-Stub-Model": "1" } });
const out = {};

async function caught(f) {
  try {
    await f();
    return null;
  } catch (e) {
    return { name: e.constructor.name, status: e.status ?? null, code: e.code ?? null,
             type: e.type ?? null, message: e.message ?? null,
             retryAfter: e.headers?.get?.("retry-after") ?? null };
  }
}

const messages = [{ role: "user", content: "hello" }];

out.models = [];
for await (const m of client.models.list()) out.models.push(m);
out.model = await client.models.retrieve("gpt-4o");

const stream = await client.chat.completions.create({ model: "gpt-4o", messages, stream: true });
out.chunks = [];
for await (const chunk of stream) out.chunks.push(chunk);

const { data: full, response } = await client.chat.completions
  .create({ model: "gpt-4o", messages }).withResponse();
out.completion = full;
out.sluiceModel = response.headers.get("x-sluice-model");

out.notFound = await caught(() => client.chat.completions.create({ model: "nope", messages }));
out.notFoundRetrieve = await caught(() => client.models.retrieve("nope"));
out.noModel = await caught(() => client.chat.completions.create({ messages }));

process.stdout.write(JSON.stringify(out) + "\n");
