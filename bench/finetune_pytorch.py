#!/usr/bin/env python3
"""The PyTorch baseline of the fine-tuning figures (docs/benchmarks.md).

The model of bench/lm_pytorch.py (SmolLM2-135M's shape in plain PyTorch 1.13,
random f32 weights) trained as kiln's bench_finetune trains it:

  --mode lora  LoRA written by hand as PEFT computes it: each of q, k, v, o,
               gate, up and down gets y = W x + (alpha / r) * B(A x), A
               kaiming-uniform (a = sqrt(5)), B zero, the base weights frozen;
               AdamW over the adapters only.
  --mode full  AdamW over every weight.

Next-token cross-entropy on batch x seq windows of ids (i * 7919 + 13) mod
vocab, one untimed warm-up step, then --steps timed ones; prints tokens/s and
the process's peak RSS (which includes the interpreter and torch itself).

  OMP_WAIT_POLICY=PASSIVE python3 bench/finetune_pytorch.py --mode lora --threads 2
"""
import argparse
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from lm_pytorch import VOCAB, Llama

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraLinear(nn.Module):
    def __init__(self, base, r, alpha):
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = alpha / r

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling


def add_lora(model, r, alpha):
    for p in model.parameters():
        p.requires_grad_(False)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name in TARGETS and isinstance(child, nn.Linear):
                setattr(module, name, LoraLinear(child, r, alpha))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("lora", "full"), default="lora")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--r", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Llama(a.seq).train()
    nn.init.normal_(model.embed_tokens.weight, std=0.02)  # N(0, 1) would give huge tied logits
    if a.mode == "lora":
        add_lora(model, a.r, a.alpha)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    n = a.batch * a.seq
    ids = torch.tensor([(i * 7919 + 13) % VOCAB for i in range(n)]).view(a.batch, a.seq)
    labels = torch.tensor([((i + 1) * 7919 + 13) % VOCAB for i in range(n)])

    def step():
        logits = model(ids)
        loss = F.cross_entropy(logits.view(n, VOCAB), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss)

    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    secs = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"finetune: mode={a.mode} torch={torch.__version__} batch={a.batch} seq={a.seq} "
          f"steps={a.steps} threads={a.threads} trained_params={sum(p.numel() for p in params)} "
          f"loss={loss:.4f} step_s={secs / a.steps:.3f} tokens_per_s={a.steps * n / secs:.1f} "
          f"peak_rss_mb={rss:.1f}")


if __name__ == "__main__":
    main()
