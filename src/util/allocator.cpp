#include "util/allocator.h"

// Any C library header defines __GLIBC__ (through <features.h>); without one before the check
// below, the check is always false and the settings silently compile away.
#include <cstdlib>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace phasekv {

namespace {
// 32 MiB is the largest mmap threshold glibc accepts on 64-bit (a larger tunable is ignored), so
// larger blocks would still be mmapped and page-faulted in on every use: the 38 MB attention
// scores of an 8-head full-attention model on 137-token rows (batch 64) ran at 5.7K tokens/s.
// kMmapMax = 0 turns mmap off, so every block comes from the heap. Do not trim the heap top back
// to the OS after each step, and grow it in large steps.
constexpr int kMmapThreshold = 32 << 20, kMmapMax = 0, kTrimThreshold = 1 << 30,
              kTopPad = 64 << 20;
}  // namespace

void keep_freed_memory_in_heap() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  mallopt(M_MMAP_MAX, kMmapMax);
  mallopt(M_TRIM_THRESHOLD, kTrimThreshold);
  mallopt(M_TOP_PAD, kTopPad);
#endif
}

std::string glibc_tunables_for_children() {
#if defined(__GLIBC__)
  return "glibc.malloc.mmap_threshold=" + std::to_string(kMmapThreshold) +
         ":glibc.malloc.mmap_max=" + std::to_string(kMmapMax) +
         ":glibc.malloc.trim_threshold=" + std::to_string(kTrimThreshold) +
         ":glibc.malloc.top_pad=" + std::to_string(kTopPad);
#else
  return "";
#endif
}

}  // namespace phasekv
