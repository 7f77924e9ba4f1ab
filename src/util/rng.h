// The one portable random-number helper. std::mt19937_64's output is fixed by the standard, but
// std::uniform_int_distribution and std::shuffle differ between standard libraries; these do not,
// so a seed names the same examples, bootstrap replicates and permutations everywhere.
#pragma once
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace phasekv {

using Rng = std::mt19937_64;

// splitmix64's finaliser: a bijective mixer, so nearby inputs give unrelated outputs.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The seed of item `id` of a stream named by `seed`: independent streams for consecutive ids
// (seeding with seed + id * constant would make stream id + 1 a shifted copy of stream id).
inline uint64_t seed_for(uint64_t seed, uint64_t id) { return splitmix64(seed ^ splitmix64(id)); }

// Uniform in [0, n), n >= 1, unbiased: rejects the 2^64 mod n lowest values.
inline uint64_t draw_below(Rng& rng, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
  uint64_t x = rng();
  while (x < threshold) x = rng();
  return x % n;
}
inline int draw_below(Rng& rng, int n) {
  return static_cast<int>(draw_below(rng, static_cast<uint64_t>(n)));
}

// Index i with probability weights[i] / sum(weights) (weights >= 0, sum > 0), from one 53-bit
// uniform draw: the same index for the same generator state everywhere.
inline int draw_weighted(Rng& rng, const std::vector<double>& weights) {
  double total = 0;
  for (double w : weights) total += w;
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
  double acc = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    acc += weights[i];
    if (u < acc) return static_cast<int>(i);
  }
  for (size_t i = weights.size(); i > 0; --i)  // rounding: the last index with weight
    if (weights[i - 1] > 0) return static_cast<int>(i - 1);
  return 0;
}

// True with probability p in [0, 1], from one draw. The uniform number is read from the draw's
// bits lowest first (bit 0 is its most significant bit), so p = 1/2 is exactly "the lowest bit
// is 1", i.e. draw_below(rng, 2) == 1: a share that replaces a fair coin keeps its draws.
inline bool draw_chance(Rng& rng, double p) {
  const uint64_t x = rng();
  uint64_t reversed = 0;  // x's 53 lowest bits in reverse order
  for (int i = 0; i < 53; ++i) reversed = (reversed << 1) | ((x >> i) & 1);
  return static_cast<double>(reversed) * 0x1.0p-53 >= 1.0 - p;
}

// Fisher-Yates with draw_below.
template <typename T>
void shuffle_in_place(std::vector<T>& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[draw_below(rng, uint64_t{i})]);
}

}  // namespace phasekv
