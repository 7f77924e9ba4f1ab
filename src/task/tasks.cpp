#include "task/tasks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "task/lookup.h"
#include "task/task_detail.h"
#include "util/error.h"
#include "util/json_read.h"
#include "util/rng.h"

namespace phasekv {

// ---------------------------------------------------------------------------------------------
// Random draws (util/rng.h), so (seed, example_id) names the same example everywhere; shared with
// lookup.cpp.

namespace task_detail {

// Rejection stays cheap because n <= range.
std::vector<int> draw_distinct(Rng& rng, int n, int range) {
  std::vector<int> out;
  std::unordered_set<int> taken;
  while (static_cast<int>(out.size()) < n) {
    const int x = draw_below(rng, range);
    if (taken.insert(x).second) out.push_back(x);
  }
  return out;
}

std::vector<int32_t> draw_fillers(const TaskVocab& v, Rng& rng, int count) {
  std::vector<int32_t> out(count);
  for (auto& t : out) t = v.filler(draw_below(rng, v.n_filler));
  return out;
}

uint64_t padding_seed(uint64_t example_base) {
  return splitmix64(example_base ^ 0x70616464696e67ULL);  // "padding"
}

std::vector<int32_t> padding_fillers(const LogicalExample& lg, uint64_t stream, int count) {
  Rng rng(seed_for(lg.padding_seed, stream));
  return draw_fillers(lg.vocab, rng, count);
}

void layout_error(const TaskExample& ex, const std::string& what) {
  throw Error("task layout check failed (" + to_string(ex.kind) + ", seed " +
              std::to_string(ex.seed) + ", logical example " + std::to_string(ex.logical_id) +
              ", M=" + std::to_string(ex.modulus) + ", r=" + std::to_string(ex.phase) + ", " +
              to_string(ex.padding) + "): " + what);
}

}  // namespace task_detail

namespace {

using nlohmann::json;
using task_detail::draw_distinct;
using task_detail::draw_fillers;
using task_detail::kPadAfterStream;
using task_detail::kPadBeforeStream;
using task_detail::kTrainingSeed;
using task_detail::layout_error;
using task_detail::padding_fillers;

constexpr int kMaxCount = 1'000'000;  // keys, values, fillers, records: keeps ids in int32
constexpr int kMaxContext = 1 << 24;
constexpr int kQueryLen = 3;  // <q> key value

// ---------------------------------------------------------------------------------------------
// Sizes.

int record_len(RecordFormat f) {
  return f == RecordFormat::kKvSep ? 3 : 2;
}

int query_block_len(const TaskConfig& c) {
  return kQueryLen * c.n_queries;
}

// The shortest sequence that holds <bos>, every record and the query block.
int min_sequence_len(const TaskConfig& c) {
  return 1 + c.n_records * record_len(c.record_format) + query_block_len(c);
}

// ---------------------------------------------------------------------------------------------
// Config parsing. Type checks here; every range check lives in validate().

const std::set<std::string> kTaskKeys = {"name",          "n_keys",       "n_values",
                                         "n_filler",      "n_records",    "distinct_values",
                                         "record_format", "context_len",  "min_context_len",
                                         "n_queries",     "target_depth", "n_demos"};

const json_read::Choices<TaskKind> kKinds = {
    {"kv", TaskKind::kKv}, {"passkey", TaskKind::kPasskey}, {"lookup", TaskKind::kLookup}};
const json_read::Choices<RecordFormat> kFormats = {{"kv", RecordFormat::kKv},
                                                   {"kv_sep", RecordFormat::kKvSep}};
const json_read::Choices<PaddingMode> kPaddings = {{"prefix", PaddingMode::kPrefix},
                                                   {"in_sequence", PaddingMode::kInSequence}};

void require_range(const std::string& where, const char* key, int v, int lo, int hi,
                   const std::string& why = "") {
  if (v < lo || v > hi)
    throw Error(where + ": key '" + key + "' is " + std::to_string(v) + " (allowed: integer in [" +
                std::to_string(lo) + ", " + std::to_string(hi) + "]" + why + ")");
}

// ---------------------------------------------------------------------------------------------
// Logical examples.

// The body before expansion: each unit is one filler token or one record.
struct Arrangement {
  std::vector<char> is_record;
  int target_unit = -1;  // the pinned target record's unit when target_depth is set
};

// The unit boundary whose token offset is closest to `want` (ties: the earlier one).
int nearest_boundary(const std::vector<char>& is_record, int rec_len, int want) {
  int best = 0, best_dist = std::abs(want), offset = 0;
  for (size_t u = 0; u < is_record.size(); ++u) {
    offset += is_record[u] ? rec_len : 1;
    if (std::abs(offset - want) < best_dist) {
      best = static_cast<int>(u) + 1;
      best_dist = std::abs(offset - want);
    }
  }
  return best;
}

// Shuffling units (not tokens) places records uniformly without overlaps. A pinned target is
// inserted afterwards at the boundary nearest its depth: within one record length of it.
Arrangement arrange_body(const TaskConfig& c, int n_fill, std::mt19937_64& rng) {
  const bool pinned = c.target_depth >= 0;
  Arrangement a;
  a.is_record.assign(n_fill, 0);
  a.is_record.insert(a.is_record.end(), c.n_records - (pinned ? 1 : 0), 1);
  shuffle_in_place(a.is_record, rng);
  if (pinned) {
    const int rl = record_len(c.record_format);
    const int rest_len = n_fill + (c.n_records - 1) * rl;
    const int want = static_cast<int>(std::lround(c.target_depth * rest_len));
    a.target_unit = nearest_boundary(a.is_record, rl, want);
    a.is_record.insert(a.is_record.begin() + a.target_unit, 1);
  }
  return a;
}

// Keys are distinct so a query names exactly one record; values repeat only when asked to.
std::vector<TaskRecord> draw_bindings(const TaskConfig& c, const TaskVocab& v,
                                      std::mt19937_64& rng) {
  std::vector<TaskRecord> out(c.n_records);
  if (c.kind == TaskKind::kPasskey) {
    out[0].key = TaskVocab::kPasskey;
  } else {
    const std::vector<int> keys = draw_distinct(rng, c.n_records, c.n_keys);
    for (int i = 0; i < c.n_records; ++i) out[i].key = v.key(keys[i]);
  }
  std::vector<int> values;
  if (c.distinct_values) {
    values = draw_distinct(rng, c.n_records, c.n_values);
  } else {
    for (int i = 0; i < c.n_records; ++i) values.push_back(draw_below(rng, c.n_values));
  }
  for (int i = 0; i < c.n_records; ++i) out[i].value = v.value(values[i]);
  return out;
}

void append_record(std::vector<int32_t>& tokens, const TaskRecord& r, RecordFormat f) {
  tokens.push_back(r.key);
  tokens.push_back(r.value);
  if (f == RecordFormat::kKvSep) tokens.push_back(TaskVocab::kSep);
}

// Distinct queried records in random order, the target last.
std::vector<int> draw_queries(const TaskConfig& c, int target, std::mt19937_64& rng) {
  if (target < 0) target = draw_below(rng, c.n_records);
  std::vector<int> others;
  for (int i = 0; i < c.n_records; ++i)
    if (i != target) others.push_back(i);
  shuffle_in_place(others, rng);
  others.resize(c.n_queries - 1);
  others.push_back(target);
  return others;
}

LogicalExample build_logical(const TaskConfig& c, int context_len, std::mt19937_64& rng) {
  LogicalExample lg;
  lg.kind = c.kind;
  lg.vocab = task_vocab(c);
  lg.record_format = c.record_format;
  const int n_fill = context_len - min_sequence_len(c);
  const Arrangement a = arrange_body(c, n_fill, rng);
  const std::vector<TaskRecord> bindings = draw_bindings(c, lg.vocab, rng);
  int target = -1;
  for (size_t u = 0; u < a.is_record.size(); ++u) {
    if (!a.is_record[u]) {
      lg.body.push_back(lg.vocab.filler(draw_below(rng, c.n_filler)));
      continue;
    }
    if (static_cast<int>(u) == a.target_unit) target = static_cast<int>(lg.records.size());
    TaskRecord r = bindings[lg.records.size()];
    r.key_pos = static_cast<int>(lg.body.size());
    append_record(lg.body, r, c.record_format);
    lg.records.push_back(r);
  }
  lg.query_records = draw_queries(c, target, rng);
  return lg;
}

LogicalExample make_logical(const TaskConfig& c, uint64_t seed, uint64_t id, int context_len) {
  validate(c, "task config");
  const uint64_t base = seed_for(seed, id);
  std::mt19937_64 rng(base);
  LogicalExample lg = build_logical(c, context_len, rng);
  lg.seed = seed;
  lg.id = id;
  lg.padding_seed = task_detail::padding_seed(base);
  return lg;
}

// ---------------------------------------------------------------------------------------------
// Materialization. Padding fillers come from padding_fillers: phases of one example differ in
// padding only by count.

struct PaddingPlan {
  PaddingMode mode;
  int before;  // k
  int after;   // M - 1 - k
};

// Where a body position lands: in-sequence padding moves only the target and what follows it.
int absolute_pos(const LogicalExample& lg, const PaddingPlan& p, int body_pos) {
  const bool moves = p.mode == PaddingMode::kPrefix || body_pos >= lg.target().key_pos;
  return 1 + body_pos + (moves ? p.before : 0);
}

std::vector<int32_t> layout_tokens(const LogicalExample& lg, const PaddingPlan& p,
                                   bool with_answer) {
  const std::vector<int32_t> before = padding_fillers(lg, kPadBeforeStream, p.before);
  const std::vector<int32_t> after = padding_fillers(lg, kPadAfterStream, p.after);
  const auto split = lg.body.begin() + lg.target().key_pos;
  std::vector<int32_t> t = {TaskVocab::kBos};
  if (p.mode == PaddingMode::kPrefix) t.insert(t.end(), before.begin(), before.end());
  t.insert(t.end(), lg.body.begin(), split);
  if (p.mode == PaddingMode::kInSequence) t.insert(t.end(), before.begin(), before.end());
  t.insert(t.end(), split, lg.body.end());
  t.insert(t.end(), after.begin(), after.end());
  for (int q : lg.query_records)
    t.insert(t.end(), {TaskVocab::kQuery, lg.records[q].key, lg.records[q].value});
  if (!with_answer) t.pop_back();
  return t;
}

// Positions computed from the plan alone, never by looking at the tokens: check_layout then
// compares the two.
void plan_positions(const LogicalExample& lg, const PaddingPlan& p, TaskExample& ex) {
  ex.records = lg.records;
  for (auto& r : ex.records) r.key_pos = absolute_pos(lg, p, r.key_pos);
  const int query_start = 1 + static_cast<int>(lg.body.size()) + p.before + p.after;
  for (size_t i = 0; i < lg.query_records.size(); ++i) {
    TaskQuery q;
    q.record = lg.query_records[i];
    q.query_pos = query_start + kQueryLen * static_cast<int>(i) + 1;
    q.answer = ex.records[q.record].value;
    q.key_pos = ex.records[q.record].key_pos;
    q.value_pos = q.key_pos + 1;
    ex.queries.push_back(q);
  }
}

// ---------------------------------------------------------------------------------------------
// Layout check.

int find_query_block(const TaskExample& ex) {
  const auto it = std::find(ex.tokens.begin(), ex.tokens.end(), TaskVocab::kQuery);
  if (it == ex.tokens.end()) layout_error(ex, "no <q> token");
  return static_cast<int>(it - ex.tokens.begin());
}

// Scans the context once and checks every record where the plan put it.
void check_records(const TaskExample& ex, int query_start) {
  std::unordered_map<int32_t, std::vector<int>> seen;  // key token -> positions in the context
  for (const auto& r : ex.records) seen[r.key];
  for (int p = 0; p < query_start; ++p) {
    auto it = seen.find(ex.tokens[p]);
    if (it != seen.end()) it->second.push_back(p);
  }
  const int rl = record_len(ex.record_format);
  for (size_t i = 0; i < ex.records.size(); ++i) {
    const TaskRecord& r = ex.records[i];
    const std::string name =
        "record " + std::to_string(i) + " planned at " + std::to_string(r.key_pos);
    if (seen[r.key] != std::vector<int>{r.key_pos})
      layout_error(ex, name + ": its key occurs " + std::to_string(seen[r.key].size()) +
                           " time(s) in the context, not once at the planned position");
    if (r.key_pos + rl > query_start) layout_error(ex, name + ": runs into the query block");
    if (ex.tokens[r.key_pos + 1] != r.value) layout_error(ex, name + ": value is not after key");
    if (rl == 3 && ex.tokens[r.key_pos + 2] != TaskVocab::kSep)
      layout_error(ex, name + ": <sep> is not after the value");
  }
}

void check_query(const TaskExample& ex, size_t i, int query_start) {
  const TaskQuery& q = ex.queries[i];
  const int n = static_cast<int>(ex.tokens.size());
  const std::string name = "query " + std::to_string(i) + " at " + std::to_string(q.query_pos);
  const bool last = i + 1 == ex.queries.size();
  if (q.record < 0 || q.record >= static_cast<int>(ex.records.size()))
    layout_error(ex, name + ": no such record");
  const TaskRecord& r = ex.records[q.record];
  if (q.query_pos <= query_start || q.query_pos >= n) layout_error(ex, name + ": out of range");
  if (ex.tokens[q.query_pos - 1] != TaskVocab::kQuery || ex.tokens[q.query_pos] != r.key)
    layout_error(ex, name + ": is not `<q> key` of its record");
  if (q.answer != r.value || q.key_pos != r.key_pos || q.value_pos != r.key_pos + 1)
    layout_error(ex, name + ": answer or positions differ from its record");
  // Only the last query of an evaluation sequence stops at its key.
  const bool answer_shown = ex.with_answer || !last;
  if (last && n != q.query_pos + (answer_shown ? 2 : 1))
    layout_error(ex, name + ": the sequence does not end where planned");
  if (answer_shown && (q.query_pos + 1 >= n || ex.tokens[q.query_pos + 1] != q.answer))
    layout_error(ex, name + ": the answer is not the next token");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Vocabulary.

namespace {
const std::vector<std::string> kSpecialNames = {"<pad>", "<bos>", "<q>", "<sep>", "<pk>"};

// "k12" -> 12 for prefix 'k'; -1 unless canonical (no sign, no leading zero), so names and ids
// are in one-to-one correspondence.
int parse_indexed(const std::string& name, char prefix) {
  if (name.size() < 2 || name.size() > 8 || name[0] != prefix) return -1;
  if (name[1] == '0' && name.size() > 2) return -1;
  int v = 0;
  for (size_t i = 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}
}  // namespace

TaskVocab task_vocab(const TaskConfig& c) {
  TaskVocab v;
  v.n_keys = c.n_keys;
  v.n_values = c.n_values;
  v.n_filler = c.n_filler;
  return v;
}

// Names are built by append, not `"k" + std::to_string(..)`: GCC 12 reports a false -Wrestrict
// on the latter (GCC bug 105329).
static std::string prefixed(char prefix, int32_t index) {
  std::string s(1, prefix);
  s += std::to_string(index);
  return s;
}

std::string TaskVocab::token_name(int32_t id) const {
  if (id >= 0 && id < kFirstKey) return kSpecialNames[id];
  if (is_key(id)) return prefixed('k', id - key(0));
  if (is_value(id)) return prefixed('v', id - value(0));
  if (is_filler(id)) return prefixed('f', id - filler(0));
  throw Error("token id " + std::to_string(id) + " is outside the task vocabulary [0, " +
              std::to_string(vocab_size()) + ")");
}

int32_t TaskVocab::token_id(const std::string& name) const {
  for (int32_t i = 0; i < kFirstKey; ++i)
    if (kSpecialNames[i] == name) return i;
  const struct {
    char prefix;
    int count;
    int32_t first;
  } ranges[] = {{'k', n_keys, key(0)}, {'v', n_values, value(0)}, {'f', n_filler, filler(0)}};
  for (const auto& r : ranges) {
    const int i = parse_indexed(name, r.prefix);
    if (i >= 0 && i < r.count) return r.first + i;
  }
  throw Error("unknown token name '" + name + "' (allowed: " + json_read::join(kSpecialNames) +
              ", k0..k" + std::to_string(n_keys - 1) + ", v0..v" + std::to_string(n_values - 1) +
              ", f0..f" + std::to_string(n_filler - 1) + ")");
}

std::vector<std::string> TaskVocab::token_names() const {
  std::vector<std::string> out;
  for (int32_t id = 0; id < vocab_size(); ++id) out.push_back(token_name(id));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Config.

std::string to_string(TaskKind k) {
  return json_read::choice_name(k, kKinds);
}
std::string to_string(RecordFormat f) {
  return json_read::choice_name(f, kFormats);
}
std::string to_string(PaddingMode m) {
  return json_read::choice_name(m, kPaddings);
}

PaddingMode padding_mode_from_string(const std::string& s, const std::string& where) {
  // Outputs spell it in_sequence; command lines may say in-sequence.
  const std::string name = s == "in-sequence" ? "in_sequence" : s;
  PaddingMode m = PaddingMode::kPrefix;
  json_read::read_choice(json{{"padding", name}}, "padding", m, kPaddings, where);
  return m;
}

TaskConfig task_config_from_json(const json& j, const std::string& where) {
  json_read::check_keys(j, kTaskKeys, where);
  TaskConfig c;
  json_read::read_choice(j, "name", c.kind, kKinds, where);
  json_read::read(j, "n_keys", c.n_keys, where);
  json_read::read(j, "n_values", c.n_values, where);
  json_read::read(j, "n_filler", c.n_filler, where);
  json_read::read(j, "n_records", c.n_records, where);
  json_read::read(j, "distinct_values", c.distinct_values, where);
  json_read::read_choice(j, "record_format", c.record_format, kFormats, where);
  json_read::read(j, "context_len", c.context_len, where);
  json_read::read(j, "min_context_len", c.min_context_len, where);
  json_read::read(j, "n_queries", c.n_queries, where);
  json_read::read(j, "target_depth", c.target_depth, where);
  json_read::read(j, "n_demos", c.n_demos, where);
  validate(c, where);
  return c;
}

json task_config_to_json(const TaskConfig& c) {
  json j = {{"name", to_string(c.kind)},
            {"n_keys", c.n_keys},
            {"n_values", c.n_values},
            {"n_filler", c.n_filler},
            {"n_records", c.n_records},
            {"distinct_values", c.distinct_values},
            {"record_format", to_string(c.record_format)},
            {"context_len", c.context_len},
            {"min_context_len", c.min_context_len},
            {"n_queries", c.n_queries},
            {"target_depth", c.target_depth}};
  // Only lookup has demonstrations: other kinds' task.json files stay as they were.
  if (c.kind == TaskKind::kLookup) j["n_demos"] = c.n_demos;
  return j;
}

namespace {

// name = lookup: the study's layout fixes the record format and counts its queries in n_demos.
void validate_lookup(const TaskConfig& c, const std::string& where) {
  require_range(where, "n_records", c.n_records, 1, kMaxCount);
  require_range(where, "n_keys", c.n_keys, c.n_records, kMaxCount,
                "; keys are distinct, so at least n_records");
  require_range(where, "n_values", c.n_values, c.distinct_values ? c.n_records : 1, kMaxCount,
                c.distinct_values ? "; distinct_values needs at least n_records" : "");
  require_range(where, "n_filler", c.n_filler, 1, kMaxCount, "; padding and body fillers");
  require_range(where, "n_demos", c.n_demos, 0, c.n_records - 1,
                "; demonstrations copy distinct records other than the target's");
  if (c.n_queries != 1)
    throw Error(where + ": key 'n_queries' is " + std::to_string(c.n_queries) +
                " (allowed: 1 for name=lookup, whose queries are its n_demos demonstrations and "
                "the target)");
  if (c.record_format != RecordFormat::kKv)
    throw Error(where + ": key 'record_format' is \"" + to_string(c.record_format) +
                "\" (allowed: \"kv\" for name=lookup: each key directly followed by its value)");
  require_range(where, "context_len", c.context_len, lookup::min_context_len(c), kMaxContext,
                "; name=lookup needs <bos> + 2 n_records + 2 n_demos + target key + answer = " +
                    std::to_string(lookup::min_context_len(c)) +
                    " at least, the rest are fillers between records");
  if (c.min_context_len != 0)
    require_range(where, "min_context_len", c.min_context_len, lookup::min_context_len(c),
                  c.context_len, "; or 0 for a fixed context_len");
}

}  // namespace

void validate(const TaskConfig& c, const std::string& where) {
  if (c.target_depth != -1 && !(c.target_depth >= 0 && c.target_depth <= 1))
    throw Error(where + ": key 'target_depth' is " + std::to_string(c.target_depth) +
                " (allowed: a number in [0, 1], or -1 for a random depth)");
  if (c.kind == TaskKind::kLookup) return validate_lookup(c, where);
  if (c.n_demos != 0)
    throw Error(where + ": key 'n_demos' is " + std::to_string(c.n_demos) +
                " (allowed: 0 for name=" + to_string(c.kind) +
                "; only name=lookup has demonstrations)");
  const bool passkey = c.kind == TaskKind::kPasskey;
  require_range(where, "n_records", c.n_records, 1, passkey ? 1 : kMaxCount,
                passkey ? "; name=passkey has one needle" : "");
  require_range(where, "n_keys", c.n_keys, passkey ? 0 : c.n_records, kMaxCount,
                passkey ? "" : "; keys are distinct, so at least n_records");
  require_range(where, "n_values", c.n_values, c.distinct_values ? c.n_records : 1, kMaxCount,
                c.distinct_values ? "; distinct_values needs at least n_records" : "");
  require_range(where, "n_filler", c.n_filler, 1, kMaxCount);
  require_range(where, "n_queries", c.n_queries, 1, c.n_records,
                "; queries ask distinct records, so at most n_records");
  require_range(where, "context_len", c.context_len, min_sequence_len(c), kMaxContext,
                "; at least <bos> + n_records records + n_queries queries of 3 tokens");
  if (c.min_context_len != 0)
    require_range(where, "min_context_len", c.min_context_len, min_sequence_len(c), c.context_len,
                  "; or 0 for a fixed context_len");
}

// ---------------------------------------------------------------------------------------------
// Examples.

LogicalExample make_logical_example(const TaskConfig& c, uint64_t seed, uint64_t example_id) {
  if (c.kind == TaskKind::kLookup) {
    validate(c, "task config");
    return lookup::make_logical(c, seed, example_id, c.context_len);
  }
  return make_logical(c, seed, example_id, c.context_len);
}

TaskExample materialize(const LogicalExample& lg, int modulus, int phase, PaddingMode padding,
                        bool with_answer) {
  if (modulus < 1 || phase < 0 || phase >= modulus)
    throw Error("materialize: phase " + std::to_string(phase) + " mod " + std::to_string(modulus) +
                " (allowed: modulus >= 1 and 0 <= phase < modulus)");
  if (lg.kind == TaskKind::kLookup)
    return lookup::materialize(lg, modulus, phase, padding, with_answer);
  // Padding is added before the target, so k = (r - p0) mod M moves the key from p0 to phase r.
  const int unpadded_pos = 1 + lg.target().key_pos;
  const int k = ((phase - unpadded_pos) % modulus + modulus) % modulus;
  const PaddingPlan plan{padding, k, modulus - 1 - k};
  TaskExample ex;
  ex.kind = lg.kind;
  ex.tokens = layout_tokens(lg, plan, with_answer);
  plan_positions(lg, plan, ex);
  ex.record_format = lg.record_format;
  ex.with_answer = with_answer;
  ex.seed = lg.seed;
  ex.logical_id = lg.id;
  ex.padding = padding;
  ex.modulus = modulus;
  ex.phase = phase;
  ex.pad_before = plan.before;
  ex.pad_after = plan.after;
  check_layout(ex);
  return ex;
}

void check_layout(const TaskExample& ex) {
  if (ex.kind == TaskKind::kLookup) return lookup::check_layout(ex);
  if (ex.tokens.empty() || ex.tokens[0] != TaskVocab::kBos) layout_error(ex, "no leading <bos>");
  if (ex.queries.empty()) layout_error(ex, "no query");
  const int query_start = find_query_block(ex);
  check_records(ex, query_start);
  for (size_t i = 0; i < ex.queries.size(); ++i) check_query(ex, i, query_start);
  if (ex.modulus < 1 || ex.target().key_pos % ex.modulus != ex.phase)
    layout_error(ex, "the target key at " + std::to_string(ex.target().key_pos) +
                         " is not at the planned phase");
}

TaskExample sample_training_example(const TaskConfig& c, std::mt19937_64& rng,
                                    int offset_randomization_M) {
  return sample_training_example(c, rng, offset_randomization_M, {});
}

int draw_training_phase(std::mt19937_64& rng, int m, const std::vector<double>& phase_weights) {
  if (phase_weights.empty()) return draw_below(rng, m);
  if (static_cast<int>(phase_weights.size()) != m)
    throw Error("phase weights: " + std::to_string(phase_weights.size()) +
                " weights for modulus " + std::to_string(m) + " (allowed: one per phase)");
  double total = 0;
  for (double w : phase_weights) {
    if (!(w >= 0) || !std::isfinite(w))
      throw Error("phase weights: a weight is " + std::to_string(w) + " (allowed: finite, >= 0)");
    total += w;
  }
  if (!(total > 0)) throw Error("phase weights: they sum to 0 (allowed: a positive sum)");
  return draw_weighted(rng, phase_weights);
}

TaskExample sample_training_example(const TaskConfig& c, std::mt19937_64& rng,
                                    int offset_randomization_M,
                                    const std::vector<double>& phase_weights,
                                    double in_sequence_share) {
  if (offset_randomization_M < 0)
    throw Error("offset randomization modulus is " + std::to_string(offset_randomization_M) +
                " (allowed: 0 = off, or >= 1)");
  if (c.kind == TaskKind::kLookup) {
    validate(c, "task config");
    return lookup::sample_training_example(c, rng, offset_randomization_M, phase_weights,
                                           in_sequence_share);
  }
  if (in_sequence_share != kDefaultInSequenceShare)
    throw Error("in-sequence padding share " + std::to_string(in_sequence_share) +
                ": only the lookup task trains with in-sequence padding (allowed for '" +
                to_string(c.kind) + "': the default " + std::to_string(kDefaultInSequenceShare) +
                ")");
  const int lo = c.min_context_len == 0 ? c.context_len : c.min_context_len;
  const int len = lo + draw_below(rng, c.context_len - lo + 1);
  const uint64_t id = rng();
  const LogicalExample lg = make_logical(c, kTrainingSeed, id, len);
  // A uniform phase is the same as a uniform prefix padding k in [0, M).
  const int m = std::max(offset_randomization_M, 1);
  return materialize(lg, m, draw_training_phase(rng, m, phase_weights), PaddingMode::kPrefix,
                     true);
}

std::vector<int> answer_positions(const TaskExample& ex) {
  std::vector<int> out;
  for (const auto& q : ex.queries)
    if (q.query_pos + 1 < static_cast<int>(ex.tokens.size())) out.push_back(q.query_pos);
  return out;
}

std::vector<uint8_t> answer_loss_mask(const TaskExample& ex) {
  std::vector<uint8_t> mask(ex.tokens.size(), 0);
  for (int p : answer_positions(ex)) mask[p] = 1;
  return mask;
}

double shortcut_ceiling(const LogicalExample& lg) {
  std::map<int32_t, int> remaining;  // value -> records still possible for the target
  for (const auto& r : lg.records) ++remaining[r.value];
  for (size_t i = 0; i + 1 < lg.query_records.size(); ++i)
    --remaining[lg.records[lg.query_records[i]].value];
  int best = 0, total = 0;
  for (const auto& [value, count] : remaining) {
    best = std::max(best, count);
    total += count;
  }
  return static_cast<double>(best) / total;
}

double shortcut_ceiling(const TaskConfig& c, uint64_t seed, int n_examples) {
  if (n_examples < 1) throw Error("shortcut_ceiling: n_examples must be >= 1");
  double sum = 0;
  for (int i = 0; i < n_examples; ++i) sum += shortcut_ceiling(make_logical_example(c, seed, i));
  return sum / n_examples;
}

}  // namespace phasekv
