#!/usr/bin/python3
"""Writes the model fixtures of tests/models: small random-weight models in the
Hugging Face directory layout, and the logits (and, for two of them, the loss
and gradients of a training step) a reference computes from them.

The reference is written here from the architectures' descriptions (LLaMA,
RoPE's frequency scaling in rope_reference.py, Qwen2/Qwen3, Mistral, Phi-3, GPT-2), following Hugging
Face's conventions: parameter names, rotate_half RoPE over the two halves of the
head dim, Conv1D weights stored [in, out] in GPT-2. It computes in float64 from
the weights exactly as stored (bf16/f16 values included), so the expected values
are the model's own, not one float32 rounding of them. safetensors files are
written by this script from the format's spec (no `safetensors` module needed).

    /usr/bin/python3 tests/models/make_fixtures.py [names]   # Debian python3-torch

(names: write only those fixtures; each fixture's seed is its place in FIXTURES.)

Each fixture directory holds config.json, model.safetensors (or shards and
model.safetensors.index.json), generation_config.json and expected.safetensors:
input_ids (I32 [B, T]), logits (F32 [B, T, V]); with a training step also
labels (I32 [B, T]), loss (F32 [1]) and grad.<param name> (F32) for a few
params, of the mean cross-entropy of logits against labels. generation.safetensors
holds prompt_ids and the greedy_ids that follow them (12 tokens, each chosen by
recomputing the whole sequence), and ppl_ids with their perplexity in windows
of ppl_window tokens (the ids also as text, ppl_ids.txt, for kiln-lm's test).
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rope_reference import cos_sin  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
B, T = 2, 12
torch.set_default_dtype(torch.float64)


# ---------------------------------------------------------------- safetensors
def st_bytes(t, dtype):
    """Raw little-endian bytes and the safetensors dtype name of tensor t."""
    t = t.detach().contiguous()
    if dtype == "F32":
        return t.to(torch.float32).numpy().astype("<f4").tobytes()
    if dtype == "F16":
        return t.to(torch.float16).numpy().astype("<f2").tobytes()
    if dtype == "BF16":
        return t.to(torch.float32).to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
    if dtype == "I32":
        return t.to(torch.int32).numpy().astype("<i4").tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors, dtype_of):
    """tensors: list of (name, tensor); dtype_of(name) -> "F32" | "F16" | "BF16" | "I32"."""
    header = {"__metadata__": {"format": "pt"}}
    blobs, off = [], 0
    for name, t in tensors:
        dt = dtype_of(name)
        data = st_bytes(t, dt)
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return off


def stored(t, dtype):
    """The value a tensor has once stored in `dtype` (rounded), as float64."""
    if dtype == "F16":
        return t.to(torch.float16).to(torch.float64)
    if dtype == "BF16":
        return t.to(torch.float32).to(torch.bfloat16).to(torch.float64)
    return t.to(torch.float32).to(torch.float64)


# ---------------------------------------------------------------- Llama family
def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def llama_forward(cfg, p, ids, lora=None):
    """lora(x, name) -> a term added to linear layer `name`'s output (make_lora_fixtures.py)."""
    hidden, H = cfg["hidden_size"], cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads", H)
    D = cfg.get("head_dim") or hidden // H
    eps = cfg["rms_norm_eps"]
    bsz, seq = ids.shape
    # [T, D], every scaling type (rope_reference.py), the attention factor included.
    # The table's length: kiln's (ModelOptions::max_seq_len unset), which only
    # dynamic and longrope scaling depend on.
    cos, sin = cos_sin(cfg, D, min(cfg["max_position_embeddings"], 4096))
    cos, sin = cos[:seq], sin[:seq]
    window = cfg.get("sliding_window") if cfg["model_type"] == "mistral" else None
    i = torch.arange(seq)[:, None]
    j = torch.arange(seq)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (i - j) < window
    mask = torch.where(allowed, 0.0, float("-inf"))

    def lin(x, name, bias=False):
        y = x @ p[name + ".weight"].T
        if name + ".bias" in p:
            y = y + p[name + ".bias"]
        return y if lora is None else y + lora(x, name)

    x = p["model.embed_tokens.weight"][ids]
    for layer in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{layer}."
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q = lin(h, pre + "self_attn.q_proj").view(bsz, seq, H, D)
        k = lin(h, pre + "self_attn.k_proj").view(bsz, seq, Hkv, D)
        v = lin(h, pre + "self_attn.v_proj").view(bsz, seq, Hkv, D)
        if pre + "self_attn.q_norm.weight" in p:  # Qwen3: RMSNorm per head, before RoPE
            q = rms_norm(q, p[pre + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, p[pre + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, D]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = H // Hkv  # query head h reads key/value head h // rep
        k = k[:, :, None].expand(bsz, Hkv, rep, seq, D).reshape(bsz, H, seq, D)
        v = v[:, :, None].expand(bsz, Hkv, rep, seq, D).reshape(bsz, H, seq, D)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + mask, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(bsz, seq, H * D)
        x = x + lin(y, pre + "self_attn.o_proj")
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        gate = lin(h, pre + "mlp.gate_proj")
        x = x + lin(gate * torch.sigmoid(gate) * lin(h, pre + "mlp.up_proj"), pre + "mlp.down_proj")
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else p["lm_head.weight"]
    return x @ head.T


def llama_params(cfg, g):
    hidden, H = cfg["hidden_size"], cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads", H)
    D = cfg.get("head_dim") or hidden // H
    inter, V = cfg["intermediate_size"], cfg["vocab_size"]
    qwen2 = cfg["model_type"] == "qwen2"
    qk_norm = cfg["model_type"] == "qwen3"
    attn_bias = qwen2 or cfg.get("attention_bias", False)

    def rnd(*shape, sd=0.2):
        return torch.randn(*shape, generator=g) * sd

    def norm_w(n):
        return 1.0 + rnd(n, sd=0.1)

    p = {"model.embed_tokens.weight": rnd(V, hidden, sd=1.0)}
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        p[pre + "input_layernorm.weight"] = norm_w(hidden)
        for name, out in (("q_proj", H * D), ("k_proj", Hkv * D), ("v_proj", Hkv * D)):
            p[pre + f"self_attn.{name}.weight"] = rnd(out, hidden)
            if attn_bias:
                p[pre + f"self_attn.{name}.bias"] = rnd(out, sd=0.1)
        p[pre + "self_attn.o_proj.weight"] = rnd(hidden, H * D)
        if attn_bias and not qwen2:  # attention_bias=True: o_proj too (Qwen2 has q/k/v only)
            p[pre + "self_attn.o_proj.bias"] = rnd(hidden, sd=0.1)
        if qk_norm:
            p[pre + "self_attn.q_norm.weight"] = norm_w(D)
            p[pre + "self_attn.k_norm.weight"] = norm_w(D)
        p[pre + "post_attention_layernorm.weight"] = norm_w(hidden)
        p[pre + "mlp.gate_proj.weight"] = rnd(inter, hidden)
        p[pre + "mlp.up_proj.weight"] = rnd(inter, hidden)
        p[pre + "mlp.down_proj.weight"] = rnd(hidden, inter)
    p["model.norm.weight"] = norm_w(hidden)
    if not cfg.get("tie_word_embeddings"):
        p["lm_head.weight"] = rnd(V, hidden)
    return p


# ---------------------------------------------------------------- Phi-3
def phi3_rope_config(cfg):
    """Phi-3 keeps longrope's pretraining context at the config's top level
    (original_max_position_embeddings), and its factor is max_position_embeddings
    over it (transformers' longrope for such configs)."""
    rs = cfg.get("rope_scaling")
    if not rs or "original_max_position_embeddings" not in cfg:
        return cfg
    orig = cfg["original_max_position_embeddings"]
    rs = dict(rs, original_max_position_embeddings=orig, factor=cfg["max_position_embeddings"] / orig)
    return dict(cfg, rope_scaling=rs)


def phi3_forward(cfg, p, ids, lora=None):
    """Phi-3 (Phi3ForCausalLM): the Llama block with q, k and v as one projection
    (qkv_proj, rows q | k | v) and gate and up as one (gate_up_proj, gate | up),
    RoPE on the first int(head_dim * partial_rotary_factor) dims of each head only
    (rotate_half within them, the rest passed through), longrope scaling."""
    hidden, H = cfg["hidden_size"], cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads", H)
    D = hidden // H
    R = int(D * cfg.get("partial_rotary_factor", 1.0))
    eps, inter = cfg["rms_norm_eps"], cfg["intermediate_size"]
    bsz, seq = ids.shape
    cos, sin = cos_sin(phi3_rope_config(cfg), R, min(cfg["max_position_embeddings"], 4096))
    cos, sin = cos[:seq], sin[:seq]
    i = torch.arange(seq)[:, None]
    j = torch.arange(seq)[None, :]
    allowed = j <= i
    if cfg.get("sliding_window"):
        allowed &= (i - j) < cfg["sliding_window"]
    mask = torch.where(allowed, 0.0, float("-inf"))

    def lin(x, name):
        y = x @ p[name + ".weight"].T
        return y if lora is None else y + lora(x, name)

    def rot(t):  # [B, heads, T, D]: the first R dims turn
        a, rest = t[..., :R], t[..., R:]
        return torch.cat((a * cos + rotate_half(a) * sin, rest), dim=-1)

    x = p["model.embed_tokens.weight"][ids]
    for layer in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{layer}."
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        qkv = lin(h, pre + "self_attn.qkv_proj")
        q = qkv[..., :H * D].view(bsz, seq, H, D).transpose(1, 2)
        k = qkv[..., H * D:(H + Hkv) * D].view(bsz, seq, Hkv, D).transpose(1, 2)
        v = qkv[..., (H + Hkv) * D:].view(bsz, seq, Hkv, D).transpose(1, 2)
        q, k = rot(q), rot(k)
        rep = H // Hkv
        k = k[:, :, None].expand(bsz, Hkv, rep, seq, D).reshape(bsz, H, seq, D)
        v = v[:, :, None].expand(bsz, Hkv, rep, seq, D).reshape(bsz, H, seq, D)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + mask, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(bsz, seq, H * D)
        x = x + lin(y, pre + "self_attn.o_proj")
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        gate_up = lin(h, pre + "mlp.gate_up_proj")
        gate, up = gate_up[..., :inter], gate_up[..., inter:]
        x = x + lin(up * (gate * torch.sigmoid(gate)), pre + "mlp.down_proj")
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else p["lm_head.weight"]
    return x @ head.T


def phi3_params(cfg, g):
    hidden, H = cfg["hidden_size"], cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads", H)
    D = hidden // H
    inter, V = cfg["intermediate_size"], cfg["vocab_size"]

    def rnd(*shape, sd=0.2):
        return torch.randn(*shape, generator=g) * sd

    p = {"model.embed_tokens.weight": rnd(V, hidden, sd=1.0)}
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        p[pre + "input_layernorm.weight"] = 1.0 + rnd(hidden, sd=0.1)
        p[pre + "self_attn.qkv_proj.weight"] = rnd((H + 2 * Hkv) * D, hidden)
        p[pre + "self_attn.o_proj.weight"] = rnd(hidden, H * D)
        p[pre + "post_attention_layernorm.weight"] = 1.0 + rnd(hidden, sd=0.1)
        p[pre + "mlp.gate_up_proj.weight"] = rnd(2 * inter, hidden)
        p[pre + "mlp.down_proj.weight"] = rnd(hidden, inter)
    p["model.norm.weight"] = 1.0 + rnd(hidden, sd=0.1)
    if not cfg.get("tie_word_embeddings"):
        p["lm_head.weight"] = rnd(V, hidden)
    return p


# ---------------------------------------------------------------- GPT-2
def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def gpt2_forward(cfg, p, ids, lora=None):
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    D = C // H
    bsz, seq = ids.shape
    mask = torch.where(torch.arange(seq)[None, :] <= torch.arange(seq)[:, None], 0.0, float("-inf"))

    def conv1d(x, name):  # HF's Conv1D: weight [in, out], y = x W + b
        y = x @ p[name + ".weight"] + p[name + ".bias"]
        return y if lora is None else y + lora(x, name)

    x = p["wte.weight"][ids] + p["wpe.weight"][torch.arange(seq)]
    for i in range(cfg["n_layer"]):
        pre = f"h.{i}."
        h = layer_norm(x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], eps)
        q, k, v = conv1d(h, pre + "attn.c_attn").split(C, dim=-1)
        q, k, v = (t.view(bsz, seq, H, D).transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + mask, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(bsz, seq, C)
        x = x + conv1d(y, pre + "attn.c_proj")
        h = layer_norm(x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], eps)
        x = x + conv1d(gelu_tanh(conv1d(h, pre + "mlp.c_fc")), pre + "mlp.c_proj")
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"], eps)
    return x @ p["wte.weight"].T  # GPT-2's head is tied to wte


def gpt2_params(cfg, g):
    C, V, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_layer"]

    def rnd(*shape, sd=0.2):
        return torch.randn(*shape, generator=g) * sd

    p = {"wte.weight": rnd(V, C, sd=1.0), "wpe.weight": rnd(cfg["n_positions"], C, sd=0.5)}
    for i in range(L):
        pre = f"h.{i}."
        p[pre + "ln_1.weight"], p[pre + "ln_1.bias"] = 1 + rnd(C, sd=0.1), rnd(C, sd=0.1)
        p[pre + "attn.c_attn.weight"], p[pre + "attn.c_attn.bias"] = rnd(C, 3 * C), rnd(3 * C, sd=0.1)
        p[pre + "attn.c_proj.weight"], p[pre + "attn.c_proj.bias"] = rnd(C, C), rnd(C, sd=0.1)
        p[pre + "ln_2.weight"], p[pre + "ln_2.bias"] = 1 + rnd(C, sd=0.1), rnd(C, sd=0.1)
        p[pre + "mlp.c_fc.weight"], p[pre + "mlp.c_fc.bias"] = rnd(C, 4 * C), rnd(4 * C, sd=0.1)
        p[pre + "mlp.c_proj.weight"], p[pre + "mlp.c_proj.bias"] = rnd(4 * C, C), rnd(C, sd=0.1)
    p["ln_f.weight"], p["ln_f.bias"] = 1 + rnd(C, sd=0.1), rnd(C, sd=0.1)
    return p


# ---------------------------------------------------------------- fixtures
LLAMA_BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "use_cache": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
    "transformers_version": "4.46.0",
}


