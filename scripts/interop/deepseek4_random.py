#!/usr/bin/env python3
"""Write a random DeepSeek-V4 checkpoint in HF layout: config.json + model.safetensors (f32).

The keys of config.json are those of HF's DeepseekV4ForCausalLM config and the tensor names and
shapes are the official checkpoint's ("embed.weight", "layers.N.attn.wq_a.weight", ...), exactly
as llama.cpp's conversion/deepseek.py reads them, so the same directory loads in phasekv's V4
model and converts to a llama.cpp GGUF (deepseek4_to_gguf.py) for a logit-for-logit comparison.

Default shapes are llama.cpp's tests/test-llama-archs.cpp deepseek4 model: vocab 128, d 512,
8 heads of 64 (rope on the last 32), 1 KV head, 4 layers with compress ratios 0, 0, 4, 128,
q-LoRA 64, output groups 8 of rank 32, window 32, indexer 64 heads x 128, hyper-connections 4
(2 Sinkhorn iterations), 2 routed experts (both used) + 1 shared of width 1024.

Initialisation (seeded numpy): why these scales. A projection is N(0, 1/fan_in), so every
activation stays O(1) through the RMS norms; the embedding is N(0, 1) and the head N(0, 1/d), so
logits are O(1) and not degenerate. Norm gains are 1 + N(0, 0.1) so a transposed norm shows up.
The hyper-connection maps are N(0, 0.5/(hc*d)) with scales near 1, the compressor slot biases
(ape) and attention sinks N(0, 0.5): every path changes the logits by a visible amount.

No tokenizer is written: deepseek4_to_gguf.py gives the GGUF llama.cpp's token-id-only "test"
vocabulary (tok_0 ... tok_{V-1}), and prompts are token ids on both sides.

--quantize writes the official quantized layout instead: the attention, compressor, indexer and
shared-expert projections as FP8 (F8_E4M3 "X.weight" with F8_E8M0 128x128 block scales
"X.scale"), the routed experts as MXFP4 (I8 "X.weight", two e2m1 codes per byte, F8_E8M0
"X.scale" per 32 values), with DeepSeek's quantization_config and "expert_dtype": "fp4";
--f32-twin DIR also writes the same model with every weight at its exact dequantized f32 value,
so a loader of the quantized layout can be checked against the f32 one logit for logit.

Usage: deepseek4_random.py OUT_DIR [--seed N] [--index-topk K] [--compress-ratios 0,0,4,128]
                           [--quantize [--f32-twin DIR]] ...
"""
import argparse
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek4_quant as q  # noqa: E402
import deepseek4_safetensors as st  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=512, help="hidden_size")
    ap.add_argument("--heads", type=int, default=8, help="num_attention_heads")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--rope-dim", type=int, default=32, help="qk_rope_head_dim")
    ap.add_argument("--kv-heads", type=int, default=1,
                    help="num_key_value_heads (DeepSeek-V4 has 1; other values exist to test "
                         "the converter's refusal)")
    ap.add_argument("--compress-ratios", default="0,0,4,128",
                    help="one ratio per layer; the layer count follows")
    ap.add_argument("--q-lora", type=int, default=64)
    ap.add_argument("--o-groups", type=int, default=8)
    ap.add_argument("--o-lora", type=int, default=32)
    ap.add_argument("--window", type=int, default=32, help="sliding_window")
    ap.add_argument("--index-heads", type=int, default=64)
    ap.add_argument("--index-head-dim", type=int, default=128)
    ap.add_argument("--index-topk", type=int, default=131072,
                    help="compressed entries the indexer keeps (default: more than any prompt has, "
                         "so every entry is kept and the selection cannot flip)")
    ap.add_argument("--experts", type=int, default=2, help="n_routed_experts")
    ap.add_argument("--experts-per-tok", type=int, default=2)
    ap.add_argument("--shared-experts", type=int, default=1)
    ap.add_argument("--moe-inter", type=int, default=1024, help="moe_intermediate_size")
    ap.add_argument("--hash-layers", type=int, default=0, help="num_hash_layers")
    ap.add_argument("--hc-mult", type=int, default=4)
    ap.add_argument("--sinkhorn-iters", type=int, default=2)
    ap.add_argument("--swiglu-limit", type=float, default=10.0)
    ap.add_argument("--route-scale", type=float, default=1.0, help="routed_scaling_factor")
    ap.add_argument("--max-pos", type=int, default=4096, help="max_position_embeddings")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--compress-rope-theta", type=float, default=160000.0)
    ap.add_argument("--norm-eps", type=float, default=1e-5, help="rms_norm_eps")
    ap.add_argument("--yarn-factor", type=float,
                    help="add rope_scaling {type: yarn, factor, original_max_position_embeddings: "
                         "--yarn-orig-ctx, beta_fast 32, beta_slow 1}, as DeepSeek's configs do")
    ap.add_argument("--yarn-orig-ctx", type=int, default=256)
    ap.add_argument("--quantize", action="store_true",
                    help="the official layout: FP8 projections, MXFP4 routed experts")
    ap.add_argument("--f32-twin", help="with --quantize: also write the exact f32 model here")
    return ap.parse_args()


