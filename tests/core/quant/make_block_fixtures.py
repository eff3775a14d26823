#!/usr/bin/env python3
"""Writes the fixtures of the block formats Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K,
Q5_K and Q6_K (tests/core/quant/blocks/): one input of f32 rows, and for each
type the bytes ggml's reference quantizer (quantize_row_<type>_ref in
ggml-quants.c, no importance matrix) makes of it and the values its
dequantizer (dequantize_row_<type>) gives back. The formulas are re-implemented
here in numpy, one f32 operation at a time in ggml's order (the k-quant scale
searches compare errors, so every rounding must match). kiln's quantize_row /
dequantize_row must match them byte for byte and bit for bit
(tests/core/test_quant_blocks.cpp).

Files (little-endian): input.f32 (the rows, kRows x 256 f32), <type>.blocks
(the quantized bytes), <type>.f32 (the dequantized values).

Run from the repository root with a Python that has numpy:
    python3 tests/core/quant/make_block_fixtures.py
"""
import os
import struct

import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
GROUP_MAX_EPS = F32(1e-15)
QK_K = 256


# ---- scalar helpers: every value is an np.float32, every operation f32 ----

def f16_bytes(v):
    return np.float16(F32(v)).tobytes()


def f16_value(b, off):
    return F32(np.frombuffer(bytes(b[off:off + 2]), dtype=np.float16)[0])


def nearest_int(v):
    # ggml: add 1.5 * 2^23 in f32 and read the low mantissa bits.
    s = F32(F32(v) + F32(12582912.0))
    bits = int(np.array([s], dtype=F32).view(np.uint32)[0])
    return (bits & 0x007FFFFF) - 0x00400000


def trunc_int(v):
    return int(np.trunc(F32(v)))


def clamp(v, lo, hi):
    return max(lo, min(hi, v))


def signed_absmax(x):
    amax, mx = F32(0), F32(0)
    for v in x:
        if abs(v) > amax:
            amax, mx = F32(abs(v)), v
    return mx, amax


# ---- 32-value formats ----

def q4_1_block(x):
    mn, mx = FLT_MAX, -FLT_MAX
    for v in x:
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    d = F32(F32(mx - mn) / F32(15))
    inv = F32(F32(1) / d) if d != 0 else F32(0)
    q = [min(15, trunc_int(F32(F32(F32(v - mn) * inv) + F32(0.5)))) for v in x]
    return f16_bytes(d) + f16_bytes(mn) + bytes(q[j] | (q[j + 16] << 4) for j in range(16))


def pack_5bit(q):
    qh = 0
    for j in range(32):
        qh |= ((q[j] >> 4) & 1) << j
    return struct.pack("<I", qh) + bytes((q[j] & 15) | ((q[j + 16] & 15) << 4) for j in range(16))


def q5_0_block(x):
    mx, _ = signed_absmax(x)
    d = F32(mx / F32(-16))
    inv = F32(F32(1) / d) if d != 0 else F32(0)
    q = [min(31, trunc_int(F32(F32(v * inv) + F32(16.5)))) for v in x]
    return f16_bytes(d) + pack_5bit(q)


def q5_1_block(x):
    mn, mx = FLT_MAX, -FLT_MAX
    for v in x:
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    d = F32(F32(mx - mn) / F32(31))
    inv = F32(F32(1) / d) if d != 0 else F32(0)
    q = [trunc_int(F32(F32(F32(v - mn) * inv) + F32(0.5))) for v in x]
    return f16_bytes(d) + f16_bytes(mn) + pack_5bit(q)


def unpack_5bit(b, off):
    qh = struct.unpack("<I", bytes(b[off:off + 4]))[0]
    qs = b[off + 4:off + 20]
    lo = [(qs[j] & 15) | (((qh >> j) & 1) << 4) for j in range(16)]
    hi = [(qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4) for j in range(16)]
    return lo + hi


def q4_1_values(b):
    d, m = f16_value(b, 0), f16_value(b, 2)
    q = [b[4 + j] & 15 for j in range(16)] + [b[4 + j] >> 4 for j in range(16)]
    return [F32(F32(F32(v) * d) + m) for v in q]


