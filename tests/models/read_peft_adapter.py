#!/usr/bin/python3
"""Reads a LoRA adapter directory as a PEFT-layout reader does and checks it
against a base fixture: the config keys and values PEFT's LoraConfig needs,
every tensor named "base_model.model.<HF module path>.lora_A.weight" /
".lora_B.weight" for exactly the layers target_modules matches (PEFT's rule),
shapes [r, in] / [out, r]; then computes the logits of base + adapter with the
hand-written LoRA reference (make_lora_fixtures.py) and compares them with a
file of logits (F32 "logits" and I32 "input_ids" in a safetensors file).

    read_peft_adapter.py ADAPTER_DIR BASE_FIXTURE LOGITS_FILE

Exit status 0 when everything holds; otherwise the first problem is printed.
Used by tests/models/test_lora_files.cpp (skipped where torch is missing).
"""
import json
import os
import re
import sys

import torch

sys.dont_write_bytecode = True  # nothing written next to the sources
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402
import make_lora_fixtures as mlf  # noqa: E402

torch.set_default_dtype(torch.float64)


def main(adapter_dir, base_name, logits_file):
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        cfg = json.load(f)
    for key in ("peft_type", "r", "lora_alpha", "target_modules", "lora_dropout", "bias",
                "use_rslora", "base_model_name_or_path", "fan_in_fan_out", "task_type"):
        assert key in cfg, f"adapter_config.json lacks '{key}'"
    assert cfg["peft_type"] == "LORA" and cfg["bias"] == "none", cfg
    assert isinstance(cfg["r"], int) and cfg["r"] > 0, cfg["r"]
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scaling = alpha / r ** 0.5 if cfg["use_rslora"] else alpha / r

    base_cfg, base = mlf.base_params(base_name)
    gpt2 = base_cfg["model_type"] == "gpt2"
    layers = mlf.gpt2_layers(base_cfg) if gpt2 else mlf.llama_layers(base_cfg)
    hf = (lambda n: "transformer." + n) if gpt2 else (lambda n: n)
    assert cfg["fan_in_fan_out"] == gpt2, "fan_in_fan_out must say whether the layers are Conv1D"
    tensors = mlf.read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    pattern = re.compile(r"base_model\.model\.(.+)\.lora_([AB])\.weight")
    for name in tensors:
        assert pattern.fullmatch(name), f"tensor name '{name}' is not PEFT's"
    adapter = {}
    for lname, (fan_in, fan_out) in layers.items():
        a = f"base_model.model.{hf(lname)}.lora_A.weight"
        b = f"base_model.model.{hf(lname)}.lora_B.weight"
        if not mlf.matches(cfg["target_modules"], hf(lname)):
            assert a not in tensors and b not in tensors, f"{lname} is not a target"
            continue
        assert a in tensors and b in tensors, f"{lname} is a target but has no tensors"
        assert list(tensors[a].shape) == [r, fan_in], (a, tensors[a].shape)
        assert list(tensors[b].shape) == [fan_out, r], (b, tensors[b].shape)
        adapter[lname] = (tensors[a], tensors[b])
    assert len(tensors) == 2 * len(adapter), "tensors beyond the targets' lora_A/lora_B"

    want = mlf.read_safetensors(logits_file)
    ids = want["input_ids"].to(torch.int64)
    forward = mf.gpt2_forward if gpt2 else mf.llama_forward
    with torch.no_grad():
        logits = forward(base_cfg, base, ids, mlf.lora_term(adapter, scaling))
    err = mf.rel_diff(want["logits"], logits)
    assert err < 1e-4, f"logits differ from the reference's: relative error {err:.3g}"
    print(f"{adapter_dir}: {len(adapter)} layers in PEFT's layout, logits match ({err:.2g})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(*sys.argv[1:]))
    except AssertionError as e:
        print(f"read_peft_adapter: {e}")
        sys.exit(1)
