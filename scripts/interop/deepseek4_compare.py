#!/usr/bin/env python3
"""Compare two runs' logits position by position, and by phase of the compressors.

Each input is a .npy (float32 [n_tokens, n_vocab], as phasekv-llama-logits writes it) or a
.json with a "logits" list of rows (as `phasekv logits` and phasekv-llama-logits write it). The
report gives max |dlogit| over the vocabulary at every position, summarised overall, per phase
r = position mod S for each compress ratio S (a compressor's error shows up at the phases where
its blocks complete), and the positions where the top-1 token differs.

Usage: deepseek4_compare.py A B [--ratios 4,128] [--tol T] [--json OUT] [--label-a NAME ...]
Exit status: 0, or 1 when --tol is given and some position's max |dlogit| exceeds it.
"""
import argparse
import json
import sys

import numpy as np


def load_logits(path):
    if path.endswith(".npy"):
        return np.load(path).astype(np.float64)
    with open(path) as f:
        j = json.load(f)
    if "logits" not in j:
        sys.exit(f"deepseek4_compare.py: {path}: no \"logits\" key")
    return np.asarray(j["logits"], dtype=np.float64)


def per_phase(d, ratio):
    """max |dlogit| at each phase r = position mod ratio (phases with no position are None)."""
    pos = np.arange(len(d))
    return [float(d[pos % ratio == r].max()) if (pos % ratio == r).any() else None
            for r in range(ratio)]


def compare(a, b, ratios):
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    d = np.abs(a - b).max(axis=1)
    scale = np.abs(a).max()
    flips = np.nonzero(a.argmax(axis=1) != b.argmax(axis=1))[0]
    return {
        "n_tokens": int(a.shape[0]),
        "n_vocab": int(a.shape[1]),
        "max_abs": float(d.max()),
        "worst_position": int(d.argmax()),
        "mean_abs": float(np.abs(a - b).mean()),
        "max_rel": float(d.max() / scale) if scale else 0.0,
        "logit_scale": float(scale),
        "per_position": [float(x) for x in d],
        "per_phase": {str(s): per_phase(d, s) for s in ratios},
        "top1_differs": [int(p) for p in flips],
    }


def summary_lines(r, ratios, tol, names):
    out = [f"{names[0]} vs {names[1]}: {r['n_tokens']} positions x {r['n_vocab']} logits; "
           f"max |dlogit| {r['max_abs']:.3g} at position {r['worst_position']} "
           f"(logits up to {r['logit_scale']:.3g}; relative {r['max_rel']:.2g}); "
           f"mean {r['mean_abs']:.3g}"]
    for s in ratios:
        ph = [x for x in r["per_phase"][str(s)] if x is not None]
        worst = int(np.argmax(ph))
        out.append(f"  ratio {s}: per-phase max |dlogit| from {min(ph):.3g} to {max(ph):.3g} "
                   f"(worst phase r = {worst})")
    if tol is not None:
        over = [i for i, x in enumerate(r["per_position"]) if x > tol]
        out.append(f"  tolerance {tol:g}: {len(over)} of {r['n_tokens']} positions exceed it"
                   + (f" (first {over[:10]})" if over else ""))
    out.append(f"  top-1 token differs at {len(r['top1_differs'])} positions"
               + (f": {r['top1_differs'][:10]}" if r["top1_differs"] else ""))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--ratios", default="4,128", help="compress ratios whose phases to report")
    ap.add_argument("--tol", type=float, help="fail (exit 1) when a position exceeds this")
    ap.add_argument("--json", help="write the full report (every position and phase) here")
    ap.add_argument("--label-a", default=None)
    ap.add_argument("--label-b", default=None)
    a = ap.parse_args()
    ratios = [int(s) for s in a.ratios.split(",") if s]
    try:
        r = compare(load_logits(a.a), load_logits(a.b), ratios)
    except ValueError as e:
        sys.exit(f"deepseek4_compare.py: {a.a} vs {a.b}: {e}")
    names = (a.label_a or a.a, a.label_b or a.b)
    print("\n".join(summary_lines(r, ratios, a.tol, names)))
    if a.json:
        r["a"], r["b"], r["tol"] = names[0], names[1], a.tol
        with open(a.json, "w") as f:
            json.dump(r, f)
    if a.tol is not None and r["max_abs"] > a.tol:
        sys.exit(1)


if __name__ == "__main__":
    main()
