#!/usr/bin/env python3
"""Re-initialise a V4 model directory (`phasekv init` output) for training, the way dense
transformers are initialised (the V4 family's own init_random is built for parity tests):
matrices N(0, 0.02), residual outputs (wo_b, w2) N(0, 0.02 / sqrt(2 L)), norm gains 1, sinks,
compressor slot biases and routing biases 0, hyper-connection mixing identity-like (pre 0.5,
post 1, comb close to the identity after Sinkhorn) with its dynamic scales 1 or 0.01.

usage: init.py SRC_DIR DST_DIR dense|dense-hc01 LAYERS   (numpy: Debian's python3-numpy)"""
import json, math, os, shutil, struct, sys

import numpy as np

src, dst, mode, layers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
path = os.path.join(dst, "model.safetensors")
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
body = bytearray(raw[8 + n:])
rng = np.random.default_rng(0)
hc_scale = 0.01 if mode == "dense-hc01" else 1.0
for name, v in header.items():
    if name == "__metadata__" or v["dtype"] != "F32":
        continue
    a, b = v["data_offsets"]
    shape = v["shape"]
    x = np.frombuffer(bytes(body[a:b]), dtype="<f4").reshape(shape).copy()
    if name.endswith("norm.weight"):
        x[:] = 1
    elif name.endswith(("attn_sink", "ffn.gate.bias", ".ape")):
        x[:] = 0
    elif "hc_" in name and name.endswith("_fn"):
        x = rng.normal(0, 0.02, shape)
    elif "hc_" in name and name.endswith("_base"):
        x[:] = 0
        if name != "hc_head_base":  # [pre hc, post hc, comb hc x hc]
            hc = int(round(math.sqrt(len(x) + 1) - 1))
            x[2 * hc:] = (np.eye(hc) * 8).reshape(-1)
    elif "hc_" in name and name.endswith("_scale"):
        x[:] = hc_scale
    elif len(shape) == 2:
        out = name.endswith(("wo_b.weight", "w2.weight"))
        x = rng.normal(0, 0.02 / math.sqrt(2 * layers) if out else 0.02, shape)
    body[a:b] = np.asarray(x, dtype="<f4").tobytes()
open(path, "wb").write(raw[:8 + n] + bytes(body))
