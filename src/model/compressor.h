// The chunked KV compressor: every S tokens, the W tokens [jS+S-W-o, jS+S-o) are pooled into entry j
// (o = grid_offset, usually 0, or the KV head's own offset with kv_head_offsets).
//
// Work is split in two so that the full-sequence forward and the streaming session run the SAME
// arithmetic: `project` runs once per token (payloads and gate scores), `pool` turns the projected
// tokens of complete entries into finished entries (softmax over slots, weighted sum, entry norm,
// RoPE at the entry's position). Streaming keeps projected tokens of the partial entry between
// calls.
#pragma once
#include <torch/torch.h>

#include "config/model_config.h"
#include "model/layers.h"

namespace phasekv {

// Per-token projections of a run of consecutive tokens. T is the time dimension (dim 1).
struct CompressorTokens {
  // Payloads per lane: [B, T, lanes, Hkv, hd]. A token sits in one slot of each lane's entry
  // (slot i = W - S(l+1) + (p+o) mod S for lane l), so per-slot payloads fit the same shape. pv is
  // undefined with tied_kv (the entry's value is its key).
  torch::Tensor pk, pv;
  torch::Tensor gk, gv;  // gate scores per slot, bias included: scalar [B,T,W,Hkv], vector
                         // [B,T,W,Hkv,hd]; undefined for the mean gate; gv undefined when tied
  int64_t length() const { return pk.defined() ? pk.size(1) : 0; }
  int64_t bytes() const;
  // The KV heads [h0, h0 + n) (dim 3 of every field): one grid group's tokens.
  CompressorTokens heads(int64_t h0, int64_t n) const;
};

struct CompressorImpl : torch::nn::Module {
  // wk/wv are the attention's raw key/value projections: lane 0 (the current block) shares them,
  // so raw keys and entries live in one space and S=W=1 mean pooling reduces to full attention.
  CompressorImpl(const ModelConfig& model, const AttentionConfig& attn);

  // k_lin, v_lin: the shared lane-0 payloads wk(x), wv(x) as [B, T, Hkv*hd]; tok0: the absolute
  // position of x's first token (per-slot payloads depend on the slot, i.e. on p mod S).
  CompressorTokens project(const torch::Tensor& x, const torch::Tensor& k_lin,
                           const torch::Tensor& v_lin, int64_t tok0);
  // Finished entries j in [j0, j1) from projected tokens whose first token is at absolute
  // position tok0, on the grid moved o tokens earlier; the tokens must cover positions
  // [max(0, j0*S+S-W-o), j1*S+S-1-o] and may be one grid group's heads (CompressorTokens::heads)
  // projected with that group's offset. Returns K, V as [B, Hkv, j1-j0, hd]: K normed (if
  // entry_norm) and rotated at the entry position.
  std::pair<torch::Tensor, torch::Tensor> pool(const CompressorTokens& tokens, int64_t tok0,
                                               int64_t j0, int64_t j1, int64_t o);
  // Pool weights a[b, e, slot, h(, c)] of entries [j0, j1): the K side, or the V side
  // (value_side; the K weights when the value side has no gate of its own). Scalar and mean
  // gates give [B, n, W, Hkv] (mean: expanded over B and Hkv), vector gates [B, n, W, Hkv, hd];
  // slots before position 0 weigh 0. Exposed for gate-concentration analyses.
  torch::Tensor pool_weights(const CompressorTokens& tokens, int64_t tok0, int64_t j0, int64_t j1,
                             int64_t o, bool value_side = false);

  // The position at which entry j of a grid moved o tokens earlier is rotated.
  int64_t entry_position(int64_t j, int64_t o) const;

  AttentionConfig cfg;
  int64_t n_kv, head_dim;
  Rope rope;
  // Lanes >= 1 (overlap, W > S) have their own payload projections: the earlier block enters the
  // entry through a second projection, as in DeepSeek CSA.
  std::vector<torch::nn::Linear> lane_wk, lane_wv;
  // payload = per_slot: C_i for every slot i as [W, Hkv*hd, D] (+ [W, Hkv*hd] biases with
  // qkv_bias); no lane maps then.
  torch::Tensor payload_k, payload_v, bias_payload_k, bias_payload_v;
  torch::Tensor gate_k, bias_k, gate_v, bias_v;
  std::shared_ptr<RMSNormImpl> k_norm;
  std::shared_ptr<RMSNormImpl> k_payload_norm, v_payload_norm;  // payload_norm
  torch::Tensor lane_of_slot;  // [W] int64: lane(i) = (W-1-i) / S
  torch::Tensor head_offset;   // [Hkv] int64: each KV head's grid offset (kv_head_offsets)

 private:
  torch::Tensor gate_scores(const torch::Tensor& x, const torch::Tensor& gate,
                            const torch::Tensor& bias);
  torch::Tensor per_slot_payloads(const torch::Tensor& x, const torch::Tensor& maps,
                                  const torch::Tensor& bias, int64_t tok0);
  torch::Tensor gather_slots(const torch::Tensor& per_token, const torch::Tensor& flat_idx,
                             int64_t n);
  torch::Tensor gather_scores(const torch::Tensor& per_token, const torch::Tensor& flat_idx,
                              int64_t n);
  torch::Tensor weights(const torch::Tensor& scores, const torch::Tensor& valid, int64_t n,
                        const torch::Tensor& like);
  // [n, W] int64: the position of every slot of entries [j0, j1) (negative: before the sequence).
  torch::Tensor slot_positions(int64_t j0, int64_t j1, int64_t o) const;
  // The softmax weights of entries [j0, j1) as pool() uses them ([B or 1, n, W, Hkv or 1(, hd)]).
  torch::Tensor raw_pool_weights(const CompressorTokens& tokens, int64_t tok0, int64_t j0,
                                 int64_t j1, int64_t o, bool value_side);
};
TORCH_MODULE(Compressor);

}  // namespace phasekv