def variant(**kw):
    c = dict(LLAMA_BASE)
    c.update(kw)
    # As the hub's configs: Mistral and Qwen2 have no bias fields, Qwen3 no mlp_bias.
    drop = {"mistral": ("attention_bias", "mlp_bias"), "qwen2": ("attention_bias", "mlp_bias"),
            "qwen3": ("mlp_bias",)}.get(c["model_type"], ())
    return {k: v for k, v in c.items() if k not in drop}


FIXTURES = [
    # Llama 3: GQA (4 query heads, 2 key/value heads) and llama3 rope scaling whose
    # three bands (kept, smoothed, slowed) each hold some of the 4 frequencies.
    ("llama3_gqa", variant(
        num_key_value_heads=2, eos_token_id=[2, 3],
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
     {"dtype": "F32", "shards": 2, "train": True}),
    # Plain Llama with tied embeddings, multi-head attention, in BF16.
    ("llama_tied_bf16", variant(tie_word_embeddings=True, torch_dtype="bfloat16"),
     {"dtype": "BF16"}),
    # Qwen2: biases on q/k/v (not o), tied head, sliding window configured but off.
    ("qwen2_bias", variant(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", num_key_value_heads=2,
        tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6,
        use_sliding_window=False, sliding_window=4096, max_window_layers=2),
     {"dtype": "F32"}),
    # Qwen3: q/k RMSNorm per head, head_dim (12) that is not hidden / heads, MQA
    # (one key/value head), in F16.
    ("qwen3_qknorm_f16", variant(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_key_value_heads=1,
        head_dim=12, rms_norm_eps=1e-6, use_sliding_window=False, sliding_window=None,
        max_window_layers=2, torch_dtype="float16"),
     {"dtype": "F16"}),
    # Mistral: sliding window of 5 tokens over sequences of 12.
    ("mistral_swa", variant(
        architectures=["MistralForCausalLM"], model_type="mistral", num_key_value_heads=2,
        sliding_window=5, head_dim=8),
     {"dtype": "F32"}),
    # YaRN (Qwen's long-context setting): frequencies ramped between kept and
    # divided by 4 over an original context of 64, cos/sin scaled by 0.1 ln 4 + 1.
    ("llama_yarn", variant(
        num_key_value_heads=2,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
     {"dtype": "F32"}),
    # Linear position interpolation (factor 4), in the older "type" spelling.
    ("llama_linear", variant(rope_scaling={"type": "linear", "factor": 4.0}), {"dtype": "F32"}),
]

GPT2_CONFIG = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "vocab_size": 96,
    "n_positions": 16,
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 4,
    "n_inner": None,
    "activation_function": "gelu_new",
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "layer_norm_epsilon": 1e-5,
    "initializer_range": 0.02,
    "scale_attn_weights": True,
    "use_cache": True,
    "bos_token_id": 95,
    "eos_token_id": 95,
    "torch_dtype": "float32",
    "transformers_version": "4.46.0",
}

# Phi-4-mini's shape of Phi-3, scaled down: 3/4 of each head's 16 dims rotate
# (partial_rotary_factor), longrope with 6 factors over a pretraining context of
# 64 (the table of 256 positions takes long_factor), grouped-query attention.
PHI3_CONFIG = {
    "architectures": ["Phi3ForCausalLM"],
    "model_type": "phi3",
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "original_max_position_embeddings": 64,
    "partial_rotary_factor": 0.75,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "longrope",
                     "short_factor": [1.0, 1.05, 1.1, 1.2, 1.4, 1.8],
                     "long_factor": [1.0, 1.5, 2.5, 4.0, 8.0, 16.0]},
    "rms_norm_eps": 1e-5,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "attention_dropout": 0.0,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
    "transformers_version": "4.46.0",
}

