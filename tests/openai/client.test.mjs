// The official OpenAI client for Node (npm `openai`, v4) against `phasekv serve` serving the
// bundled models/kv-chunked (word-level) and models/code-chunked (sentencepiece): every call
// checks values (tokens, logprobs, usage), and every streamed answer must equal the whole answer
// it streams, byte for byte. Run by run.sh (ctest OpenAIClient): client.test.mjs URL SP_URL.
//
// The prompt is a kv-task sequence whose answer the model knows: records `k5 v9` and `k7 v2`
// among fillers, then the query `<q> k5`; the greedy answer is v9.
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.argv[2];
const client = new OpenAI({ baseURL, apiKey: 'not-needed', maxRetries: 0 });
const spURL = process.argv[3];
const sp = new OpenAI({ baseURL: spURL, apiKey: 'not-needed', maxRetries: 0 });

const words = 'f3 k5 v9 f1 f2 k7 v2 f0 f4 f5 f6 <q> k5';
// The same prompt as ids (tokenizer.json): <bos> 1, <q> 2, k0.. 5.., v0.. 37.., f0.. 69...
const ids = [1, 72, 10, 46, 70, 71, 12, 39, 69, 73, 74, 75, 2, 10];
const V9 = 46;

let passed = 0;
async function check(name, fn) {
  await fn();
  passed += 1;
  console.log(`ok ${passed} - ${name}`);
}

// Everything a stream sent, concatenated.
async function collect(stream, pick) {
  const out = { text: '', logprobs: [], usage: null, finish: [], chunks: 0, first: null };
  for await (const chunk of stream) {
    out.chunks += 1;
    if (chunk.usage) out.usage = chunk.usage;
    for (const c of chunk.choices) {
      out.first ??= c;
      pick(c, out);
      if (c.finish_reason) out.finish.push(c.finish_reason);
    }
  }
  return out;
}

let model;
await check('models.list names the served model and publishes its chat template', async () => {
  const models = [];
  for await (const m of client.models.list()) models.push(m);
  assert.equal(models.length, 1);
  model = models[0].id;
  assert.match(model, /^kv-chunked@[0-9a-f]{12}$/);
  assert.equal(models[0].owned_by, 'phasekv');
  assert.equal(models[0].max_model_len, 512);
  assert.match(models[0].phasekv.chat_template, /bos_token/);
});

let byText, byIds;
await check('completions with a text prompt answer v9 with its logprobs and usage', async () => {
  byText = await client.completions.create({
    model, prompt: words, max_tokens: 3, temperature: 0, logprobs: 2,
  });
  const c = byText.choices[0];
  assert.equal(c.text.split(' ')[1], 'v9');
  assert.equal(c.logprobs.tokens.length, 3);
  assert.equal(c.logprobs.tokens[0], 'v9');
  assert.ok(c.logprobs.token_logprobs[0] > Math.log(0.99), c.logprobs.token_logprobs[0]);
  // Greedy: the chosen token is the best of its top_logprobs.
  const top = c.logprobs.top_logprobs[0];
  assert.equal(Math.max(...Object.values(top)), top.v9);
  // The server prepends <bos> to text, so the prompt is the 14 ids.
  assert.deepEqual(byText.usage, { prompt_tokens: 14, completion_tokens: 3, total_tokens: 17 });
});

await check('completions with token ids equal the text prompt, token_ids returned', async () => {
  byIds = await client.completions.create({
    model, prompt: ids, max_tokens: 3, temperature: 0, logprobs: 2, return_token_ids: true,
  });
  const c = byIds.choices[0];
  assert.equal(c.text, byText.choices[0].text);
  assert.deepEqual(c.logprobs, byText.choices[0].logprobs);
  assert.equal(c.token_ids[0], V9);
  assert.deepEqual(c.prompt_token_ids, ids);
  assert.deepEqual(byIds.usage, byText.usage);
});

await check('seeded sampling is reproducible', async () => {
  const ask = () => client.completions.create({
    model, prompt: ids, max_tokens: 8, temperature: 1.5, seed: 7, return_token_ids: true,
  });
  const [a, b] = [await ask(), await ask()];
  assert.equal(a.choices[0].token_ids.length, 8);
  assert.deepEqual(a.choices[0].token_ids, b.choices[0].token_ids);
});

await check('a streamed completion equals the whole one: text, logprobs, usage', async () => {
  const stream = await client.completions.create({
    model, prompt: ids, max_tokens: 3, temperature: 0, logprobs: 2,
    stream: true, stream_options: { include_usage: true },
  });
  const got = await collect(stream, (c, out) => {
    out.text += c.text;
    out.logprobs.push(...c.logprobs.token_logprobs);
  });
  const want = byIds.choices[0];
  assert.equal(got.chunks, 4); // one per token, then the usage chunk
  assert.equal(got.text, want.text);
  assert.deepEqual(got.logprobs, want.logprobs.token_logprobs);
  assert.deepEqual(got.finish, ['length']);
  assert.deepEqual(got.usage, byIds.usage);
});

