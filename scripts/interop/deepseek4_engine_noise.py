#!/usr/bin/env python3
"""How llama.cpp's deepseek4 logits move with the way a prompt is run (issue 40, section 3).

An auditor comparing a served DeepSeek-V4 against a reference needs the engine's own noise
floor: the same weights and tokens give slightly different logits with another micro-batch size
(-ub), another split of the prompt into llama_decode calls, or flash attention, and with a real
indexer top-k that noise can flip which compressed entries are selected, so a few positions jump.

This script writes the random tiny model twice (deepseek4_random.py, the same seed: top-k above
the number of entries, and top-k 8), converts both (deepseek4_to_gguf.py), runs every variant
through phasekv-llama-logits and compares each with the reference run (flash attention off,
-ub 512, one call). A position "jumps" when its max |dlogit| exceeds --jump (default 1e-2, far
above the f32 rounding seen without top-k).

Usage: deepseek4_engine_noise.py [--out DIR] [--driver BIN] [--tokens N] [--threads T]
Prints a Markdown table per model and writes DIR/noise.json.
"""
import argparse
import json
import os
import platform
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# (name, driver flags); the first is the reference.
VARIANTS = [("fa off, ub 512, one call", ["--ub", "512"])]
VARIANTS += [(f"fa off, ub {u}", ["--ub", str(u)]) for u in (1, 2, 3, 7, 16, 64, 128, 256)]
VARIANTS += [(f"fa off, split {s}", ["--split", s])
             for s in ("300", "4,8,12", "1,2,130,517", "127,128,129", "255,256,257")]
VARIANTS += [("fa off, chunk 100", ["--chunk", "100"]),
             ("fa off, chunk 1 (decode)", ["--chunk", "1"])]
VARIANTS += [(f"fa on, ub {u}", ["--flash-attn", "on", "--ub", str(u)]) for u in (1, 2, 7, 64, 512)]
VARIANTS += [("fa auto (llama.cpp default), ub 512", ["--flash-attn", "auto"]),
             ("fa on, split 1,2,130,517", ["--flash-attn", "on", "--split", "1,2,130,517"])]


def cpu_name():
    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if ":" in line:
                k, v = (s.strip() for s in line.split(":", 1))
                info.setdefault(k, v)
    flags = info.get("flags", "").split()
    isa = [f for f in ("avx512f", "amx_bf16", "amx_int8", "avx2") if f in flags]
    return (f"{info.get('model name', platform.processor())} (family {info.get('cpu family')} "
            f"model {info.get('model')}, {os.cpu_count()} cores, {' '.join(isa)})")


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"deepseek4_engine_noise.py: {' '.join(cmd)} failed:\n{p.stderr}{p.stdout}")
    return p.stdout


def make_model(out, name, topk):
    hf, gguf = os.path.join(out, name), os.path.join(out, name + ".gguf")
    py = sys.executable
    run([py, os.path.join(HERE, "deepseek4_random.py"), hf, "--index-topk", str(topk)])
    run([py, os.path.join(HERE, "deepseek4_to_gguf.py"), hf, gguf])
    return gguf


def measure(a, gguf, name):
    rows, ref = [], None
    for label, flags in VARIANTS:
        if "--split" in flags:  # cuts at or past the prompt's end would be refused
            i = flags.index("--split") + 1
            cuts = [c for c in flags[i].split(",") if int(c) < a.tokens]
            label = label.replace(flags[i], ",".join(cuts))
            flags = flags[:i] + [",".join(cuts)] + flags[i + 1:]
        npy = os.path.join(a.out, f"{name}-{len(rows)}.npy")
        timing = json.loads(run([a.driver, "-m", gguf, "--random", str(a.tokens), "--seed",
                                 str(a.seed), "-t", str(a.threads), "-o", npy] + flags))
        logits = np.load(npy).astype(np.float64)
        ref = logits if ref is None else ref
        d = np.abs(logits - ref).max(axis=1)
        rows.append({"variant": label, "flags": flags, "max_abs": float(d.max()),
                     "positions_differing": int((d > 0).sum()),
                     "positions_jumping": int((d > a.jump).sum()),
                     "top1_differs": int((logits.argmax(1) != ref.argmax(1)).sum()),
                     "ms_per_token": timing["ms_per_token"]})
    return rows


def table(rows, n):
    out = ["| variant | max abs dlogit | positions differing | jumping | top-1 differs | ms/token |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['variant']} | {r['max_abs']:.3g} | {r['positions_differing']}/{n} | "
                   f"{r['positions_jumping']} | {r['top1_differs']} | {r['ms_per_token']:.2f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/deepseek4-llamacpp-noise")
    ap.add_argument("--driver", default="build/phasekv-llama-logits")
    ap.add_argument("--tokens", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1, help="seed of the random prompt")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--jump", type=float, default=1e-2)
    a = ap.parse_args()
    if not os.access(a.driver, os.X_OK):
        sys.exit(f"deepseek4_engine_noise.py: --driver {a.driver} is not an executable "
                 "(build it: cmake --build build --target phasekv-llama-logits)")
    os.makedirs(a.out, exist_ok=True)
    report = {"cpu": cpu_name(), "tokens": a.tokens, "threads": a.threads, "jump": a.jump}
    print(f"CPU: {report['cpu']}; {a.tokens} random tokens (seed {a.seed}), {a.threads} thread(s)")
    for name, topk in (("topk-all", 131072), ("topk-8", 8)):
        rows = measure(a, make_model(a.out, name, topk), name)
        report[name] = rows
        print(f"\n## index_topk {topk} (reference: {rows[0]['variant']})\n")
        print(table(rows, a.tokens))
    with open(os.path.join(a.out, "noise.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
