#include "config/model_config.h"

#include <fmt/format.h>

#include <fstream>
#include <set>

#include "util/error.h"
#include "util/json_read.h"

namespace phasekv {
namespace {

using nlohmann::json;

const std::set<std::string> kModelKeys = {
    "vocab_size",     "d_model",  "n_layers",    "n_heads",   "n_kv_heads",
    "head_dim",       "d_ff",     "rope_theta",  "rope_dims", "qk_norm",  "qkv_bias",
    "tie_embeddings", "norm_eps", "max_context", "attention", "layers"};
const std::set<std::string> kAttentionKeys = {
    "kind",       "stride",     "width", "gate", "gate_bias",        "tied_kv_gates",
    "entry_norm", "entry_rope", "n_win", "sink", "uncompressed_tail", "payload", "tied_kv",
    "payload_norm", "grid_offset", "kv_head_offsets", "index_topk", "index_heads", "index_dim"};

using json_read::check_keys;
using json_read::read;

const json_read::Choices<AttentionKind> kKinds = {
    {"full", AttentionKind::kFull},
    {"window", AttentionKind::kWindow},
    {"chunked", AttentionKind::kChunked}};
const json_read::Choices<GateKind> kGates = {
    {"scalar", GateKind::kScalar}, {"vector", GateKind::kVector}, {"mean", GateKind::kMean}};
const json_read::Choices<PayloadKind> kPayloads = {{"shared", PayloadKind::kShared},
                                                  {"per_slot", PayloadKind::kPerSlot}};
const json_read::Choices<EntryRope> kEntryRopes = {{"start", EntryRope::kStart},
                                                                    {"prev", EntryRope::kPrev},
                                                                    {"last", EntryRope::kLast},
                                                                    {"none", EntryRope::kNone}};

AttentionConfig attention_from_json(const json& j, AttentionConfig a, const std::string& where) {
  check_keys(j, kAttentionKeys, where);
  json_read::read_choice(j, "kind", a.kind, kKinds, where);
  json_read::read_choice(j, "gate", a.gate, kGates, where);
  json_read::read_choice(j, "entry_rope", a.entry_rope, kEntryRopes, where);
  read(j, "stride", a.stride, where);
  read(j, "width", a.width, where);
  read(j, "gate_bias", a.gate_bias, where);
  read(j, "tied_kv_gates", a.tied_kv_gates, where);
  read(j, "entry_norm", a.entry_norm, where);
  read(j, "n_win", a.n_win, where);
  read(j, "sink", a.sink, where);
  read(j, "uncompressed_tail", a.uncompressed_tail, where);
  json_read::read_choice(j, "payload", a.payload, kPayloads, where);
  read(j, "tied_kv", a.tied_kv, where);
  read(j, "payload_norm", a.payload_norm, where);
  read(j, "grid_offset", a.grid_offset, where);
  read(j, "index_topk", a.index_topk, where);
  read(j, "index_heads", a.index_heads, where);
  read(j, "index_dim", a.index_dim, where);
  if (j.contains("kv_head_offsets")) {
    const json& v = j.at("kv_head_offsets");
    if (!v.is_array())
      throw Error(where + ": key 'kv_head_offsets' must be a list of integers, one per KV head (got " +
                  v.dump() + ")");
    a.kv_head_offsets.clear();
    for (size_t i = 0; i < v.size(); ++i) {
      int o = 0;
      read(json{{"value", v[i]}}, "value", o, where + ": kv_head_offsets[" + std::to_string(i) + "]");
      a.kv_head_offsets.push_back(o);
    }
  }
  return a;
}

json attention_to_json(const AttentionConfig& a) {
  json j = {{"kind", to_string(a.kind)},
          {"stride", a.stride},
          {"width", a.width},
          {"gate", to_string(a.gate)},
          {"gate_bias", a.gate_bias},
          {"tied_kv_gates", a.tied_kv_gates},
          {"entry_norm", a.entry_norm},
          {"entry_rope", to_string(a.entry_rope)},
          {"n_win", a.n_win},
          {"sink", a.sink},
          {"uncompressed_tail", a.uncompressed_tail}};
  // Written only when not the default, so that the config (and config_hash) of every model made
  // before these options existed stays the same.
  if (a.payload != PayloadKind::kShared) j["payload"] = to_string(a.payload);
  if (a.tied_kv) j["tied_kv"] = true;
  if (a.payload_norm) j["payload_norm"] = true;
  if (a.grid_offset != 0) j["grid_offset"] = a.grid_offset;
  if (!a.kv_head_offsets.empty()) j["kv_head_offsets"] = a.kv_head_offsets;
  if (a.index_topk > 0) {
    j["index_topk"] = a.index_topk;
    j["index_heads"] = a.index_heads;
    j["index_dim"] = a.index_dim;
  }
  return j;
}

// n_layers, or the length of 'layers' ("key 'layers' has N entries"), against kMaxLayers.
void check_layer_count(size_t n, const std::string& where, const char* key, const char* unit = "") {
  if (n > static_cast<size_t>(kMaxLayers))
    throw Error(fmt::format("{}: key '{}' {} {}{} (allowed: 1..{})", where, key,
                            *unit ? "has" : "is", n, unit, kMaxLayers));
}

}  // namespace

std::string to_string(AttentionKind k) {
  return json_read::choice_name(k, kKinds);
}
std::string to_string(GateKind g) {
  return json_read::choice_name(g, kGates);
}
std::string to_string(PayloadKind p) {
  return json_read::choice_name(p, kPayloads);
}
std::string to_string(EntryRope e) {
  return json_read::choice_name(e, kEntryRopes);
}

bool ModelConfig::any_chunked() const {
  for (const auto& l : layers)
    if (l.kind == AttentionKind::kChunked) return true;
  return false;
}

std::string describe(const AttentionConfig& a) {
  switch (a.kind) {
    case AttentionKind::kFull:
      return "full";
    case AttentionKind::kWindow:
      return "window n_win=" + std::to_string(a.n_win);
    case AttentionKind::kChunked:
      break;
  }
  std::string s = "chunked S=" + std::to_string(a.stride) + " W=" + std::to_string(a.width) +
                  " gate=" + to_string(a.gate) + (a.gate_bias ? "" : " no-bias") +
                  (a.tied_kv_gates ? " tied-gates" : "") +
                  (a.payload == PayloadKind::kPerSlot ? " per-slot" : "") +
                  (a.tied_kv ? " tied-kv" : "") + (a.payload_norm ? " payload-norm" : "") +
                  (a.entry_norm ? " entry-norm" : "") +
                  " entry_rope=" + to_string(a.entry_rope) + " n_win=" + std::to_string(a.n_win);
  if (a.sink) s += " sink";
  if (a.uncompressed_tail) s += " tail";
  if (a.grid_offset != 0) s += " offset=" + std::to_string(a.grid_offset);
  if (!a.kv_head_offsets.empty()) {
    s += " head-offsets=";
    for (size_t h = 0; h < a.kv_head_offsets.size(); ++h)
      s += (h ? "," : "") + std::to_string(a.kv_head_offsets[h]);
  }
  if (a.indexed())
    s += fmt::format(" top-k={} index={}x{}", a.index_topk, a.index_heads, a.index_dim);
  return s;
}

void validate(const ModelConfig& c, const std::string& where) {
  auto positive = [&](int v, const char* key) {
    if (v < 1)
      throw Error(where + ": key '" + key + "' must be >= 1 (got " + std::to_string(v) + ")");
  };
  positive(c.vocab_size, "vocab_size");
  positive(c.d_model, "d_model");
  positive(c.n_layers, "n_layers");
  check_layer_count(static_cast<size_t>(c.n_layers), where, "n_layers");
  positive(c.n_heads, "n_heads");
  positive(c.n_kv_heads, "n_kv_heads");
  positive(c.head_dim, "head_dim");
  positive(c.d_ff, "d_ff");
  positive(c.max_context, "max_context");
  if (c.n_heads % c.n_kv_heads != 0)
    throw Error(where + ": n_heads (" + std::to_string(c.n_heads) +
                ") must be a multiple of n_kv_heads (" + std::to_string(c.n_kv_heads) + ")");
  int rd = c.rotary_dims();
  if (rd < 0 || rd > c.head_dim || rd % 2 != 0)
    throw Error(where +
                ": key 'rope_dims' must be -1 (all), 0 (none) or an even number <= head_dim (" +
                std::to_string(c.head_dim) + "), got " + std::to_string(c.rope_dims));
  if (c.rope_theta <= 0) throw Error(where + ": key 'rope_theta' must be > 0");
  if (c.norm_eps <= 0) throw Error(where + ": key 'norm_eps' must be > 0");
  if (static_cast<int>(c.layers.size()) != c.n_layers)
    throw Error(where + ": 'layers' has " + std::to_string(c.layers.size()) +
                " entries but n_layers is " + std::to_string(c.n_layers));
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const auto& a = c.layers[i];
    std::string w = where + ": layers[" + std::to_string(i) + "]";
    if (a.n_win < 0) throw Error(w + ": 'n_win' must be >= 0");
    if (a.grid_offset != 0 && a.kind != AttentionKind::kChunked)
      throw Error(w + ": 'grid_offset' applies to chunked layers only (got " +
                  std::to_string(a.grid_offset) + " on a " + to_string(a.kind) + " layer)");
    if (!a.kv_head_offsets.empty() && a.kind != AttentionKind::kChunked)
      throw Error(w + ": 'kv_head_offsets' applies to chunked layers only (this is a " +
                  to_string(a.kind) + " layer)");
    if (a.index_topk != 0 && a.kind != AttentionKind::kChunked)
      throw Error(w + ": 'index_topk' applies to chunked layers only (this is a " +
                  to_string(a.kind) + " layer)");
    if (a.kind == AttentionKind::kWindow && a.n_win < 1)
      throw Error(w + ": a window layer needs n_win >= 1");
    if (a.kind != AttentionKind::kChunked) continue;
    if (a.stride < 1) throw Error(w + ": 'stride' must be >= 1");
    if (a.width < a.stride)
      throw Error(w + ": 'width' (" + std::to_string(a.width) + ") must be >= stride (" +
                  std::to_string(a.stride) + ")");
    if (a.grid_offset < 0 || a.grid_offset >= a.stride)
      throw Error(w + ": 'grid_offset' must be in [0, stride) = [0, " +
                  std::to_string(a.stride) + "), got " + std::to_string(a.grid_offset));
    if (!a.kv_head_offsets.empty()) {
      if (static_cast<int>(a.kv_head_offsets.size()) != c.n_kv_heads)
        throw Error(fmt::format("{}: 'kv_head_offsets' needs one offset per KV head (n_kv_heads = "
                                "{}), got {}",
                                w, c.n_kv_heads, a.kv_head_offsets.size()));
      if (a.grid_offset != 0)
        throw Error(w + ": set 'grid_offset' or 'kv_head_offsets', not both (grid_offset " +
                    std::to_string(a.grid_offset) + " with per-head offsets)");
      for (size_t h = 0; h < a.kv_head_offsets.size(); ++h)
        if (a.kv_head_offsets[h] < 0 || a.kv_head_offsets[h] >= a.stride)
          throw Error(fmt::format("{}: kv_head_offsets[{}] must be in [0, stride) = [0, {}), got {}",
                                  w, h, a.stride, a.kv_head_offsets[h]));
    }
    if (a.index_topk < 0)
      throw Error(w + ": 'index_topk' must be >= 0 (0 = every visible entry), got " +
                  std::to_string(a.index_topk));
    if (a.indexed()) {
      if (a.index_heads < 1)
        throw Error(w + ": 'index_heads' must be >= 1, got " + std::to_string(a.index_heads));
      if (a.index_dim < 2 || a.index_dim % 2 != 0)
        throw Error(w + ": 'index_dim' must be an even number >= 2 (its queries and keys are "
                        "rotated), got " + std::to_string(a.index_dim));
      if (!a.kv_head_offsets.empty())
        throw Error(w + ": 'index_topk' selects one set of entries for all heads, so it needs one "
                        "grid: remove 'kv_head_offsets'");
    }
    if (a.tied_kv && a.tied_kv_gates)
      throw Error(w + ": 'tied_kv' has no value branch, so 'tied_kv_gates' cannot apply (set one)");
    if (a.tied_kv_gates && a.gate == GateKind::kMean)
      throw Error(w + ": 'tied_kv_gates' needs a learned gate (scalar|vector), not mean");
  }
  const double n = min_parameter_count(c);
  if (n > kMaxParameters)
    throw Error(fmt::format(
        "{}: vocab_size, d_model, n_layers, n_heads x head_dim and d_ff imply at least {:.3g} "
        "parameters (allowed: at most {:.0f})",
        where, n, kMaxParameters));
}

