"""A small safetensors reader and writer on numpy, for DeepSeek-V4 checkpoints in HF layout.

Why not the `safetensors` package: phasekv's Python tools run on Debian's python3 with
python3-numpy only (no PyPI). The format is one little-endian u64 header length, a JSON header
{name: {dtype, shape, data_offsets}} and the raw bytes, so the reader is a few lines.

Tensors come back as numpy arrays of the file's own dtype; the ones numpy has no type for come
back as raw bytes with their safetensors dtype beside them:
  F8_E4M3, F8_E8M0   uint8 arrays of the file's shape (DeepSeek-V4's FP8 weights and their scales)
  BF16               uint16 arrays (the bits; bf16_to_f32 widens them)
  I8                 int8 (DeepSeek-V4's packed MXFP4 experts: two e2m1 codes per byte)
A sharded checkpoint (model.safetensors.index.json with a weight_map) is read shard by shard.
"""
import json
import os
import struct

import numpy as np

# safetensors dtype -> numpy dtype of the stored bytes.
_NP = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
       "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "u1", "F8_E4M3": "u1", "F8_E5M2": "u1",
       "F8_E8M0": "u1"}
_DTYPE_OF = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i4"): "I32",
             np.dtype("<i8"): "I64", np.dtype("i1"): "I8", np.dtype("u1"): "U8"}


class Tensor:
    """One stored tensor: its safetensors dtype and its data as a numpy array of that shape."""

    def __init__(self, dtype, data):
        self.dtype = dtype
        self.data = data

    @property
    def shape(self):
        return tuple(self.data.shape)


def read_file(path):
    """name -> Tensor for one .safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, t in header.items():
            if name == "__metadata__":
                continue
            if t["dtype"] not in _NP:
                raise ValueError(f"{path}: tensor {name} has dtype {t['dtype']} "
                                 f"(readable: {', '.join(sorted(_NP))})")
            begin, end = t["data_offsets"]
            f.seek(base + begin)
            raw = np.frombuffer(f.read(end - begin), dtype=_NP[t["dtype"]])
            out[name] = Tensor(t["dtype"], raw.reshape(t["shape"]).copy())
    return out


def read_dir(model_dir):
    """name -> Tensor for a checkpoint directory: model.safetensors, or the shards an
    index.json names."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.exists(os.path.join(model_dir, "model.safetensors")):
        shards = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{model_dir}: no model.safetensors and no "
                                "model.safetensors.index.json")
    out = {}
    for shard in shards:
        out.update(read_file(os.path.join(model_dir, shard)))
    return out


def write_file(path, tensors, metadata=None):
    """Writes name -> numpy array (f32, f16, i32, i64, i8, u8) or name -> Tensor (any dtype,
    raw bytes) in sorted name order, as the safetensors package does."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if isinstance(t, Tensor):
            dtype, arr = t.dtype, np.ascontiguousarray(t.data)
        else:
            arr = np.ascontiguousarray(t)
            if arr.dtype not in _DTYPE_OF:
                raise ValueError(f"{name}: numpy dtype {arr.dtype} has no safetensors name here")
            dtype = _DTYPE_OF[arr.dtype]
        blob = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def bf16_to_f32(bits):
    """BF16 bits (uint16) -> float32: the top half of an f32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)
