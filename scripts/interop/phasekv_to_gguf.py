#!/usr/bin/env python3
"""Write a phasekv full-attention model as a GGUF file of llama.cpp's qwen3 architecture.

A phasekv layer of kind "full" with QK-norm, full NeoX RoPE and SwiGLU is the Qwen3 block
(docs/ARCHITECTURE.md section 4.1: RMSNorm, q/k/v projections with optional biases, per-head
RMSNorm of q and k before RoPE, scaled dot-product attention, SwiGLU), so the weights map one to
one and nothing is approximated. Anything else (a chunked layer, partial RoPE, no QK-norm, a sink)
is refused with the key that is not supported.

Tokenizers:
  sentencepiece (the code models): llama.cpp's SentencePiece tokenizer ("llama") with the same
      pieces, scores and piece types, no dummy prefix, so the server tokenizes text as phasekv does;
  word (the synthetic task models): the vocabulary is written as is, for token-id prompts only
      (the server cannot tokenize text into these words; audit them with --render ids).

Uses llama.cpp's own gguf-py (PYTHONPATH=<llama.cpp>/gguf-py) and Debian's python3-numpy.
Usage: phasekv_to_gguf.py MODEL_DIR OUT.gguf [--chat-template FILE] [--context-length N]
"""
import argparse
import json
import os
import sys

import numpy as np

from deepseek4_safetensors import read_file  # the one safetensors reader of scripts/interop

try:
    import gguf
except ImportError:
    sys.exit("phasekv_to_gguf.py: gguf-py not found; set PYTHONPATH=<llama.cpp>/gguf-py")


def fail(msg):
    sys.exit(f"phasekv_to_gguf.py: {msg}")


def read_safetensors(path):
    """name -> float32 array; phasekv writes F32 tensors only (deepseek4_safetensors reads the file)."""
    out = {}
    for name, t in read_file(path).items():
        if t.dtype != "F32":
            fail(f"{path}: tensor {name} has dtype {t.dtype} (supported: F32)")
        out[name] = t.data
    return out


def check_config(cfg, where):
    for i, layer in enumerate(cfg["layers"]):
        if layer.get("kind") != "full":
            fail(f"{where}: layers[{i}].kind is {layer.get('kind')!r} (supported: \"full\"; "
                 "llama.cpp has no chunked compressor)")
        if layer.get("sink"):
            fail(f"{where}: layers[{i}].sink is true (supported: false)")
    if not cfg.get("qk_norm", True):
        fail(f"{where}: qk_norm is false (qwen3 normalises q and k)")
    rd = cfg.get("rope_dims", -1)
    if rd >= 0 and rd != cfg["head_dim"]:
        fail(f"{where}: rope_dims is {rd} (supported: -1, RoPE over all head_dim channels)")


