// DeepSeek-V4 models (src/v4) behind train/trainable.h, through V4Model::forward_batch (the whole
// batch at once). The routers are balanced as
// DeepSeek-V3/V4 describe it, without an auxiliary loss: after every step each score-routed layer's
// selection bias moves by kRoutingBiasSpeed towards balance, from the expert loads of that step's
// whole batch (v4/train.h update_routing_bias).
#include "train/trainable.h"
#include "util/error.h"
#include "v4/model_dir.h"
#include "v4/train.h"

namespace phasekv {
namespace {

// DeepSeek-V3's bias update speed gamma (its technical report, section 2.1.2).
constexpr double kRoutingBiasSpeed = 0.001;

class V4Trainable : public Trainable {
 public:
  explicit V4Trainable(v4::V4Model model) : model_(std::move(model)) {
    for (torch::Tensor& t : model_.parameters()) t.requires_grad_(true);
  }

  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& [name, t] : model_.tensors)  // a std::map: a fixed order
      if (t.is_floating_point()) out.emplace_back(name, t);
    return out;
  }
  torch::Tensor logits_at(const torch::Tensor& tokens, const torch::Tensor& row,
                          const torch::Tensor& col) override {
    return logits(tokens).index({row, col});
  }
  torch::Tensor logits(const torch::Tensor& tokens) override {
    if (!torch::GradMode::is_enabled()) return model_.forward_batch(tokens);  // an evaluation
    std::vector<torch::Tensor> loads;
    torch::Tensor out = model_.forward_batch(tokens, &loads);
    add_loads(loads);
    return out;
  }
  void after_step() override {
    if (loads_.expert_load.empty()) return;
    v4::update_routing_bias(model_, loads_, kRoutingBiasSpeed);
    loads_ = {};
  }
  void set_training(bool) override {}  // no dropout: the same forward in training and eval
  void save(const std::string& dir, const std::map<std::string, std::string>&) override {
    v4::save_v4_dir(dir, model_);
  }
  void init_from(const std::string& dir) override {
    const v4::V4Model src = v4::load_v4_dir(dir);
    if (v4::config_to_json(src.cfg) != v4::config_to_json(model_.cfg))
      throw Error("init_from: the model in " + dir +
                  " has another config than the [model] being trained; compare " + dir +
                  "/config.json with [model]");
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : src.tensors) model_.tensors.at(name).copy_(t);
  }

 private:
  void add_loads(const std::vector<torch::Tensor>& loads) {
    loads_.expert_load.resize(loads.size());
    for (size_t i = 0; i < loads.size(); ++i) {
      if (!loads[i].defined()) continue;
      torch::Tensor& sum = loads_.expert_load[i];
      sum = sum.defined() ? sum + loads[i] : loads[i].clone();
    }
  }

  v4::V4Model model_;
  v4::V4Cache loads_;  // the expert loads of the step so far
};

}  // namespace

std::unique_ptr<Trainable> make_v4_trainable(const TrainConfig& cfg) {
  v4::V4Model model(*cfg.v4);
  model.init_random(cfg.train.seed);
  return std::make_unique<V4Trainable>(std::move(model));
}

}  // namespace phasekv