def make_config(a, ratios):
    cfg = base_config(a, ratios)
    if a.yarn_factor:
        cfg["rope_scaling"] = {"type": "yarn", "factor": a.yarn_factor, "beta_fast": 32,
                               "beta_slow": 1,
                               "original_max_position_embeddings": a.yarn_orig_ctx}
    return cfg


def base_config(a, ratios):
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "torch_dtype": "float32",
        "vocab_size": a.vocab,
        "hidden_size": a.hidden,
        "num_hidden_layers": len(ratios),
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "qk_rope_head_dim": a.rope_dim,
        "q_lora_rank": a.q_lora,
        "o_groups": a.o_groups,
        "o_lora_rank": a.o_lora,
        "sliding_window": a.window,
        "compress_ratios": ratios,
        "compress_rope_theta": a.compress_rope_theta,
        "rope_theta": a.rope_theta,
        "max_position_embeddings": a.max_pos,
        "rms_norm_eps": a.norm_eps,
        "index_n_heads": a.index_heads,
        "index_head_dim": a.index_head_dim,
        "index_topk": a.index_topk,
        "hc_mult": a.hc_mult,
        "hc_sinkhorn_iters": a.sinkhorn_iters,
        "hc_eps": 1e-6,
        "n_routed_experts": a.experts,
        "num_experts_per_tok": a.experts_per_tok,
        "n_shared_experts": a.shared_experts,
        "moe_intermediate_size": a.moe_inter,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": a.route_scale,
        "swiglu_limit": a.swiglu_limit,
        "num_hash_layers": a.hash_layers,
        "num_nextn_predict_layers": 0,
        "tie_word_embeddings": False,
    }


