// Model configuration: the Qwen3-style backbone plus one attention configuration per layer.
// Names follow docs/ARCHITECTURE.md: stride S, width W, raw window n_win, entry j, phase r.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace phasekv {

enum class AttentionKind { kFull, kWindow, kChunked };
// scalar: one score per slot and KV head; vector: one score per slot and channel (DeepSeek-V4);
// mean: uniform averaging over the slots of the window.
enum class GateKind { kScalar, kVector, kMean };
// Position at which an entry's key is rotated: start = S*j (DeepSeek), prev = (j-1)*S (a public
// reproduction), last = S*j + S - 1 (the token that completes the entry), none = no RoPE on
// entries.
enum class EntryRope { kStart, kPrev, kLast, kNone };
// What a slot's token contributes to its entry (its payload): shared = one map per lane (lane 0
// is the raw key/value projection wk/wv, as in DeepSeek-V4); per_slot = every slot i has its own
// map C_i (the study's default kernel), so an entry knows which slot a token sat in.
enum class PayloadKind { kShared, kPerSlot };

struct AttentionConfig {
  AttentionKind kind = AttentionKind::kFull;
  int stride = 4;  // S: one entry every S tokens
  int width = 4;   // W >= S: entry j pools tokens [jS+S-W, jS+S)
  GateKind gate = GateKind::kScalar;
  bool gate_bias = true;  // per-slot learned bias added to the gate score
  bool tied_kv_gates = false;  // the value branch reuses the key branch's gate scores
  PayloadKind payload = PayloadKind::kShared;
  // The study's tied K/V: an entry's value IS its key (normalised and rotated); no value branch.
  bool tied_kv = false;
  bool payload_norm = false;  // RMSNorm of every slot payload before pooling (the study's post-norm)
  bool entry_norm = true;  // RMSNorm of each key entry (own weight)
  EntryRope entry_rope = EntryRope::kStart;
  int n_win = 0;      // raw sliding window: the last n_win tokens, the query included
  bool sink = false;  // learned per-head logit in the softmax denominator with zero value
  bool uncompressed_tail = false;  // tokens not yet in a visible entry are visible raw
  // The grid moved o = grid_offset tokens earlier (0 <= o < S): entry j pools tokens
  // [jS+S-W-o, jS+S-o), so the layer's entry boundaries fall at positions = S - o (mod S)
  // instead of 0. Layers with different offsets have staggered grids (docs/ARCHITECTURE.md).
  int grid_offset = 0;
  // Per-KV-head grids (empty: every head at grid_offset): head h's grid moved kv_head_offsets[h]
  // tokens earlier, one value per KV head, each in [0, S). Staggered heads (e.g. h*S/H_kv) leave
  // no position at an entry boundary of every head. Consecutive heads with equal offsets form a
  // grid group (grid_groups below).
  std::vector<int> kv_head_offsets;
  // CSA top-k (DeepSeek-V4): a light indexer with its own compressor scores the visible entries
  // for each query and the attention uses only the index_topk best (plus the raw window and the
  // sink). 0 = dense: every visible entry (docs/ARCHITECTURE.md section 5, "Indexer").
  int index_topk = 0;
  int index_heads = 4;  // indexer query heads, each with a weight from the query's hidden state
  int index_dim = 16;   // width of the indexer's queries and compressed keys

  int lanes() const { return (width + stride - 1) / stride; }
  bool indexed() const { return kind == AttentionKind::kChunked && index_topk > 0; }
};

struct ModelConfig {
  int vocab_size = 256;
  int d_model = 64;
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 1;
  int head_dim = 16;
  int d_ff = 256;
  double rope_theta = 10000.0;
  int rope_dims = -1;  // rotated dims per head: -1 = all (head_dim), 0 = no RoPE, else partial
  bool qk_norm = true;
  // Biases on the q/k/v projections (Qwen2 style). With RoPE they make content-independent
  // relative-position attention (e.g. a previous-token head) expressible from the start.
  bool qkv_bias = false;
  bool tie_embeddings = true;
  double norm_eps = 1e-6;
  int max_context = 4096;
  std::vector<AttentionConfig> layers;

  int rotary_dims() const { return rope_dims < 0 ? head_dim : rope_dims; }
  bool any_chunked() const;
};

// One grid group of a layer: the KV heads [head0, head0 + heads) and their query heads, attended
// as a layer of their own with attn.grid_offset = the group's offset (grouped-query attention
// keeps KV heads independent, so a layer with per-head grids is the concatenation of its groups).
struct GridGroup {
  int head0 = 0, heads = 0;
  AttentionConfig attn;  // the layer's config with the group's grid_offset, kv_head_offsets empty
};
// The layer's groups: one (all heads, the layer's own config) without kv_head_offsets; else the
// runs of consecutive heads with equal offsets, in head order.
std::vector<GridGroup> grid_groups(const ModelConfig& m, const AttentionConfig& a);

// The indexer of an indexed layer (a.indexed()) as a model and a layer of its own: one KV head of
// width index_dim and index_heads query heads; its compressor is the layer's (same S, W, gate,
// payload kind, entry norm and RoPE) with tied K/V (keys only), no raw window, tail or sink.
ModelConfig indexer_model(const ModelConfig& m, const AttentionConfig& a);
AttentionConfig indexer_attention(const AttentionConfig& a);

// Parses and validates; `where` names the source (a file path) in error messages. Unknown keys,
// wrong types and out-of-range values throw phasekv::Error naming the key and what is allowed.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& where);
ModelConfig model_config_from_file(const std::string& path);
nlohmann::json model_config_to_json(const ModelConfig& c);
void validate(const ModelConfig& c, const std::string& where);
// A lower bound on the parameter count of the config's Decoder: the embedding, an untied lm_head,
// and per layer the query and output projections and the SwiGLU (every kernel variant has them).
// Checked before anything is allocated: against kMaxParameters by validate(), and against the
// weights file by load_model_dir, so a config.json with d_ff = 2^21 over small weights fails at
// once instead of allocating gigabytes before the shape-mismatch error.
double min_parameter_count(const ModelConfig& c);
constexpr double kMaxParameters = 2147483648.0;  // 2^31: 8 GiB of f32, far beyond a CPU model
// n_layers and the length of 'layers', checked before the per-layer configs are built: with
// d_model = d_ff = 1 the parameter bound alone lets n_layers reach 4 x 10^8 (25 GB of configs).
constexpr int kMaxLayers = 1024;

// The stride of the model's chunked layers when they all share one (what the interior/boundary
// split of a sweep needs); 0 when there are no chunked layers or several strides.
int chunked_stride(const ModelConfig& cfg);

std::string to_string(AttentionKind k);
std::string to_string(GateKind g);
std::string to_string(EntryRope e);
std::string to_string(PayloadKind p);
// One line per layer, e.g. "chunked S=4 W=4 gate=scalar n_win=1".
std::string describe(const AttentionConfig& a);

}  // namespace phasekv
