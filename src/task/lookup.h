// The lookup task (TaskConfig name "lookup"): the controlled study's evaluation in token-id space.
//
// Layout (R = n_records, D = n_demos, M = the sweep's modulus):
//
//   <bos> | records k_0 v_0 k_1 v_1 ... k_{R-1} v_{R-1}, with padding fillers in the gaps |
//         demonstrations k_a v_a ... (D pairs of records other than the target's) | k_t [v_t]
//
// Each record is a single key token directly followed by its value token; keys are distinct, so a
// key names one record. The demonstrations copy records' pairs in random order; the target key,
// the last token of an evaluation context, is the query: the prediction made there is scored
// (full-vocabulary top-1 of v_t). TaskExample::queries holds one query per demonstration (its key
// position, its value as answer) and the target last, so the answer-only loss of training covers
// demonstrations and target. Grouping is by the target key's position mod M.
//
// Sizes. context_len counts <bos>, the records, the demonstrations, the target key and its answer,
// like the other kinds' logical length: its minimum 2R + 2D + 3 is the study's layout (R = 64,
// D = 8: 147); every token above it is a body filler placed in a gap drawn uniformly among the
// R + 1 gaps (before record 0, between records, before the demonstrations), the same at every
// phase. A materialized context adds P = 4M - 2 padding fillers at every phase, so it has
// context_len + P tokens with the answer and context_len + P - 1 without (the sweep's form: 240
// for the study at M = 24); the query, the target key, is the last context token at every phase.
//
// Target record. target_depth in [0, 1] puts the target at record index d = round(depth (R - 1));
// -1 = uniform over the records, from a low-discrepancy sequence in the example id rotated by the
// seed (see "Why d is quasi-random").
//
// Padding with fixed moments. Let b = 1 + (the target key's offset in the body) be its position
// without padding, P0 = 2M - 1 and s = (P0 + b) mod M. At phase r, with X in {-1, 0, +1},
//
//   k = P0 + (r - s) + M X   padding fillers go before the target key, P - k after it.
//
// Since r - s is in [-(M-1), M-1], k is in [0, 4M - 2] = [0, P] for every X. The target key then
// sits at T = b + k = M floor((P0 + b) / M) + r + M X, so T mod M = r. X is +1 with probability
// a_r = (v + mu^2 + mu) / 2, -1 with b_r = (v + mu^2 - mu) / 2, else 0, where mu = ((M-1)/2 - r)/M
// and v = 1/4: a_r = (mu + 1/2)^2 / 2 >= 0, b_r = (mu - 1/2)^2 / 2 >= 0, a_r + b_r = 1/4 + mu^2
// <= 1/2 since |mu| < 1/2; E[X] = a_r - b_r = mu and Var X = a_r + b_r - mu^2 = v. Hence
//
//   E[T | r]   = E[M floor((P0 + b)/M)] + r + M mu = E[M floor((P0 + b)/M)] + (M - 1)/2,
//   Var[T | r] = Var[M floor((P0 + b)/M)] + M^2 / 4          (X independent of b),
//
// the same at every phase; and because a sweep evaluates the same logical examples at every
// phase, the floor term is not only equal in distribution but identical across phases. With
// modulus 1 (training without offset randomisation) P = 2 and k is 0, 1 or 2 (1/8, 3/4, 1/8).
//
// X comes from a low-discrepancy sequence, so that the empirical moments are close to the exact
// ones for any number of examples: u = frac((e + 1/2) phi + r psi), e = the example id,
// phi = (sqrt 5 - 1)/2, psi = sqrt 2 - 1, in 64-bit fixed point (exact for every id, including
// the random 64-bit ids of training examples); X = +1 if u < a_r, -1 if u < a_r + b_r, else 0.
// Per phase, the shares of +1 and -1 then match a_r and b_r within O(log N / N).
//
// Why d is quasi-random. What X cannot fix is the sample covariance between the base term
// M floor((P0 + b)/M) (SD about 37 tokens for R = 64) and M X (SD 12), which differs from phase
// to phase. With d drawn at random it moved the per-phase SD of T by 0.7-1.3 tokens (4 seeds) over
// 2400 examples (M = 24, R = 64). With d = floor(R frac((e + 1/2)(sqrt 2 - 1) + a rotation drawn
// from the seed)), (d, u) is a two-dimensional Kronecker sequence in e and that covariance falls
// like its discrepancy: the per-phase SD spread is 0.22 tokens on average over 20 seeds at
// N = 2400 (0.28 at worst), 0.43 at N = 1000 and 1.4 at N = 300; the mean spread is 0.05, 0.09
// and 0.4. Keys, values, demonstrations and fillers stay random (util/rng.h, seed_for(seed, id)).
//
// Prefix padding: k fillers right after <bos>, P - k right before the demonstrations; every
// record moves with the target. In-sequence padding: the k fillers before the target are spread
// over the d + 1 gaps before it (before record 0, ..., between record d-1 and the target), the
// P - k after it over the R - d gaps after it (..., between the last record and the
// demonstrations), each filler in a gap drawn uniformly. The draws come from the example's
// padding seed and are nested: a phase with more fillers on one side places the same first ones
// and adds more, so two phases of an example differ by added or removed fillers only. As r moves
// the target, the other records therefore mostly stay: far records do not move with the target
// (phase locking, |mean_r exp(2 pi i (p_record - p_target)/M)|, is 0.04 for record 0 and 0.41 at
// 16 records' distance, against 1 for prefix padding; study sizes, M = 24). The nearest records
// still mostly do (0.95 at distance 1, 0.82 at 4): 4M - 2 fillers over R + 1 gaps leave about 1.5
// per gap, so the gaps next to the target rarely change by as much as M. Both modes put the
// target key at the same T, so the moments above hold for both, and the demonstrations and the
// query at the same positions.
//
// Training examples (sample_training_example): a fresh logical example (random id under the
// training seed, length uniform in [min_context_len, context_len]), laid out exactly as above at a
// uniform phase mod max(offset_randomization, 1), in-sequence padding with probability
// in_sequence_share ([train] in_sequence_padding, 1/2 by default) and prefix padding otherwise,
// answers included: the loss covers every demonstration and the target. Training sees
// the evaluation's padding (fillers between records included), so in-sequence sweeps are not out
// of distribution. Without any padding the records would start at position 1 and every key would
// sit at an odd position; modulus 1 already moves them by 0, 1 or 2, and offset_randomization = M
// spreads the target over every phase mod M; each training sequence then carries 4M - 2 fillers
// (30 for M = 8, 94 for M = 24).
#pragma once
#include <cstdint>