class Init:
    """Seeded draws at the scales the module docstring explains."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def normal(self, shape, std):
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def linear(self, out_features, in_features):
        return self.normal((out_features, in_features), 1.0 / np.sqrt(in_features))

    def gain(self, n):
        return (1.0 + self.normal((n,), 0.1)).astype(np.float32)


def hc_tensors(init, prefix, hc, d, n_mix, n_scale):
    return {f"{prefix}_fn": init.normal((n_mix, hc * d), 0.5 / np.sqrt(hc * d)),
            f"{prefix}_base": init.normal((n_mix,), 0.5),
            f"{prefix}_scale": (1.0 + init.normal((n_scale,), 0.1)).astype(np.float32)}


def compressor_tensors(init, prefix, d, width, ratio):
    coff = 2 if ratio == 4 else 1  # ratio 4 overlaps blocks: two lanes of maps and slot biases
    return {f"{prefix}.wkv.weight": init.linear(coff * width, d),
            f"{prefix}.wgate.weight": init.linear(coff * width, d),
            f"{prefix}.ape": init.normal((ratio, coff * width), 0.5),
            f"{prefix}.norm.weight": init.gain(width)}


def attention_tensors(init, a, p, ratio):
    d, hd, nh = a.hidden, a.head_dim, a.heads
    t = {f"{p}.attn_sink": init.normal((nh,), 0.5),
         f"{p}.wq_a.weight": init.linear(a.q_lora, d),
         f"{p}.q_norm.weight": init.gain(a.q_lora),
         f"{p}.wq_b.weight": init.linear(nh * hd, a.q_lora),
         f"{p}.wkv.weight": init.linear(hd * a.kv_heads, d),
         f"{p}.kv_norm.weight": init.gain(hd),
         # wo_a holds the G groups' (rank x heads-of-the-group) maps stacked on the out axis
         f"{p}.wo_a.weight": init.linear(a.o_groups * a.o_lora, nh * hd // a.o_groups),
         f"{p}.wo_b.weight": init.linear(d, a.o_groups * a.o_lora)}
    if ratio:
        t.update(compressor_tensors(init, f"{p}.compressor", d, hd, ratio))
    if ratio == 4:  # the indexer lives on the overlapping (ratio 4) layers only
        ih, ihd = a.index_heads, a.index_head_dim
        t[f"{p}.indexer.wq_b.weight"] = init.linear(ih * ihd, a.q_lora)
        t[f"{p}.indexer.weights_proj.weight"] = init.linear(ih, d)
        t.update(compressor_tensors(init, f"{p}.indexer.compressor", d, ihd, ratio))
    return t


def moe_tensors(init, a, p, layer):
    d, f = a.hidden, a.moe_inter
    t = {f"{p}.gate.weight": init.linear(a.experts, d)}
    if layer < a.hash_layers:
        # hash routing: a fixed token -> experts table (distinct experts per token)
        table = np.stack([init.rng.permutation(a.experts)[:a.experts_per_tok]
                          for _ in range(a.vocab)]).astype(np.int32)
        t[f"{p}.gate.tid2eid"] = table
    else:
        t[f"{p}.gate.bias"] = init.normal((a.experts,), 0.1)
    for e in range(a.experts):
        t[f"{p}.experts.{e}.w1.weight"] = init.linear(f, d)
        t[f"{p}.experts.{e}.w2.weight"] = init.linear(d, f)
        t[f"{p}.experts.{e}.w3.weight"] = init.linear(f, d)
    fs = f * a.shared_experts
    t[f"{p}.shared_experts.w1.weight"] = init.linear(fs, d)
    t[f"{p}.shared_experts.w2.weight"] = init.linear(d, fs)
    t[f"{p}.shared_experts.w3.weight"] = init.linear(fs, d)
    return t


def make_tensors(a, ratios):
    init = Init(a.seed)
    d, hc = a.hidden, a.hc_mult
    n_mix = (2 + hc) * hc  # pre (hc), post (hc) and the hc x hc residual mix
    t = {"embed.weight": init.normal((a.vocab, d), 1.0)}
    for i, ratio in enumerate(ratios):
        p = f"layers.{i}"
        t[f"{p}.attn_norm.weight"] = init.gain(d)
        t[f"{p}.ffn_norm.weight"] = init.gain(d)
        t.update(hc_tensors(init, f"{p}.hc_attn", hc, d, n_mix, 3))
        t.update(hc_tensors(init, f"{p}.hc_ffn", hc, d, n_mix, 3))
        t.update(attention_tensors(init, a, f"{p}.attn", ratio))
        t.update(moe_tensors(init, a, f"{p}.ffn", i))
    t.update(hc_tensors(init, "hc_head", hc, d, hc, 1))
    t["norm.weight"] = init.gain(d)
    t["head.weight"] = init.linear(a.vocab, d)
    return t


# The projections stored as FP8 in the quantized layout (norms, embeddings, the head, the router,
# the hyper-connection maps, slot biases and sinks stay f32).
FP8_RE = re.compile(r"layers\.\d+\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|compressor\.wkv|compressor\.wgate|"
                    r"indexer\.wq_b|indexer\.compressor\.wkv|indexer\.compressor\.wgate)|"
                    r"ffn\.shared_experts\.w[123])\.weight$")
EXPERT_RE = re.compile(r"layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$")
QUANTIZATION_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                       "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def quantize(tensors):
    """(the quantized layout, its exact f32 twin) of an f32 checkpoint."""
    stored, twin = {}, {}
    for name, w in tensors.items():
        scale = name.removesuffix(".weight") + ".scale"
        if FP8_RE.match(name):
            codes, sb = q.quantize_fp8(w)
            stored[name], stored[scale] = st.Tensor("F8_E4M3", codes), st.Tensor("F8_E8M0", sb)
            twin[name] = q.dequant_fp8(stored[name], stored[scale], name)
        elif EXPERT_RE.match(name):
            packed, sb = q.quantize_mxfp4(w)
            stored[name], stored[scale] = st.Tensor("I8", packed), st.Tensor("F8_E8M0", sb)
            twin[name] = q.dequant_mxfp4(stored[name], stored[scale], name)
        else:
            stored[name] = twin[name] = w
    return stored, twin


def write_checkpoint(out_dir, cfg, tensors, seed):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    st.write_file(os.path.join(out_dir, "model.safetensors"), tensors,
                  {"format": "pt", "writer": "phasekv deepseek4_random.py", "seed": str(seed)})


def main():
    a = parse_args()
    try:
        ratios = [int(r) for r in a.compress_ratios.split(",")]
    except ValueError:
        sys.exit(f"deepseek4_random.py: --compress-ratios {a.compress_ratios!r} is not a "
                 "comma-separated list of integers")
    if a.f32_twin and not a.quantize:
        sys.exit("deepseek4_random.py: --f32-twin needs --quantize")
    cfg = make_config(a, ratios)
    tensors = make_tensors(a, ratios)
    if a.quantize:
        stored, twin = quantize(tensors)
        write_checkpoint(a.out_dir, dict(cfg, quantization_config=QUANTIZATION_CONFIG,
                                         expert_dtype="fp4"), stored, a.seed)
        if a.f32_twin:
            write_checkpoint(a.f32_twin, cfg, twin, a.seed)
    else:
        write_checkpoint(a.out_dir, cfg, tensors, a.seed)
    n_params = sum(int(v.size) for v in tensors.values())
    print(f"wrote {a.out_dir}: DeepseekV4ForCausalLM, {len(ratios)} layers (ratios "
          f"{a.compress_ratios}), d {a.hidden}, vocab {a.vocab}, {len(tensors)} tensors, "
          f"{n_params / 1e6:.1f} M parameters, seed {a.seed}"
          + (", FP8 projections and MXFP4 experts" if a.quantize else "")
          + (f"; its f32 twin in {a.f32_twin}" if a.f32_twin else ""))


if __name__ == "__main__":
    main()
