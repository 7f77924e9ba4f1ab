#include "perf/alloc_count.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>

namespace phasekv {
namespace {

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const override {
    count.fetch_add(1, std::memory_order_relaxed);
    bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
    return base->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return base->raw_deleter(); }

  c10::Allocator* base = nullptr;
  mutable std::atomic<int64_t> count{0}, bytes{0};
};

CountingAllocator& counting() {
  static CountingAllocator a;
  return a;
}

}  // namespace

AllocCounter::AllocCounter() : previous_(c10::GetCPUAllocator()) {
  auto& a = counting();
  a.base = previous_;
  a.count = 0;
  a.bytes = 0;
  c10::SetCPUAllocator(&a, /*priority=*/0);
}

AllocCounter::~AllocCounter() {
  c10::SetCPUAllocator(previous_, /*priority=*/0);
}

AllocStats AllocCounter::stats() const {
  return {counting().count.load(), counting().bytes.load()};
}

}  // namespace phasekv