std::vector<GridGroup> grid_groups(const ModelConfig& m, const AttentionConfig& a) {
  if (a.kv_head_offsets.empty()) return {GridGroup{0, m.n_kv_heads, a}};
  std::vector<GridGroup> out;
  for (int h = 0; h < static_cast<int>(a.kv_head_offsets.size()); ++h) {
    const int o = a.kv_head_offsets[static_cast<size_t>(h)];
    if (out.empty() || out.back().attn.grid_offset != o) {
      GridGroup g{h, 0, a};
      g.attn.kv_head_offsets.clear();
      g.attn.grid_offset = o;
      out.push_back(g);
    }
    ++out.back().heads;
  }
  return out;
}

ModelConfig indexer_model(const ModelConfig& m, const AttentionConfig& a) {
  ModelConfig im = m;
  im.n_heads = a.index_heads;
  im.n_kv_heads = 1;
  im.head_dim = a.index_dim;
  // Rotate as many dims as the layer does, at most all of the indexer's (kept even).
  im.rope_dims = std::min(m.rotary_dims(), a.index_dim) / 2 * 2;
  im.layers.clear();
  return im;
}

AttentionConfig indexer_attention(const AttentionConfig& a) {
  AttentionConfig ia = a;
  ia.tied_kv = true;  // keys only: the indexer never reads values
  ia.tied_kv_gates = false;
  ia.n_win = 0;
  ia.uncompressed_tail = false;
  ia.sink = false;
  ia.index_topk = 0;
  return ia;
}