def add_tokenizer(w, model_dir, vocab_size):
    path = os.path.join(model_dir, "tokenizer.json")
    with open(path) as f:
        tok = json.load(f)
    kind = tok.get("type")
    if kind == "sentencepiece":
        opts = tok.get("options", {})
        if opts.get("model_type") != "bpe":
            fail(f"{path}: options.model_type is {opts.get('model_type')!r} (supported: \"bpe\")")
        if opts.get("normalization", "identity") != "identity":
            fail(f"{path}: options.normalization must be \"identity\"")
        types = {"normal": gguf.TokenType.NORMAL, "unknown": gguf.TokenType.UNKNOWN,
                 "control": gguf.TokenType.CONTROL, "user_defined": gguf.TokenType.USER_DEFINED,
                 "unused": gguf.TokenType.UNUSED, "byte": gguf.TokenType.BYTE}
        pieces = tok["pieces"]
        if len(pieces) != vocab_size:
            fail(f"{path}: {len(pieces)} pieces, the model's vocab_size is {vocab_size}")
        w.add_tokenizer_model("llama")
        w.add_token_list([p[0] for p in pieces])
        w.add_token_scores([float(p[1]) for p in pieces])
        w.add_token_types([types[p[2]] for p in pieces])
        ids = {p[0]: i for i, p in enumerate(pieces)}
        w.add_unk_token_id(ids["<unk>"])
        w.add_bos_token_id(ids["<s>"])
        w.add_eos_token_id(ids["</s>"])
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(bool(opts.get("add_dummy_prefix", False)))
    elif kind == "word":
        tokens = tok["tokens"]
        if len(tokens) != vocab_size:
            fail(f"{path}: {len(tokens)} tokens, the model's vocab_size is {vocab_size}")
        # BPE: every word is one token; prompts are sent as ids. llama.cpp refuses a BPE vocabulary
        # without merges (an empty list is not written), so one merge of two non-tokens is given.
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_merges(["\u0120 \u0120"])
        w.add_token_types([gguf.TokenType.CONTROL if t.startswith("<") else gguf.TokenType.NORMAL
                           for t in tokens])
        if "<bos>" in tokens:
            w.add_bos_token_id(tokens.index("<bos>"))
        if "<pad>" in tokens:
            w.add_pad_token_id(tokens.index("<pad>"))
            w.add_eos_token_id(tokens.index("<pad>"))
        w.add_add_bos_token(False)  # the task's prompts carry their own <bos>
    else:
        fail(f"{path}: type is {kind!r} (supported: sentencepiece, word)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--chat-template", help="a Jinja chat template file to embed")
    ap.add_argument("--context-length", type=int,
                    help="the context length to declare (default: the model's max_context); "
                         "llama-server caps its slots to it, so long-document audits need more, "
                         "which tests the harness: the model was not trained that long")
    a = ap.parse_args()
    where = os.path.join(a.model_dir, "config.json")
    with open(where) as f:
        cfg = json.load(f)
    check_config(cfg, where)
    t = read_safetensors(os.path.join(a.model_dir, "model.safetensors"))

    w = gguf.GGUFWriter(a.out, "qwen3")
    w.add_name(os.path.basename(os.path.normpath(a.model_dir)))
    w.add_context_length(a.context_length or int(cfg.get("max_context", 512)))
    w.add_embedding_length(cfg["d_model"])
    w.add_feed_forward_length(cfg["d_ff"])
    w.add_block_count(cfg["n_layers"])
    w.add_head_count(cfg["n_heads"])
    w.add_head_count_kv(cfg["n_kv_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["norm_eps"]))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tokenizer(w, a.model_dir, cfg["vocab_size"])
    if a.chat_template:
        with open(a.chat_template) as f:
            w.add_chat_template(f.read())

    names = {"embed.weight": "token_embd.weight", "final_norm.weight": "output_norm.weight"}
    if not cfg.get("tie_embeddings", True):
        names["lm_head.weight"] = "output.weight"
    per_layer = {"attn_norm.weight": "attn_norm.weight", "mlp_norm.weight": "ffn_norm.weight",
                 "attn.wq.weight": "attn_q.weight", "attn.wq.bias": "attn_q.bias",
                 "attn.wk.weight": "attn_k.weight", "attn.wk.bias": "attn_k.bias",
                 "attn.wv.weight": "attn_v.weight", "attn.wv.bias": "attn_v.bias",
                 "attn.wo.weight": "attn_output.weight",
                 "attn.q_norm.weight": "attn_q_norm.weight",
                 "attn.k_norm.weight": "attn_k_norm.weight",
                 "mlp.w_gate.weight": "ffn_gate.weight", "mlp.w_up.weight": "ffn_up.weight",
                 "mlp.w_down.weight": "ffn_down.weight"}
    for i in range(cfg["n_layers"]):
        for src, dst in per_layer.items():
            names[f"layers.{i}.{src}"] = f"blk.{i}.{dst}"
    unknown = sorted(set(t) - set(names))
    if unknown:
        fail(f"{a.model_dir}/model.safetensors: tensors with no qwen3 counterpart: {unknown[:5]}")
    for src, dst in names.items():
        if src not in t:
            if src.endswith(".bias"):
                continue  # qkv_bias false
            fail(f"{a.model_dir}/model.safetensors: missing tensor {src}")
        # Both use the (out, in) layout of torch.nn.Linear; gguf-py reverses it for ggml.
        w.add_tensor(dst, t[src])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}: qwen3, {cfg['n_layers']} layers, d {cfg['d_model']}, "
          f"vocab {cfg['vocab_size']}, {len(names)} tensor names")


if __name__ == "__main__":
    main()
