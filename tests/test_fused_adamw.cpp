// FusedAdamW against torch::optim::AdamW: same updates over several steps (two parameter groups,
// one without weight decay), and the same state format (a checkpoint of one loads into the other).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "train/fused_adamw.h"

using namespace phasekv;

namespace {

std::vector<torch::optim::OptimizerParamGroup> groups(const std::vector<torch::Tensor>& p) {
  std::vector<torch::optim::OptimizerParamGroup> g;
  g.emplace_back(std::vector<torch::Tensor>{p[0], p[1]},
                 std::make_unique<torch::optim::AdamWOptions>(
                     torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).weight_decay(0.1)));
  g.emplace_back(std::vector<torch::Tensor>{p[2]},
                 std::make_unique<torch::optim::AdamWOptions>(
                     torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).weight_decay(0.0)));
  return g;
}

std::vector<torch::Tensor> params(uint64_t seed) {
  torch::manual_seed(seed);
  // 70001 values: several parallel tasks and a vector tail.
  return {torch::randn({70001}).requires_grad_(true), torch::randn({13, 7}).requires_grad_(true),
          torch::randn({5}).requires_grad_(true)};
}

// Gradients that change from step to step (and are the same for both optimisers).
void set_grads(const std::vector<torch::Tensor>& p, int step) {
  for (size_t i = 0; i < p.size(); ++i) {
    torch::manual_seed(100 * step + i);
    p[i].mutable_grad() = torch::randn(p[i].sizes()) * (0.1 + step);
  }
}

// Steps [from, to) of both optimisers, each over its own copy of the parameters.
void run_steps(torch::optim::Optimizer& x, const std::vector<torch::Tensor>& px,
               torch::optim::Optimizer& y, const std::vector<torch::Tensor>& py, int from, int to) {
  for (int step = from; step < to; ++step) {
    set_grads(px, step);
    set_grads(py, step);
    x.step();
    y.step();
  }
}

double max_rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

}  // namespace

TEST(FusedAdamW, MatchesLibtorchAdamWOverSteps) {
  auto a = params(1), b = params(1);
  FusedAdamW fused(groups(a), torch::optim::AdamWOptions(3e-3));
  torch::optim::AdamW plain(groups(b), torch::optim::AdamWOptions(3e-3));
  run_steps(fused, a, plain, b, 0, 6);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LT(max_rel(a[i].detach(), b[i].detach()), 1e-6) << "param " << i;
    EXPECT_FALSE(torch::equal(a[i].detach(), params(1)[i].detach())) << "param " << i << " moved";
  }
}

TEST(FusedAdamW, CheckpointsInterchangeWithLibtorchAdamW) {
  auto a = params(2), b = params(2);
  FusedAdamW fused(groups(a), torch::optim::AdamWOptions(3e-3));
  torch::optim::AdamW plain(groups(b), torch::optim::AdamWOptions(3e-3));
  run_steps(fused, a, plain, b, 0, 3);
  // Save the fused optimiser's state, load it into a fresh libtorch AdamW over copies of the
  // fused run's parameters, and continue both: they must stay together.
  auto path = (std::filesystem::temp_directory_path() / "phasekv_fused_adamw.pt").string();
  torch::save(fused, path);
  std::vector<torch::Tensor> c;
  for (const auto& t : a) c.push_back(t.detach().clone().requires_grad_(true));
  torch::optim::AdamW restored(groups(c), torch::optim::AdamWOptions(3e-3));
  torch::load(restored, path);
  std::filesystem::remove(path);
  run_steps(fused, a, restored, c, 3, 6);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LT(max_rel(a[i].detach(), c[i].detach()), 1e-6) << "param " << i;
}
