#!/usr/bin/python3
"""PyTorch baseline of bench_generate: greedy decoding with a KV cache on a
random model shaped like SmolLM2-135M (30 layers, hidden 576, 9 heads, 3
key/value heads, MLP 1536, vocabulary 49152, tied head), f32, batch 1.

The model is written here in plain PyTorch the way Hugging Face's Llama runs
with use_cache=True (the cache grows by torch.cat each step, key/value heads
repeated for the query heads, F.scaled_dot_product_attention is not in 1.13:
softmax(q k^T / sqrt(d)) v). Prints the same fields as bench_generate.

    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/generate_pytorch.py --threads 1
"""
import argparse
import math
import time

import torch

V, C, F, L, H, HKV, D = 49152, 576, 1536, 30, 9, 3, 64


def rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rot(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Model:
    def __init__(self, layers):
        g = torch.Generator().manual_seed(1)
        r = lambda *s: torch.randn(*s, generator=g) * 0.02
        self.emb = r(V, C)
        self.layers = [dict(ln1=torch.ones(C), q=r(H * D, C), k=r(HKV * D, C), v=r(HKV * D, C),
                            o=r(C, H * D), ln2=torch.ones(C), gate=r(F, C), up=r(F, C), down=r(C, F))
                       for _ in range(layers)]
        self.norm = torch.ones(C)
        inv = 1.0 / (100000.0 ** (torch.arange(0, D, 2).float() / D))
        ang = torch.arange(4096).float()[:, None] * inv[None, :]
        ang = torch.cat((ang, ang), -1)
        self.cos, self.sin = ang.cos(), ang.sin()

    def forward(self, ids, cache, pos):
        T = ids.shape[1]
        x = self.emb[ids]
        cos, sin = self.cos[pos:pos + T], self.sin[pos:pos + T]
        mask = None
        if T > 1:
            mask = torch.full((T, T), float("-inf")).triu(1)
        for i, p in enumerate(self.layers):
            h = rms(x, p["ln1"])
            q = (h @ p["q"].T).view(1, T, H, D).transpose(1, 2)
            k = (h @ p["k"].T).view(1, T, HKV, D).transpose(1, 2)
            v = (h @ p["v"].T).view(1, T, HKV, D).transpose(1, 2)
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            if cache[i] is not None:
                k = torch.cat((cache[i][0], k), 2)
                v = torch.cat((cache[i][1], v), 2)
            cache[i] = (k, v)
            kk = k.repeat_interleave(H // HKV, 1)
            vv = v.repeat_interleave(H // HKV, 1)
            s = q @ kk.transpose(-1, -2) / math.sqrt(D)
            if mask is not None:
                s = s + mask
            y = (torch.softmax(s, -1) @ vv).transpose(1, 2).reshape(1, T, H * D)
            x = x + y @ p["o"].T
            h = rms(x, p["ln2"])
            gt = h @ p["gate"].T
            x = x + (torch.nn.functional.silu(gt) * (h @ p["up"].T)) @ p["down"].T
        return rms(x[:, -1], self.norm) @ self.emb.T


def run(m, prompt, tokens):
    cache = [None] * len(m.layers)
    t0 = time.perf_counter()
    logits = m.forward(prompt, cache, 0)
    t1 = time.perf_counter()
    pos = prompt.shape[1]
    steps = 0
    for _ in range(tokens - 1):
        nxt = logits.argmax(-1).view(1, 1)
        logits = m.forward(nxt, cache, pos)
        pos += 1
        steps += 1
    t2 = time.perf_counter()
    return prompt.shape[1] / (t1 - t0), steps / (t2 - t1), steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=L)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m = Model(a.layers)
    prompt = (torch.arange(a.prompt) * 7919 % V).view(1, -1)
    with torch.no_grad():
        run(m, prompt, a.tokens)  # warm-up
        pps, tps, steps = run(m, prompt, a.tokens)
    wmb = sum(t.numel() for p in m.layers for t in p.values()) * 4 / 1e6 + (V * C + C) * 4 / 1e6
    print(f"pytorch={torch.__version__} layers={a.layers} threads={a.threads} prompt={a.prompt} "
          f"prompt_tokens_per_s={pps:.1f} decode_tokens={steps} decode_tokens_per_s={tps:.2f} "
          f"weight_mb={wmb:.1f} weights_gb_per_s={tps * wmb / 1e3:.2f}")


if __name__ == "__main__":
    main()
