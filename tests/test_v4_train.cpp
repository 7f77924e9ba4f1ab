// Training DeepSeek-V4: the loss falls on a memorisable sequence, and the routing-bias update
// moves towards balance.
#include <gtest/gtest.h>

#include "test_util.h"
#include "test_v4_util.h"
#include "v4/train.h"

namespace phasekv {
namespace {

TEST(V4Train, LossFallsOnARepeatedSequence) {
  v4::V4Model m = test::v4_small_model(31);
  auto params = m.parameters();
  for (auto& p : params) p.requires_grad_(true);
  // The routing biases are moved by update_routing_bias, not by gradients (they only select).
  std::vector<torch::Tensor> trained;
  for (const auto& [name, t] : m.tensors)
    if (t.is_floating_point() && name.find("ffn.gate.bias") == std::string::npos)
      trained.push_back(t);
  torch::optim::AdamW opt(trained, torch::optim::AdamWOptions(1e-2).weight_decay(0.0));
  auto tokens = test::random_tokens(24, 32, 32).squeeze(0);
  const double first = v4::train_step(m, opt, tokens).loss;
  double last = first;
  for (int step = 0; step < 40; ++step) {
    auto s = v4::train_step(m, opt, tokens);
    v4::update_routing_bias(m, s.cache, 1e-3);
    last = s.loss;
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

TEST(V4Train, RoutingBiasMovesTowardsBalance) {
  v4::V4Model m = test::v4_small_model(33);
  v4::V4Cache cache;
  cache.expert_load.resize(3);
  cache.expert_load[0] = torch::tensor({9, 0, 0}, torch::kInt64);   // hash layer: untouched
  cache.expert_load[2] = torch::tensor({10, 1, 4}, torch::kInt64);  // mean 5
  auto before = m.tensors.at("layers.2.ffn.gate.bias").clone();
  v4::update_routing_bias(m, cache, 0.25);
  auto moved = m.tensors.at("layers.2.ffn.gate.bias") - before;
  EXPECT_LT(test::max_abs_diff(moved, torch::tensor({-0.25, 0.25, 0.25})), 1e-7);
  // Layer 1 had no recorded load (it did not run): unchanged.
  auto b1 = m.tensors.at("layers.1.ffn.gate.bias").clone();
  v4::update_routing_bias(m, cache, 0.25);
  EXPECT_TRUE(torch::equal(m.tensors.at("layers.1.ffn.gate.bias"), b1));
}

}  // namespace
}  // namespace phasekv
