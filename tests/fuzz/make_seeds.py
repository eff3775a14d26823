#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (corpus/safetensors, corpus/gguf):
small valid files built from the specs, covering every dtype and value type.
The files are committed; rerun this only to change them:
    python3 tests/fuzz/make_seeds.py"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(folder, name, data):
    d = os.path.join(HERE, "corpus", folder)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors: u64 header length, JSON padded to 8 with spaces, data ----
def safetensors(entries, metadata=None):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, payload in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


write("safetensors", "empty.safetensors", safetensors([]))
write("safetensors", "torch_layout.safetensors", safetensors(
    [("z.weight", "F32", [2, 2], struct.pack("<4f", 1.5, -2, 0.25, 3)),
     ("m.idx", "I32", [3], struct.pack("<3i", 7, -1, 2**31 - 1)),
     ("a.bias", "F16", [2], struct.pack("<2H", 0x3C00, 0xC000))], {"format": "pt"}))
BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6,
        "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
        "F64": 64, "I64": 64, "U64": 64, "C64": 64}
write("safetensors", "every_dtype.safetensors", safetensors(
    [("t_" + k, k, [4], bytes(range(4 * b // 8))) for k, b in BITS.items()]))
write("safetensors", "zero_size_and_scalar.safetensors", safetensors(
    [("e", "F32", [0, 3], b""), ("s", "F32", [], struct.pack("<f", 2)), ("x", "BF16", [1, 1, 1, 2], b"\x80\x3f\x00\x40")],
    {"a": "1", "b": ""}))

# ---- GGUF v3: header, metadata, tensor infos (dims innermost first), data ----
def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(kvs, tensors, align=32):
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, typ, payload in kvs:
        out += gstr(key) + struct.pack("<I", typ) + payload
    offset, data = 0, b""
    for name, ggml_type, dims, payload in tensors:
        out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ggml_type, offset)
        pad = (align - len(payload) % align) % align
        data += payload + b"\0" * pad
        offset += len(payload) + pad
    out += b"\0" * ((align - len(out) % align) % align)
    return out + data


write("gguf", "empty.gguf", gguf([], []))
write("gguf", "metadata.gguf", gguf(
    [("u8", 0, b"\x07"), ("i32", 5, struct.pack("<i", -3)), ("f64", 12, struct.pack("<d", 0.5)),
     ("b", 7, b"\x01"), ("s", 8, gstr("hello")), ("general.alignment", 4, struct.pack("<I", 16)),
     ("ints", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, 2, 3)),
     ("strs", 9, struct.pack("<IQ", 8, 2) + gstr("a") + gstr("")),
     ("nested", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 2, 2) + struct.pack("<2H", 4, 5))],
    [("w", 0, [3, 2], struct.pack("<6f", *range(6)))], align=16))
write("gguf", "tensors.gguf", gguf(
    [("kiln.opt.step", 11, struct.pack("<q", 12))],
    [("f32", 0, [4], struct.pack("<4f", 1, 2, 3, 4)), ("f16", 1, [2, 1], struct.pack("<2H", 0x3C00, 0x4000)),
     ("i32", 26, [1, 1, 3], struct.pack("<3i", -1, 0, 1)), ("bf16", 30, [2], struct.pack("<2H", 0x3F80, 0)),
     ("zero", 0, [0, 3], b"")]))
# ggml's block-quantized types: Q8_0 (f16 scale, 32 int8) and Q4_0 (f16 scale, 16 bytes of nibbles).
write("gguf", "quantized.gguf", gguf(
    [("general.architecture", 8, gstr("llama"))],
    [("q8", 8, [32, 2], (struct.pack("<H", 0x3C00) + bytes(range(32))) * 2),
     ("q4", 2, [64], (struct.pack("<H", 0x3800) + bytes(range(0, 256, 16))) * 2)]))
# The other block types of kiln/quant_types.def, one tensor each of two blocks
# (type id, values per block, bytes per block); the bytes are a fixed pattern.
BLOCK_TYPES = {"q4_1": (3, 32, 20), "q5_0": (6, 32, 22), "q5_1": (7, 32, 24), "q2_k": (10, 256, 84),
               "q3_k": (11, 256, 110), "q4_k": (12, 256, 144), "q5_k": (13, 256, 176), "q6_k": (14, 256, 210)}
write("gguf", "block_types.gguf", gguf(
    [("general.architecture", 8, gstr("llama"))],
    [(name, tid, [qk, 2], bytes((i * 37 + 11) % 256 for i in range(2 * size)))
     for name, (tid, qk, size) in BLOCK_TYPES.items()]))
