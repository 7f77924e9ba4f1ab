#include "v4/train.h"

namespace phasekv::v4 {

TrainStep train_step(V4Model& model, torch::optim::Optimizer& opt, const torch::Tensor& tokens) {
  TrainStep step;
  const int64_t T = tokens.size(0);
  opt.zero_grad();
  auto logits = model.forward(tokens.narrow(0, 0, T - 1), step.cache);
  auto loss = torch::cross_entropy_loss(logits, tokens.narrow(0, 1, T - 1));
  loss.backward();
  opt.step();
  step.loss = loss.item<double>();
  return step;
}

void update_routing_bias(V4Model& model, const V4Cache& cache, double gamma) {
  torch::NoGradGuard no_grad;
  for (int64_t i = model.cfg.num_hash_layers; i < model.cfg.num_hidden_layers; ++i) {
    const torch::Tensor& load = cache.expert_load.at(i);
    if (!load.defined()) continue;
    auto l = load.to(torch::kFloat64);
    auto& bias = model.tensors.at(layer_name(i, "ffn.gate.bias"));
    bias.add_(torch::sign(l.mean() - l).to(bias.scalar_type()) * gamma);
  }
}

}  // namespace phasekv::v4
