#!/usr/bin/python3
"""The phasekv model and benchmark training step, written in plain PyTorch from docs/ARCHITECTURE.md.

Two jobs:

  check  DIR   numerics: DIR comes from `phasekv bench dump` (config.json + model.safetensors,
               batch.safetensors, grads.safetensors, step.json). Recomputes the f32 loss and every
               parameter gradient on the same weights and batch and compares them with phasekv's.
  time  ...    speed: times the benchmark training step (forward, next-token cross-entropy at every
               position, backward, clip_grad_norm_(1.0), AdamW lr 1e-3 betas (0.9, 0.95) weight
               decay 0.1), the same step as src/perf/train_step.h; `phasekv bench train` runs this
               side by side with its own step and prints the ratio.

The attention is the idiomatic dense form: one [T, E + T] score matrix per head with boolean
visibility masks and a joint softmax. bf16 is torch.autocast("cpu", torch.bfloat16), the same
mechanism phasekv's PrecisionGuard drives from C++. Needs only Debian's python3-torch and numpy.
Run with /usr/bin/python3 (Debian's python, where torch is installed).
"""
import argparse
import json
import math
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------
# safetensors, read with struct + numpy (no pip packages)

_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32,
           "BF16": np.uint16, "F16": np.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        arr = np.frombuffer(data[base + lo:base + hi], dtype=_DTYPES[info["dtype"]])
        if info["dtype"] == "BF16":  # widen exactly: bf16 is the top half of an f32
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = torch.from_numpy(arr.copy()).reshape(info["shape"])
    return out


# ----------------------------------------------------------------------------------------------
# the model (docs/ARCHITECTURE.md sections 3-6)

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):  # normalised in f32 (f64 stays f64), cast back to x's dtype
        c = torch.float64 if x.dtype == torch.float64 else torch.float32
        xf = x.to(c)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.to(c)).to(x.dtype)


def rope(x, pos, rd, theta):
    """NeoX RoPE on the first rd channels of x [..., T, d] at positions pos [T]."""
    if rd == 0:
        return x
    inv = theta ** (-torch.arange(0, rd, 2, dtype=torch.float64) / rd)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    h = rd // 2
    x1, x2 = x[..., :h], x[..., h:rd]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    return out if rd == x.shape[-1] else torch.cat([out, x[..., rd:]], -1)


def linear(i, o, bias=False):
    return nn.Linear(i, o, bias=bias)


