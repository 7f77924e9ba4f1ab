// Repeated random sequences: an auxiliary training objective with dense induction targets.
//
// Retrieval of an adjacent `key value` pair by full attention needs two heads that only work
// together: a previous-token head (each value learns which key precedes it) and an induction head
// (the query key attends to the value whose previous token matches it). With the answer-only loss
// of the kv task, the gradient towards this circuit is tiny until both exist, and small models sat
// at the "unused value" shortcut for 8,000 steps (docs/FINDINGS.md). A repeated sequence
// `<bos> s1 .. sn <q> s1 .. sn` gives every token of the repeat an induction target, the textbook
// setting in which induction heads form. Chunked models can use the same circuit only through
// their compressed entries, so both models of a comparison get the same data.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "task/tasks.h"

namespace phasekv {

struct RepeatSequence {
  std::vector<int32_t> tokens;  // <bos> s1 .. sn <q> s1 .. sn
  std::vector<int> positions;   // the loss positions: tokens[p + 1] is predictable from the first copy
};

// A sequence of `len` tokens (len even, >= 6) of distinct content tokens s1..sn (keys, values and
// fillers of `c`'s vocabulary, so the same embeddings are trained) and their repeat.
// Marked (the default): `<bos> s1..sn <q> s1..sn` with n = len / 2 - 1; the loss covers <q> -> s1
// and every token of the repeat but the last. Unmarked: `<bos> x1..xm s1..sn s1..sn`, a row of L
// tokens with L even and uniform in [6, len], n uniform in [2, min((L - 1) / 2, content tokens
// - 1)] and a prefix of m = L - 1 - 2n tokens drawn from the tokens outside s; nothing announces
// the repeat, so the loss covers the second copy from its second token. Why both: a model trained
// on marked repeats may learn an induction head that only fires after <q>, and with one length
// per row it can copy by a fixed offset instead of by content (a lookup12 control followed
// repeats of exactly 35 tokens and no others: docs/FINDINGS.md); the lookup task's queries carry
// no marker and sit at every distance.
RepeatSequence sample_repeat_sequence(const TaskConfig& c, std::mt19937_64& rng, int len,
                                      bool marked = true);

// The task's training lengths, uniform in [min_context_len (or context_len), context_len], rounded
// down to even: repeat rows are as long as the task rows they replace. A lookup row also carries
// the 4M - 2 padding fillers of its modulus M = max(offset_randomization, 1) (task/lookup.h), so
// its repeats are that much longer: an induction head trained only on shorter distances did not
// reach the lookup's records (docs/FINDINGS.md).
int draw_repeat_length(const TaskConfig& c, std::mt19937_64& rng, int offset_randomization);

// Throws phasekv::Error (naming `where`) unless every length draw_repeat_length can return
// builds a sequence: at least 6 tokens, and no more distinct tokens than the vocabulary has.
void check_repeat_lengths(const TaskConfig& c, int offset_randomization, const std::string& where);

// Throws phasekv::Error (naming `where` and [train] induction_len) unless induction_len is in
// [6, 2 (content tokens) + 2]: the longest unmarked repeat row of distinct tokens c allows.
void check_induction_len(const TaskConfig& c, int induction_len, const std::string& where);

}  // namespace phasekv