# Gradients recorded for the training step (besides the loss).
GRAD_NAMES = {
    "llama": ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
              "model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.down_proj.weight",
              "model.layers.1.post_attention_layernorm.weight", "model.norm.weight",
              "lm_head.weight"],
    "phi3": ["model.embed_tokens.weight", "model.layers.0.self_attn.qkv_proj.weight",
             "model.layers.1.mlp.gate_up_proj.weight", "model.layers.1.mlp.down_proj.weight",
             "model.layers.0.input_layernorm.weight", "model.norm.weight", "lm_head.weight"],
    "gpt2": ["wte.weight", "wpe.weight", "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias",
             "h.1.mlp.c_proj.weight", "h.1.ln_2.bias", "ln_f.weight"],
}


def write_dir(name, cfg, params, dtype, shards=1):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    eos = cfg.get("eos_token_id")
    gen = {"_from_model_config": True, "bos_token_id": cfg.get("bos_token_id"), "eos_token_id": eos,
           "transformers_version": cfg["transformers_version"]}
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    items = list(params.items())
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), items, lambda n: dtype)
    else:
        per = (len(items) + shards - 1) // shards
        weight_map, total = {}, 0
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = items[s * per:(s + 1) * per]
            total += write_safetensors(os.path.join(d, fname), part, lambda n: dtype)
            for n, _ in part:
                weight_map[n] = fname
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
            f.write("\n")
    return d


