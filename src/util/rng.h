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

// Fisher-Yates with draw_below.
template <typename T>
void shuffle_in_place(std::vector<T>& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[draw_below(rng, uint64_t{i})]);
}

}  // namespace phasekv
