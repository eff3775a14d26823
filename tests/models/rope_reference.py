"""RoPE's inverse frequencies and attention factor for every scaling type of a
Llama-family config.json, written from transformers' documented behaviour
(modeling_rope_utils: the default, linear, dynamic, yarn, longrope and llama3
types) and the papers (YaRN, arXiv 2309.00071; LongRoPE, arXiv 2402.13753), in
float64. Shared by make_fixtures.py (model logits) and make_rope_fixtures.py
(the tables alone).

The scaling comes from "rope_scaling" or transformers' newer "rope_parameters"
(which may also hold rope_theta); its type from "rope_type" or the older "type".
seq_len is the length the tables are computed for: dynamic NTK raises theta for
it when it exceeds max_position_embeddings, longrope takes its long factors when
it exceeds original_max_position_embeddings (transformers decides both per
forward call from the positions; kiln computes its tables once, for its table
length, which is the seq_len given here).
"""
import math

import torch


def rope_params(cfg):
    """(scaling dict or None, theta)."""
    rs = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    theta = cfg.get("rope_theta", 10000.0)
    if rs and "rope_theta" in rs:
        theta = rs["rope_theta"]
    return rs, theta


def plain(theta, dim):
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def yarn_mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def inv_freq_and_attention(cfg, head_dim, seq_len):
    rs, theta = rope_params(cfg)
    dim = head_dim
    inv = plain(theta, dim)
    kind = (rs or {}).get("rope_type", (rs or {}).get("type", "default"))
    if kind == "default":
        return inv, 1.0
    max_pos = cfg["max_position_embeddings"]
    if kind == "linear":
        # Position interpolation: positions (equivalently frequencies) divided by factor.
        return inv / rs["factor"], 1.0
    if kind == "dynamic":
        # NTK-aware: theta grows with the sequence once it exceeds the trained length.
        L = max(seq_len, max_pos)
        f = rs["factor"]
        theta2 = theta * ((f * L / max_pos) - (f - 1)) ** (dim / (dim - 2))
        return plain(theta2, dim), 1.0
    if kind == "llama3":
        f, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        out = torch.where(wavelen > old / lo, inv / f, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (wavelen >= old / hi) & (wavelen <= old / lo)
        return torch.where(mid, (1 - smooth) * inv / f + smooth * inv, out), 1.0
    if kind == "yarn":
        orig = rs.get("original_max_position_embeddings") or max_pos
        f = rs.get("factor") or max_pos / orig
        att = rs.get("attention_factor")
        if att is None:
            m, m_all = rs.get("mscale"), rs.get("mscale_all_dim")
            att = yarn_mscale(f, m) / yarn_mscale(f, m_all) if m and m_all else yarn_mscale(f)
        beta_fast = rs.get("beta_fast") or 32
        beta_slow = rs.get("beta_slow") or 1

        def dim_for(turns):  # the dim whose wavelength fits `turns` times in the original context
            return dim * math.log(orig / (turns * 2 * math.pi)) / (2 * math.log(theta))

        low, high = dim_for(beta_fast), dim_for(beta_slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        # ramp 0: the frequency kept (extrapolated); 1: divided by factor (interpolated).
        return inv / f * ramp + inv * (1 - ramp), att
    if kind == "longrope":
        orig = rs.get("original_max_position_embeddings") or max_pos
        f = rs.get("factor") or max_pos / orig
        att = rs.get("attention_factor")
        if att is None:
            att = 1.0 if f <= 1 else math.sqrt(1 + math.log(f) / math.log(orig))
        ext = rs["long_factor"] if seq_len > orig else rs["short_factor"]
        return inv / torch.tensor(ext, dtype=torch.float64), att
    raise ValueError(f"rope type {kind}")


def cos_sin(cfg, head_dim, seq_len):
    """cos and sin [seq_len, head_dim] (HF's layout: the D/2 angles twice), times the
    attention factor."""
    inv, att = inv_freq_and_attention(cfg, head_dim, seq_len)
    ang = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos() * att, emb.sin() * att
