// torch::optim::AdamW with its step done in one pass per parameter (kernels::adamw_update)
// instead of ten tensor ops (mul_, mul_/add_, mul_/addcmul_, sqrt, div, add_, addcdiv_, with
// two temporaries). Same options, same state objects (AdamWParamState), so checkpoints written
// with either load into the other; same arithmetic up to float rounding.
//
// Falls back to torch::optim::AdamW::step for amsgrad and for parameters that are not contiguous
// f32 CPU tensors.
#pragma once
#include <torch/torch.h>

namespace phasekv {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace phasekv
