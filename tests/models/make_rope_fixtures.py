#!/usr/bin/python3
"""Writes tests/models/fixtures/rope_scaling: for each case, a config.json fragment
(cases.json) and, from rope_reference.py (transformers' formulas in float64),
<case>.inv_freq, <case>.cos and <case>.sin for the case's table length
(<case>.positions), plus <case>.attention_factor, in expected.safetensors.

    /usr/bin/python3 tests/models/make_rope_fixtures.py   # Debian python3-torch
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import write_safetensors  # noqa: E402
from rope_reference import cos_sin, inv_freq_and_attention  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "rope_scaling")
HEAD_DIM = 16
BASE = {"model_type": "llama", "vocab_size": 8, "hidden_size": 32, "intermediate_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": HEAD_DIM,
        "rope_theta": 10000.0, "max_position_embeddings": 1024}
HALF = HEAD_DIM // 2

# (name, config fields over BASE, table length)
CASES = [
    ("linear", {"rope_scaling": {"type": "linear", "factor": 4.0}}, 64),
    # Dynamic NTK: a table no longer than max_position_embeddings is plain RoPE;
    # a longer one raises theta for its length.
    ("dynamic_short", {"max_position_embeddings": 32,
                       "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, 32),
    ("dynamic_long", {"max_position_embeddings": 32,
                      "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, 96),
    # YaRN over an original context of 256: the ramp spans dims 0..4.
    ("yarn", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                               "original_max_position_embeddings": 256}}, 64),
    # transformers' newer form: rope_parameters holding rope_theta, and the
    # optional fields: betas, no truncation, DeepSeek's mscale pair.
    ("yarn_parameters", {"rope_theta": None,
                         "rope_parameters": {"rope_type": "yarn", "rope_theta": 50000.0,
                                             "factor": 8.0, "original_max_position_embeddings": 128,
                                             "beta_fast": 16.0, "beta_slow": 2.0,
                                             "truncate": False, "mscale": 1.0,
                                             "mscale_all_dim": 0.5}}, 64),
    ("yarn_attention_factor", {"rope_scaling": {"rope_type": "yarn", "factor": 2.0,
                                                "attention_factor": 1.25}}, 32),
    # LongRoPE: short factors for a table within the original context, long beyond.
    ("longrope_short", {"max_position_embeddings": 256,
                        "rope_scaling": {"rope_type": "longrope",
                                         "original_max_position_embeddings": 64,
                                         "short_factor": [1.0 + 0.1 * i for i in range(HALF)],
                                         "long_factor": [1.0 + 0.7 * i for i in range(HALF)]}}, 64),
    ("longrope_long", {"max_position_embeddings": 256,
                       "rope_scaling": {"rope_type": "longrope",
                                        "original_max_position_embeddings": 64,
                                        "short_factor": [1.0 + 0.1 * i for i in range(HALF)],
                                        "long_factor": [1.0 + 0.7 * i for i in range(HALF)]}}, 80),
    ("llama3", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 64}}, 64),
]


def main():
    os.makedirs(OUT, exist_ok=True)
    cases, tensors = {}, []
    for name, fields, positions in CASES:
        cfg = dict(BASE)
        cfg.update(fields)
        cfg = {k: v for k, v in cfg.items() if v is not None}
        inv, att = inv_freq_and_attention(cfg, HEAD_DIM, positions)
        cos, sin = cos_sin(cfg, HEAD_DIM, positions)
        cases[name] = cfg
        tensors += [(name + ".inv_freq", inv), (name + ".cos", cos), (name + ".sin", sin),
                    (name + ".attention_factor", torch.tensor([att], dtype=torch.float64)),
                    (name + ".positions", torch.tensor([positions]))]
        plain = inv_freq_and_attention({**cfg, "rope_scaling": None, "rope_parameters": None},
                                       HEAD_DIM, positions)[0]
        changed = float((inv - plain).abs().max() / plain.abs().max())
        print(f"{name}: attention factor {att:.6f}, max change of inv_freq {changed:.4f}")
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(cases, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(OUT, "expected.safetensors"), tensors,
                      lambda n: "I32" if n.endswith(".positions") else "F32")


if __name__ == "__main__":
    sys.exit(main())