#include "task/tasks.h"
#include "util/rng.h"

namespace phasekv::lookup {

// 2 n_records + 2 n_demos + 3: <bos>, the records, the demonstrations, the target key and answer.
int min_context_len(const TaskConfig& c);
// Padding fillers of every materialized context at modulus M: 4M - 2. Throws beyond kMaxModulus.
inline constexpr int kMaxModulus = 1 << 20;
int padding_tokens(int modulus);

// The target's record index for (c, seed, example_id): round(target_depth (n_records - 1)), or
// the quasi-random draw described above when target_depth is -1.
int target_record(const TaskConfig& c, uint64_t seed, uint64_t example_id);

// The padding fillers before the target key (k) and the draw X behind it, for the target whose
// unpadded key position is `unpadded_pos` (b above), at phase r mod M.
struct TargetPadding {
  int pad_before = 0;  // k, in [0, 4M - 2]
  int x = 0;           // X in {-1, 0, +1}
};
TargetPadding target_padding(uint64_t example_id, int unpadded_pos, int modulus, int phase);

// The implementations behind make_logical_example, materialize, check_layout and
// sample_training_example for name = lookup; `c` must be valid (validate).
LogicalExample make_logical(const TaskConfig& c, uint64_t seed, uint64_t example_id,
                            int context_len);
TaskExample materialize(const LogicalExample& lg, int modulus, int phase, PaddingMode padding,
                        bool with_answer);
void check_layout(const TaskExample& ex);
TaskExample sample_training_example(const TaskConfig& c, Rng& rng, int offset_randomization_M,
                                    const std::vector<double>& phase_weights,
                                    double in_sequence_share);

}  // namespace phasekv::lookup
