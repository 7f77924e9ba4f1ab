"""DeepSeek-V4's quantized layouts in numpy: FP8 (e4m3, 128x128 E8M0 block scales) and MXFP4
(e2m1 codes two per byte, one E8M0 scale per 32 values), both ways.

Decoding gives the exact values (the numpy twins of src/io/quantized.cpp; the converter uses
them to write f32 GGUFs); encoding (round to nearest under power-of-two scales) lets
deepseek4_random.py write a checkpoint in the official quantized layout together with its exact
f32 twin, so a loader can be tested on a synthesised layer.
"""
import numpy as np

import deepseek4_safetensors as st


# --- decoding: the exact values ----------------------------------------------------------------

def e4m3_table():
    """The 256 float8_e4m3fn values: bias 7, no infinities, 0x7f/0xff are NaN."""
    out = np.zeros(256, np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 0x7
        if e == 0xF and m == 0x7:
            out[b] = np.nan
        elif e == 0:
            out[b] = sign * m * 2.0 ** -9  # subnormal: m/8 * 2^-6
        else:
            out[b] = sign * (1 + m / 8.0) * 2.0 ** (e - 7)
    return out


E4M3 = e4m3_table()
# e2m1 (MXFP4) codes: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (bit 3 is the sign).
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def e8m0_to_f32(bits):
    """E8M0 scale bytes -> 2^(b-127); 0xff is NaN."""
    out = np.ldexp(np.float32(1.0), bits.astype(np.int32) - 127).astype(np.float32)
    out[bits == 0xFF] = np.nan
    return out


def scale_to_f32(t, name):
    if t.dtype in ("F8_E8M0", "U8"):
        return e8m0_to_f32(t.data)
    if t.dtype == "F32":
        return t.data.astype(np.float32)
    if t.dtype == "BF16":
        return st.bf16_to_f32(t.data)
    raise ValueError(f"{name}: scale dtype {t.dtype} (supported: F8_E8M0, F32, BF16)")


def dequant_fp8(weight, scale, name, block=128):
    """e4m3 [out, in] with one scale per 128x128 block ([ceil(out/128), ceil(in/128)]); the last
    blocks are partial when a side is not a multiple of 128."""
    rows, cols = weight.shape
    s = scale_to_f32(scale, name)
    want = (-(-rows // block), -(-cols // block))
    if s.shape != want:
        raise ValueError(f"{name}: scale shape {s.shape}, expected {want} for a "
                           f"{rows}x{cols} weight in {block}x{block} blocks")
    s = np.repeat(np.repeat(s, block, 0)[:rows], block, 1)[:, :cols]
    return E4M3[weight.data] * s


def dequant_mxfp4(weight, scale, name):
    """Packed [out, in/2] (element 2i in the low nibble) with E8M0 scales [out, in/32]."""
    packed = weight.data.view(np.uint8)
    rows, half = packed.shape
    cols = half * 2
    s = scale_to_f32(scale, name)
    if cols % 32 or s.shape != (rows, cols // 32):
        raise ValueError(f"{name}: MXFP4 weight [{rows}, {half}] needs scales "
                           f"[{rows}, {cols // 32}], got {list(s.shape)}")
    codes = np.stack((packed & 0xF, packed >> 4), axis=-1).reshape(rows, cols)
    return E2M1[codes] * np.repeat(s, 32, axis=1)


def repack_mxfp4(weight, scale):
    """Lossless: ggml's block_mxfp4 is one E8M0 byte then 16 bytes, byte j holding element j
    (low nibble) and element j+16 (high nibble); conversion/base.py's repack_mxfp4_blocks."""
    p = weight.data.view(np.uint8)
    rows, half = p.shape
    nb = half * 2 // 32
    src = p.reshape(rows, nb, 16)
    vals = np.stack((src & 0xF, src >> 4), axis=-1).reshape(rows, nb, 32)
    qs = vals[:, :, :16] | (vals[:, :, 16:] << 4)
    s = scale.data.view(np.uint8).reshape(rows, nb, 1)
    return np.concatenate((s, qs.astype(np.uint8)), axis=-1).reshape(rows, nb * 17)


def to_f32(tensors, name):
    """A weight as f32: FP8 with its block scale, BF16/F16 widened, F32 as is."""
    t = tensors[name]
    if t.dtype == "F8_E4M3":
        scale_name = name.removesuffix(".weight") + ".scale"
        if scale_name not in tensors:
            raise ValueError(f"{name}: F8_E4M3 weight without {scale_name}")
        return dequant_fp8(t, tensors[scale_name], scale_name)
    if t.dtype == "BF16":
        return st.bf16_to_f32(t.data)
    if t.dtype in ("F32", "F16", "F64"):
        return t.data.astype(np.float32)
    raise ValueError(f"{name}: dtype {t.dtype} (supported: F32, BF16, F16, F8_E4M3 with a "
                       ".scale, I8 MXFP4 experts)")




# --- encoding: round to nearest under power-of-two scales -------------------------------------

def _nearest(values, x):
    """The index into sorted `values` of the element nearest each x (ties to the lower one)."""
    i = np.clip(np.searchsorted(values, x), 1, len(values) - 1)
    lower_nearer = np.abs(x - values[i - 1]) <= np.abs(values[i] - x)
    return np.where(lower_nearer, i - 1, i)


def _pow2_scale_bytes(amax, top):
    """E8M0 bytes of the smallest power of two s with amax / s <= top (1 for an all-zero block)."""
    e = np.ceil(np.log2(np.maximum(amax, 1e-30) / top))
    return np.clip(e + 127, 0, 254).astype(np.uint8)


def quantize_fp8(w, block=128):
    """f32 [rows, cols] -> (e4m3 codes uint8 [rows, cols], E8M0 scales uint8 [ceil(rows/block),
    ceil(cols/block)]): the official FP8 layout, each block's amax within e4m3's 448."""
    rows, cols = w.shape
    br, bc = -(-rows // block), -(-cols // block)
    padded = np.zeros((br * block, bc * block), np.float32)
    padded[:rows, :cols] = w
    amax = np.abs(padded.reshape(br, block, bc, block)).max(axis=(1, 3))
    scale_bytes = _pow2_scale_bytes(amax, 448.0)
    s = np.repeat(np.repeat(e8m0_to_f32(scale_bytes), block, 0)[:rows], block, 1)[:, :cols]
    finite = np.array([b for b in range(256) if not np.isnan(E4M3[b])], np.uint8)
    order = np.argsort(E4M3[finite], kind="stable")
    codes = finite[order][_nearest(E4M3[finite][order], w / s)]
    return codes.astype(np.uint8), scale_bytes


def quantize_mxfp4(w):
    """f32 [rows, cols] (cols a multiple of 32) -> (packed int8 [rows, cols/2], element 2k in the
    low nibble; E8M0 scales uint8 [rows, cols/32]): the official expert layout."""
    rows, cols = w.shape
    groups = w.reshape(rows, cols // 32, 32)
    scale_bytes = _pow2_scale_bytes(np.abs(groups).max(axis=2), 6.0)
    x = groups / e8m0_to_f32(scale_bytes)[:, :, None]
    codes = np.arange(16, dtype=np.uint8)[np.argsort(E2M1, kind="stable")]
    nib = codes[_nearest(np.sort(E2M1, kind="stable"), x)].reshape(rows, cols)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    return packed.view(np.int8), scale_bytes
