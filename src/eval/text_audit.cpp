#include "eval/text_audit.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "backend/http_chat.h"
#include "util/error.h"
#include "util/hash.h"

namespace phasekv {

TextAuditMode::TextAuditMode(std::vector<TextAuditCell> cells, EvalRecord identity,
                             TextAuditOptions options)
    : cells_(std::move(cells)), identity_(std::move(identity)), o_(options) {
  if (cells_.empty()) throw Error("internal: a text audit needs a cell");
}

const TextAuditCell& TextAuditMode::cell_of(const std::string& condition) const {
  for (const auto& c : cells_)
    if (c.condition == condition) return c;
  throw Error("internal: no text audit cell '" + condition + "'");
}

std::vector<EvalItem> TextAuditMode::items() const {
  std::vector<EvalItem> out;
  for (const auto& c : cells_)
    for (int64_t e = 0; e < o_.examples; ++e)
      for (int r = 0; r < o_.modulus; ++r) out.push_back({c.condition, e, r});
  return out;
}

// Whole examples per batch when nothing was resumed (their pieces are tokenized once), and at
// least 4 requests per connection so that one slow request does not idle the others for long.
size_t TextAuditMode::batch_size() const {
  const size_t per_example = static_cast<size_t>(o_.modulus);
  const size_t want = 4 * static_cast<size_t>(std::max(1, o_.concurrency));
  return per_example * std::max<size_t>(1, (want + per_example - 1) / per_example);
}

TextAuditPlan TextAuditMode::plan(const std::vector<EvalItem>& items) {
  TextAuditPlan p;
  std::map<std::pair<std::string, int64_t>, TextKvTask::Shape> shapes;
  for (const auto& it : items) {
    const auto key = std::pair{it.condition, it.example_id};
    auto s = shapes.find(key);
    if (s == shapes.end()) {
      const TextAuditCell& cell = cell_of(it.condition);
      s = shapes.emplace(key, cell.task->shape(it.example_id, cell.needle)).first;
    }
    ++p.items;
    p.prompt_tokens += s->second.prompt_tokens;
    if (s->second.prompt_tokens > p.longest_prompt) {
      p.longest_prompt = s->second.prompt_tokens;
      p.longest_example = it.example_id;
    }
    p.longest_answer = std::max(p.longest_answer, s->second.answer_tokens);
    p.filler_repeats += s->second.filler_repeats ? 1 : 0;
  }
  return p;
}

std::vector<EvalRecord> TextAuditMode::evaluate(Backend& backend,
                                                const std::vector<EvalItem>& batch) {
  // Each cell's items built and checked by its own task, in batch order.
  std::vector<TextItem> items(batch.size());
  std::vector<TextCheck> checks(batch.size());
  for (const auto& cell : cells_) {
    std::vector<size_t> at;
    std::vector<std::pair<int64_t, int>> pairs;
    for (size_t i = 0; i < batch.size(); ++i)
      if (batch[i].condition == cell.condition) {
        at.push_back(i);
        pairs.push_back({batch[i].example_id, batch[i].phase});
      }
    if (at.empty()) continue;
    std::vector<TextItem> built = cell.task->build(pairs, cell.needle);
    const std::vector<TextCheck> checked = cell.task->verify(built);
    for (size_t j = 0; j < at.size(); ++j) {
      items[at[j]] = std::move(built[j]);
      checks[at[j]] = checked[j];
    }
  }

  std::vector<ScoreResult> scored;
  std::vector<Generation> generated;
  if (o_.generate) {
    std::vector<std::vector<int32_t>> contexts;
    size_t longest = 1;
    for (const auto& it : items) {
      contexts.push_back(it.tokens);
      longest = std::max(longest, it.answer.size());
    }
    generated = backend.generate_many(
        contexts, o_.max_tokens > 0 ? o_.max_tokens : static_cast<int>(longest));
    for (size_t i = 0; i < generated.size(); ++i)
      if (!generated[i].text && generated[i].tokens.size() > items[i].answer.size())
        generated[i].tokens.resize(items[i].answer.size());
  } else {
    std::vector<ScoreRequest> requests;
    for (const auto& it : items) requests.push_back({it.tokens, it.target});
    scored = backend.score(requests);
  }
  if ((o_.generate ? generated.size() : scored.size()) != items.size())
    throw Error("backend " + identity_.model + " returned a wrong number of results");

  std::vector<EvalRecord> out;
  for (size_t i = 0; i < items.size(); ++i) {
    const TextItem& it = items[i];
    EvalRecord r = identity_;
    r.condition = batch[i].condition;
    r.example_id = it.example_id;
    r.phase = it.phase;
    r.key_pos = it.key_pos;
    r.value_pos = it.value_pos;
    r.query_pos = it.query_pos;
    r.target = it.target;
    if (o_.generate) {
      const Generation& g = generated[i];
      r.error = g.error;
      r.prediction = g.tokens.empty() ? -1 : g.tokens.front();
      // Exact match of the value. Output the server refused as invalid UTF-8 (llama.cpp) is
      // wrong: the value is ASCII digits, so its tokens always decode to valid text. A chat
      // answer is text: the first number after the reasoning must be the value.
      if (g.text) {
        const std::string said = first_number(*g.text);
        r.correct = r.ok() && !g.answer_missing && said == it.answer_text;
        r.extra["answer"] = said;
        r.extra["answer_missing"] = g.answer_missing;
        r.extra["finish_reason"] = g.finish_reason;
        r.extra["reasoning_chars"] = g.reasoning.size();
      } else {
        r.correct = r.ok() && !g.invalid_utf8 && g.tokens == it.answer;
      }
    } else {
      const ScoreResult& s = scored[i];
      r.error = s.error;
      r.prediction = s.argmax;
      r.correct = r.ok() && s.argmax == it.target;
      r.censored = s.censored;
      if (!s.censored && std::isfinite(s.target_logprob)) r.target_logprob = s.target_logprob;
    }
    r.extra.update({{"retokenizes_identically", checks[i].identical},
                    {"measured_key_pos", checks[i].measured_key_pos},
                    {"position_ok", checks[i].position_ok()}});
    if (!r.condition.empty()) r.extra["depth_measured"] = it.depth;
    if (it.filler_repeats) r.extra["filler_repeats"] = true;
    if (cell_of(r.condition).task->needles() > 1) r.extra["needle"] = it.needle;
    if (o_.chat) {  // the rendered prompt (checked equal to these ids before it was sent)
      r.extra["prompt_tokens"] = it.tokens.size();
      r.extra["prompt_ids_fnv1a64"] = prompt_ids_hash(it.tokens);
      r.extra["reasoning"] = o_.reasoning.empty() ? "server default" : o_.reasoning;
    }
    if (o_.generate && generated[i].invalid_utf8) r.extra["output_invalid_utf8"] = true;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace phasekv
