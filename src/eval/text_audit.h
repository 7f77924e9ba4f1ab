// The text-rendered key-value audit as an evaluation mode of the runner (eval/runner.h): for
// served models with real tokenizers, prompts built by TextKvTask (backend/http_text_task.h) are
// scored by log-probability or greedy generation. Each record also says whether the prompt's text
// re-tokenizes to the same ids and where the key lands when it does not (docs/AUDIT.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/http_text_task.h"
#include "eval/runner.h"

namespace phasekv {

struct TextAuditOptions {
  int examples = 50;
  int modulus = 24;
  bool generate = false;  // exact match of greedy generation instead of top-1 of the logprobs
  int concurrency = 8;    // the backend's requests in flight: batches keep them busy
  // Chat (`--api chat`): every record names the hash of its rendered prompt's ids and the
  // reasoning setting; generated answers are read as text (the value after any reasoning).
  bool chat = false;
  std::string reasoning;  // as requested ("" = the server's default)
  int max_tokens = 0;     // generation budget per request (0: the longest answer's tokens)
};


// One cell of a long-document grid (`--context-tokens LIST --depths LIST`), and with several
// needles one per (grid cell, needle): its condition name (records carry it; "" for an audit of
// one cell and one needle) and the task that builds its prompts.
struct TextAuditCell {
  std::string condition;
  TextKvTask* task = nullptr;
  int needle = 0;  // the target its questions ask for (multi-needle: one cell per needle)
};

// The prompts of a set of items, known before any is scored (TextAuditMode::plan).
struct TextAuditPlan {
  int64_t items = 0;
  int64_t prompt_tokens = 0;  // summed over the items
  int longest_prompt = 0;
  int64_t longest_example = -1;  // the example with the longest prompt
  int longest_answer = 0;        // value tokens (generate mode's max_tokens)
  int64_t filler_repeats = 0;    // items whose document wraps around the filler corpus
};

class TextAuditMode : public EvalMode {
 public:
  // `identity`: model, task ("text-kv"), seed, modulus and padding of the run. Every cell is
  // audited on the same examples and phases.
  TextAuditMode(std::vector<TextAuditCell> cells, EvalRecord identity, TextAuditOptions options);

  EvalRecord identity() const override { return identity_; }
  std::vector<EvalItem> items() const override;
  size_t batch_size() const override;
  std::vector<EvalRecord> evaluate(Backend& backend, const std::vector<EvalItem>& batch) override;
  // Lengths of the items' prompts (each example built once; no scoring request is sent).
  TextAuditPlan plan(const std::vector<EvalItem>& items);

 private:
  const TextAuditCell& cell_of(const std::string& condition) const;
  std::vector<TextAuditCell> cells_;
  EvalRecord identity_;
  TextAuditOptions o_;
};

}  // namespace phasekv