def make(name, cfg, forward, params, dtype, shards=1, train=False, grad_names=(), seed=0):
    params = {n: stored(t, dtype) for n, t in params.items()}
    d = write_dir(name, cfg, params, dtype, shards)
    g = torch.Generator().manual_seed(1000 + seed)
    V = cfg["vocab_size"]
    ids = torch.randint(0, V, (B, T), generator=g)
    expected = [("input_ids", ids)]
    if train:
        labels = torch.randint(0, V, (B, T), generator=g)
        for t in params.values():
            t.requires_grad_(True)
        logits = forward(cfg, params, ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1))
        loss.backward()
        expected += [("logits", logits.detach()), ("labels", labels), ("loss", loss.detach().reshape(1))]
        expected += [("grad." + n, params[n].grad) for n in grad_names]
    else:
        with torch.no_grad():
            logits = forward(cfg, params, ids)
        expected.append(("logits", logits))
    write_safetensors(os.path.join(d, "expected.safetensors"), expected,
                      lambda n: "I32" if n in ("input_ids", "labels") else "F32")
    return params, ids, logits.detach()


GEN_NEW, PPL_LEN, PPL_WINDOW = 12, 40, 16


def greedy(forward, cfg, params, prompt, n_new):
    """Greedy generation by recomputing the whole sequence for every token (no
    cache). Returns the new ids and the smallest gap between the largest and the
    second-largest logit over the steps (a near tie would make the test flaky)."""
    ids, gap = list(prompt), float("inf")
    with torch.no_grad():
        for _ in range(n_new):
            row = forward(cfg, params, torch.tensor([ids]))[0, -1]
            top = torch.topk(row, 2).values
            gap = min(gap, float(top[0] - top[1]))
            ids.append(int(row.argmax()))
    return ids[len(prompt):], gap


