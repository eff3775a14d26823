// kiln-lm quantize's recipes in llama.cpp: two small random models
// (kiln_recipe_model: rows of 256, and SmolLM2's 576-wide rows that take the
// fallbacks) are quantized by `kiln-lm quantize --type R` with every recipe;
// `kiln-lm generate --temperature 0` decodes greedily from fixed prompt ids,
// and llama.cpp (node-llama-cpp 3.21.1's prebuilt CPU build) loads the same
// file and reads the same sequence (prompt, then kiln's ids one at a time),
// taking its own most likely next token at every step: it must be kiln's.
// Random models have near ties, where two correct programs may pick either
// token (llama.cpp keeps its KV cache in f16 and rounds x to 8-bit blocks in
// prefill too, where kiln multiplies dequantized tiles in f32): a step where
// llama.cpp's top token is another, but kiln's token's logit is below it by
// less than TIE (5%) of the spread (standard deviation) of llama.cpp's logits
// there, is counted as a tie and reported, not a difference. Following kiln's
// ids keeps one tie from making every later step differ. Exit status 0 when no
// step of any file differs.
// With --recipes none and --models (e.g. kiln_arch_model's llama,qwen2,qwen3,
// phi3,gpt2) the files are compared as the model tool wrote them (f32), not
// quantized: llama.cpp runs every architecture kiln writes as kiln does.
//
//   node tests/llamacpp/recipes_check.mjs --nlc /work/npm --kiln-lm build/release/examples/kiln-lm \
//        --model-tool build/release/tests/kiln_recipe_model --work /tmp/recipes [--tokens 16]
// (ctest runs it as llamacpp_quant_recipes when configured with
// -DKILN_NODE_LLAMA_CPP=<the npm prefix of node-llama-cpp>.)
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const { values: a } = parseArgs({
  options: {
    nlc: { type: "string" },
    "kiln-lm": { type: "string" },
    "model-tool": { type: "string" },
    work: { type: "string" },
    tokens: { type: "string", default: "16" },
    recipes: { type: "string" },  // comma-separated; default: every recipe; none: unquantized
    models: { type: "string", default: "k256,w576" },  // the model tool's files, comma-separated
  },
});
for (const k of ["nlc", "kiln-lm", "model-tool", "work"])
  if (!a[k]) throw new Error(`--${k} is required`);
const nTokens = Number(a.tokens);
// models::quant_recipe_names()
const recipes = (a.recipes ??
  "q2_k,q3_k_m,q4_0,q4_1,q4_k_s,q4_k_m,q5_0,q5_1,q5_k_s,q5_k_m,q6_k,q8_0").split(",");
const prompt = [1, 300, 17, 42, 99, 260, 5, 77];

fs.mkdirSync(a.work, { recursive: true });
execFileSync(a["model-tool"], [a.work], { stdio: "inherit" });

const { getLlama, LlamaLogLevel } = await import(
  pathToFileURL(path.join(a.nlc, "node_modules/node-llama-cpp/dist/index.js")).href);
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });

const TIE = 0.05;

// llama.cpp's most likely next token at every step of prompt + `forced` (the
// ids kiln generated), with the probabilities of each step.
async function llamacppGreedy(file, forced) {
  const model = await llama.loadModel({ modelPath: path.resolve(file) });
  const vocab = model.fileInsights?.metadata?.tokenizer?.ggml?.tokens?.length ?? 320;
  const context = await model.createContext({ contextSize: 256, threads: 2 });
  const seq = context.getSequence();
  const sampling = { temperature: 1, topK: vocab, topP: 1, minP: 0 };
  const ids = [], probs = [];
  let input = prompt.map((t, i) =>
    i === prompt.length - 1 ? [t, { generateNext: { probabilities: true, options: sampling } }] : t);
  for (let step = 0; step < forced.length; ++step) {
    const out = await seq.controlledEvaluate(input);
    const p = out[out.length - 1].next.probabilities;  // Map token -> probability
    const best = [...p.entries()].sort((x, y) => y[1] - x[1] || x[0] - y[0])[0][0];
    ids.push(best);
    probs.push(p);
    input = [[forced[step], { generateNext: { probabilities: true, options: sampling } }]];
  }
  await context.dispose();
  await model.dispose();
  return { ids, probs };
}

function kilnGreedy(file) {
  const out = execFileSync(a["kiln-lm"], ["generate", "--model", file, "--prompt-ids",
    prompt.join(","), "--print-ids", "--temperature", "0", "--repeat-penalty", "1",
    "--max-tokens", String(nTokens), "--ignore-eos", "--threads", "2"], { encoding: "utf8" });
  const m = out.match(/new ids: ([0-9 ]+)/);
  if (!m) throw new Error(`no "new ids:" in kiln-lm generate's output:\n${out}`);
  return m[1].trim().split(/\s+/).map(Number);
}

const results = [];
for (const base of a.models.split(",")) {
  for (const r of recipes) {
    const plain = r === "none";
    const file = path.join(a.work, plain ? `${base}.gguf` : `${base}-${r}.gguf`);
    const summary = plain ? "f32" : execFileSync(a["kiln-lm"], ["quantize",
      path.join(a.work, `${base}.gguf`), file, "--type", r, "--threads", "2"],
      { encoding: "utf8" }).trim();
    const kiln = kilnGreedy(file);
    const lc = await llamacppGreedy(file, kiln);
    const ties = [], differ = [];
    kiln.forEach((t, i) => {
      if (t === lc.ids[i]) return;
      const p = lc.probs[i], pk = p.get(t) ?? 0, pl = p.get(lc.ids[i]);
      const logits = [...p.values()].map(Math.log);  // up to a constant
      const mean = logits.reduce((s, x) => s + x, 0) / logits.length;
      const spread = Math.sqrt(logits.reduce((s, x) => s + (x - mean) ** 2, 0) / logits.length);
      const gap = (Math.log(pl) - Math.log(pk)) / spread;
      (gap < TIE ? ties : differ).push({ step: i, kiln: t, llamacpp: lc.ids[i],
        llamacpp_p_of_its_token: pl, llamacpp_p_of_kilns_token: pk, gap_over_spread: gap });
    });
    const res = { model: base, recipe: r, equal: differ.length === 0 && kiln.length === nTokens,
                  types: summary.replace(/^recipe [^:]+: /, "").replace(/;.*$/, ""),
                  kiln_ids: kiln.join(" "), same_steps: kiln.length - ties.length - differ.length };
    if (ties.length) res.ties = ties;
    if (differ.length) res.differ = differ;
    console.log(JSON.stringify(res));
    results.push(res);
  }
}
const bad = results.filter((r) => !r.equal);
const steps = results.reduce((n, r) => n + r.same_steps, 0);
const ties = results.reduce((n, r) => n + (r.ties?.length ?? 0), 0);
console.log(`recipes_check: ${results.length - bad.length}/${results.length} files: ` +
  `llama.cpp's greedy ids equal kiln's (${steps} steps the same, ${ties} near ties)` +
  (bad.length ? `; differ: ${bad.map((r) => `${r.model}-${r.recipe}`).join(", ")}` : ""));
process.exit(bad.length ? 1 : 0);