let chat;
const messages = [
  { role: 'system', content: 'f3 k5 v9' },
  { role: 'user', content: 'f1 f2 k7 v2 f0 f4 f5 f6 <q> k5' },
];
await check('chat.completions renders the messages into the same tokens and answers v9', async () => {
  chat = await client.chat.completions.create({
    model, messages, max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  const c = chat.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(c.message.content.split(' ')[0], 'v9');
  assert.equal(c.message.content, byIds.choices[0].text.trimStart());
  const entries = c.logprobs.content;
  assert.equal(entries.length, 3);
  entries.forEach((e, t) => {
    assert.equal(e.token, byIds.choices[0].logprobs.tokens[t]);
    assert.equal(e.logprob, byIds.choices[0].logprobs.token_logprobs[t]);
    assert.equal(e.top_logprobs.length, 2);
    assert.equal(e.top_logprobs[0].token, e.token);
  });
  assert.deepEqual(chat.usage, { prompt_tokens: 14, completion_tokens: 3, total_tokens: 17 });
  // /tokenize with messages (vLLM's route, not in the client) counts the same tokens.
  const res = await fetch(baseURL.replace(/\/v1$/, '') + '/tokenize', {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages }),
  });
  assert.deepEqual((await res.json()).tokens, ids);
});

await check('a streamed chat equals the whole one: content, logprobs, usage', async () => {
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 2,
    stream: true, stream_options: { include_usage: true },
  });
  const got = await collect(stream, (c, out) => {
    out.text += c.delta.content ?? '';
    if (c.logprobs) out.logprobs.push(...c.logprobs.content);
  });
  assert.equal(got.first.delta.role, 'assistant');
  assert.equal(got.text, chat.choices[0].message.content);
  assert.deepEqual(got.logprobs, chat.choices[0].logprobs.content);
  assert.deepEqual(got.finish, ['length']);
  assert.deepEqual(got.usage, chat.usage);
});

await check('bad requests are 4xx errors that name the field', async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages: [{ role: 'user', content: 'k5 hello' }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'messages' &&
      /hello/.test(e.message));
  await assert.rejects(
    client.completions.create({ model, prompt: ids, logprobs: 50 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'logprobs' && /0\.\.20/.test(e.message));
  await assert.rejects(
    client.completions.create({ model: 'no-such-model', prompt: ids }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.param === 'model');
});

await check('text that is not what it must be: invalid UTF-8, an empty prompt, a second <bos>',
  async () => {
    // The client always sends UTF-8; a raw body with a stray byte in a stop string.
    const raw = Buffer.concat([Buffer.from('{"prompt": "k5", "stop": ["v9", "'),
      Buffer.from([0xc3]), Buffer.from('"]}')]);
    const res = await fetch(baseURL + '/completions', {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: raw,
    });
    assert.equal(res.status, 400);
    const e = (await res.json()).error;
    assert.equal(e.param, 'stop');
    assert.match(e.message, /^stop\[1\] is not valid UTF-8/);
    await assert.rejects(client.completions.create({ model, prompt: '' }),
      (err) => err instanceof OpenAI.BadRequestError && err.param === 'prompt' &&
        /empty string/.test(err.message));
    await assert.rejects(
      client.chat.completions.create({ model, messages: [{ role: 'user', content: null }] }),
      (err) => err instanceof OpenAI.BadRequestError && err.param === 'messages' &&
        /messages\[0\]\.content is null/.test(err.message));
    // A prompt that starts with <bos> is not given a second one.
    const withBos = await client.completions.create({
      model, prompt: '<bos> ' + words, max_tokens: 3, temperature: 0,
    });
    assert.deepEqual(withBos.usage, byText.usage);
    assert.equal(withBos.choices[0].text, byText.choices[0].text);
  });

let spModel;
await check('sentencepiece: streamed completions equal the whole text, byte for byte', async () => {
  for await (const m of sp.models.list()) spModel = m.id;
  assert.match(spModel, /^code-chunked@/);
  const prompt = 'import sys\n\nif len(sys.argv) > 1:\n    name = sys.argv[1]\nelse:\n    name =';
  for (const sampling of [{ temperature: 0 }, { temperature: 1, seed: 5 }]) {
    const body = { model: spModel, prompt, max_tokens: 24, ...sampling };
    const whole = await sp.completions.create(body);
    const got = await collect(await sp.completions.create({ ...body, stream: true }),
      (c, out) => { out.text += c.text; });
    assert.equal(whole.usage.completion_tokens, 24);
    assert.equal(got.text, whole.choices[0].text, JSON.stringify(sampling));
    assert.deepEqual(got.finish, ['length']);
    console.log(`# ${JSON.stringify(sampling)}: ${JSON.stringify(whole.choices[0].text)}`);
  }
});

await check('sentencepiece: a streamed chat equals the whole content, byte for byte', async () => {
  const messages = [{ role: 'user', content: 'def main():\n    for i in range(' }];
  for (const sampling of [{ temperature: 0 }, { temperature: 1, seed: 5 }]) {
    const body = { model: spModel, messages, max_tokens: 24, ...sampling };
    const whole = await sp.chat.completions.create(body);
    const got = await collect(await sp.chat.completions.create({ ...body, stream: true }),
      (c, out) => { out.text += c.delta.content ?? ''; });
    assert.equal(got.first.delta.role, 'assistant');
    assert.equal(got.text, whole.choices[0].message.content, JSON.stringify(sampling));
    assert.deepEqual(got.finish, ['length']);
  }
});

await check('leaving a stream early aborts it; the server answers the next request', async () => {
  const stream = await client.completions.create({
    model, prompt: ids, max_tokens: 400, temperature: 0, stream: true,
  });
  for await (const chunk of stream) {
    assert.equal(chunk.choices[0].text, ' v9');
    break; // the client aborts the connection; run.sh checks the server's log
  }
  const after = await client.completions.create({ model, prompt: ids, max_tokens: 1, temperature: 0 });
  assert.equal(after.choices[0].text, ' v9');
});

console.log(`all ${passed} checks passed`);
