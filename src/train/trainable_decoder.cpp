// phasekv's own models (model/decoder.h) behind train/trainable.h.
#include "model/model_dir.h"
#include "train/trainable.h"
#include "util/error.h"

namespace phasekv {
namespace {

class DecoderTrainable : public Trainable {
 public:
  explicit DecoderTrainable(Decoder model) : model_(std::move(model)) {}

  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& p : model_->named_parameters()) out.emplace_back(p.key(), p.value());
    return out;
  }
  torch::Tensor logits_at(const torch::Tensor& tokens, const torch::Tensor& row,
                          const torch::Tensor& col) override {
    // The LM head on the scored positions only: [N, V] instead of [B, T, V].
    return model_->logits_from_hidden(model_->hidden(tokens).index({row, col}));
  }
  torch::Tensor logits(const torch::Tensor& tokens) override {
    return model_->logits_from_hidden(model_->hidden(tokens));
  }
  // Indexed layers train their indexers on their own loss (model/indexer.h).
  torch::Tensor aux_loss() override { return model_->index_loss(); }
  void set_training(bool on) override { on ? model_->train() : model_->eval(); }
  void save(const std::string& dir, const std::map<std::string, std::string>& metadata) override {
    save_model_dir(dir, model_, torch::kFloat32, metadata);
  }
  void init_from(const std::string& dir) override {
    Decoder src = load_model_dir(dir);
    if (config_hash(src->cfg) != config_hash(model_->cfg))
      throw Error("init_from: the model in " + dir + " has config " + config_hash(src->cfg) +
                  ", not the [model] being trained (" + config_hash(model_->cfg) + "); compare " +
                  dir + "/config.json with [model]");
    torch::NoGradGuard no_grad;
    auto dst = model_->named_parameters();
    for (const auto& p : src->named_parameters()) dst[p.key()].copy_(p.value());
  }

 private:
  Decoder model_;
};

}  // namespace

std::unique_ptr<Trainable> trainable_decoder(Decoder model) {
  return std::make_unique<DecoderTrainable>(std::move(model));
}

std::unique_ptr<Trainable> make_trainable(const TrainConfig& cfg) {
  if (cfg.v4) return make_v4_trainable(cfg);
  Decoder model(cfg.model);
  model->init_weights(cfg.train.seed);
  return trainable_decoder(model);
}

}  // namespace phasekv
