#!/usr/bin/env python3
"""The PyTorch baseline of `kiln-mnist train` (docs/benchmarks.md, docs/cuda.md).

Same models (examples/mnist/model.cpp: fc 784-500-10 with ReLU; cnn conv 3x3
1->8 pad 1, ReLU, max-pool 2, conv 3x3 8->16 pad 1, ReLU, max-pool 2, dense
784->10; PyTorch's default init, as kiln's nn modules), same recipe (AdamW lr
1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay; logical batch 1000 as two
physical batches of 500 whose mean losses are averaged; the last 5% of the
training set held out and evaluated after every epoch; shuffled every epoch),
eager mode. train_time_s counts the epochs (validation included), not the
loading, like kiln-mnist's.

  python3 bench/mnist_pytorch.py --model fc|cnn --data DIR [--device cuda] [--epochs 30]

DIR holds the four MNIST idx files, plain or gzipped (scripts/get-mnist.sh).
Prints `test_loss=... test_acc=...% train_time_s=...` like kiln-mnist.
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(folder, name):
    for path, opener in ((os.path.join(folder, name), open), (os.path.join(folder, name + ".gz"), gzip.open)):
        if os.path.exists(path):
            with opener(path, "rb") as f:
                data = f.read()
            ndim = data[3]
            dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
            return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    raise SystemExit(f"{folder}: no {name}; run bash scripts/get-mnist.sh")


class Fc(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(784, 500), nn.Linear(500, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.view(x.shape[0], 784))))


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.dense = nn.Linear(784, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.conv1(x.view(x.shape[0], 1, 28, 28))), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        return self.dense(h.reshape(x.shape[0], 784))


def evaluate(model, x, y, batch=500):
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            out = model(x[i : i + batch])
            loss += F.cross_entropy(out, y[i : i + batch], reduction="sum").item()
            correct += (out.argmax(1) == y[i : i + batch]).sum().item()
    model.train()
    return loss / x.shape[0], 100.0 * correct / x.shape[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["fc", "cnn"], required=True)
    p.add_argument("--data", default="data/mnist")
    p.add_argument("--device", default="cpu")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)

    def tensors(prefix):
        x = torch.from_numpy(read_idx(a.data, f"{prefix}-images-idx3-ubyte").copy()).float().div_(255.0)
        y = torch.from_numpy(read_idx(a.data, f"{prefix}-labels-idx1-ubyte").astype(np.int64))
        return x.reshape(-1, 784).to(dev), y.to(dev)

    train_x, train_y = tensors("train")
    test_x, test_y = tensors("t10k")
    n_val = int(round(0.05 * train_x.shape[0]))
    n_fit = train_x.shape[0] - n_val
    val_x, val_y = train_x[n_fit:], train_y[n_fit:]
    fit_x, fit_y = train_x[:n_fit], train_y[:n_fit]

    model = (Fc() if a.model == "fc" else Cnn()).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    logical, physical = 1000, 500
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    sync()
    t0 = time.perf_counter()
    for epoch in range(a.epochs):
        perm = torch.randperm(n_fit, device=dev)
        for s in range(0, n_fit - logical + 1, logical):
            opt.zero_grad(set_to_none=True)
            for m in range(0, logical, physical):
                idx = perm[s + m : s + m + physical]
                loss = F.cross_entropy(model(fit_x[idx]), fit_y[idx]) * (physical / logical)
                loss.backward()
            opt.step()
        val_loss, val_acc = evaluate(model, val_x, val_y)
    sync()
    train_s = time.perf_counter() - t0
    test_loss, test_acc = evaluate(model, test_x, test_y)
    print(f"pytorch {torch.__version__} {a.model} on {dev}: val_acc={val_acc:.2f}% "
          f"test_loss={test_loss:.4f} test_acc={test_acc:.2f}% train_time_s={train_s:.2f}")


if __name__ == "__main__":
    main()