class Compressor(nn.Module):
    def __init__(self, m, a):
        super().__init__()
        D, kv = m["d_model"], m["n_kv_heads"] * m["head_dim"]
        self.a, self.Hkv, self.d = a, m["n_kv_heads"], m["head_dim"]
        S, W = a["stride"], a["width"]
        self.L = -(-W // S)
        self.rd = 0 if a["entry_rope"] == "none" else rotary_dims(m)
        self.theta = m["rope_theta"]
        gate = a["gate"]
        shape = [W, self.Hkv, D] if gate == "scalar" else [self.L, kv, D]
        bshape = [W, self.Hkv] if gate == "scalar" else [W, self.Hkv, self.d]
        if gate != "mean":
            self.gate_k = nn.Parameter(torch.zeros(shape))
            if a["gate_bias"]:
                self.bias_k = nn.Parameter(torch.zeros(bshape))
            if not a["tied_kv_gates"]:
                self.gate_v = nn.Parameter(torch.zeros(shape))
                if a["gate_bias"]:
                    self.bias_v = nn.Parameter(torch.zeros(bshape))
        b = m.get("qkv_bias", False)
        unsupported = [k for k in ("tied_kv", "payload_norm") if a.get(k)]
        if a.get("grid_offset", 0):
            unsupported.append("grid_offset")
        if unsupported:
            sys.exit(f"torch_reference.py: the compressor options {unsupported} are not implemented")
        # per_slot (the study's kernel): slot i's token enters the entry as C_i x (+ b_i).
        self.per_slot = a.get("payload", "shared") == "per_slot"
        if self.per_slot:
            self.payload_k = nn.Parameter(torch.zeros([W, kv, D]))
            self.payload_v = nn.Parameter(torch.zeros([W, kv, D]))
            if b:
                self.bias_payload_k = nn.Parameter(torch.zeros([W, kv]))
                self.bias_payload_v = nn.Parameter(torch.zeros([W, kv]))
        for l in range(1, self.L if not self.per_slot else 1):
            setattr(self, f"lane{l}_wk", linear(D, kv, b))
            setattr(self, f"lane{l}_wv", linear(D, kv, b))
        if a["entry_norm"]:
            self.k_norm = RMSNorm(self.d, m["norm_eps"])

    def scores(self, u, gate, bias, lane):  # per token, per slot: [B, T, W, Hkv(, d)]
        B, T, _ = u.shape
        a, W = self.a, self.a["width"]
        s = u @ gate.to(u.dtype).reshape(-1, u.shape[-1]).t()
        if a["gate"] == "scalar":
            s = s.view(B, T, W, self.Hkv)
        else:
            s = s.view(B, T, self.L, self.Hkv, self.d)[:, :, lane]
        return s if bias is None else s + bias.to(s.dtype)

    def forward(self, u, k_lin, v_lin):
        """Entries 0 .. T//S - 1 of the sequence u [B, T, D]: K [B, Hkv, n, d], V likewise."""
        a, B, T = self.a, u.shape[0], u.shape[1]
        S, W, n = a["stride"], a["width"], u.shape[1] // a["stride"]
        slot = torch.arange(W)
        lane = (W - 1 - slot) // S
        pos = torch.arange(n)[:, None] * S + (S - W) + slot[None, :]  # [n, W]
        valid, p = pos >= 0, pos.clamp(min=0)
        if self.per_slot:  # every slot's map on every token, then the one of the slot it is in
            def slots(maps, bias):
                y = u @ maps.to(u.dtype).reshape(-1, u.shape[-1]).t()
                y = y.view(B, T, W, -1) + (0 if bias is None else bias.to(y.dtype))
                return y[:, p, slot[None, :]].view(B, n, W, self.Hkv, self.d)
            pk = slots(self.payload_k, getattr(self, "bias_payload_k", None))
            pv = slots(self.payload_v, getattr(self, "bias_payload_v", None))
        else:
            pk = torch.stack([k_lin] + [getattr(self, f"lane{l}_wk")(u) for l in range(1, self.L)], 2)
            pv = torch.stack([v_lin] + [getattr(self, f"lane{l}_wv")(u) for l in range(1, self.L)], 2)
            pk = pk.view(B, T, self.L, self.Hkv, self.d)[:, p, lane[None, :]]  # [B, n, W, Hkv, d]
            pv = pv.view(B, T, self.L, self.Hkv, self.d)[:, p, lane[None, :]]

        def weights(gate, bias):
            if a["gate"] == "mean":
                w = valid.to(pk.dtype)
                return (w / w.sum(1, keepdim=True)).view(1, n, W, 1, 1)
            s = self.scores(u, gate, bias, lane)[:, p, slot[None, :]]  # [B, n, W, Hkv(, d)]
            mask = valid.view(1, n, W, *([1] * (s.dim() - 3)))
            w = torch.softmax(s.masked_fill(~mask, float("-inf")), 2)
            return w.unsqueeze(-1) if a["gate"] == "scalar" else w

        wk = weights(getattr(self, "gate_k", None), getattr(self, "bias_k", None))
        wv = wk
        if a["gate"] != "mean" and not a["tied_kv_gates"]:
            wv = weights(self.gate_v, getattr(self, "bias_v", None))
        k = (wk * pk).sum(2).transpose(1, 2)
        v = (wv * pv).sum(2).transpose(1, 2)
        if a["entry_norm"]:
            k = self.k_norm(k)
        j = torch.arange(n)
        epos = {"start": j * S, "prev": (j - 1) * S, "last": j * S + S - 1, "none": j}[a["entry_rope"]]
        if self.rd > 0:
            k = rope(k, epos, self.rd, self.theta)
        return k, v


def rotary_dims(m):
    return m["head_dim"] if m["rope_dims"] < 0 else m["rope_dims"]


class Attention(nn.Module):
    def __init__(self, m, a):
        super().__init__()
        D, H, Hkv, d = m["d_model"], m["n_heads"], m["n_kv_heads"], m["head_dim"]
        self.a, self.H, self.Hkv, self.d = a, H, Hkv, d
        self.rd, self.theta = rotary_dims(m), m["rope_theta"]
        self.chunked = a["kind"] == "chunked"
        if self.chunked and a["sink"]:
            self.sink = nn.Parameter(torch.zeros(H))
        b = m.get("qkv_bias", False)  # Qwen2-style biases on wq, wk, wv and the lanes
        self.wq, self.wk, self.wv = linear(D, H * d, b), linear(D, Hkv * d, b), linear(D, Hkv * d, b)
        self.wo = linear(H * d, D)
        if m["qk_norm"]:
            self.q_norm, self.k_norm = RMSNorm(d, m["norm_eps"]), RMSNorm(d, m["norm_eps"])
        if self.chunked:
            self.comp = Compressor(m, a)
        self.raw = not self.chunked or a["n_win"] > 0 or a["uncompressed_tail"]

    def raw_mask(self, t, p):
        a, causal = self.a, p[None, :] <= t[:, None]
        if a["kind"] == "full":
            return causal
        win = causal & (p[None, :] > t[:, None] - a["n_win"])
        if self.chunked and a["uncompressed_tail"]:
            win = win | (causal & (p[None, :] >= (t[:, None] + 1) // a["stride"] * a["stride"]))
        return win

    def forward(self, u):
        B, T, _ = u.shape
        H, Hkv, d = self.H, self.Hkv, self.d
        pos = torch.arange(T)
        k_lin, v_lin = self.wk(u), self.wv(u)
        q = self.wq(u).view(B, T, H, d).transpose(1, 2)
        k = k_lin.view(B, T, Hkv, d).transpose(1, 2)
        v = v_lin.view(B, T, Hkv, d).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q, pos, self.rd, self.theta), rope(k, pos, self.rd, self.theta)
        keys, vals, masks = [], [], []
        if self.chunked:
            ek, ev = self.comp(u, k_lin, v_lin)
            keys.append(ek), vals.append(ev)
            j = torch.arange(ek.shape[2])
            masks.append(j[None, :] < (pos[:, None] + 1) // self.a["stride"])
        if self.raw:
            keys.append(k), vals.append(v), masks.append(self.raw_mask(pos, pos))
        G = H // Hkv
        kk = torch.cat(keys, 2).repeat_interleave(G, 1)  # [B, H, N, d]
        vv = torch.cat(vals, 2).repeat_interleave(G, 1)
        mask = torch.cat(masks, 1)  # [T, N]
        s = (q @ kk.transpose(-1, -2)) / math.sqrt(d)
        sees = mask.any(-1, keepdim=True)  # a query that sees nothing outputs 0
        s = s.masked_fill(~(mask | ~sees), float("-inf"))
        N = s.shape[-1]
        if hasattr(self, "sink"):
            s = torch.cat([s, self.sink.to(s.dtype).view(1, H, 1, 1).expand(B, H, T, 1)], -1)
        w = torch.softmax(s, -1)[..., :N] * sees.to(s.dtype)
        o = (w @ vv).transpose(1, 2).reshape(B, T, H * d)
        return self.wo(o)


class SwiGLU(nn.Module):
    def __init__(self, D, Fd):
        super().__init__()
        self.w_gate, self.w_up, self.w_down = linear(D, Fd), linear(D, Fd), linear(Fd, D)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, m, a):
        super().__init__()
        self.attn_norm = RMSNorm(m["d_model"], m["norm_eps"])
        self.attn = Attention(m, a)
        self.mlp_norm = RMSNorm(m["d_model"], m["norm_eps"])
        self.mlp = SwiGLU(m["d_model"], m["d_ff"])

    def forward(self, x):
        h = x + self.attn(self.attn_norm(x))
        return h + self.mlp(self.mlp_norm(h))


class Decoder(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.embed = nn.Embedding(m["vocab_size"], m["d_model"])
        self.layers = nn.ModuleList([Block(m, a) for a in m["layers"]])
        self.final_norm = RMSNorm(m["d_model"], m["norm_eps"])
        if not m["tie_embeddings"]:
            self.lm_head = linear(m["d_model"], m["vocab_size"])

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.layers:
            x = b(x)
        z = self.final_norm(x)
        return self.lm_head(z) if hasattr(self, "lm_head") else F.linear(z, self.embed.weight)


def load_model(dir_):
    with open(f"{dir_}/config.json") as f:
        m = json.load(f)
    model = Decoder(m)
    weights = read_safetensors(f"{dir_}/model.safetensors")
    names = {n for n, _ in model.named_parameters()}
    if names != set(weights):
        sys.exit(f"{dir_}: parameters differ from model.safetensors: "
                 f"missing {sorted(names - set(weights))}, extra {sorted(set(weights) - names)}")
    model.load_state_dict(weights)
    return model


# ----------------------------------------------------------------------------------------------
# the benchmark step (src/perf/train_step.h)

def step_loss(model, tokens, bf16):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(tokens[:, :-1]).float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def cmd_check(args):
    torch.set_num_threads(args.threads)
    model = load_model(args.dir).train()
    tokens = read_safetensors(f"{args.dir}/batch.safetensors")["tokens"]
    ref = read_safetensors(f"{args.dir}/grads.safetensors")
    with open(f"{args.dir}/step.json") as f:
        step = json.load(f)
    loss = step_loss(model, tokens, False)
    loss.backward()
    worst, worst_name = 0.0, ""
    for name, p in model.named_parameters():
        g, r = p.grad, ref[name]
        err = (g - r).abs().max().item() / max(r.abs().max().item(), 1e-30)
        if err > worst:
            worst, worst_name = err, name
    loss_err = abs(loss.item() - step["loss"]) / abs(step["loss"])
    ok = loss_err < args.tol and worst < args.tol
    print(f"{args.dir}: loss phasekv {step['loss']:.7f} torch {loss.item():.7f} (rel {loss_err:.1e});"
          f" worst gradient error {worst:.1e} ({worst_name}), max|diff| / max|grad| per tensor;"
          f" {'PASS' if ok else 'FAIL'} at tol {args.tol:g}", file=sys.stderr)
    print(json.dumps({"loss_phasekv": step["loss"], "loss_torch": loss.item(),
                      "loss_rel_err": loss_err, "worst_grad_rel_err": worst,
                      "worst_grad_tensor": worst_name, "n_tensors": len(ref), "pass": ok}))
    return 0 if ok else 1


def cmd_time(args):
    torch.set_num_threads(args.threads)
    model = load_model(args.model).train()
    with open(f"{args.model}/config.json") as f:
        vocab = json.load(f)["vocab_size"]
    g = torch.Generator().manual_seed(args.seed + 17)
    tokens = torch.randint(vocab, (args.batch, args.seq + 1), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    bf16 = args.precision == "bf16"

    def step():
        opt.zero_grad()
        loss = step_loss(model, tokens, bf16)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(max(args.reps, 1)):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    times.sort()  # the fastest step, as phasekv reports (the machine may be shared)
    best, med = times[0], times[len(times) // 2]
    print(json.dumps({"step_s": best, "median_step_s": med,
                      "tokens_per_s": args.batch * args.seq / best, "loss": loss,
                      "threads": torch.get_num_threads(), "precision": args.precision,
                      "torch": torch.__version__}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="compare loss and gradients with a `phasekv bench dump` dir")
    c.add_argument("dir")
    c.add_argument("--tol", type=float, default=1e-4)
    c.add_argument("--threads", type=int, default=2)
    t = sub.add_parser("time", help="time the benchmark training step")
    t.add_argument("--model", required=True, help="model directory (config.json + weights)")
    t.add_argument("--batch", type=int, required=True)
    t.add_argument("--seq", type=int, required=True)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    t.add_argument("--warmup", type=int, default=2)
    t.add_argument("--reps", type=int, default=5)
    t.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sys.exit(cmd_check(args) if args.cmd == "check" else cmd_time(args))


if __name__ == "__main__":
    main()
