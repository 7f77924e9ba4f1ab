#include "util/allocator.h"

// Any C library header defines __GLIBC__ (through <features.h>); without one before the check
// below, the check is always false and the settings silently compile away.
#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace phasekv {

void keep_freed_memory_in_heap() {
#if defined(__GLIBC__)
  // 32 MiB is the largest mmap threshold glibc accepts on 64-bit; larger blocks still use mmap.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  // Do not trim the heap top back to the OS after each step, and grow it in large steps.
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
#endif
}

}  // namespace phasekv