double min_parameter_count(const ModelConfig& c) {
  const double d = c.d_model, vocab = c.vocab_size, qo = 2.0 * d * c.n_heads * c.head_dim;
  const double mlp = 3.0 * d * c.d_ff;
  return vocab * d * (c.tie_embeddings ? 1 : 2) + c.n_layers * (qo + mlp);
}

ModelConfig model_config_from_json(const json& j, const std::string& where) {
  check_keys(j, kModelKeys, where);
  ModelConfig c;
  read(j, "vocab_size", c.vocab_size, where);
  read(j, "d_model", c.d_model, where);
  read(j, "n_layers", c.n_layers, where);
  read(j, "n_heads", c.n_heads, where);
  read(j, "n_kv_heads", c.n_kv_heads, where);
  read(j, "head_dim", c.head_dim, where);
  read(j, "d_ff", c.d_ff, where);
  read(j, "rope_theta", c.rope_theta, where);
  read(j, "rope_dims", c.rope_dims, where);
  read(j, "qk_norm", c.qk_norm, where);
  read(j, "qkv_bias", c.qkv_bias, where);
  read(j, "tie_embeddings", c.tie_embeddings, where);
  read(j, "norm_eps", c.norm_eps, where);
  read(j, "max_context", c.max_context, where);
  // "attention" is the default for every layer; "layers" (optional) overrides it layer by layer,
  // so a hybrid stack needs only the keys that differ.
  AttentionConfig base;
  if (j.contains("attention"))
    base = attention_from_json(j.at("attention"), base, where + ": attention");
  if (j.contains("layers")) {
    const json& ls = j.at("layers");
    if (!ls.is_array()) throw Error(where + ": key 'layers' must be an array of attention objects");
    check_layer_count(ls.size(), where, "layers", " entries");
    for (size_t i = 0; i < ls.size(); ++i)
      c.layers.push_back(
          attention_from_json(ls[i], base, where + ": layers[" + std::to_string(i) + "]"));
  } else {
    if (c.n_layers > 0) check_layer_count(static_cast<size_t>(c.n_layers), where, "n_layers");
    c.layers.assign(static_cast<size_t>(std::max(c.n_layers, 0)), base);
  }
  validate(c, where);
  return c;
}

