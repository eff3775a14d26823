#!/usr/bin/env python3
"""The baseline for the GPT figures (docs/benchmarks.md): kiln-gpt's model and recipe in PyTorch.

Same corpus definition (docs/gpt.md), model (nanoGPT: learned positions, pre-LN
blocks, causal attention, 4x exact-GELU MLP, tied LM head, nanoGPT init), recipe
(AdamW, betas (0.9, 0.99), weight decay on tensors of 2+ dims, clipping at norm
1.0, linear warm-up then cosine decay to --min-lr, the same step-0 learning rate
as kiln's schedule), validation (mean loss over the first 200 non-overlapping
windows in batches of 8, every --eval-interval iterations and at the end, each
followed by a checkpoint save) and summary line as `kiln-gpt train`, tokens/s
counted from the 10th iteration on, evaluations and saves included.
Only the random windows differ (torch's generator instead of kiln's).

PyTorch 1.13 (Debian's python3-torch) has no fused attention; the causal mask is
applied with masked_fill as nanoGPT does on such versions. Where PyTorch has
F.scaled_dot_product_attention (2.x, the GPU machines), the attention uses it as
nanoGPT does (its flash kernel on a GPU: the baseline at its best).

--device cuda runs everything on the GPU (eager; batches copied over each
iteration as nanoGPT does); timings synchronize first.

--autocast runs the forward passes (training and validation) under
torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's CPU mixed precision: the
baseline of `kiln-gpt train --precision bf16` (f32 params and AdamW either way).

  OMP_WAIT_POLICY=PASSIVE python3 bench/gpt_pytorch.py --threads 2 [--iters 2000] [--autocast]
"""
import argparse
import math
import os
import resource
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def load_corpus(folder):
    names = sorted(n for n in os.listdir(folder) if n.endswith(".txt"))
    if not names:
        raise SystemExit(f"{folder}: no .txt files; run bash scripts/get-sotu.sh")
    parts = []
    for n in names:
        with open(os.path.join(folder, n), "rb") as f:
            parts.append(f.read())
        parts.append(b"\n")
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


class Block(nn.Module):
    def __init__(self, c, n_head, dropout, block):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.attn_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)
        self.drop = nn.Dropout(dropout)
        mask = torch.tril(torch.ones(block, block, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, block, block), persistent=False)

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        h = self.n_head
        q = q.view(b, t, h, c // h).transpose(1, 2)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        if hasattr(F, "scaled_dot_product_attention"):
            p = self.drop.p if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h))
            att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
            att = self.drop(F.softmax(att, dim=-1))
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.drop(self.attn_proj(y))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)))))


class Gpt(nn.Module):
    def __init__(self, a):
        super().__init__()
        c = a.n_embd
        self.wte = nn.Embedding(256, c)
        self.wpe = nn.Embedding(a.block, c)
        self.drop = nn.Dropout(a.dropout)
        self.blocks = nn.ModuleList(Block(c, a.n_head, a.dropout, a.block) for _ in range(a.n_layer))
        self.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, 256, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * a.n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe.weight[:t])
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/sotu")
    ap.add_argument("--out", default="out/gpt-pytorch.pt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--eval-interval", type=int, default=250)
    ap.add_argument("--eval-windows", type=int, default=200)
    ap.add_argument("--autocast", action="store_true", help="autocast to bf16 (forward passes)")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    data = load_corpus(a.data)
    n_train = int(len(data) * 0.9)
    train = torch.from_numpy(data[:n_train].astype(np.int64))
    val = torch.from_numpy(data[n_train:].astype(np.int64))
    B, T = a.batch, a.block

    model = Gpt(a).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.99))

    def lr_at(step):  # kiln::schedule::cosine
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        t = min(1.0, (step - a.warmup) / max(1, a.iters - a.warmup))
        return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))

    def amp():
        return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.autocast)

    windows = val[: (len(val) // (T + 1)) * (T + 1)].view(-1, T + 1)[: a.eval_windows].to(dev)

    @torch.no_grad()
    def val_loss():
        model.eval()
        total = 0.0
        for w in windows.split(8):
            with amp():
                logits = model(w[:, :T])
                loss = F.cross_entropy(logits.reshape(-1, 256), w[:, 1:].reshape(-1))
            total += loss.float().item() * len(w)
        model.train()
        return total / len(windows)

    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    t0 = time.perf_counter()
    t_rate, rate_start, last_val = None, None, float("nan")
    for it in range(a.iters):
        if it == 10:
            sync()
            t_rate, rate_start = time.perf_counter(), it
        ix = torch.randint(0, len(train) - T, (B,))
        xy = torch.stack([train[i : i + T + 1] for i in ix]).to(dev, non_blocking=True)
        for g in opt.param_groups:
            g["lr"] = lr_at(it)
        with amp():
            logits = model(xy[:, :T])
            loss = F.cross_entropy(logits.reshape(-1, 256), xy[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        if (it + 1) % a.eval_interval == 0 or it + 1 == a.iters:
            last_val = val_loss()
            print(f"iter {it + 1}: train_loss {loss.item():.4f} val_loss {last_val:.4f}", flush=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": it + 1}, a.out)
    sync()
    end = time.perf_counter()
    rate = (a.iters - rate_start) * B * T / (end - t_rate) if rate_start is not None else float("nan")
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"val_loss={last_val:.4f} train_tokens_per_s={rate:.0f} train_time_s={end - t0:.2f} "
          f"peak_rss_mb={rss_mb:.1f}")


if __name__ == "__main__":
    main()
