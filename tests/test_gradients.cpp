// Analytic gradients of the compressor and attention against central finite differences in
// double precision, for every gate type.
#include <gtest/gtest.h>

#include "test_util.h"

namespace phasekv {
namespace {

TEST(Gradients, MatchFiniteDifferencesForEveryGate) {
  struct Case {
    std::string name;
    AttentionConfig a;
  };
  std::vector<Case> cases;
  for (GateKind g : {GateKind::kScalar, GateKind::kVector, GateKind::kMean}) {
    AttentionConfig a;
    a.kind = AttentionKind::kChunked;
    a.stride = 4;
    a.width = 8;
    a.gate = g;
    a.n_win = 1;
    a.sink = true;
    cases.push_back({to_string(g), a});
  }
  cases[0].a.tied_kv_gates = true;
  cases.push_back({"full", AttentionConfig{}});
  for (const auto& c : cases) {
    auto cfg = test::tiny_config(c.a);
    auto m = test::make_model(cfg, 5, torch::kFloat64);
    auto tokens = test::random_tokens(19, cfg.vocab_size, 6);
    torch::manual_seed(1);
    auto probe = torch::randn({1, 19, cfg.vocab_size}, torch::kFloat64);
    auto loss_fn = [&] { return (m->forward(tokens) * probe).sum(); };
    m->zero_grad();
    loss_fn().backward();
    int checked = 0;
    for (auto& item : m->named_parameters()) {
      const auto& name = item.key();
      if (name.find("attn.") == std::string::npos) continue;
      auto p = item.value();
      auto flat = p.view({-1});
      auto grad = p.grad().view({-1});
      for (int64_t idx : {int64_t{0}, flat.numel() / 2, flat.numel() - 1}) {
        const double eps = 1e-6;
        torch::NoGradGuard g;
        double orig = flat[idx].item<double>();
        flat[idx] = orig + eps;
        double up = loss_fn().item<double>();
        flat[idx] = orig - eps;
        double down = loss_fn().item<double>();
        flat[idx] = orig;
        double fd = (up - down) / (2 * eps), an = grad[idx].item<double>();
        EXPECT_NEAR(an, fd, 1e-6 + 1e-5 * std::abs(fd))
            << c.name << " " << name << "[" << idx << "]";
        ++checked;
      }
    }
    EXPECT_GT(checked, 10) << c.name;
  }
}

}  // namespace
}  // namespace phasekv