def perplexity(forward, cfg, params, ids, window):
    """exp(mean next-token NLL) over consecutive windows of `window` tokens; the
    first token of each window is not predicted."""
    nll, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, window):
            w = ids[s:s + window]
            logp = torch.log_softmax(forward(cfg, params, torch.tensor([w]))[0], dim=-1)
            for t in range(len(w) - 1):
                nll -= float(logp[t, w[t + 1]])
                count += 1
    return math.exp(nll / count)


def write_generation(name, cfg, forward, params, seed):
    """generation.safetensors: a prompt and its greedy continuation, and the
    perplexity of a fixed token sequence in windows of PPL_WINDOW tokens."""
    g = torch.Generator().manual_seed(2000 + seed)
    V = cfg["vocab_size"]
    prompt = torch.randint(0, V, (5 if cfg["model_type"] != "gpt2" else 4,), generator=g).tolist()
    new, gap = greedy(forward, cfg, params, prompt, GEN_NEW)
    assert gap > 1e-3, f"{name}: greedy near tie ({gap})"
    ppl_ids = torch.randint(0, V, (PPL_LEN,), generator=g).tolist()
    ppl = perplexity(forward, cfg, params, ppl_ids, PPL_WINDOW)
    out = [("prompt_ids", torch.tensor(prompt)), ("greedy_ids", torch.tensor(new)),
           ("ppl_ids", torch.tensor(ppl_ids)), ("ppl_window", torch.tensor([PPL_WINDOW])),
           ("perplexity", torch.tensor([ppl]))]
    write_safetensors(os.path.join(OUT, name, "generation.safetensors"), out,
                      lambda n: "F32" if n == "perplexity" else "I32")
    with open(os.path.join(OUT, name, "ppl_ids.txt"), "w") as f:  # for kiln-lm perplexity --ids
        f.write(",".join(str(i) for i in ppl_ids) + "\n")
    print(f"{name}: greedy {new} (min top-2 gap {gap:.4f}), perplexity {ppl:.4f}")


