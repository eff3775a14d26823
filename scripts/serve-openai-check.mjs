// kiln-lm serve tested with OpenAI's official client (npm `openai`), by hand:
// not in CI (it needs npm). Against a running server:
//
//   npm install --prefix /work/npm openai          # anywhere outside the repo
//   kiln-lm serve --model DIR --port 8080 --parallel 4 --ctx 2048 &
//   node scripts/serve-openai-check.mjs --url http://127.0.0.1:8080/v1 --model DIR \
//        --lm build/release/examples/kiln-lm --npm /work/npm --ctx 2048
//
// Checks: models.list; a greedy chat reply, whole and streamed, equals
// `kiln-lm generate --no-echo` on the same rendered prompt (kiln-lm template,
// then kiln-lm tokenize --no-special: the ids the server runs); 4 clients at
// once (sampled, a seed each) get what generate gives each alone; /v1/completions; every bad request is an
// APIError with a 4xx status (malformed JSON, wrong types, n > 1, a prompt
// longer than the context, a template error) and the server answers after.
// Exit status 0 when every check passes.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((a, v, i, all) => (i % 2 ? a : [...a, [v.replace(/^--/, ''), all[i + 1]]]), []));
const url = args.url ?? 'http://127.0.0.1:8080/v1';
const lm = args.lm ?? 'build/release/examples/kiln-lm';
const modelDir = args.model;
const ctx = Number(args.ctx ?? 2048);  // the server's --ctx (the model's positions for generate too)
if (!modelDir) throw new Error('give --model DIR (the directory the server runs)');
const require = createRequire(join(args.npm ?? '/work/npm', 'node_modules', 'x.js'));
const OpenAI = require('openai');
const client = new OpenAI({ baseURL: url, apiKey: 'none' });

let failures = 0;
const check = (ok, what) => {
  if (!ok) { failures++; console.error('FAIL:', what); } else console.log('ok:', what);
};

const tmp = mkdtempSync(join(tmpdir(), 'kiln-serve-'));
// What kiln-lm generate answers, greedy, to the conversation `messages`.
// Greedy, or sampled at temperature 1 with `seed`.
function generateReply(messages, maxTokens, seed) {
  writeFileSync(join(tmp, 'req.json'), JSON.stringify({ messages }));
  const prompt = execFileSync(lm, ['template', '--tokenizer', modelDir, '--messages', join(tmp, 'req.json'),
    '--add-generation-prompt']);
  writeFileSync(join(tmp, 'prompt.txt'), prompt);
  const ids = execFileSync(lm, ['tokenize', '--tokenizer', modelDir, '--text', join(tmp, 'prompt.txt'),
    '--ids', '--no-special'], { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim().split(/\s+/).join(',');
  const sampling = seed === undefined ? ['--temperature', '0']
    : ['--temperature', '1', '--top-k', '0', '--top-p', '1', '--seed', String(seed)];
  const out = execFileSync(lm, ['generate', '--model', modelDir, '--prompt-ids', ids, ...sampling,
    '--max-tokens', String(maxTokens), '--no-echo', '--threads', '1', '--ctx', String(ctx)], { stdio: ['ignore', 'pipe', 'ignore'] });
  return out.toString().replace(/\n$/, '');
}

async function chat(content, maxTokens, stream, seed) {
  const req = { model: 'kiln', messages: [{ role: 'user', content }], max_tokens: maxTokens, temperature: 0 };
  if (seed !== undefined) Object.assign(req, { temperature: 1, top_p: 1, seed });
  if (!stream) {
    const r = await client.chat.completions.create(req);
    return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason, usage: r.usage };
  }
  const s = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null;
  for await (const chunk of s) {
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  return { text, finish, usage };
}

async function expectError(what, f) {
  try {
    await f();
    check(false, `${what}: no error`);
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status >= 400 && e.status < 500,
      `${what}: ${e.status} ${e.error?.type ?? ''} ${e.message}`);
  }
}

const models = await client.models.list();
check(models.data.length === 1 && models.data[0].object === 'model', `models.list: ${models.data[0]?.id}`);

const want = generateReply([{ role: 'user', content: 'Hello there' }], 12);
const whole = await chat('Hello there', 12, false);
check(whole.text === want, `greedy chat equals kiln-lm generate: ${JSON.stringify(whole.text)} vs ${JSON.stringify(want)}`);
const streamed = await chat('Hello there', 12, true);
check(streamed.text === want && streamed.finish === whole.finish, `streamed chat equals it: ${JSON.stringify(streamed.text)}`);
check(streamed.usage?.completion_tokens === whole.usage.completion_tokens, 'stream usage');

const users = ['The cat sat', 'A second question here', 'Tell me a story', 'Why'];
// Sampled with a seed each: distinct replies, so a mix-up would show.
const alone = users.map((u, i) => generateReply([{ role: 'user', content: u }], 16, 100 + i));
const together = await Promise.all(users.map((u, i) => chat(u, 16, i % 2 === 1, 100 + i)));
users.forEach((u, i) => check(together[i].text === alone[i], `4 clients at once, client ${i}: ${JSON.stringify(together[i].text)}`));

const comp = await client.completions.create({ model: 'kiln', prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
check(typeof comp.choices[0].text === 'string' && comp.usage.completion_tokens >= 1, `completions: ${JSON.stringify(comp.choices[0].text)}`);

const badJson = await fetch(`${url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{oops' });
const badBody = await badJson.json();
check(badJson.status === 400 && badBody.error?.type === 'invalid_request_error', `malformed JSON: ${badJson.status} ${badBody.error?.message}`);
await expectError('max_tokens of the wrong type', () => client.chat.completions.create({ model: 'kiln', messages: [{ role: 'user', content: 'x' }], max_tokens: 'many' }));
await expectError('temperature of the wrong type', () => client.chat.completions.create({ model: 'kiln', messages: [{ role: 'user', content: 'x' }], temperature: 'hot' }));
await expectError('messages of the wrong type', () => client.chat.completions.create({ model: 'kiln', messages: 'hello' }));
await expectError('n = 2', () => client.chat.completions.create({ model: 'kiln', messages: [{ role: 'user', content: 'x' }], n: 2 }));
await expectError('a prompt longer than the context', () => client.chat.completions.create({ model: 'kiln', messages: [{ role: 'user', content: 'word '.repeat(20000) }] }));
await expectError('a template error (a system turn, if the template refuses one)', () => client.chat.completions.create({ model: 'kiln', messages: [{ role: 'system', content: 'x' }] }));

const after = await chat('Hello there', 12, false);
check(after.text === want, 'the server answers after the bad requests');
console.log(failures ? `${failures} checks failed` : 'all checks passed');
process.exit(failures ? 1 : 0);
