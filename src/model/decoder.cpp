#include "model/decoder.h"

#include <cmath>

#include "model/component_scope.h"
#include "model/fused.h"

namespace phasekv {

BlockImpl::BlockImpl(const ModelConfig& m, const AttentionConfig& a) {
  attn_norm = register_module("attn_norm", RMSNorm(m.d_model, m.norm_eps));
  attn = register_module("attn", Attention(m, a));
  mlp_norm = register_module("mlp_norm", RMSNorm(m.d_model, m.norm_eps));
  mlp = register_module("mlp", SwiGLU(m.d_model, m.d_ff));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, AttentionProbe* probe) {
  torch::Tensor h;
  {
    ComponentScope scope(Component::kAttention);
    h = x + attn->forward(attn_norm(x), probe);
  }
  ComponentScope scope(Component::kMlp);
  return h + mlp(mlp_norm(h));
}

torch::Tensor BlockImpl::forward_last(const torch::Tensor& x) {
  const int64_t T = x.size(1);
  torch::Tensor h;
  {
    ComponentScope scope(Component::kAttention);
    h = x.narrow(1, T - 1, 1) + attn->forward_last(attn_norm(x));
  }
  ComponentScope scope(Component::kMlp);
  return h + mlp(mlp_norm(h));
}

torch::Tensor BlockImpl::forward_cached(const torch::Tensor& x, LayerCache& cache) {
  auto h = x + attn->forward_cached(attn_norm(x), cache);
  return h + mlp(mlp_norm(h));
}

DecoderImpl::DecoderImpl(const ModelConfig& c) : cfg(c) {
  embed = register_module("embed", torch::nn::Embedding(c.vocab_size, c.d_model));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int i = 0; i < c.n_layers; ++i) {
    blocks.push_back(Block(c, c.layers[static_cast<size_t>(i)]));
    layers->push_back(blocks.back());
  }
  final_norm = register_module("final_norm", RMSNorm(c.d_model, c.norm_eps));
  if (!c.tie_embeddings) lm_head = register_module("lm_head", make_linear(c.d_model, c.vocab_size));
}

torch::Tensor DecoderImpl::hidden(const torch::Tensor& tokens, std::vector<AttentionProbe>* probes) {
  TORCH_CHECK(!probes || probes->empty() || probes->size() == blocks.size(),
              "one AttentionProbe per layer expected (", blocks.size(), "), got ",
              probes ? probes->size() : 0);
  const bool probed = probes && !probes->empty();
  auto x = embed(tokens);
  for (size_t i = 0; i < blocks.size(); ++i)
    x = blocks[i]->forward(x, probed ? &(*probes)[i] : nullptr);
  return final_norm(x);
}

torch::Tensor DecoderImpl::hidden_last(const torch::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  auto x = embed(tokens);
  for (size_t i = 0; i + 1 < blocks.size(); ++i) x = blocks[i]->forward(x);
  Block& last = blocks.back();
  // An indexed layer's top-k selection is defined with every query: the whole forward there.
  x = last->attn->indexer ? last->forward(x).narrow(1, T - 1, 1) : last->forward_last(x);
  return final_norm(x).select(1, 0);
}

torch::Tensor DecoderImpl::logits_from_hidden(const torch::Tensor& h) {
  if (lm_head) return linear(h, lm_head);
  return linear(h, embed->weight.to(h.scalar_type()), torch::Tensor());
}

torch::Tensor DecoderImpl::forward(const torch::Tensor& tokens) {
  return logits_from_hidden(hidden(tokens));
}

torch::Tensor DecoderImpl::forward_cached(const torch::Tensor& tokens,
                                          std::vector<LayerCache>& caches) {
  TORCH_CHECK(caches.size() == blocks.size(), "one LayerCache per layer expected");
  auto x = embed(tokens);
  for (size_t i = 0; i < blocks.size(); ++i) x = blocks[i]->forward_cached(x, caches[i]);
  return logits_from_hidden(final_norm(x));
}

torch::Tensor DecoderImpl::index_loss() const {
  torch::Tensor total;
  for (const auto& b : blocks) {
    const auto& l = b->attn->last_index_loss;
    if (l.defined()) total = total.defined() ? total + l : l;
  }
  return total;
}

void DecoderImpl::init_weights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const double out_std = 0.02 / std::sqrt(2.0 * cfg.n_layers);
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    auto& p = item.value();
    auto ends_with = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    // Norm scales start at 1, gate biases and sinks at 0 (symmetric slots at init).
    if (ends_with("norm.weight")) {
      p.fill_(1.0);
    } else if (name.find(".bias_") != std::string::npos || ends_with(".bias") ||
               ends_with(".sink")) {
      p.zero_();
    } else {
      double std = (ends_with("wo.weight") || ends_with("w_down.weight")) ? out_std : 0.02;
      p.copy_(at::normal(0.0, std, p.sizes(), gen));
    }
  }
}

}  // namespace phasekv
