// Drives `kvllm serve` with the official `openai` npm package: completions and chat, streaming
// and not, n = 2, usage with cached tokens, models, and an error. Usage: node openai_client.cjs URL
'use strict';
const assert = require('node:assert/strict');
const { OpenAI, APIError } = require('openai');

async function main() {
  const client = new OpenAI({ baseURL: process.argv[2] + '/v1', apiKey: 'test-key', maxRetries: 0 });

  const models = await client.models.list();
  const model = models.data[0].id;
  assert.equal(typeof model, 'string');

  const prompt = 'It is a truth universally acknowledged, that a single man in possession';
  const c = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0, n: 2 });
  assert.equal(c.object, 'text_completion');
  assert.equal(c.choices.length, 2);
  assert.equal(c.choices[0].text, c.choices[1].text, 'greedy completions of one prompt agree');
  assert.ok(c.choices[0].text.length > 0);
  assert.ok(['length', 'stop'].includes(c.choices[0].finish_reason));
  assert.ok(c.usage.prompt_tokens > 0);
  assert.equal(typeof c.usage.prompt_tokens_details.cached_tokens, 'number');

  // The same prompt again, streamed: same text, and its whole blocks come from the cache.
  let streamed = '';
  let finish = null;
  let usage = null;
  const s = await client.completions.create({
    model, prompt, max_tokens: 8, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  for await (const chunk of s) {
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) {
      streamed += ch.text;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.equal(streamed, c.choices[0].text);
  assert.ok(finish);
  assert.ok(usage && usage.completion_tokens > 0);

  const messages = [
    { role: 'system', content: 'You are a character in a novel.' },
    { role: 'user', content: 'Where shall we walk today?' },
  ];
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 12, n: 2, seed: 7 });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices.length, 2);
  for (const ch of chat.choices) {
    assert.equal(ch.message.role, 'assistant');
    assert.equal(typeof ch.message.content, 'string');
  }

  let chatText = '';
  let roles = 0;
  let chatUsage = null;
  const cs = await client.chat.completions.create({
    model, messages, max_tokens: 12, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  for await (const chunk of cs) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) chatUsage = chunk.usage;
    for (const ch of chunk.choices) {
      if (ch.delta.role) roles++;
      if (ch.delta.content) chatText += ch.delta.content;
    }
  }
  assert.equal(roles, 1);
  assert.ok(chatText.length > 0);
  assert.ok(chatUsage.prompt_tokens_details.cached_tokens > 0, 'the shared system prompt was cached');

  await assert.rejects(
    client.completions.create({ model, prompt, max_tokens: 4, temperature: 5 }),
    (e) => e instanceof APIError && e.status === 400 && /temperature/.test(e.message));

  console.log(JSON.stringify({ ok: true, completion: c.choices[0].text, chat: chatText }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
