#!/usr/bin/python3
"""Writes the LoRA fixtures of tests/models: adapter directories in PEFT's file
layout for the llama3_gqa and gpt2 base fixtures, and what a reference computes
with them.

The layout follows PEFT's documented checkpoint format (its developer guide,
"PEFT checkpoint format"): adapter_model.safetensors with tensors named
"base_model.model.<module path>.lora_A.weight" ([r, in]) and ".lora_B.weight"
([out, r]), the module path as the transformers class names it (GPT-2's
GPT2LMHeadModel: "transformer.h.0.attn.c_attn"), and adapter_config.json. The
LoRA reference is written here from the paper (Hu et al. 2021): a target layer
computes base(x) + (alpha / r) * (x A^T) B^T, alpha / sqrt(r) with rsLoRA; for
GPT-2's Conv1D (weight [in, out]) A and B keep the same shapes. The base models
are make_fixtures.py's references, read from the fixtures it wrote. Values are
float64; the training step is torch.optim.AdamW on the adapter tensors.

    /usr/bin/python3 tests/models/make_lora_fixtures.py   # Debian python3-torch

It also writes byte_llama, a random Llama over byte ids for kiln-lm
finetune's test. Each adapter directory holds adapter_config.json, adapter_model.safetensors and
expected.safetensors: input_ids, logits; with a training step also labels,
loss, grad.<tensor name> for every adapter tensor and step.<tensor name>, the
tensor after one AdamW step (lr 1e-2, betas 0.9/0.999, eps 1e-8, weight decay
0.01) on the mean cross-entropy.
"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.dont_write_bytecode = True  # nothing written next to the sources
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

torch.set_default_dtype(torch.float64)
OUT = mf.OUT
PREFIX = "base_model.model."
ADAMW = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def read_safetensors(path):
    """name -> float64 tensor, for the F32 / F16 / BF16 / I32 tensors of a file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        dt = info["dtype"]
        if dt == "F32":
            v = torch.from_numpy(np.frombuffer(raw, "<f4").astype(np.float64))
        elif dt == "I32":
            v = torch.from_numpy(np.frombuffer(raw, "<i4").astype(np.int64))
        elif dt == "BF16":
            bits = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
            v = torch.from_numpy(bits.view(np.float32).astype(np.float64))
        else:
            raise ValueError(dt)
        out[name] = v.reshape(info["shape"])
    return out


def base_params(name):
    d = os.path.join(OUT, name)
    files = [f for f in sorted(os.listdir(d)) if f.startswith("model") and f.endswith(".safetensors")]
    p = {}
    for f in files:
        p.update(read_safetensors(os.path.join(d, f)))
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    return cfg, p


# PEFT's adapter_config.json for LoRA, every key as PEFT writes it.
def full_config(base, r, alpha, targets, dropout=0.0, fan_in_fan_out=False, rslora=False):
    return {
        "alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": base,
        "bias": "none", "corda_config": None, "eva_config": None, "exclude_modules": None,
        "fan_in_fan_out": fan_in_fan_out, "inference_mode": True, "init_lora_weights": True,
        "layer_replication": None, "layers_pattern": None, "layers_to_transform": None,
        "loftq_config": {}, "lora_alpha": alpha, "lora_bias": False, "lora_dropout": dropout,
        "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None,
        "peft_type": "LORA", "r": r, "rank_pattern": {}, "revision": None,
        "target_modules": targets, "task_type": "CAUSAL_LM", "trainable_token_indices": None,
        "use_dora": False, "use_rslora": rslora,
    }


def matches(targets, key):
    """PEFT's rule: a regex string must match the whole key; a list entry must
    equal the key or be its last dotted parts."""
    import re
    if isinstance(targets, str):
        return re.fullmatch(targets, key) is not None
    return any(key == t or key.endswith("." + t) for t in targets)


def make_adapter(name, cfg_json, layers, hf_of, g, sd=0.2, dtype="F32"):
    """layers: {reference layer name: (in, out)}; hf_of(reference name) -> HF module path.
    Returns the adapter {reference layer name: (A, B)} as stored, and writes the files."""
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    r = cfg_json["r"]
    adapter, tensors = {}, []
    for lname, (fan_in, fan_out) in layers.items():
        if not matches(cfg_json["target_modules"], hf_of(lname)):
            continue
        A = mf.stored(torch.randn(r, fan_in, generator=g) * sd, dtype)
        B = mf.stored(torch.randn(fan_out, r, generator=g) * sd, dtype)
        adapter[lname] = (A, B)
        tensors += [(PREFIX + hf_of(lname) + ".lora_A.weight", A),
                    (PREFIX + hf_of(lname) + ".lora_B.weight", B)]
    mf.write_safetensors(os.path.join(d, "adapter_model.safetensors"), tensors, lambda n: dtype)
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2)
        f.write("\n")
    return d, adapter, dict(tensors)


def lora_term(adapter, scaling):
    def term(x, lname):
        if lname not in adapter:
            return 0.0
        A, B = adapter[lname]
        return scaling * ((x @ A.T) @ B.T)
    return term


