// Runs a GGUF file kiln wrote (models::save_gguf with the tokenizer's
// vocabulary, e.g. `kiln-lm pretrain --gguf out/lm.gguf`) in llama.cpp, through
// the prebuilt CPU llama.cpp of the npm package node-llama-cpp, and compares it
// with kiln: the prompt's token ids (llama.cpp's tokenizer from the GGUF
// metadata vs kiln's), and greedy decoding step by step (llama.cpp with its KV
// cache vs kiln_greedy_probe recomputing the whole sequence), with the top
// next-token probabilities of both at every step. Not run in CI (CI does not
// install node-llama-cpp). Exit status 0 when the ids and the greedy tokens agree.
//
//   npm install --prefix /work/tools/nlc node-llama-cpp@3.21.1
//   node tests/llamacpp/check.mjs --nlc /work/tools/nlc --gguf out/lm.gguf \
//        --probe build/dev/tests/kiln_greedy_probe [--model out/lm] [--prompt TEXT] [--tokens 40]
import { execFileSync } from "node:child_process";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const { values: a } = parseArgs({
  options: {
    nlc: { type: "string" },
    gguf: { type: "string" },
    probe: { type: "string" },
    model: { type: "string" },  // also probe kiln on this Hugging Face directory
    prompt: { type: "string", default: "The President of the United States" },
    tokens: { type: "string", default: "40" },
    top: { type: "string", default: "5" },
  },
});
for (const k of ["nlc", "gguf", "probe"])
  if (!a[k]) throw new Error(`--${k} is required`);
const nTokens = Number(a.tokens), nTop = Number(a.top);

const probe = (model) =>
  JSON.parse(execFileSync(a.probe, [model, a.prompt, String(nTokens), String(nTop)], { encoding: "utf8" }));
const kiln = probe(a.gguf);
const kilnHf = a.model ? probe(a.model) : null;

const { getLlama, LlamaLogLevel } = await import(
  pathToFileURL(path.join(a.nlc, "node_modules/node-llama-cpp/dist/index.js")).href);
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.warn });
const model = await llama.loadModel({ modelPath: path.resolve(a.gguf) });
const vocab = model.fileInsights?.metadata?.tokenizer?.ggml?.tokens?.length ?? 32000;
const bos = model.tokens.bos;
const promptIds = [...(bos != null ? [bos] : []), ...model.tokenize(a.prompt)];
const context = await model.createContext({ contextSize: Math.max(256, promptIds.length + nTokens) });
const seq = context.getSequence();

const sampling = { temperature: 1, topK: vocab, topP: 1, minP: 0 };
const ids = [];
const tops = [];
let input = promptIds.map((t, i) =>
  i === promptIds.length - 1 ? [t, { generateNext: { probabilities: true, options: sampling } }] : t);
for (let step = 0; step < nTokens; ++step) {
  const out = await seq.controlledEvaluate(input);
  const probs = out[out.length - 1].next.probabilities;  // Map token -> probability
  const sorted = [...probs.entries()].sort((x, y) => y[1] - x[1] || x[0] - y[0]).slice(0, nTop);
  tops.push(sorted);
  ids.push(sorted[0][0]);
  input = [[sorted[0][0], { generateNext: { probabilities: true, options: sampling } }]];
}

const same = (x, y) => x.length === y.length && x.every((v, i) => v === y[i]);
let maxProbDiff = 0, firstDiff = -1;
for (let s = 0; s < nTokens; ++s) {
  if (firstDiff < 0 && ids[s] !== kiln.ids[s]) firstDiff = s;
  if (firstDiff >= 0) break;  // after a divergence the contexts differ
  const k = new Map(kiln.top[s]);
  for (const [t, p] of tops[s]) if (k.has(t)) maxProbDiff = Math.max(maxProbDiff, Math.abs(k.get(t) - p));
}
const report = {
  prompt: a.prompt,
  llamacpp_prompt_ids: promptIds,
  kiln_prompt_ids: kiln.prompt_ids,
  prompt_ids_equal: same(promptIds, kiln.prompt_ids),
  llamacpp_ids: ids,
  kiln_ids: kiln.ids,
  greedy_equal: same(ids, kiln.ids),
  first_difference: firstDiff,
  max_top_prob_difference: maxProbDiff,
  llamacpp_text: model.detokenize(ids),
  kiln_text: kiln.text,
  llamacpp_top_step0: tops[0],
  kiln_top_step0: kiln.top[0],
};
if (kilnHf) report.kiln_hf_dir_equals_gguf = same(kilnHf.ids, kiln.ids) && same(kilnHf.prompt_ids, kiln.prompt_ids);
console.log(JSON.stringify(report, null, 1));
await model.dispose();
process.exit(report.prompt_ids_equal && report.greedy_equal && (kilnHf ? report.kiln_hf_dir_equals_gguf : true) ? 0 : 1);
