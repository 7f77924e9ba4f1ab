// Synthetic retrieval tasks in token-id space, with exact control of the target's phase.
//
// A phase experiment compares the SAME logical example (records, bindings, filler, queries) at
// every phase r = p mod M of its target key position p. Generation is therefore split in two:
// a LogicalExample is drawn from (seed, example_id) alone, and materialize() lays it out at phase r
// by inserting filler padding: k tokens before the target (right after <bos>, or right before the
// target record) and M-1-k right before the query block, so the length and the query positions are
// the same for every r. Every materialized sequence is checked against its plan (check_layout): a
// prototype once wrote a value over a separator at one phase only, silently skewing that phase.
//
// Sequence shape: <bos> body [pad] <q> key value ... <q> key value. The body is filler with the
// records (needles) at random non-overlapping places. The last query is the target: evaluation
// scores the prediction at its key (the sequence ends there when with_answer is false).
//
// The lookup task (name = "lookup", task/lookup.h) has the study's layout instead: adjacent
// records, demonstrations, the target key last, and a padding that also holds the mean and
// variance of the target position fixed across phases. The functions below dispatch on the kind.
//
// Free of libtorch on purpose: plain vectors of int32 ids compile and test in seconds.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace phasekv {

enum class TaskKind { kKv, kPasskey, kLookup };
// kv: `key value` adjacent; kv_sep: `key value <sep>`.
enum class RecordFormat { kKv, kKvSep };
// prefix: k fillers right after <bos> (everything moves); in_sequence: k fillers right before the
// target record (only the target and what follows move). lookup spreads its in_sequence fillers
// over the gaps between records (task/lookup.h).
enum class PaddingMode { kPrefix, kInSequence };

struct TaskConfig {
  TaskKind kind = TaskKind::kKv;  // JSON key "name": "kv" | "passkey" | "lookup"
  int n_keys = 32;
  int n_values = 32;
  int n_filler = 16;
  int n_records = 1;  // passkey: exactly 1
  bool distinct_values = true;
  RecordFormat record_format = RecordFormat::kKv;
  int context_len = 64;      // logical length: <bos>, body and query block (answers included)
  int min_context_len = 0;   // training only: 0 = always context_len, else uniform in [min, max]
  int n_queries = 1;         // queries of distinct records; passkey: exactly 1
  double target_depth = -1;  // target record start as a fraction of the body; -1 = random
  // lookup only (0 for the other kinds): demonstrations, `key value` pairs of records other than
  // the target's, between the records and the target key.
  int n_demos = 0;
};

// Ids: 0 <pad>, 1 <bos>, 2 <q>, 3 <sep>, 4 <pk>, then keys k0.., values v0.., fillers f0...
// The names are the word-level tokenizer of synthetic models.
struct TaskVocab {
  static constexpr int32_t kPad = 0, kBos = 1, kQuery = 2, kSep = 3, kPasskey = 4;
  static constexpr int32_t kFirstKey = 5;
  int n_keys = 0, n_values = 0, n_filler = 0;

  int32_t key(int i) const { return kFirstKey + i; }
  int32_t value(int i) const { return kFirstKey + n_keys + i; }
  int32_t filler(int i) const { return kFirstKey + n_keys + n_values + i; }
  int vocab_size() const { return kFirstKey + n_keys + n_values + n_filler; }
  bool is_key(int32_t id) const { return id >= key(0) && id < value(0); }
  bool is_value(int32_t id) const { return id >= value(0) && id < filler(0); }
  bool is_filler(int32_t id) const { return id >= filler(0) && id < vocab_size(); }

  // Throws phasekv::Error for an id outside [0, vocab_size()).
  std::string token_name(int32_t id) const;
  // Inverse of token_name; throws phasekv::Error naming the name and the allowed forms.
  int32_t token_id(const std::string& name) const;
  // token_names()[id] == token_name(id), for writing a vocab file.
  std::vector<std::string> token_names() const;
};

TaskVocab task_vocab(const TaskConfig& c);

// A needle. key_pos is absolute in a TaskExample, relative to the body in a LogicalExample; the
// value sits at key_pos + 1 and, for kv_sep, <sep> at key_pos + 2.
struct TaskRecord {
  int32_t key = 0;
  int32_t value = 0;
  int key_pos = 0;
};

struct TaskQuery {
  int query_pos = 0;   // position of the query key: the prediction made here is scored
  int32_t answer = 0;  // the value of the queried record: tokens[query_pos + 1] when present
  int record = 0;      // index into TaskExample::records
  int key_pos = 0;     // absolute position of the queried record's key in the context
  int value_pos = 0;   // and of its value
};