ModelConfig model_config_from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open model config " + path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw Error(path + ": invalid JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  } catch (const json::exception& e) {  // a number beyond a double is out_of_range, not parse_error
    throw Error(path + ": invalid JSON: " + e.what());
  }
  return model_config_from_json(j, path);
}

json model_config_to_json(const ModelConfig& c) {
  json layers = json::array();
  for (const auto& a : c.layers) layers.push_back(attention_to_json(a));
  return {{"vocab_size", c.vocab_size},
          {"d_model", c.d_model},
          {"n_layers", c.n_layers},
          {"n_heads", c.n_heads},
          {"n_kv_heads", c.n_kv_heads},
          {"head_dim", c.head_dim},
          {"d_ff", c.d_ff},
          {"rope_theta", c.rope_theta},
          {"rope_dims", c.rope_dims},
          {"qk_norm", c.qk_norm},
          {"qkv_bias", c.qkv_bias},
          {"tie_embeddings", c.tie_embeddings},
          {"norm_eps", c.norm_eps},
          {"max_context", c.max_context},
          {"layers", layers}};
}

int chunked_stride(const ModelConfig& cfg) {
  std::set<int> strides;
  for (const auto& a : cfg.layers)
    if (a.kind == AttentionKind::kChunked) strides.insert(a.stride);
  return strides.size() == 1 ? *strides.begin() : 0;
}

}  // namespace phasekv
