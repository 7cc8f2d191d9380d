"""Independent NumPy references for the tests: softmax attention in float64,
RoPE, state merging and the bfloat16 / float8 bit formats. Nothing here calls
pagedattn."""

import numpy as np


def attention(q, k, v, scale, *, causal=True, window_left=-1, softcap=0.0,
              alibi_slopes=None, sinks=None):
    """One sequence. q [n, Hq, D] are the last n positions of the L keys
    k [L, Hkv, D], v [L, Hkv, Dv]; returns [n, Hq, Dv] float64. window_left W:
    the query at p sees keys [p - W, p]. sinks [Hq]: a logit in the
    denominator only."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    n, hq, _ = q.shape
    length, hkv, _ = k.shape
    group = hq // hkv
    out = np.zeros((n, hq, v.shape[2]))
    for h in range(hq):
        kh, vh = k[:, h // group], v[:, h // group]
        for i in range(n):
            p = length - n + i
            s = (kh @ q[i, h]) * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            if alibi_slopes is not None:
                s = s + alibi_slopes[h] * (np.arange(length) - p)
            visible = np.ones(length, bool)
            if causal:
                visible &= np.arange(length) <= p
            if window_left >= 0:
                visible &= np.arange(length) >= p - window_left
            s = np.where(visible, s, -np.inf)
            m = s.max() if visible.any() else 0.0
            if sinks is not None:
                m = max(m, sinks[h])
            w = np.exp(s - m)
            denom = w.sum() + (np.exp(sinks[h] - m) if sinks is not None else 0.0)
            if denom > 0:
                out[i, h] = (w @ vh) / denom
    return out


def rope(x, positions, theta=10000.0, scale=1.0, interleaved=False, rotary_dim=None):
    """Rotates x [T, H, D] (float64 copy), token i at positions[i]; pairs are
    (t, t + R/2) (half split) or (2t, 2t + 1) (interleaved)."""
    x = np.array(x, np.float64)
    r = rotary_dim or x.shape[2]
    half = r // 2
    inv = scale / theta ** (2.0 * np.arange(half) / r)
    ang = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if interleaved:
        a, b = x[..., 0:r:2].copy(), x[..., 1:r:2].copy()
        x[..., 0:r:2], x[..., 1:r:2] = a * cos - b * sin, b * cos + a * sin
    else:
        a, b = x[..., :half].copy(), x[..., half:r].copy()
        x[..., :half], x[..., half:r] = a * cos - b * sin, b * cos + a * sin
    return x


def merge(v_a, s_a, v_b, s_b):
    """Merged state of two (v, lse) pairs; -inf lse is an empty state."""
    v_a, s_a, v_b, s_b = (np.asarray(a, np.float64) for a in (v_a, s_a, v_b, s_b))
    m = np.maximum(s_a, s_b)
    m = np.where(np.isfinite(m), m, 0.0)
    wa, wb = np.exp(s_a - m), np.exp(s_b - m)
    tot = wa + wb
    safe = np.where(tot > 0, tot, 1.0)
    v = (wa[..., None] * v_a + wb[..., None] * v_b) / safe[..., None]
    s = np.where(tot > 0, m + np.log(safe), -np.inf)
    return v, s


def bf16_bits(x):
    """float32 -> bfloat16 bits (uint16), round to nearest even."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def fp8_value(bits, fmt):
    """Decodes float8 bits: fmt "e4m3fn" (bias 7, no inf) or "e5m2" (bias 15)."""
    bits = np.asarray(bits, np.uint8).astype(np.int64)
    mant_bits, bias = (3, 7) if fmt == "e4m3fn" else (2, 15)
    sign = np.where(bits & 0x80, -1.0, 1.0)
    exp = (bits & 0x7F) >> mant_bits
    mant = bits & ((1 << mant_bits) - 1)
    normal = (1 + mant / 2.0 ** mant_bits) * 2.0 ** (exp - bias)
    sub = mant / 2.0 ** mant_bits * 2.0 ** (1 - bias)
    val = np.where(exp == 0, sub, normal)
    if fmt == "e4m3fn":
        val = np.where((bits & 0x7F) == 0x7F, np.nan, val)
    else:
        val = np.where(exp == 31, np.where(mant == 0, np.inf, np.nan), val)
    return sign * val


def fp8_bits(x, fmt):
    """float -> nearest float8 bits (saturating), by search over all 256 codes."""
    codes = np.arange(256, dtype=np.uint8)
    vals = fp8_value(codes, fmt)
    ok = np.isfinite(vals)
    x = np.asarray(x, np.float64)
    # ties are rare with randn data; the tests compare values with a tolerance
    idx = np.abs(x.reshape(-1, 1) - np.where(ok, vals, np.inf)[None, :]).argmin(axis=1)
    return codes[idx].reshape(x.shape)
