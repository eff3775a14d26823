#!/usr/bin/env python3
"""Checks the block fixtures (make_block_fixtures.py) against ggml itself: runs
ggml's quantize_row_<type>_ref and dequantize_row_<type> from a libggml-base
shared library on blocks/input.f32 and compares bytes and value bits. Not part
of the test suite (it needs a ggml build); run it when the fixtures change:

    python3 tests/core/quant/check_block_fixtures_with_ggml.py path/to/libggml-base.so

(node-llama-cpp's prebuilt packages, e.g. @node-llama-cpp/linux-x64, ship one.)
"""
import ctypes
import os
import sys

import numpy as np

BLOCK = {"q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q2_k": (256, 84),
         "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210),
         "q8_0": (32, 34), "q4_0": (32, 18)}


def ggml_name(t):
    return t[:-1] + "K" if t.endswith("_k") else t


def main():
    lib = ctypes.CDLL(sys.argv[1])
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "blocks")
    x = np.fromfile(os.path.join(here, "input.f32"), dtype="<f4")
    bad = 0
    for t, (qk, size) in BLOCK.items():
        path = os.path.join(here, t + ".blocks")
        if not os.path.exists(path):
            continue
        n = len(x)
        out = np.zeros(n // qk * size, dtype=np.uint8)
        q = getattr(lib, "quantize_row_" + ggml_name(t) + "_ref")
        q(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
        want = np.fromfile(path, dtype=np.uint8)
        vals = np.zeros(n, dtype=np.float32)
        dq = getattr(lib, "dequantize_row_" + ggml_name(t))
        dq(want.ctypes.data_as(ctypes.c_void_p), vals.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
        want_vals = np.fromfile(os.path.join(here, t + ".f32"), dtype="<f4")
        qb = np.nonzero(out != want)[0]
        vb = np.nonzero(vals.view(np.uint32) != want_vals.view(np.uint32))[0]
        print(f"{t}: bytes {'ok' if len(qb) == 0 else f'{len(qb)} differ, first at block {qb[0] // size}'}, "
              f"values {'ok' if len(vb) == 0 else f'{len(vb)} differ, first at {vb[0]}'}")
        bad += len(qb) + len(vb)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
