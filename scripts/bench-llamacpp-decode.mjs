// Decode tokens/s of a GGUF file in llama.cpp (node-llama-cpp 3.21.1's prebuilt
// CPU binary), measured as bench_generate measures kiln's: a prompt of PROMPT
// token ids (i * 7919 % vocab), then TOKENS greedy steps, timed after a
// warm-up run, on THREADS threads. The file may have no vocabulary (bench_generate
// --save writes none): token ids are passed as numbers. Not run in CI.
//
//   npm install --prefix /work/npm node-llama-cpp@3.21.1
//   node scripts/bench-llamacpp-decode.mjs --nlc /work/npm --gguf FILE [--threads 2]
//        [--prompt 32] [--tokens 64]
import path from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const { values: a } = parseArgs({
  options: {
    nlc: { type: "string" },
    gguf: { type: "string" },
    threads: { type: "string", default: "2" },
    prompt: { type: "string", default: "32" },
    tokens: { type: "string", default: "64" },
    vocab: { type: "string", default: "49152" },
  },
});
for (const k of ["nlc", "gguf"]) if (!a[k]) throw new Error(`--${k} is required`);
const nPrompt = Number(a.prompt), nTokens = Number(a.tokens), vocab = Number(a.vocab);

const { getLlama, LlamaLogLevel } = await import(
  pathToFileURL(path.join(a.nlc, "node_modules/node-llama-cpp/dist/index.js")).href);
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.warn });
const model = await llama.loadModel({ modelPath: path.resolve(a.gguf) });
const context = await model.createContext({
  contextSize: 512, threads: Number(a.threads), batchSize: 512 });
const prompt = Array.from({ length: nPrompt }, (_, i) => (i * 7919) % vocab);

const seq = context.getSequence();
async function run() {
  await seq.clearHistory();
  // seq.evaluate: the prompt in one batch, then one token per step (greedy),
  // each fed back; the first token's time ends the prompt.
  const t0 = performance.now();
  let t1 = 0, n = 0;
  for await (const token of seq.evaluate(prompt, { temperature: 0 })) {
    void token;
    if (++n === 1) t1 = performance.now();
    if (n >= nTokens) break;
  }
  const t2 = performance.now();
  return { prompt_tokens_per_s: nPrompt / ((t1 - t0) / 1e3),
           decode_tokens_per_s: (nTokens - 1) / ((t2 - t1) / 1e3) };
}
await run();  // warm-up
const r = await run();
console.log(`llamacpp gguf=${path.basename(a.gguf)} threads=${a.threads} prompt=${nPrompt} ` +
  `prompt_tokens_per_s=${r.prompt_tokens_per_s.toFixed(1)} decode_tokens=${nTokens - 1} ` +
  `decode_tokens_per_s=${r.decode_tokens_per_s.toFixed(2)}`);
await model.dispose();