def rel_diff(a, b):
    return float((a - b).abs().max() / b.abs().max())


def make_phi3():
    name, cfg = "phi3_longrope", PHI3_CONFIG
    g = torch.Generator().manual_seed(303)
    p, ids, logits = make(name, cfg, phi3_forward, phi3_params(cfg, g), "F32", train=True,
                          grad_names=GRAD_NAMES["phi3"], seed=303)
    p = {n: t.detach() for n, t in p.items()}
    # What the fixture is about changes its logits: longrope's factors, and
    # partial rotary (rotating all 16 dims instead, with 8 factors).
    with torch.no_grad():
        assert rel_diff(phi3_forward(dict(cfg, rope_scaling=None), p, ids), logits) > 1e-2
        full = dict(cfg, partial_rotary_factor=1.0, rope_scaling=dict(
            cfg["rope_scaling"], short_factor=[1.0] * 8, long_factor=[1.0] * 8))
        assert rel_diff(phi3_forward(full, p, ids), logits) > 1e-2
    print(f"{name}: logits max |x| {float(logits.abs().max()):.3f}")
    write_generation(name, cfg, phi3_forward, p, 303)


def main():
    # Names given: only those fixtures are written (the others' files stay as they are).
    only = set(sys.argv[1:])
    for seed, (name, cfg, opt) in enumerate(FIXTURES):
        if only and name not in only:
            continue
        g = torch.Generator().manual_seed(seed + 1)
        params = llama_params(cfg, g)
        names = GRAD_NAMES["llama"] if opt.get("train") else ()
        p, ids, logits = make(name, cfg, llama_forward, params, opt["dtype"], opt.get("shards", 1),
                              opt.get("train", False), names, seed)
        # The feature a fixture is about must change its logits, or it proves nothing.
        if cfg.get("rope_scaling"):
            plain = dict(cfg, rope_scaling=None)
            assert rel_diff(llama_forward(plain, p, ids).detach(), logits) > 1e-2, name
        if cfg["model_type"] == "mistral":
            plain = dict(cfg, sliding_window=None)
            assert rel_diff(llama_forward(plain, p, ids).detach(), logits) > 1e-2, name
        print(f"{name}: logits max |x| {float(logits.abs().max()):.3f}")
        write_generation(name, cfg, llama_forward, {n: t.detach() for n, t in p.items()}, seed)
    if not only or "phi3_longrope" in only:
        make_phi3()
    if only and "gpt2" not in only:
        return
    g = torch.Generator().manual_seed(100)
    p, _, _ = make("gpt2", GPT2_CONFIG, gpt2_forward, gpt2_params(GPT2_CONFIG, g), "F32",
                   train=True, grad_names=GRAD_NAMES["gpt2"], seed=100)
    write_generation("gpt2", GPT2_CONFIG, gpt2_forward, {n: t.detach() for n, t in p.items()}, 100)
    print("gpt2: written")


if __name__ == "__main__":
    sys.exit(main())
