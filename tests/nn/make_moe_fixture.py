#!/usr/bin/python3
"""Writes tests/nn/fixtures/moe/expected.safetensors: a small mixture-of-experts
feed-forward block (Mixtral / Qwen3-MoE semantics, written from their public
descriptions) in float64, its output and a training step's gradients, for
tests/nn/test_moe.cpp (kiln::nn::MoeFeedForward).

Block: router logits = x @ gate^T; p = softmax over all experts; the top_k
experts by p; their weights p, divided by their sum when norm_topk_prob
(Mixtral always; Qwen3-MoE per config). Expert e: down_e(silu(gate_e x) * up_e x).
Output: the weighted sum of the chosen experts' outputs. Loss: sum(y * cot)
with a fixed random cotangent, so every gradient is checked against a
non-trivial upstream gradient.

Two variants (prefix "norm." and "raw."): norm_topk_prob true and false.
Tensors per variant: x [N, H], gate [E, H], gate_exps / up_exps [E, I, H],
down_exps [E, H, I], cot [N, H], y [N, H], ids [N, k] (i32), and grad.<name>
for x, gate, gate_exps, up_exps, down_exps. All F32 (rounded from float64 for
the inputs, which are drawn as float32 first so both sides see equal values).

    /usr/bin/python3 tests/nn/make_moe_fixture.py   # Debian python3-torch
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "models"))
from make_fixtures import write_safetensors  # noqa: E402

OUT = os.path.join(HERE, "fixtures", "moe")
N, H, I, E, K = 5, 12, 8, 6, 2


def moe_forward(x, gate, gate_exps, up_exps, down_exps, top_k, norm_topk_prob):
    p = torch.softmax(x @ gate.T, dim=-1)
    w, ids = torch.topk(p, top_k, dim=-1)
    if norm_topk_prob:
        w = w / w.sum(dim=-1, keepdim=True)
    rows = []
    for n in range(x.shape[0]):
        acc = torch.zeros(x.shape[1], dtype=x.dtype)
        for j in range(top_k):
            e = int(ids[n, j])
            h = torch.nn.functional.silu(gate_exps[e] @ x[n]) * (up_exps[e] @ x[n])
            acc = acc + w[n, j] * (down_exps[e] @ h)
        rows.append(acc)
    return torch.stack(rows), ids, p


def variant(prefix, norm, seed):
    g = torch.Generator().manual_seed(seed)

    def draw(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(torch.float32).to(torch.float64)

    while True:
        t = {"x": draw(N, H), "gate": draw(E, H, scale=0.5),
             "gate_exps": draw(E, I, H, scale=0.3), "up_exps": draw(E, I, H, scale=0.3),
             "down_exps": draw(E, H, I, scale=0.3), "cot": draw(N, H)}
        p = torch.softmax(t["x"] @ t["gate"].T, dim=-1).sort(dim=-1, descending=True).values
        # No near-tie between the k-th and the next expert: float32 picks the same.
        if float((p[:, K - 1] - p[:, K]).min()) > 1e-3:
            break
    leaves = {k: v.clone().requires_grad_(True) for k, v in t.items() if k != "cot"}
    y, ids, _ = moe_forward(leaves["x"], leaves["gate"], leaves["gate_exps"], leaves["up_exps"],
                            leaves["down_exps"], K, norm)
    (y * t["cot"]).sum().backward()
    out = [(prefix + k, v) for k, v in t.items()]
    out += [(prefix + "y", y.detach()), (prefix + "ids", ids.to(torch.int32))]
    out += [(prefix + "grad." + k, v.grad) for k, v in leaves.items()]
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    tensors = variant("norm.", True, 1) + variant("raw.", False, 2)
    tensors = [(n, v if v.dtype == torch.int32 else v.to(torch.float32)) for n, v in tensors]
    write_safetensors(os.path.join(OUT, "expected.safetensors"), tensors,
                      lambda n: "I32" if n.endswith(".ids") else "F32")


if __name__ == "__main__":
    main()