def q5_0_values(b):
    d = f16_value(b, 0)
    return [F32(F32(v - 16) * d) for v in unpack_5bit(b, 2)]


def q5_1_values(b):
    d, m = f16_value(b, 0), f16_value(b, 2)
    return [F32(F32(F32(v) * d) + m) for v in unpack_5bit(b, 4)]


# ---- the k-quant scale searches ----

def make_qx_quants(x, nmax):
    """Symmetric, weights x^2, 18 trial scales (rmse_type 1). -> (scale, L)."""
    n = len(x)
    mx, amax = signed_absmax(x)
    if amax < GROUP_MAX_EPS:
        return F32(0), [0] * n
    iscale = F32(F32(-nmax) / mx)
    L = [0] * n
    sumlx = suml2 = F32(0)
    for i in range(n):
        l = clamp(nearest_int(F32(iscale * x[i])), -nmax, nmax - 1)
        L[i] = l + nmax
        w = F32(x[i] * x[i])
        sumlx = F32(sumlx + F32(F32(w * x[i]) * F32(l)))
        suml2 = F32(suml2 + F32(F32(w * F32(l)) * F32(l)))
    scale = F32(sumlx / suml2) if suml2 != 0 else F32(0)
    best = F32(scale * sumlx)
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = F32(-F32(F32(nmax) + F32(F32(0.1) * F32(step))) / mx)
        sumlx = suml2 = F32(0)
        for i in range(n):
            l = clamp(nearest_int(F32(iscale * x[i])), -nmax, nmax - 1)
            w = F32(x[i] * x[i])
            sumlx = F32(sumlx + F32(F32(w * x[i]) * F32(l)))
            suml2 = F32(suml2 + F32(F32(w * F32(l)) * F32(l)))
        if suml2 > 0 and F32(sumlx * sumlx) > F32(best * suml2):
            L = [nmax + clamp(nearest_int(F32(iscale * v)), -nmax, nmax - 1) for v in x]
            scale = F32(sumlx / suml2)
            best = F32(scale * sumlx)
    return scale, L


def make_q3_quants(x, nmax):
    """Symmetric, weights x^2, then moves single quants while the fit improves."""
    n = len(x)
    mx, amax = signed_absmax(x)
    if amax < GROUP_MAX_EPS:
        return F32(0), [0] * n
    iscale = F32(F32(-nmax) / mx)
    L = [0] * n
    sumlx = suml2 = F32(0)
    for i in range(n):
        l = clamp(nearest_int(F32(iscale * x[i])), -nmax, nmax - 1)
        L[i] = l
        w = F32(x[i] * x[i])
        sumlx = F32(sumlx + F32(F32(w * x[i]) * F32(l)))
        suml2 = F32(suml2 + F32(F32(w * F32(l)) * F32(l)))
    for _ in range(5):
        changed = 0
        for i in range(n):
            w = F32(x[i] * x[i])
            slx = F32(sumlx - F32(F32(w * x[i]) * F32(L[i])))
            if slx > 0:
                sl2 = F32(suml2 - F32(F32(w * F32(L[i])) * F32(L[i])))
                new_l = clamp(nearest_int(F32(F32(x[i] * sl2) / slx)), -nmax, nmax - 1)
                if new_l != L[i]:
                    slx = F32(slx + F32(F32(w * x[i]) * F32(new_l)))
                    sl2 = F32(sl2 + F32(F32(w * F32(new_l)) * F32(new_l)))
                    if sl2 > 0 and F32(F32(slx * slx) * suml2) > F32(F32(sumlx * sumlx) * sl2):
                        L[i], sumlx, suml2 = new_l, slx, sl2
                        changed += 1
        if not changed:
            break
    L = [l + nmax for l in L]
    return (F32(sumlx / suml2) if suml2 > 0 else F32(0)), L


