// Training a DeepSeek-V4 model: next-token cross-entropy through the full forward, and the
// routers balanced as DeepSeek-V3/V4 describe it, without an auxiliary loss: after each step the
// selection bias of every score-routed layer moves by `gamma` towards balance (down for an expert
// that took more than the mean load, up for one that took less). Hash-routed layers have no bias;
// their table is fixed.
#pragma once
#include <torch/torch.h>

#include "v4/model.h"

namespace phasekv::v4 {

struct TrainStep {
  double loss = 0.0;
  V4Cache cache;  // the step's expert loads (cache.expert_load)
};

// One optimiser step on tokens [T] (predict t+1 from <= t); the model's floating tensors must be
// the optimiser's parameters and require grad.
TrainStep train_step(V4Model& model, torch::optim::Optimizer& opt, const torch::Tensor& tokens);

// bias_e += gamma * sign(mean load - load_e) on layers >= num_hash_layers.
void update_routing_bias(V4Model& model, const V4Cache& cache, double gamma);

}  // namespace phasekv::v4
