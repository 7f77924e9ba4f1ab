// What the training loop (trainer.h) needs of a model, so phasekv's own models (model/decoder.h)
// and DeepSeek-V4 models (src/v4) train through one loop: batches, schedule, checkpoints, exact
// resume and evaluation are shared; the forward and what follows an optimiser step differ.
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/decoder.h"
#include "train/train_config.h"

namespace phasekv {

class Trainable {
 public:
  virtual ~Trainable() = default;
  // The trained tensors under their checkpoint names, in a fixed order (the optimiser's state
  // follows it).
  virtual std::vector<std::pair<std::string, torch::Tensor>> named_parameters() = 0;
  // Logits [N, V] of tokens [B, T] at positions (row[i], col[i]).
  virtual torch::Tensor logits_at(const torch::Tensor& tokens, const torch::Tensor& row,
                                  const torch::Tensor& col) = 0;
  // Every position's logits [B, T, V].
  virtual torch::Tensor logits(const torch::Tensor& tokens) = 0;
  // A loss of the last forward that trains parts the LM loss cannot reach (indexers); undefined
  // when there is none.
  virtual torch::Tensor aux_loss() { return {}; }
  // After each optimiser step (DeepSeek-V4: the routers' selection biases move towards balance).
  virtual void after_step() {}
  virtual void set_training(bool on) = 0;
  // The model directory's config and weights (f32).
  virtual void save(const std::string& dir, const std::map<std::string, std::string>& metadata) = 0;
  // Copies the weights of the model directory `dir`; throws phasekv::Error naming it when its
  // config differs from this model's.
  virtual void init_from(const std::string& dir) = 0;
};

// The model cfg trains, freshly initialised with cfg.train.seed.
std::unique_ptr<Trainable> make_trainable(const TrainConfig& cfg);
// cfg.v4's model, freshly initialised (trainable_v4.cpp); make_trainable calls it.
std::unique_ptr<Trainable> make_v4_trainable(const TrainConfig& cfg);
// An existing Decoder (sharing its module) behind the interface.
std::unique_ptr<Trainable> trainable_decoder(Decoder model);

}  // namespace phasekv
