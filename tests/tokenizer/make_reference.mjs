// Reference token ids for kiln's tokenizer tests, from the reference
// implementation (@lenml/tokenizers, a fork of transformers.js's tokenizers)
// that scripts/get-tokenizers.sh fetches with the tokenizers.
//
//   node tests/tokenizer/make_reference.mjs            writes tests/tokenizer/expected/<name>.json
//   node tests/tokenizer/make_reference.mjs --bench N  prints the reference's MB/s on SOTU with tokenizer N
//
// Each expected file holds, for every text of tests/tokenizer/texts/, the ids
// of encode(text) without and with the special tokens the post-processor adds,
// and for the State of the Union corpus (scripts/get-sotu.sh; every *.txt in
// byte order of names, each encoded on its own, without special tokens) the
// number of ids and the FNV-1a 64 hash of the ids as little-endian u32s.
// Texts are read as UTF-8 the way node does: an invalid sequence becomes one
// U+FFFD per maximal subpart (the WHATWG decoder), which is what kiln does too.
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..");
const dataDir = process.env.KILN_TOKENIZERS ?? join(root, "data", "tokenizers");
const sotuDir = process.env.KILN_SOTU ?? join(root, "data", "sotu");
const NAMES = ["llama3", "qwen3", "llama2", "gpt2", "gpt4o", "mistral_nemo"];

const { TokenizerLoader } = await import(join(dataDir, "reference", "main.mjs"));

function load(name) {
  const dir = join(dataDir, name);
  return TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")),
    tokenizerConfig: JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")),
  });
}

const encode = (tok, text, special) => Array.from(tok.encode(text, { add_special_tokens: special }));

function sotuDocs() {
  return readdirSync(sotuDir)
    .filter((f) => f.endsWith(".txt"))
    .sort((a, b) => (Buffer.from(a) < Buffer.from(b) ? -1 : 1))
    .map((f) => readFileSync(join(sotuDir, f), "utf8"));
}

function fnv1a64(ids) {
  const prime = 0x100000001b3n, mask = (1n << 64n) - 1n;
  let h = 0xcbf29ce484222325n;
  for (const id of ids)
    for (let k = 0; k < 4; ++k) h = ((h ^ BigInt((id >>> (8 * k)) & 0xff)) * prime) & mask;
  return h.toString(16).padStart(16, "0");
}

if (process.argv[2] === "--bench") {
  const tok = load(process.argv[3] ?? "llama3");
  const docs = sotuDocs();
  const bytes = docs.reduce((n, d) => n + Buffer.byteLength(d), 0);
  const t0 = performance.now();
  const c0 = process.cpuUsage();
  let n = 0;
  for (const d of docs) n += encode(tok, d, false).length;
  const s = (performance.now() - t0) / 1000;
  const c = process.cpuUsage(c0);
  const cpu = (c.user + c.system) / 1e6;  // the whole process (its GC threads too)
  console.log(`reference ${process.argv[3] ?? "llama3"}: ${n} tokens, ${bytes} bytes in ${s.toFixed(2)} s: ` +
              `${(bytes / s / 1e6).toFixed(2)} MB/s wall, ${(bytes / cpu / 1e6).toFixed(2)} MB/s of CPU time`);
  process.exit(0);
}

const textDir = join(here, "texts");
const textFiles = readdirSync(textDir).sort();
const docs = sotuDocs();
for (const name of NAMES) {
  const tok = load(name);
  const out = { tokenizer: name, texts: {} };
  for (const f of textFiles) {
    const text = readFileSync(join(textDir, f), "utf8");
    out.texts[f] = { ids: encode(tok, text, false), ids_special: encode(tok, text, true) };
  }
  const t0 = performance.now();
  const all = [];
  let bytes = 0;
  for (const d of docs) {
    bytes += Buffer.byteLength(d);
    for (const id of encode(tok, d, false)) all.push(id);
  }
  const s = (performance.now() - t0) / 1000;
  out.sotu = { files: docs.length, bytes, tokens: all.length, fnv1a64: fnv1a64(all) };
  const file = join(here, "expected", `${name}.json`);
  writeFileSync(file, JSON.stringify(out) + "\n");
  console.log(`${name}: ${all.length} SOTU tokens (${(bytes / s / 1e6).toFixed(2)} MB/s) -> ${file}`);
}