def make_qkx2_quants(x, weights, nmax, rmin, rdelta, nstep, use_mad):
    """Asymmetric x ~ scale * L - the_min, weighted errors. -> (scale, the_min, L)."""
    n = len(x)
    mn = mx = x[0]
    sum_w = weights[0]
    sum_x = F32(sum_w * x[0])
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        sum_w = F32(sum_w + weights[i])
        sum_x = F32(sum_x + F32(weights[i] * x[i]))
    if mn > 0:
        mn = F32(0)
    if mx == mn:
        return F32(0), F32(-mn), [0] * n

    def err(dv):
        return F32(abs(dv)) if use_mad else F32(dv * dv)

    iscale = F32(F32(nmax) / F32(mx - mn))
    scale = F32(F32(1) / iscale)
    best_error = F32(0)
    L = [0] * n
    for i in range(n):
        L[i] = clamp(nearest_int(F32(iscale * F32(x[i] - mn))), 0, nmax)
        diff = F32(F32(F32(scale * F32(L[i])) + mn) - x[i])
        best_error = F32(best_error + F32(weights[i] * err(diff)))
    for step in range(nstep + 1):
        iscale = F32(F32(F32(rmin + F32(rdelta * F32(step))) + F32(nmax)) / F32(mx - mn))
        aux = [0] * n
        sum_l = sum_l2 = sum_xl = F32(0)
        for i in range(n):
            l = clamp(nearest_int(F32(iscale * F32(x[i] - mn))), 0, nmax)
            aux[i] = l
            w = weights[i]
            sum_l = F32(sum_l + F32(w * F32(l)))
            sum_l2 = F32(sum_l2 + F32(F32(w * F32(l)) * F32(l)))
            sum_xl = F32(sum_xl + F32(F32(w * F32(l)) * x[i]))
        D = F32(F32(sum_w * sum_l2) - F32(sum_l * sum_l))
        if D > 0:
            this_scale = F32(F32(F32(sum_w * sum_xl) - F32(sum_x * sum_l)) / D)
            this_min = F32(F32(F32(sum_l2 * sum_x) - F32(sum_l * sum_xl)) / D)
            if this_min > 0:
                this_min = F32(0)
                this_scale = F32(sum_xl / sum_l2)
            cur_error = F32(0)
            for i in range(n):
                diff = F32(F32(F32(this_scale * F32(aux[i])) + this_min) - x[i])
                cur_error = F32(cur_error + F32(weights[i] * err(diff)))
            if cur_error < best_error:
                L, best_error, scale, mn = aux, cur_error, this_scale, this_min
    return scale, F32(-mn), L