// Everything about an example that does not depend on its phase.
struct LogicalExample {
  TaskKind kind = TaskKind::kKv;
  TaskVocab vocab;
  RecordFormat record_format = RecordFormat::kKv;
  uint64_t seed = 0, id = 0;
  uint64_t padding_seed = 0;        // padding fillers: same stream for every phase
  std::vector<int32_t> body;        // between <bos> and the query block, records included
  std::vector<TaskRecord> records;  // in context order, key_pos relative to the body
  std::vector<int> query_records;   // the last one is the target; lookup: demonstrations, target

  const TaskRecord& target() const { return records.at(query_records.back()); }
};

struct TaskExample {
  TaskKind kind = TaskKind::kKv;
  std::vector<int32_t> tokens;
  std::vector<TaskRecord> records;  // in context order, absolute positions
  std::vector<TaskQuery> queries;   // in sequence order; the last one is the target
  RecordFormat record_format = RecordFormat::kKv;
  bool with_answer = true;
  uint64_t seed = 0, logical_id = 0;
  PaddingMode padding = PaddingMode::kPrefix;
  int modulus = 1;     // M; target().key_pos % modulus == phase
  int phase = 0;       // r
  int pad_before = 0;  // k: padding fillers before the target key
  int pad_after = 0;   // after it: M - 1 - k (lookup: 4M - 2 - k)

  const TaskQuery& target() const { return queries.back(); }
};

// Strict parsing: unknown keys, wrong types and out-of-range values throw phasekv::Error naming
// `where`, the key and what is allowed.
TaskConfig task_config_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json task_config_to_json(const TaskConfig& c);
void validate(const TaskConfig& c, const std::string& where);

std::string to_string(TaskKind k);
std::string to_string(RecordFormat f);
std::string to_string(PaddingMode m);  // "prefix" | "in_sequence"
// "prefix" | "in_sequence" ("in-sequence" is accepted too); throws naming `where` and the choices.
PaddingMode padding_mode_from_string(const std::string& s, const std::string& where);

// Deterministic in (c, seed, example_id) on every platform (no std:: distributions).
LogicalExample make_logical_example(const TaskConfig& c, uint64_t seed, uint64_t example_id);

// Lays out `lg` with its target key at a position p, p % modulus == phase; length and query
// positions depend on modulus only. modulus 1 = no padding (lookup: 2 padding tokens, see
// task/lookup.h). Runs check_layout before returning.
TaskExample materialize(const LogicalExample& lg, int modulus, int phase, PaddingMode padding,
                        bool with_answer);

// Throws phasekv::Error when the tokens disagree with the planned positions in `ex`: each record's
// key occurs exactly once before the query block, at key_pos, followed by its value (and <sep>);
// each query is `<q> key` followed by its answer; the target key sits at `phase` mod `modulus`.
void check_layout(const TaskExample& ex);

// A fresh random example with answers, for training. Context length uniform in
// [min_context_len, context_len] (fixed when min_context_len is 0). offset_randomization_M > 0
// puts the target key at a uniform phase mod M (prefix padding k uniform in [0, M)); 0 = off.
// lookup: the evaluation's own padding at a uniform phase mod max(M, 1), in_sequence with
// probability in_sequence_share and prefix otherwise (task/lookup.h); the other tasks pad the
// prefix only.
TaskExample sample_training_example(const TaskConfig& c, std::mt19937_64& rng,
                                    int offset_randomization_M);
// The same with the phase mod M drawn with probability phase_weights[r] / sum (a phase
// curriculum, [train] phase_curriculum); empty weights = uniform, the call above, draw for draw.
// phase_weights must have M entries, >= 0, with a positive sum. in_sequence_share in [0, 1]
// (lookup only; every share consumes the same draws, so runs that differ in it see the same
// examples at the same phases).
inline constexpr double kDefaultInSequenceShare = 0.5;
TaskExample sample_training_example(const TaskConfig& c, std::mt19937_64& rng,
                                    int offset_randomization_M,
                                    const std::vector<double>& phase_weights,
                                    double in_sequence_share = kDefaultInSequenceShare);
// The phase of a training example: uniform in [0, m), or weighted as above.
int draw_training_phase(std::mt19937_64& rng, int m, const std::vector<double>& phase_weights);

// Answer-only loss: the positions whose next token is an answer present in the tokens, and the
// same as a 0/1 mask over input positions (size tokens.size()).
std::vector<int> answer_positions(const TaskExample& ex);
std::vector<uint8_t> answer_loss_mask(const TaskExample& ex);

// Accuracy on the target query of the best strategy that never reads keys: rule out the values
// already answered by earlier queries, then guess the most frequent remaining value. Report it
// next to accuracies: a model at this level has not shown retrieval. (With target_depth set, the
// target's position alone also identifies it; this ceiling does not cover that shortcut.)
double shortcut_ceiling(const LogicalExample& lg);
// Mean over make_logical_example(c, seed, 0..n_examples-1).
double shortcut_ceiling(const TaskConfig& c, uint64_t seed, int n_examples);

}  // namespace phasekv
