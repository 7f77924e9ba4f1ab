// Process-wide allocator settings for tensor workloads.
#pragma once
#include <string>

namespace phasekv {

// glibc hands every block above 128 KiB back to the OS (munmap) when it is freed, and libtorch frees
// and re-allocates the same activation-sized buffers every training step, so each step page-faults
// them in again. Keeping them in the heap made `phasekv train` on configs/train/kv-chunked.toml 3.5x
// faster on the 2-core machine (15K -> 53K tokens/s, most of the difference was system time).
// Call once at the start of main(); a no-op outside glibc.
void keep_freed_memory_in_heap();

// The same settings as a GLIBC_TUNABLES value, for child processes that are compared with phasekv
// (the PyTorch reference of `phasekv bench train`: with glibc's defaults it ran 2-3.3x slower,
// which made the comparison unfair). "" outside glibc.
std::string glibc_tunables_for_children();

}  // namespace phasekv
