#include "train/repeat_task.h"

#include <algorithm>
#include <string>
#include <utility>

#include "task/lookup.h"
#include "util/error.h"

namespace phasekv {

namespace {
int content_tokens(const TaskConfig& c) {
  return task_vocab(c).vocab_size() - TaskVocab::kFirstKey;
}
int shortest(const TaskConfig& c) {
  return c.min_context_len == 0 ? c.context_len : c.min_context_len;
}
// Tokens every training row of the task carries beyond its logical length.
int row_padding(const TaskConfig& c, int offset_randomization) {
  return c.kind == TaskKind::kLookup ? lookup::padding_tokens(std::max(offset_randomization, 1))
                                     : 0;
}
}  // namespace

RepeatSequence sample_repeat_sequence(const TaskConfig& c, std::mt19937_64& rng, int len,
                                      bool marked) {
  const int n_content = content_tokens(c);
  if (len % 2 != 0 || len / 2 - 1 < 2 || len / 2 - 1 > n_content)
    throw Error("repeat sequence of length " + std::to_string(len) +
                " (allowed: an even length from 6 to " + std::to_string(2 * n_content + 2) +
                ", with distinct content tokens)");
  // (Modulo, not std::uniform_int_distribution: the sequence must be the same with every
  // standard library; the bias is below 1e-17 for these ranges.)
  auto below = [&rng](int k) { return static_cast<int>(rng() % static_cast<uint64_t>(k)); };
  // Marked: n = len / 2 - 1, so that <q> sits at the same place in every row of a length.
  // Unmarked: a row of L tokens, L even and uniform in [6, len]; n uniform in [2, most]; the rest
  // of the row a prefix of other tokens. The distance between the copies varies, so a head cannot
  // follow the repeat by a fixed offset; the short rows let induction form at all: a control
  // trained on rows of 73 tokens had not formed it after 3,000 steps, on rows of 31 it did in 300.
  const int row = marked ? len : 6 + 2 * below((len - 6) / 2 + 1);
  const int most = std::min((row - 1) / 2, n_content - 1);
  const int n = marked ? len / 2 - 1 : 2 + below(most - 1);
  // A partial Fisher-Yates shuffle draws n distinct content tokens.
  std::vector<int32_t> pool(static_cast<size_t>(n_content));
  for (int i = 0; i < n_content; ++i) pool[static_cast<size_t>(i)] = TaskVocab::kFirstKey + i;
  for (int i = 0; i < n; ++i)
    std::swap(pool[static_cast<size_t>(i)], pool[static_cast<size_t>(i + below(n_content - i))]);
  RepeatSequence out;
  out.tokens.push_back(TaskVocab::kBos);
  if (!marked)  // the prefix: tokens outside the repeat, so each repeated token has one match
    for (int i = 0, m = row - 1 - 2 * n; i < m; ++i)
      out.tokens.push_back(pool[static_cast<size_t>(n + below(n_content - n))]);
  const int start = static_cast<int>(out.tokens.size());  // s1 of the first copy
  out.tokens.insert(out.tokens.end(), pool.begin(), pool.begin() + n);
  if (marked) out.tokens.push_back(TaskVocab::kQuery);
  out.tokens.insert(out.tokens.end(), pool.begin(), pool.begin() + n);
  // Marked: <q> predicts s1, then every repeat token but the last predicts its successor.
  // Unmarked: the second s1 predicts s2, and so on.
  const int last = static_cast<int>(out.tokens.size()) - 1;
  for (int p = start + n; p < last; ++p) out.positions.push_back(p);
  return out;
}

int draw_repeat_length(const TaskConfig& c, std::mt19937_64& rng, int offset_randomization) {
  const int lo = shortest(c);
  const int len = lo + static_cast<int>(rng() % static_cast<uint64_t>(c.context_len - lo + 1));
  return (len + row_padding(c, offset_randomization)) & ~1;
}

void check_repeat_lengths(const TaskConfig& c, int offset_randomization, const std::string& where) {
  const int pad = row_padding(c, offset_randomization);
  const int lo = (shortest(c) + pad) & ~1, hi = (c.context_len + pad) & ~1,
            most = 2 * content_tokens(c) + 2;
  if (lo < 6 || hi > most)
    throw Error(where + ": repeat_fraction > 0 needs task lengths in [6, " + std::to_string(most) +
                "] (the repeated tokens are distinct: at most n_keys + n_values + n_filler = " +
                std::to_string(content_tokens(c)) + " of them), but [task] gives [" +
                std::to_string(shortest(c)) + ", " + std::to_string(c.context_len) + "]" +
                (pad > 0 ? " plus " + std::to_string(pad) +
                               " padding fillers (lookup rows at offset_randomization " +
                               std::to_string(offset_randomization) + ")"
                         : std::string()));
}

void check_induction_len(const TaskConfig& c, int induction_len, const std::string& where) {
  const int most = 2 * content_tokens(c) + 2;
  if (induction_len < 6 || induction_len > most)
    throw Error(where + ": [train] key 'induction_len' is " + std::to_string(induction_len) +
                " (allowed: 6 to " + std::to_string(most) + ", twice the task's " +
                std::to_string(content_tokens(c)) + " content tokens plus 2)");
}

}  // namespace phasekv
