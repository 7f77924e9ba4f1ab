#include "task/lookup.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <vector>

#include "task/task_detail.h"
#include "util/error.h"

namespace phasekv::lookup {
namespace {

using task_detail::layout_error;

// Low-discrepancy steps in 64-bit fixed point: (sqrt 5 - 1)/2 (the golden ratio's fraction) and
// sqrt 2 - 1, times 2^64, rounded to odd so that id -> id * step is a bijection of the 64-bit ids
// (uniform for the random ids of training examples too). sqrt 2 - 1 also steps the target's depth:
// of sqrt 2 - 1, sqrt 3 - 1, e - 2 and 1 / the plastic number it gave the smallest per-phase SD
// spread of the target position (0.22 tokens on average over 20 seeds, N = 2400, M = 24, R = 64).
constexpr uint64_t kPhi = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kPsi = 0x6A09E667F3BCC909ULL;
constexpr uint64_t kDepthStep = kPsi;
constexpr uint64_t kDepthStream = 0x6465707468ULL;  // "depth": the seed's rotation of d
// Streams of the padding seed that place in-sequence fillers in gaps (the filler tokens come from
// task_detail::kPadBeforeStream / kPadAfterStream).
constexpr uint64_t kBeforeGapStream = 3, kAfterGapStream = 4;

// A fixed-point fraction x / 2^64 as a double in [0, 1), from its top 53 bits.
double unit(uint64_t x) {
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

// floor(n frac(x)) for n < 2^32, in integers.
int scale(uint64_t x, int n) {
  return static_cast<int>(((x >> 32) * static_cast<uint64_t>(n)) >> 32);
}

}  // namespace

int min_context_len(const TaskConfig& c) {
  return 2 * c.n_records + 2 * c.n_demos + 3;
}

int padding_tokens(int modulus) {
  if (modulus < 1 || modulus > kMaxModulus)
    throw Error("lookup task: modulus " + std::to_string(modulus) + " (allowed: 1 to " +
                std::to_string(kMaxModulus) + ")");
  return 4 * modulus - 2;
}

int target_record(const TaskConfig& c, uint64_t seed, uint64_t example_id) {
  if (c.target_depth >= 0) return static_cast<int>(std::lround(c.target_depth * (c.n_records - 1)));
  const uint64_t w = example_id * kDepthStep + kDepthStep / 2 + seed_for(seed, kDepthStream);
  return scale(w, c.n_records);
}

TargetPadding target_padding(uint64_t example_id, int unpadded_pos, int modulus, int phase) {
  const int M = modulus, P0 = 2 * M - 1;
  padding_tokens(M);  // range check
  if (phase < 0 || phase >= M || unpadded_pos < 0)
    throw Error("lookup task: phase " + std::to_string(phase) + " mod " + std::to_string(M) +
                " at unpadded position " + std::to_string(unpadded_pos) +
                " (allowed: 0 <= phase < modulus, position >= 0)");
  const int s = static_cast<int>((static_cast<int64_t>(P0) + unpadded_pos) % M);
  const double mu = ((M - 1) / 2.0 - phase) / M, v = 0.25;
  const double a = (v + mu * mu + mu) / 2, b = (v + mu * mu - mu) / 2;
  const double u = unit(example_id * kPhi + kPhi / 2 + static_cast<uint64_t>(phase) * kPsi);
  TargetPadding out;
  out.x = u < a ? 1 : (u < a + b ? -1 : 0);
  out.pad_before = P0 + (phase - s) + M * out.x;
  return out;
}

LogicalExample make_logical(const TaskConfig& c, uint64_t seed, uint64_t example_id,
                            int context_len) {
  const int R = c.n_records;
  if (context_len < min_context_len(c))
    throw Error("lookup task: context length " + std::to_string(context_len) + " below " +
                std::to_string(min_context_len(c)));
  const uint64_t base = seed_for(seed, example_id);
  Rng rng(base);
  LogicalExample lg;
  lg.kind = TaskKind::kLookup;
  lg.vocab = task_vocab(c);
  lg.record_format = RecordFormat::kKv;
  lg.seed = seed;
  lg.id = example_id;
  lg.padding_seed = task_detail::padding_seed(base);

  // Draw order (fixed: (seed, id) names the same example everywhere): keys, values,
  // demonstrations, body-filler gaps, body-filler tokens.
  const std::vector<int> keys = task_detail::draw_distinct(rng, R, c.n_keys);
  std::vector<int> values;
  if (c.distinct_values) {
    values = task_detail::draw_distinct(rng, R, c.n_values);
  } else {
    for (int i = 0; i < R; ++i) values.push_back(draw_below(rng, c.n_values));
  }
  const int target = target_record(c, seed, example_id);
  std::vector<int> others;
  for (int i = 0; i < R; ++i)
    if (i != target) others.push_back(i);
  shuffle_in_place(others, rng);
  lg.query_records.assign(others.begin(), others.begin() + c.n_demos);
  lg.query_records.push_back(target);

  const int n_fill = context_len - min_context_len(c);
  std::vector<int> gap_fill(static_cast<size_t>(R) + 1, 0);
  for (int i = 0; i < n_fill; ++i) ++gap_fill[static_cast<size_t>(draw_below(rng, R + 1))];
  const std::vector<int32_t> fill = task_detail::draw_fillers(lg.vocab, rng, n_fill);

  auto next_fill = fill.begin();
  for (int j = 0; j <= R; ++j) {
    lg.body.insert(lg.body.end(), next_fill, next_fill + gap_fill[static_cast<size_t>(j)]);
    next_fill += gap_fill[static_cast<size_t>(j)];
    if (j == R) break;
    TaskRecord r;
    r.key = lg.vocab.key(keys[static_cast<size_t>(j)]);
    r.value = lg.vocab.value(values[static_cast<size_t>(j)]);
    r.key_pos = static_cast<int>(lg.body.size());
    lg.body.push_back(r.key);
    lg.body.push_back(r.value);
    lg.records.push_back(r);
  }
  return lg;
}

TaskExample materialize(const LogicalExample& lg, int modulus, int phase, PaddingMode padding,
                        bool with_answer) {
  const int P = padding_tokens(modulus);
  const int R = static_cast<int>(lg.records.size());
  const int d = lg.query_records.back();
  const int body_len = static_cast<int>(lg.body.size());
  const TargetPadding tp = target_padding(lg.id, 1 + lg.target().key_pos, modulus, phase);
  const int k = tp.pad_before;

  // Fillers inserted right before body offset o (o = body_len: after the body).
  std::vector<int> at(static_cast<size_t>(body_len) + 1, 0);
  const auto gap_offset = [&](int j) {
    return j < R ? lg.records[static_cast<size_t>(j)].key_pos : body_len;
  };
  if (padding == PaddingMode::kPrefix) {
    at[0] += k;
    at[static_cast<size_t>(body_len)] += P - k;
  } else {
    Rng before(seed_for(lg.padding_seed, kBeforeGapStream));
    for (int i = 0; i < k; ++i) ++at[static_cast<size_t>(gap_offset(draw_below(before, d + 1)))];
    Rng after(seed_for(lg.padding_seed, kAfterGapStream));
    for (int i = 0; i < P - k; ++i)
      ++at[static_cast<size_t>(gap_offset(d + 1 + draw_below(after, R - d)))];
  }

  // Tokens. Fillers before the target key come from the before stream, the rest from the after
  // stream, in context order.
  const std::vector<int32_t> fill_before =
      task_detail::padding_fillers(lg, task_detail::kPadBeforeStream, k);
  const std::vector<int32_t> fill_after =
      task_detail::padding_fillers(lg, task_detail::kPadAfterStream, P - k);
  auto next_before = fill_before.begin(), next_after = fill_after.begin();
  TaskExample ex;
  ex.kind = TaskKind::kLookup;
  ex.tokens.reserve(static_cast<size_t>(1 + body_len + P + 2 * R + 2));
  ex.tokens.push_back(TaskVocab::kBos);
  const int target_off = lg.target().key_pos;
  for (int o = 0; o <= body_len; ++o) {
    for (int i = 0; i < at[static_cast<size_t>(o)]; ++i)
      ex.tokens.push_back(o <= target_off ? *next_before++ : *next_after++);
    if (o < body_len) ex.tokens.push_back(lg.body[static_cast<size_t>(o)]);
  }
  for (size_t q = 0; q + 1 < lg.query_records.size(); ++q) {
    const TaskRecord& r = lg.records[static_cast<size_t>(lg.query_records[q])];
    ex.tokens.push_back(r.key);
    ex.tokens.push_back(r.value);
  }
  ex.tokens.push_back(lg.target().key);
  if (with_answer) ex.tokens.push_back(lg.target().value);

  // Positions from the plan alone (cumulative insertions), never from the tokens: check_layout
  // compares the two.
  std::vector<int> inserted_through(static_cast<size_t>(body_len) + 1, 0);
  for (int o = 0, sum = 0; o <= body_len; ++o) {
    sum += at[static_cast<size_t>(o)];
    inserted_through[static_cast<size_t>(o)] = sum;
  }
  ex.records = lg.records;
  for (auto& r : ex.records)
    r.key_pos = 1 + r.key_pos + inserted_through[static_cast<size_t>(r.key_pos)];
  const int query_start = 1 + body_len + P;
  for (size_t i = 0; i < lg.query_records.size(); ++i) {
    TaskQuery q;
    q.record = lg.query_records[i];
    q.query_pos = query_start + 2 * static_cast<int>(i);
    q.answer = ex.records[static_cast<size_t>(q.record)].value;
    q.key_pos = ex.records[static_cast<size_t>(q.record)].key_pos;
    q.value_pos = q.key_pos + 1;
    ex.queries.push_back(q);
  }
  ex.record_format = RecordFormat::kKv;
  ex.with_answer = with_answer;
  ex.seed = lg.seed;
  ex.logical_id = lg.id;
  ex.padding = padding;
  ex.modulus = modulus;
  ex.phase = phase;
  ex.pad_before = k;
  ex.pad_after = P - k;
  lookup::check_layout(ex);
  return ex;
}

void check_layout(const TaskExample& ex) {
  const int n = static_cast<int>(ex.tokens.size());
  if (n == 0 || ex.tokens[0] != TaskVocab::kBos) layout_error(ex, "no leading <bos>");
  if (ex.queries.empty()) layout_error(ex, "no query");
  if (ex.modulus < 1 || ex.modulus > kMaxModulus) layout_error(ex, "modulus out of range");
  if (ex.pad_before < 0 || ex.pad_after < 0 ||
      ex.pad_before + ex.pad_after != padding_tokens(ex.modulus))
    layout_error(ex, "padding counts " + std::to_string(ex.pad_before) + " + " +
                         std::to_string(ex.pad_after) +
                         " are not 4M - 2 = " + std::to_string(padding_tokens(ex.modulus)));
  // The query block: demonstrations `key value`, then the target key (and its answer).
  const int query_start = ex.queries.front().query_pos;
  const TaskQuery& target = ex.queries.back();
  if (query_start < 1 || query_start > n) layout_error(ex, "query block out of range");
  if (n != target.query_pos + (ex.with_answer ? 2 : 1))
    layout_error(ex, "the sequence does not end at the target key" +
                         std::string(ex.with_answer ? " and its answer" : ""));

  // Records: in context order, before the query block, each key exactly once there, its value
  // next; every other token of the context is a filler.
  std::unordered_map<int32_t, int> key_count;
  for (const auto& r : ex.records) key_count[r.key] = 0;
  for (int p = 0; p < query_start; ++p) {
    auto it = key_count.find(ex.tokens[static_cast<size_t>(p)]);
    if (it != key_count.end()) ++it->second;
  }
  std::vector<char> is_record_token(static_cast<size_t>(query_start), 0);
  for (size_t i = 0; i < ex.records.size(); ++i) {
    const TaskRecord& r = ex.records[i];
    const std::string name =
        "record " + std::to_string(i) + " planned at " + std::to_string(r.key_pos);
    if (r.key_pos < 1 || r.key_pos + 2 > query_start)
      layout_error(ex, name + ": not between <bos> and the demonstrations");
    if (i > 0 && r.key_pos < ex.records[i - 1].key_pos + 2)
      layout_error(ex, name + ": overlaps or precedes the record before it");
    if (ex.tokens[static_cast<size_t>(r.key_pos)] != r.key || key_count[r.key] != 1)
      layout_error(ex, name + ": its key occurs " + std::to_string(key_count[r.key]) +
                           " time(s) before the demonstrations, not once at the planned position");
    if (ex.tokens[static_cast<size_t>(r.key_pos) + 1] != r.value)
      layout_error(ex, name + ": value is not after key");
    is_record_token[static_cast<size_t>(r.key_pos)] =
        is_record_token[static_cast<size_t>(r.key_pos) + 1] = 1;
  }
  // (TaskExample carries no vocabulary: a padding token must be no special token and no record's
  // key or value, which is what a retrieval could confuse.)
  std::unordered_map<int32_t, int> values;
  for (const auto& r : ex.records) ++values[r.value];
  for (int p = 1; p < query_start; ++p) {
    if (is_record_token[static_cast<size_t>(p)]) continue;
    const int32_t t = ex.tokens[static_cast<size_t>(p)];
    if (t < TaskVocab::kFirstKey || key_count.count(t) || values.count(t))
      layout_error(ex, "token " + std::to_string(t) + " at " + std::to_string(p) +
                           " between the records is a special token or a record's key or value, "
                           "not a filler");
  }

  // Queries: the demonstrations are distinct records other than the target's, in consecutive
  // pairs; the target is the last token (or the one before its answer).
  std::vector<char> demo_seen(ex.records.size(), 0);
  for (size_t i = 0; i < ex.queries.size(); ++i) {
    const TaskQuery& q = ex.queries[i];
    const bool last = i + 1 == ex.queries.size();
    const std::string name = (last ? "target query" : "demonstration " + std::to_string(i)) +
                             " at " + std::to_string(q.query_pos);
    if (q.record < 0 || q.record >= static_cast<int>(ex.records.size()))
      layout_error(ex, name + ": no such record");
    const TaskRecord& r = ex.records[static_cast<size_t>(q.record)];
    if (q.query_pos != query_start + 2 * static_cast<int>(i))
      layout_error(ex, name + ": not where the query block puts it");
    if (q.query_pos >= n || ex.tokens[static_cast<size_t>(q.query_pos)] != r.key)
      layout_error(ex, name + ": is not its record's key");
    if (q.answer != r.value || q.key_pos != r.key_pos || q.value_pos != r.key_pos + 1)
      layout_error(ex, name + ": answer or positions differ from its record");
    const bool answer_shown = ex.with_answer || !last;
    if (answer_shown &&
        (q.query_pos + 1 >= n || ex.tokens[static_cast<size_t>(q.query_pos) + 1] != q.answer))
      layout_error(ex, name + ": the answer is not the next token");
    if (!last) {
      if (q.record == target.record) layout_error(ex, name + ": demonstrates the target's record");
      if (demo_seen[static_cast<size_t>(q.record)]++) layout_error(ex, name + ": repeats a record");
    }
  }
  if (target.key_pos % ex.modulus != ex.phase)
    layout_error(
        ex, "the target key at " + std::to_string(target.key_pos) + " is not at the planned phase");
}

TaskExample sample_training_example(const TaskConfig& c, Rng& rng, int offset_randomization_M,
                                    const std::vector<double>& phase_weights,
                                    double in_sequence_share) {
  const int lo = c.min_context_len == 0 ? c.context_len : c.min_context_len;
  const int len = lo + draw_below(rng, c.context_len - lo + 1);
  const uint64_t id = rng();
  const LogicalExample lg = make_logical(c, task_detail::kTrainingSeed, id, len);
  const int m = std::max(offset_randomization_M, 1);
  const int phase = draw_training_phase(rng, m, phase_weights);
  const PaddingMode mode =
      draw_chance(rng, in_sequence_share) ? PaddingMode::kInSequence : PaddingMode::kPrefix;
  return lookup::materialize(lg, m, phase, mode, true);
}

}  // namespace phasekv::lookup