def pack_2bit(L):
    out = bytearray(64)
    for j in range(0, QK_K, 128):
        for l in range(32):
            out[j // 4 + l] = L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6)
    return bytes(out)


def unpack_2bit(qs, v):
    return (qs[v // 128 * 32 + v % 32] >> (2 * (v % 128 // 32))) & 3


# ---- Q2_K: scales[16] qs[64] d dmin ----

def q2_k_block(x):
    L = [0] * QK_K
    scales, mins = [], []
    max_scale = max_min = F32(0)
    for j in range(16):
        g = x[16 * j:16 * j + 16]
        weights = [F32(abs(v)) for v in g]
        s, m, Lg = make_qkx2_quants(g, weights, 3, F32(-0.5), F32(0.1), 15, True)
        L[16 * j:16 * j + 16] = Lg
        scales.append(s)
        mins.append(m)
        if s > max_scale:
            max_scale = s
        if m > max_min:
            max_min = m
    sc = [0] * 16
    d = dmin = F32(0)
    if max_scale > 0:
        iscale = F32(F32(15) / max_scale)
        sc = [nearest_int(F32(iscale * s)) & 0xFF for s in scales]
        d = F32(max_scale / F32(15))
    if max_min > 0:
        iscale = F32(F32(15) / max_min)
        sc = [(sc[j] | (nearest_int(F32(iscale * mins[j])) << 4)) & 0xFF for j in range(16)]
        dmin = F32(max_min / F32(15))
    head = f16_bytes(d) + f16_bytes(dmin)
    d_all, dmin_all = f16_value(head, 0), f16_value(head, 2)
    for j in range(16):
        dd = F32(d_all * F32(sc[j] & 15))
        if dd == 0:
            continue
        dm = F32(dmin_all * F32(sc[j] >> 4))
        for i in range(16):
            L[16 * j + i] = clamp(nearest_int(F32(F32(x[16 * j + i] + dm) / dd)), 0, 3)
    return bytes(sc) + pack_2bit(L) + head


def q2_k_values(b):
    d, dmin = f16_value(b, 80), f16_value(b, 82)
    out = []
    for v in range(QK_K):
        s = b[v // 16]
        out.append(F32(F32(F32(d * F32(s & 15)) * F32(unpack_2bit(b[16:80], v))) - F32(dmin * F32(s >> 4))))
    return out


# ---- Q3_K: hmask[32] qs[64] scales[12] d ----

def q3_scale(sc, j):
    lo = sc[j] & 15 if j < 8 else sc[j - 8] >> 4
    return lo | (((sc[8 + j % 4] >> (2 * (j // 4))) & 3) << 4)


def int8(v):
    v &= 0xFF
    return v - 256 if v > 127 else v


def q3_k_block(x):
    L = [0] * QK_K
    scales = []
    max_scale = amax = F32(0)
    for j in range(16):
        s, Lg = make_q3_quants(x[16 * j:16 * j + 16], 4)
        L[16 * j:16 * j + 16] = Lg
        scales.append(s)
        if abs(s) > amax:
            amax, max_scale = F32(abs(s)), s
    sc = [0] * 12
    d = F32(0)
    if max_scale != 0:
        iscale = F32(F32(-32) / max_scale)
        for j in range(16):
            l = clamp(int8(nearest_int(F32(iscale * scales[j]))), -32, 31) + 32
            if j < 8:
                sc[j] = l & 15
            else:
                sc[j - 8] |= (l & 15) << 4
            sc[j % 4 + 8] |= (l >> 4) << (2 * (j // 4))
        d = F32(F32(1) / iscale)
    dbytes = f16_bytes(d)
    d_all = f16_value(dbytes, 0)
    for j in range(16):
        dd = F32(d_all * F32(q3_scale(sc, j) - 32))
        if dd == 0:
            continue
        for i in range(16):
            L[16 * j + i] = clamp(nearest_int(F32(x[16 * j + i] / dd)), -4, 3) + 4
    hmask = bytearray(32)
    low = [0] * QK_K
    for v in range(QK_K):
        q = L[v]
        if q > 3:
            hmask[v % 32] |= 1 << (v // 32)
            q -= 4
        low[v] = q
    return bytes(hmask) + pack_2bit(low) + bytes(sc) + dbytes


def q3_k_values(b):
    d = f16_value(b, 108)
    out = []
    for v in range(QK_K):
        dl = F32(d * F32(q3_scale(b[96:108], v // 16) - 32))
        high = (b[v % 32] >> (v // 32)) & 1
        out.append(F32(dl * F32(unpack_2bit(b[32:96], v) - (0 if high else 4))))
    return out


# ---- Q4_K / Q5_K: d dmin scales[12] (qh[32]) qs[128] ----

def scale_min_k4(j, q):
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def k4_scales_and_quants(x, nmax, rmin, nstep):
    L = [0] * QK_K
    scales, mins = [], []
    max_scale = max_min = F32(0)
    for j in range(8):
        g = x[32 * j:32 * j + 32]
        sum_x2 = F32(0)
        for v in g:
            sum_x2 = F32(sum_x2 + F32(v * v))
        av_x = F32(np.sqrt(F32(sum_x2 / F32(32))))
        weights = [F32(av_x + F32(abs(v))) for v in g]
        s, m, Lg = make_qkx2_quants(g, weights, nmax, rmin, F32(0.1), nstep, False)
        L[32 * j:32 * j + 32] = Lg
        scales.append(s)
        mins.append(m)
        if s > max_scale:
            max_scale = s
        if m > max_min:
            max_min = m
    inv_scale = F32(F32(63) / max_scale) if max_scale > 0 else F32(0)
    inv_min = F32(F32(63) / max_min) if max_min > 0 else F32(0)
    sc = [0] * 12
    for j in range(8):
        ls = min(63, nearest_int(F32(inv_scale * scales[j])) & 0xFF)
        lm = min(63, nearest_int(F32(inv_min * mins[j])) & 0xFF)
        if j < 4:
            sc[j], sc[j + 4] = ls, lm
        else:
            sc[j + 4] = (ls & 15) | ((lm & 15) << 4)
            sc[j - 4] |= (ls >> 4) << 6
            sc[j] |= (lm >> 4) << 6
    head = f16_bytes(F32(max_scale / F32(63))) + f16_bytes(F32(max_min / F32(63)))
    d_all, dmin_all = f16_value(head, 0), f16_value(head, 2)
    for j in range(8):
        s, m = scale_min_k4(j, sc)
        dd = F32(d_all * F32(s))
        if dd == 0:
            continue
        dm = F32(dmin_all * F32(m))
        for i in range(32):
            L[32 * j + i] = clamp(nearest_int(F32(F32(x[32 * j + i] + dm) / dd)), 0, nmax)
    return head + bytes(sc), L


def low_nibbles(L):
    out = bytearray(128)
    for j in range(0, QK_K, 64):
        for l in range(32):
            out[j // 2 + l] = (L[j + l] & 15) | ((L[j + l + 32] & 15) << 4)
    return bytes(out)


def q4_k_block(x):
    head, L = k4_scales_and_quants(x, 15, F32(-1.0), 20)
    return head + low_nibbles(L)


def q5_k_block(x):
    head, L = k4_scales_and_quants(x, 31, F32(-0.5), 15)
    qh = bytearray(32)
    for v in range(QK_K):
        if L[v] > 15:
            qh[v % 32] |= 1 << (v // 32)
    return head + bytes(qh) + low_nibbles(L)


def low_nibble(qs, v):
    byte = qs[v // 64 * 32 + v % 32]
    return byte & 15 if v % 64 < 32 else byte >> 4


def q4_k_values(b):
    d, dmin = f16_value(b, 0), f16_value(b, 2)
    out = []
    for v in range(QK_K):
        s, m = scale_min_k4(v // 32, b[4:16])
        out.append(F32(F32(F32(d * F32(s)) * F32(low_nibble(b[16:144], v))) - F32(dmin * F32(m))))
    return out


def q5_k_values(b):
    d, dmin = f16_value(b, 0), f16_value(b, 2)
    out = []
    for v in range(QK_K):
        s, m = scale_min_k4(v // 32, b[4:16])
        q = low_nibble(b[48:176], v) + (16 if (b[16 + v % 32] >> (v // 32)) & 1 else 0)
        out.append(F32(F32(F32(d * F32(s)) * F32(q)) - F32(dmin * F32(m))))
    return out


# ---- Q6_K: ql[128] qh[64] scales[16] d ----

def q6_k_block(x):
    L = [0] * QK_K
    scales = []
    max_scale = max_abs = F32(0)
    for j in range(16):
        s, Lg = make_qx_quants(x[16 * j:16 * j + 16], 32)
        L[16 * j:16 * j + 16] = Lg
        scales.append(s)
        if abs(s) > max_abs:
            max_abs, max_scale = F32(abs(s)), s
    if max_abs < GROUP_MAX_EPS:
        return bytes(210)
    iscale = F32(F32(-128) / max_scale)
    dbytes = f16_bytes(F32(F32(1) / iscale))
    sc = [int8(min(127, nearest_int(F32(iscale * s)))) for s in scales]
    d_all = f16_value(dbytes, 0)
    for j in range(16):
        dd = F32(d_all * F32(sc[j]))
        if dd == 0:
            continue
        for i in range(16):
            L[16 * j + i] = clamp(nearest_int(F32(x[16 * j + i] / dd)), -32, 31) + 32
    ql, qh = bytearray(128), bytearray(64)
    for v in range(QK_K):
        half, quarter, l = v // 128, v % 128 // 32, v % 32
        ql[64 * half + 32 * (quarter & 1) + l] |= (L[v] & 15) << (4 * (quarter >> 1))
        qh[32 * half + l] |= (L[v] >> 4) << (2 * quarter)
    return bytes(ql) + bytes(qh) + bytes(s & 0xFF for s in sc) + dbytes


def q6_k_values(b):
    d = f16_value(b, 208)
    out = []
    for v in range(QK_K):
        half, quarter, l = v // 128, v % 128 // 32, v % 32
        lo = b[64 * half + 32 * (quarter & 1) + l] >> (4 * (quarter >> 1)) & 15
        hi = (b[128 + 32 * half + l] >> (2 * quarter)) & 3
        out.append(F32(F32(d * F32(int8(b[192 + v // 16]))) * F32((lo | (hi << 4)) - 32)))
    return out


TYPES = {  # name: (values per block, bytes per block, quantize block, dequantize block)
    "q4_1": (32, 20, q4_1_block, q4_1_values),
    "q5_0": (32, 22, q5_0_block, q5_0_values),
    "q5_1": (32, 24, q5_1_block, q5_1_values),
    "q2_k": (256, 84, q2_k_block, q2_k_values),
    "q3_k": (256, 110, q3_k_block, q3_k_values),
    "q4_k": (256, 144, q4_k_block, q4_k_values),
    "q5_k": (256, 176, q5_k_block, q5_k_values),
    "q6_k": (256, 210, q6_k_block, q6_k_values),
}


def rows():
    """Rows of 256 values: edge cases first, then random ones."""
    rng = np.random.default_rng(20261129)
    normal = lambda s=1.0: (rng.standard_normal(QK_K) * s).astype(F32)
    out = [
        np.zeros(QK_K, F32),                          # all zero
        np.full(QK_K, 0.75, F32),                     # constant
        np.full(QK_K, -2.5, F32),                     # constant, negative
        -np.abs(normal()),                            # negative only
        np.abs(normal()),                             # positive only
        normal(1e-5),                                 # tiny: f16-subnormal scales
        normal(3e3),                                  # huge (scales stay finite in f16)
        (np.arange(QK_K) % 32 - 16).astype(F32) * F32(0.5),  # halves: rounding ties
    ]
    spike = normal(0.01)
    spike[77] = F32(40.0)                             # one outlier
    out.append(spike)
    mixed = normal()
    mixed[:64] = 0                                    # zero groups next to non-zero ones
    mixed[128:144] = F32(1.0)
    out.append(mixed)
    out.append(rng.uniform(-1, 1, QK_K).astype(F32))
    out += [normal(s) for s in (0.02, 1.0, 7.0)]
    # Random rows of several shapes: the scale searches take many branches on
    # them (a fused multiply-add in kiln's code changes bytes in several of them).
    for i in range(16):
        r = normal(10 ** rng.uniform(-3, 2))
        if i % 4 == 1:
            r = rng.standard_t(2, QK_K).astype(F32)              # heavy tails
        if i % 4 == 2:
            r[rng.integers(0, QK_K, 160)] = 0                     # sparse
        if i % 4 == 3:
            r = rng.uniform(-0.5, 2.0, QK_K).astype(F32)          # mostly positive
        out.append(r)
    return [r.astype(F32) for r in out]


def main():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "blocks")
    os.makedirs(here, exist_ok=True)
    data = rows()
    x = np.concatenate(data)
    with open(os.path.join(here, "input.f32"), "wb") as f:
        f.write(x.astype("<f4").tobytes())
    for name, (qk, size, quantize, dequantize) in TYPES.items():
        blocks, values = b"", []
        for i in range(0, len(x), qk):
            blk = quantize([F32(v) for v in x[i:i + qk]])
            assert len(blk) == size, (name, len(blk))
            blocks += blk
            values += dequantize(blk)
        with open(os.path.join(here, name + ".blocks"), "wb") as f:
            f.write(blocks)
        with open(os.path.join(here, name + ".f32"), "wb") as f:
            f.write(np.array(values, dtype="<f4").tobytes())
        print(f"{name}: {len(x)} values -> {len(blocks)} bytes")


if __name__ == "__main__":
    main()
