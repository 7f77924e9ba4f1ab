#include "train/fused_adamw.h"

#include "kernels/cpu_kernels.h"

namespace phasekv {
namespace {

bool fusable(const torch::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous();
}

}  // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
  for (const auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    if (o.amsgrad()) return torch::optim::AdamW::step(closure);
    for (const auto& p : group.params())
      if (p.grad().defined() && (!fusable(p) || !fusable(p.grad())))
        return torch::optim::AdamW::step(closure);
  }
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      // The state lives where torch::optim::AdamW keeps it, under the same key.
      const auto key = c10::guts::to_string(p.unsafeGetTensorImpl());
      auto it = state_.find(key);
      if (it == state_.end()) {
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        s->step(0);
        s->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        s->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = state_.emplace(key, std::move(s)).first;
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
      if (!fusable(s.exp_avg()) || !fusable(s.exp_avg_sq())) {
        s.exp_avg(s.exp_avg().to(torch::kFloat32).contiguous());
        s.exp_avg_sq(s.exp_avg_sq().to(torch::kFloat32).contiguous());
      }
      s.step(s.step() + 1);
      const auto [beta1, beta2] = o.betas();
      kernels::AdamWStep k{o.lr(),
                           o.weight_decay(),
                           beta1,
                           beta2,
                           o.eps(),
                           1 - std::pow(beta1, static_cast<double>(s.step())),
                           1 - std::pow(beta2, static_cast<double>(s.step()))};
      // Written through raw pointers: bump p's version like an in-place op would, so that a
      // graph still holding p for a backward notices the change.
      p.unsafeGetTensorImpl()->bump_version();
      kernels::adamw_update(p.data_ptr<float>(), p.grad().data_ptr<float>(),
                            s.exp_avg().data_ptr<float>(), s.exp_avg_sq().data_ptr<float>(),
                            p.numel(), k);
    }
  }
  return loss;
}

}  // namespace phasekv
