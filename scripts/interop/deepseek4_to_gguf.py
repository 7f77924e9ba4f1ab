#!/usr/bin/env python3
"""Convert a DeepSeek-V4 checkpoint in HF layout to a llama.cpp `deepseek4` GGUF (f32 weights).

llama.cpp's own converter (conversion/deepseek.py, DeepseekV4Model) imports torch 2.x and
transformers, which do not install here; this one writes the same metadata keys and applies the
same tensor transforms with llama.cpp's gguf-py and Debian's numpy:
  - names: the official ones ("layers.3.attn.compressor.ape") map to llama.cpp's ("blk.3.
    attn_compressor_ape.weight") by DeepseekV4Model._map_dsv4_tensor_name's table;
  - the routed experts' w1/w2/w3 are stacked into one [n_expert, rows, cols] tensor each
    (ffn_gate_exps, ffn_down_exps, ffn_up_exps);
  - hash layers (layer < num_hash_layers) keep their token -> experts table (ffn.gate.tid2eid,
    as I32) and drop ffn.gate.bias, which they do not use;
  - MTP tensors (mtp.*) are skipped: llama.cpp's "conversion v0" leaves them out too.
Where this converter differs, and why:
  - every weight is written f32 (llama.cpp's writes BF16 for BF16 sources, Q8_0 for FP8 ones and
    MXFP4 for the experts): the point is a logit-for-logit comparison with phasekv, so FP8
    weights (e4m3 with 128x128 E8M0 block scales, "X.scale" beside "X.weight") and MXFP4 experts
    (two e2m1 codes per byte, one E8M0 scale per 32 values) are dequantized exactly to f32;
    --experts mxfp4 instead repacks MXFP4 experts losslessly into ggml's block_mxfp4;
  - the vocabulary is llama.cpp's token-id-only "test" vocabulary (tok_0 ... tok_{V-1}), the one
    tests/test-llama-archs.cpp uses: prompts are token ids (a tokenizer.json is not read).
What llama.cpp cannot load is refused with the key and the allowed values: hc_mult other than 4,
compress ratios other than 0/4/128, an indexer head width that is not a multiple of 64, more than
one KV head, a scoring function other than sqrtsoftplus.

Uses gguf-py (PYTHONPATH=<llama.cpp>/gguf-py) and Debian's python3-numpy.
Usage: deepseek4_to_gguf.py HF_DIR OUT.gguf [--experts f32|mxfp4] [--context-length N]
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

# gguf-py from PYTHONPATH, else from the llama.cpp source scripts/install-deps.sh clones.
LLAMACPP_DIR = os.environ.get("PHASEKV_LLAMACPP_DIR",
                              os.path.expanduser("~/.cache/phasekv/llamacpp"))
sys.path.append(os.path.join(LLAMACPP_DIR, "src", "gguf-py"))
try:
    import gguf
except ImportError:
    sys.exit(f"deepseek4_to_gguf.py: gguf-py not found on PYTHONPATH nor in {LLAMACPP_DIR}/src/"
             "gguf-py (bash scripts/install-deps.sh installs it; or set PYTHONPATH=<llama.cpp>/"
             "gguf-py)")

T = gguf.MODEL_TENSOR

# The official name -> (llama.cpp tensor, suffix): conversion/deepseek.py's table.
ROOT_MAP = {
    "embed.weight": (T.TOKEN_EMBD, ".weight"),
    "norm.weight": (T.OUTPUT_NORM, ".weight"),
    "head.weight": (T.OUTPUT, ".weight"),
    "hc_head_fn": (T.HC_HEAD_FN, ".weight"),
    "hc_head_base": (T.HC_HEAD_BASE, ".weight"),
    "hc_head_scale": (T.HC_HEAD_SCALE, ".weight"),
}
LAYER_MAP = {
    "hc_attn_fn": (T.HC_ATTN_FN, ".weight"),
    "hc_attn_base": (T.HC_ATTN_BASE, ".weight"),
    "hc_attn_scale": (T.HC_ATTN_SCALE, ".weight"),
    "hc_ffn_fn": (T.HC_FFN_FN, ".weight"),
    "hc_ffn_base": (T.HC_FFN_BASE, ".weight"),
    "hc_ffn_scale": (T.HC_FFN_SCALE, ".weight"),
    "attn.attn_sink": (T.ATTN_SINKS, ".weight"),
    "attn.wq_a.weight": (T.ATTN_Q_A, ".weight"),
    "attn.wq_b.weight": (T.ATTN_Q_B, ".weight"),
    "attn.q_norm.weight": (T.ATTN_Q_A_NORM, ".weight"),
    "attn.wkv.weight": (T.ATTN_KV, ".weight"),
    "attn.kv_norm.weight": (T.ATTN_KV_NORM, ".weight"),
    "attn.wo_a.weight": (T.ATTN_OUT_A, ".weight"),
    "attn.wo_b.weight": (T.ATTN_OUT_B, ".weight"),
    "attn.compressor.ape": (T.ATTN_COMPRESSOR_APE, ".weight"),
    "attn.compressor.wkv.weight": (T.ATTN_COMPRESSOR_WKV, ".weight"),
    "attn.compressor.wgate.weight": (T.ATTN_COMPRESSOR_WGATE, ".weight"),
    "attn.compressor.norm.weight": (T.ATTN_COMPRESSOR_NORM, ".weight"),
    "attn.indexer.wq_b.weight": (T.INDEXER_ATTN_Q_B, ".weight"),
    "attn.indexer.weights_proj.weight": (T.INDEXER_PROJ, ".weight"),
    "attn.indexer.compressor.ape": (T.INDEXER_COMPRESSOR_APE, ".weight"),
    "attn.indexer.compressor.wkv.weight": (T.INDEXER_COMPRESSOR_WKV, ".weight"),
    "attn.indexer.compressor.wgate.weight": (T.INDEXER_COMPRESSOR_WGATE, ".weight"),
    "attn.indexer.compressor.norm.weight": (T.INDEXER_COMPRESSOR_NORM, ".weight"),
    "attn_norm.weight": (T.ATTN_NORM, ".weight"),
    "ffn_norm.weight": (T.FFN_NORM, ".weight"),
    "ffn.gate.weight": (T.FFN_GATE_INP, ".weight"),
    "ffn.gate.bias": (T.FFN_EXP_PROBS_B, ".bias"),
    "ffn.gate.bias_vl": (T.FFN_EXP_PROBS_B_VL, ".bias"),
    "ffn.gate.tid2eid": (T.FFN_GATE_TID2EID, ".weight"),
    "ffn.shared_experts.w1.weight": (T.FFN_GATE_SHEXP, ".weight"),
    "ffn.shared_experts.w2.weight": (T.FFN_DOWN_SHEXP, ".weight"),
    "ffn.shared_experts.w3.weight": (T.FFN_UP_SHEXP, ".weight"),
}
EXPERT_PROJ = {"w1": T.FFN_GATE_EXP, "w2": T.FFN_DOWN_EXP, "w3": T.FFN_UP_EXP}
EXPERT_RE = re.compile(r"layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.(weight|scale)$")


class ConvertError(Exception):
    pass


def gguf_name(key, bid, suffix):
    return gguf.TENSOR_NAMES[key].format(bid=bid) + suffix


# --- what llama.cpp can load ------------------------------------------------------------------

def need(cfg, key, where):
    if key not in cfg:
        raise ConvertError(f"{where}: missing key {key!r} (DeepseekV4ForCausalLM needs it)")
    return cfg[key]


def check_config(cfg, where):
    """Refuses, with the key and the allowed values, what llama.cpp's deepseek4 cannot run."""
    n_layer = need(cfg, "num_hidden_layers", where)
    if need(cfg, "hc_mult", where) != 4:
        raise ConvertError(f"{where}: hc_mult is {cfg['hc_mult']} (llama.cpp's deepseek4 "
                           "supports 4 hyper-connection streams only)")
    ratios = need(cfg, "compress_ratios", where)
    if len(ratios) < n_layer:
        raise ConvertError(f"{where}: compress_ratios has {len(ratios)} entries for "
                           f"{n_layer} layers (one per layer)")
    bad = sorted({r for r in ratios if r not in (0, 4, 128)})
    if bad:
        raise ConvertError(f"{where}: compress_ratios holds {bad} (llama.cpp supports 0, 4 "
                           "and 128)")
    if need(cfg, "index_head_dim", where) % 64 != 0:
        raise ConvertError(f"{where}: index_head_dim is {cfg['index_head_dim']} (llama.cpp "
                           "needs a multiple of 64)")
    if cfg.get("num_key_value_heads", 1) != 1:
        raise ConvertError(f"{where}: num_key_value_heads is {cfg['num_key_value_heads']} "
                           "(DeepSeek-V4 has one KV head; llama.cpp supports 1)")
    if cfg.get("scoring_func", "sqrtsoftplus") != "sqrtsoftplus":
        raise ConvertError(f"{where}: scoring_func is {cfg['scoring_func']!r} (llama.cpp's "
                           "deepseek4 loader supports \"sqrtsoftplus\")")
    if need(cfg, "qk_rope_head_dim", where) > need(cfg, "head_dim", where):
        raise ConvertError(f"{where}: qk_rope_head_dim {cfg['qk_rope_head_dim']} exceeds "
                           f"head_dim {cfg['head_dim']}")


