#!/usr/bin/env python3
"""The PyTorch baseline of the Llama inference figures (docs/benchmarks.md).

SmolLM2-135M's shape (30 layers, 576 wide, 9 heads, 3 KV heads, 1536 MLP,
49152 vocabulary, tied head, RMSNorm eps 1e-5, RoPE theta 1e5) written out
in plain PyTorch 1.13 as Hugging Face's LlamaForCausalLM computes it (RMSNorm
in f32, rotate-half RoPE, grouped-query attention by repeating the key/value
heads, SwiGLU MLP), random weights, f32, under torch.no_grad():

  prefill   one forward of --prefill tokens (logits of every position, as
            kiln's bench_lm), best of --repeats;
  generate  greedy decoding at batch 1 with a KV cache (preallocated per layer,
            written in place: no concatenation per token) after a prompt of
            --prompt tokens; tokens/s of the --new decode steps, best of
            --repeats.

PyTorch 1.13 has no fused attention (scaled_dot_product_attention came in
2.0): scores, causal mask, softmax and the weighted sum are separate ops.

  OMP_WAIT_POLICY=PASSIVE python3 bench/lm_pytorch.py --threads 2
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, HIDDEN, MLP, LAYERS, HEADS, KV_HEADS = 49152, 576, 1536, 30, 9, 3
HEAD_DIM = HIDDEN // HEADS
EPS, THETA = 1e-5, 100000.0


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x, cos, sin, cache, pos):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k_proj(x).view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v_proj(x).view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        c, s = cos[pos:pos + t], sin[pos:pos + t]  # [t, D], broadcast over b and heads
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        if cache is not None:  # write this step's keys/values, read all so far
            kc, vc = cache
            kc[:, :, pos:pos + t] = k
            vc[:, :, pos:pos + t] = v
            k, v = kc[:, :, :pos + t], vc[:, :, :pos + t]
        n = k.shape[2]
        rep = HEADS // KV_HEADS  # HF's repeat_kv
        k = k[:, :, None].expand(b, KV_HEADS, rep, n, HEAD_DIM).reshape(b, HEADS, n, HEAD_DIM)
        v = v[:, :, None].expand(b, KV_HEADS, rep, n, HEAD_DIM).reshape(b, HEADS, n, HEAD_DIM)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HEAD_DIM))
        if t > 1:  # query i sees keys j <= pos + i
            mask = torch.ones(t, n, dtype=torch.bool).tril(diagonal=n - t)
            att = att.masked_fill(~mask, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, HEADS * HEAD_DIM))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.self_attn = Attention()
        self.post_attention_layernorm = RMSNorm(HIDDEN)
        self.gate_proj = nn.Linear(HIDDEN, MLP, bias=False)
        self.up_proj = nn.Linear(HIDDEN, MLP, bias=False)
        self.down_proj = nn.Linear(MLP, HIDDEN, bias=False)

    def forward(self, x, cos, sin, cache, pos):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, pos)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, max_seq):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(HIDDEN)
        inv = 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
        ang = torch.arange(max_seq, dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, ids, caches=None, pos=0):
        x = self.embed_tokens(ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, self.cos, self.sin, None if caches is None else caches[i], pos)
        return self.norm(x) @ self.embed_tokens.weight.t()  # tied head

    def new_cache(self, max_len):
        shape = (1, KV_HEADS, max_len, HEAD_DIM)
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in self.layers]


def tokens(n, offset=13):
    return torch.tensor([[(i * 7919 + offset) % VOCAB for i in range(n)]], dtype=torch.long)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Llama(max(a.prefill, a.prompt + a.new)).eval()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"lm_pytorch: torch {torch.__version__}, {a.threads} threads, {n_params} params")
    with torch.no_grad():
        ids = tokens(a.prefill)
        model(ids)  # warm-up
        best = math.inf
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            model(ids)
            best = min(best, time.perf_counter() - t0)
        print(f"prefill: tokens={a.prefill} seconds={best:.4f} tokens_per_s={a.prefill / best:.1f}")

        best, text = math.inf, None
        for _ in range(a.repeats):
            caches = model.new_cache(a.prompt + a.new)
            logits = model(tokens(a.prompt), caches, 0)
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out = []
            t0 = time.perf_counter()
            for i in range(a.new):
                out.append(int(nxt))
                logits = model(nxt, caches, a.prompt + i)
                nxt = logits[:, -1].argmax(-1, keepdim=True)
            best = min(best, time.perf_counter() - t0)
            text = out
        print(f"generate: prompt={a.prompt} new={a.new} seconds={best:.4f} "
              f"tokens_per_s={a.new / best:.2f} first_ids={text[:8]}")


if __name__ == "__main__":
    main()
