// Counts tensor storage allocations on the CPU while in scope, by wrapping libtorch's CPU
// allocator: how many buffers one decode step creates, and how many bytes. Everything a tensor
// op allocates on the CPU goes through this allocator; oneDNN's private scratch and small
// non-tensor heap use (vectors, autograd metadata) do not, so the count is a lower bound on
// malloc calls.
#pragma once
#include <cstdint>

namespace c10 {
struct Allocator;
}

namespace phasekv {

struct AllocStats {
  int64_t count = 0, bytes = 0;
};

// Not reentrant: one counter at a time, installed and removed on the constructing thread. Counts
// allocations from every thread while installed.
class AllocCounter {
 public:
  AllocCounter();
  ~AllocCounter();
  AllocCounter(const AllocCounter&) = delete;
  AllocCounter& operator=(const AllocCounter&) = delete;
  AllocStats stats() const;

 private:
  c10::Allocator* previous_;
};

}  // namespace phasekv