# --- metadata ---------------------------------------------------------------------------------

def rope_scaling(cfg):
    """The YaRN parameters, from rope_scaling ("type" or "rope_type") or rope_parameters."""
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    kind = rs.get("rope_type", rs.get("type"))
    return rs if kind == "yarn" and rs.get("factor") is not None else None


def add_metadata(w, cfg, n_ctx):
    """TextModel.set_gguf_parameters then DeepseekV4Model.set_gguf_parameters, key by key."""
    n_layer = cfg["num_hidden_layers"]
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(cfg["hidden_size"])
    for key in ("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size"):
        if key in cfg:
            w.add_feed_forward_length(cfg[key])
            break
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg.get("num_key_value_heads", 1))
    yarn = rope_scaling(cfg)
    if yarn:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(yarn["factor"])
        w.add_rope_scaling_orig_ctx_len(yarn["original_max_position_embeddings"])
        if "extrapolation_factor" in yarn:
            w.add_rope_scaling_yarn_ext_factor(yarn["extrapolation_factor"])
        attn = yarn.get("attention_factor", yarn.get("attn_factor"))
        if attn is not None:
            w.add_rope_scaling_yarn_attn_factor(attn)
        if "beta_fast" in yarn:
            w.add_rope_scaling_yarn_beta_fast(yarn["beta_fast"])
        if "beta_slow" in yarn:
            w.add_rope_scaling_yarn_beta_slow(yarn["beta_slow"])
    rope_theta = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta"))
    if rope_theta is not None:
        w.add_rope_freq_base(float(rope_theta))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if "n_group" in cfg:
        w.add_expert_group_count(cfg["n_group"])
    if "topk_group" in cfg:
        w.add_expert_group_used_count(cfg["topk_group"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SQRTSOFTPLUS)
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    w.add_rope_dimension_count(cfg["qk_rope_head_dim"])
    w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(float(cfg["routed_scaling_factor"]))
    w.add_expert_weights_norm(bool(cfg.get("norm_topk_prob", True)))
    w.add_swiglu_clamp_exp([float(cfg["swiglu_limit"])] * n_layer)
    w.add_swiglu_clamp_shexp([float(cfg["swiglu_limit"])] * n_layer)
    w.add_indexer_head_count(cfg["index_n_heads"])
    w.add_indexer_key_length(cfg["index_head_dim"])
    w.add_indexer_top_k(cfg["index_topk"])
    w.add_attention_output_group_count(cfg["o_groups"])
    w.add_attention_output_lora_rank(cfg["o_lora_rank"])
    w.add_attention_compress_ratios(list(cfg["compress_ratios"]))
    w.add_attention_compress_rope_freq_base(float(cfg["compress_rope_theta"]))
    w.add_hyper_connection_count(cfg["hc_mult"])
    w.add_hyper_connection_sinkhorn_iterations(cfg["hc_sinkhorn_iters"])
    w.add_hyper_connection_epsilon(float(cfg["hc_eps"]))
    w.add_hash_layer_count(cfg.get("num_hash_layers", 0))
    w.add_embedding_length_out(cfg["hidden_size"] * cfg["hc_mult"])


def add_test_vocab(w, n_vocab):
    """llama.cpp's token-id-only vocabulary (tests/test-llama-archs.cpp): no tokenizer needed."""
    w.add_tokenizer_model("test")
    w.add_token_list([f"tok_{i}" for i in range(n_vocab)])
    w.add_token_scores([0.0] * n_vocab)


# --- tensors ----------------------------------------------------------------------------------

def expert_f32(tensors, name):
    t = tensors[name]
    if t.dtype in ("I8", "U8"):  # MXFP4: two e2m1 codes per byte
        return q.dequant_mxfp4(t, tensors[name.removesuffix(".weight") + ".scale"], name)
    return q.to_f32(tensors, name)


def add_experts(w, tensors, cfg, bid, mode):
    n_expert = cfg["n_routed_experts"]
    for proj, key in EXPERT_PROJ.items():
        names = [f"layers.{bid}.ffn.experts.{e}.{proj}.weight" for e in range(n_expert)]
        missing = [n for n in names if n not in tensors]
        if missing:
            raise ConvertError(f"missing routed expert tensor {missing[0]}")
        packed = tensors[names[0]].dtype in ("I8", "U8")
        if mode == "mxfp4" and packed:
            data = np.stack([q.repack_mxfp4(tensors[n], tensors[n.removesuffix(".weight") +
                                                              ".scale"]) for n in names])
            w.add_tensor(gguf_name(key, bid, ".weight"), data,
                         raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            data = np.stack([expert_f32(tensors, n) for n in names]).astype(np.float32)
            w.add_tensor(gguf_name(key, bid, ".weight"), data)


def map_name(name, cfg):
    """(gguf name, kind) for one official tensor, or None when it is not written."""
    if name in ROOT_MAP:
        key, suffix = ROOT_MAP[name]
        return gguf_name(key, None, suffix)
    m = re.match(r"layers\.(\d+)\.(.+)$", name)
    if not m or m.group(2) not in LAYER_MAP:
        raise ConvertError(f"tensor {name!r} has no deepseek4 counterpart")
    bid, rest = int(m.group(1)), m.group(2)
    if bid >= cfg["num_hidden_layers"]:
        raise ConvertError(f"tensor {name!r}: layer {bid} >= num_hidden_layers "
                           f"{cfg['num_hidden_layers']}")
    if rest == "ffn.gate.bias" and bid < cfg.get("num_hash_layers", 0):
        return None  # hash layers route by tid2eid; the converter drops their unused bias
    key, suffix = LAYER_MAP[rest]
    return gguf_name(key, bid, suffix)


def add_tensors(w, tensors, cfg, expert_mode):
    written = 0
    for name in sorted(tensors):
        if name.startswith("mtp.") or name.endswith(".scale") or EXPERT_RE.match(name):
            continue  # MTP left out; scales go with their weights; experts are stacked below
        if name.endswith("ffn.gate.tid2eid"):
            w.add_tensor(map_name(name, cfg), tensors[name].data.astype(np.int32))
            written += 1
            continue
        out = map_name(name, cfg)
        if out is None:
            continue
        # Both sides keep torch's (out, in) row-major layout; gguf-py reverses it for ggml.
        w.add_tensor(out, np.ascontiguousarray(q.to_f32(tensors, name)))
        written += 1
    for bid in range(cfg["num_hidden_layers"]):
        add_experts(w, tensors, cfg, bid, expert_mode)
        written += 3
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--experts", choices=("f32", "mxfp4"), default="f32",
                    help="routed experts stored as MXFP4: dequantize to f32 (default, for parity) "
                         "or repack losslessly into ggml's MXFP4")
    ap.add_argument("--context-length", type=int,
                    help="the context length to declare (default: max_position_embeddings)")
    a = ap.parse_args()
    where = os.path.join(a.hf_dir, "config.json")
    try:
        with open(where) as f:
            cfg = json.load(f)
        check_config(cfg, where)
        tensors = st.read_dir(a.hf_dir)
        w = gguf.GGUFWriter(a.out, "deepseek4")
        w.add_name(os.path.basename(os.path.normpath(a.hf_dir)))
        add_metadata(w, cfg, a.context_length or int(cfg.get("max_position_embeddings", 4096)))
        add_test_vocab(w, cfg["vocab_size"])
        n = add_tensors(w, tensors, cfg, a.experts)
    except (ConvertError, FileNotFoundError, ValueError, KeyError) as e:
        sys.exit(f"deepseek4_to_gguf.py: {e}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}: deepseek4, {cfg['num_hidden_layers']} layers (ratios "
          f"{cfg['compress_ratios'][:cfg['num_hidden_layers']]}), d {cfg['hidden_size']}, "
          f"vocab {cfg['vocab_size']}, {n} tensors, experts {a.experts}")


if __name__ == "__main__":
    main()