def write_expected(d, cfg, forward, base, adapter, tensors, hf_of, scaling, seed, train):
    g = torch.Generator().manual_seed(seed)
    V = cfg["vocab_size"]
    ids = torch.randint(0, V, (mf.B, mf.T), generator=g)
    expected = [("input_ids", ids)]
    if not train:
        with torch.no_grad():
            logits = forward(cfg, base, ids, lora_term(adapter, scaling))
        expected.append(("logits", logits))
    else:
        labels = torch.randint(0, V, (mf.B, mf.T), generator=g)
        for A, B in adapter.values():
            A.requires_grad_(True)
            B.requires_grad_(True)
        logits = forward(cfg, base, ids, lora_term(adapter, scaling))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1))
        loss.backward()
        expected += [("logits", logits.detach()), ("labels", labels),
                     ("loss", loss.detach().reshape(1))]
        names = {}
        for lname, (A, B) in adapter.items():
            names[PREFIX + hf_of(lname) + ".lora_A.weight"] = A
            names[PREFIX + hf_of(lname) + ".lora_B.weight"] = B
        expected += [("grad." + n, t.grad.clone()) for n, t in names.items()]
        opt = torch.optim.AdamW(list(names.values()), **ADAMW)
        opt.step()
        expected += [("step." + n, t.detach().clone()) for n, t in names.items()]
    mf.write_safetensors(os.path.join(d, "expected.safetensors"), expected,
                         lambda n: "I32" if n in ("input_ids", "labels") else "F32")
    # The adapter must change the logits, or the fixture proves nothing.
    with torch.no_grad():
        plain = forward(cfg, base, ids)
    assert mf.rel_diff(plain, logits.detach()) > 1e-2, d
    return float(mf.rel_diff(plain, logits.detach()))


LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def llama_layers(cfg):
    hidden, H = cfg["hidden_size"], cfg["num_attention_heads"]
    Hkv, D = cfg.get("num_key_value_heads", H), cfg.get("head_dim") or hidden // H
    inter = cfg["intermediate_size"]
    shapes = {"self_attn.q_proj": (hidden, H * D), "self_attn.k_proj": (hidden, Hkv * D),
              "self_attn.v_proj": (hidden, Hkv * D), "self_attn.o_proj": (H * D, hidden),
              "mlp.gate_proj": (hidden, inter), "mlp.up_proj": (hidden, inter),
              "mlp.down_proj": (inter, hidden)}
    return {f"model.layers.{i}.{n}": s for i in range(cfg["num_hidden_layers"])
            for n, s in shapes.items()}


def gpt2_layers(cfg):
    C = cfg["n_embd"]
    shapes = {"attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "mlp.c_fc": (C, 4 * C),
              "mlp.c_proj": (4 * C, C)}
    return {f"h.{i}.{n}": s for i in range(cfg["n_layer"]) for n, s in shapes.items()}


def byte_llama():
    """A random Llama over byte ids (vocab 256): the base kiln-lm finetune's test
    trains on a text's bytes (no tokenizer needed)."""
    cfg = mf.variant(vocab_size=256, max_position_embeddings=64, bos_token_id=None,
                     eos_token_id=None)
    params = mf.llama_params(cfg, torch.Generator().manual_seed(11))
    params = {n: mf.stored(t, "F32") for n, t in params.items()}
    mf.write_dir("byte_llama", cfg, params, "F32")
    print("byte_llama: written")


def main():
    byte_llama()
    cfg, base = base_params("llama3_gqa")
    same = lambda n: n  # noqa: E731  Llama's reference names are the HF module paths

    # Every projection of both layers, r 4, alpha 8, trained one step.
    c = full_config("kiln-tests/llama3_gqa", 4, 8, LLAMA_TARGETS)
    d, ad, t = make_adapter("lora_llama3_gqa", c, llama_layers(cfg), same,
                            torch.Generator().manual_seed(7))
    diff = write_expected(d, cfg, mf.llama_forward, base, ad, t, same, 8 / 4, 70, True)
    print(f"lora_llama3_gqa: {len(t)} tensors, logits change {diff:.3f}")

    # A second adapter on the same base: PEFT's minimal config, targets as a
    # regex, rsLoRA, dropout (inactive in evaluation), BF16 tensors.
    c = {"peft_type": "LORA", "r": 2, "lora_alpha": 6, "lora_dropout": 0.1, "use_rslora": True,
         "target_modules": r".*\.(q_proj|v_proj|down_proj)"}
    d, ad, t = make_adapter("lora_llama3_gqa_rslora", c, llama_layers(cfg), same,
                            torch.Generator().manual_seed(8), sd=0.3, dtype="BF16")
    diff = write_expected(d, cfg, mf.llama_forward, base, ad, t, same, 6 / 2 ** 0.5, 80, False)
    print(f"lora_llama3_gqa_rslora: {len(t)} tensors, logits change {diff:.3f}")

    # GPT-2: Conv1D layers (weight [in, out], fan_in_fan_out), PEFT's names under
    # "transformer.", both c_proj layers matched by one name.
    cfg, base = base_params("gpt2")
    hf = lambda n: "transformer." + n  # noqa: E731
    c = full_config("kiln-tests/gpt2", 4, 16, ["c_attn", "c_proj"], fan_in_fan_out=True)
    d, ad, t = make_adapter("lora_gpt2", c, gpt2_layers(cfg), hf, torch.Generator().manual_seed(9))
    diff = write_expected(d, cfg, mf.gpt2_forward, base, ad, t, hf, 16 / 4, 90, True)
    print(f"lora_gpt2: {len(t)} tensors, logits change {diff:.3f}")


if __name__ == "__main__":
    sys.exit(main())
