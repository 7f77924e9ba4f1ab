// The training loop: AdamW with warmup + cosine, gradient clipping, answer-only loss on synthetic
// retrieval tasks or next-token loss on a text corpus ([corpus]), periodic eval, atomic
// checkpoints and exact resume.
#pragma once
#include <string>
#include <vector>

#include "model/decoder.h"
#include "train/train_config.h"

namespace phasekv {

struct TrainResult {
  int steps_done = 0;
  double final_loss = 0.0;
  double eval_acc = 0.0;
  double eval_loss = 0.0;  // cross-entropy of the target answers of the eval examples
  double tokens_per_s = 0.0;
};

// Trains into out_dir: the final model directory (config.json, model.safetensors, task.json,
// tokenizer.json, train.json), train_log.jsonl (one line per log step, streamed) and
// checkpoint/ (weights, optimiser state, data RNG state, step). With resume, continues from
// out_dir/checkpoint and reaches the same state as an uninterrupted run.
// stop_after > 0 ends the run after that many steps without writing the final model, as a kill
// would (tests use it to check resume).
// Without resume, out_dir must not hold a finished model (model.safetensors) or a checkpoint
// (training would silently replace them): that throws phasekv::Error, unless
// clear_previous_training(out_dir) removed them first (`train --force`). With resume, the
// config must equal the one in out_dir/train.json in everything but [train] steps: a changed key
// throws naming it.
TrainResult train(const TrainConfig& cfg, const std::string& out_dir, bool resume,
                  int stop_after = 0);

// Removes what a previous training left in out_dir (checkpoints, model files, train.json, log)
// so that a fresh run may start there. Returns whether there was anything to remove.
bool clear_previous_training(const std::string& out_dir);
// The files of a model directory or a training that out_dir holds (those the function above
// removes), for a command that must not write a model over another (`init`, `train`).
std::vector<std::string> model_files_in(const std::string& out_dir);

// Copies the weights of the model directory `dir` into `model`. Throws phasekv::Error naming the
// directory when it cannot be loaded or its config differs from `model`'s.
void init_from_model_dir(Decoder& model, const std::string& dir);

// Accuracy and cross-entropy (the validation loss) of the model on the target query of n fresh
// examples (seeded, disjoint from training data by seed), each at a uniform phase mod M
// (M = offset_randomization or 1).
struct EvalScore {
  double acc = 0.0;
  double loss = 0.0;
  std::vector<int> phase_correct, phase_count;  // per phase mod M (example i is at phase i mod M)
};
EvalScore evaluate_targets(Decoder& model, const TaskConfig& task, int n, uint64_t seed,
                           int modulus);
class Trainable;  // train/trainable.h: any model family the loop trains
EvalScore evaluate_targets(Trainable& model, const TaskConfig& task, int n, uint64_t seed,
                           int modulus);

// Next-token cross-entropy (mean over every predicted token, nats) and top-1 accuracy of the model
// on windows of T + 1 tokens (each predicts its tokens 1..T): a corpus run's validation loss.
// phase_correct stays empty. Throws phasekv::Error on no window or windows of unequal length.
EvalScore evaluate_next_tokens(Decoder& model, const std::vector<std::vector<int32_t>>& windows);
EvalScore evaluate_next_tokens(Trainable& model, const std::vector<std::vector<int32_t>>& windows);

// The phase curriculum's sampling weights after an evaluation ([train] phase_curriculum = c):
// (1 - c)/M + c * err(r) / sum(err) with err(r) = 1 - phase_correct[r] / phase_count[r];
// uniform when every phase is right. Sums to 1.
std::vector<double> curriculum_weights(const EvalScore& e, double c);

// What training cfg costs on this machine, measured on fresh weights at cfg.train.threads threads
// (for planning a suite: `phasekv repro --plan`). Each figure is the median of `reps` after
// `warmup` untimed repetitions; a step includes building its batch, as in train().
struct StepCost {
  double induction_s = 0;     // one step of the induction warm-up (0 if the config has none)
  double task_s = 0;          // one step on the task's batches (0 if every step is warm-up)
  double eval_example_s = 0;  // one evaluation example (a forward of one prompt, batched)
};
StepCost measure_step_cost(const TrainConfig& cfg, int warmup, int reps);

}  // namespace phasekv
