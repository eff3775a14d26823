// A LoRA adapter kiln trains, written as a GGUF adapter, loaded by llama.cpp
// (node-llama-cpp 3.21.1's prebuilt CPU binary, its `lora` context option) onto
// the base model kiln wrote as GGUF: llama.cpp's greedy ids with the adapter
// must equal kiln's (kiln-lm generate --adapter FILE.gguf), its ids without the
// adapter kiln's without it, and the adapter must change them (so it is proven
// to have an effect). The base is a small random Llama-shaped model
// (tests/models/fixtures/byte_llama: 256 byte ids, 2 layers, 4 heads, so
// llama.cpp's q/k row order applies to the adapter's B), written as an f32
// GGUF file (kiln-lm quantize --type f32); the adapter is LoRA r 8 on all seven
// projections, trained 200 steps on a text's bytes (kiln-lm finetune --out
// FILE.gguf). Prints one JSON object; exit status 0 when every check passes,
// 77 when node-llama-cpp is not installed (ctest's skip), 1 otherwise.
//
//   npm install --prefix /work/npm node-llama-cpp@3.21.1
//   node scripts/llamacpp-lora-check.mjs --nlc /work/npm --lm build/release/examples/kiln-lm
//        [--base tests/models/fixtures/byte_llama] [--data docs/design.md] [--work DIR]
//        [--prompt "The design "] [--tokens 24]
import { execFileSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const { values: a } = parseArgs({
  options: {
    nlc: { type: "string", default: "/work/npm" },
    lm: { type: "string", default: "build/release/examples/kiln-lm" },
    base: { type: "string", default: "tests/models/fixtures/byte_llama" },
    data: { type: "string", default: "docs/design.md" },
    work: { type: "string" },
    prompt: { type: "string", default: "The design " },
    tokens: { type: "string", default: "24" },
  },
});
const nlcIndex = path.join(a.nlc, "node_modules/node-llama-cpp/dist/index.js");
if (!existsSync(nlcIndex)) {
  console.log(`skipped: node-llama-cpp is not installed under ${a.nlc}`);
  process.exit(77);
}
const work = a.work ?? mkdtempSync(path.join(tmpdir(), "kiln-lora-gguf-"));
mkdirSync(work, { recursive: true });
const baseGguf = path.join(work, "base.gguf"), adapter = path.join(work, "adapter.gguf");
const nTokens = Number(a.tokens);
const promptIds = [...Buffer.from(a.prompt, "utf8")];  // a byte-level model
const lm = (...args) => execFileSync(a.lm, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });

// llama.cpp loads no model without a vocabulary: the base gets a byte-level
// BPE tokenizer.json whose id b is byte b (GPT-2's byte-to-character map, no
// merges), which kiln-lm quantize writes into the GGUF file. Only ids are
// exchanged, so it never tokenizes anything here.
function byteTokenizer() {
  const printable = [];
  for (let b = 0; b < 256; ++b)
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) printable.push(b);
  const vocab = {};
  let extra = 0;
  for (let b = 0; b < 256; ++b)
    vocab[String.fromCodePoint(printable.includes(b) ? b : 256 + extra++)] = b;
  const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true };
  return { version: "1.0", truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: byteLevel, post_processor: null, decoder: byteLevel,
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
      end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, vocab, merges: [] } };
}
const baseDir = path.join(work, "base");
mkdirSync(baseDir, { recursive: true });
for (const f of ["config.json", "generation_config.json", "model.safetensors"])
  if (existsSync(path.join(a.base, f))) copyFileSync(path.join(a.base, f), path.join(baseDir, f));
writeFileSync(path.join(baseDir, "tokenizer.json"), JSON.stringify(byteTokenizer()));
lm("quantize", baseDir, baseGguf, "--type", "f32", "--threads", "2");
const train = lm("finetune", "--model", a.base, "--data", a.data, "--bytes", "--out", adapter,
  "--lora-r", "8", "--lora-alpha", "16", "--steps", "200", "--eval-every", "100", "--lr", "2e-2",
  "--batch", "4", "--seq", "32", "--warmup", "4", "--eval-batches", "4", "--threads", "2");

const kilnIds = (...extra) => {
  // The Hugging Face directory: kiln's tokenizer reader wants a gpt2 vocabulary
  // with merges, so kiln reads the same f32 weights from there.
  const out = lm("generate", "--model", a.base, ...extra, "--prompt-ids", promptIds.join(","),
    "--max-tokens", String(nTokens), "--temperature", "0", "--ignore-eos", "--print-ids",
    "--threads", "2");
  return out.match(/new ids:([\d ]*)/)[1].trim().split(/\s+/).map(Number);
};
const kilnAdapted = kilnIds("--adapter", adapter), kilnBase = kilnIds();

const { getLlama, LlamaLogLevel } = await import(pathToFileURL(nlcIndex).href);
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.warn });
const model = await llama.loadModel({ modelPath: path.resolve(baseGguf) });
const vocab = 256;

// Greedy decoding step by step: the most probable next token (ties: the lower
// id, as kiln), and how far ahead of the second it is.
async function greedy(lora) {
  const context = await model.createContext({ contextSize: 64, threads: 2, ...(lora ? { lora } : {}) });
  const seq = context.getSequence();
  const sampling = { temperature: 1, topK: vocab, topP: 1, minP: 0 };
  const next = { generateNext: { probabilities: true, options: sampling } };
  const ids = [], margins = [];
  let input = promptIds.map((t, i) => (i === promptIds.length - 1 ? [t, next] : t));
  for (let step = 0; step < nTokens; ++step) {
    const out = await seq.controlledEvaluate(input);
    const probs = [...out[out.length - 1].next.probabilities.entries()]
      .sort((x, y) => y[1] - x[1] || x[0] - y[0]);
    ids.push(probs[0][0]);
    margins.push(probs[0][1] - (probs[1]?.[1] ?? 0));
    input = [[probs[0][0], next]];
  }
  await context.dispose();
  return { ids, minMargin: Math.min(...margins) };
}
const llamaAdapted = await greedy({ adapters: [{ filePath: path.resolve(adapter), scale: 1 }] });
const llamaBase = await greedy(null);
await model.dispose();

const same = (x, y) => x.length === y.length && x.every((v, i) => v === y[i]);
const report = {
  work,
  finetune: train.trim().split("\n").pop(),
  prompt_ids: promptIds,
  kiln_adapter_ids: kilnAdapted,
  llamacpp_adapter_ids: llamaAdapted.ids,
  adapter_ids_equal: same(kilnAdapted, llamaAdapted.ids),
  kiln_base_ids: kilnBase,
  llamacpp_base_ids: llamaBase.ids,
  base_ids_equal: same(kilnBase, llamaBase.ids),
  adapter_changes_ids: !same(kilnAdapted, kilnBase),
  llamacpp_min_top1_margin: { adapter: llamaAdapted.minMargin, base: llamaBase.minMargin },
};
console.log(JSON.stringify(report, null, 1));
const ok = report.adapter_ids_equal && report.base_ids_equal && report.adapter_changes_ids;
console.log(ok ? "llamacpp-lora-check: ok" : "llamacpp-lora-check: FAILED");
process.exit(ok ? 0 : 1);
