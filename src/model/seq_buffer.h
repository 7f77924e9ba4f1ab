// A tensor that grows along one dimension and is written in place: the streaming cache's storage
// for raw keys/values, entries and the compressor's pending tokens.
//
// The used part is storage[..., start : start + length, ...]. `append` copies into the spare
// capacity after it; `drop_front` only moves `start`. When the end of the storage is reached, the
// used part either moves to the front (if that frees enough room and the move does not overlap
// itself) or the storage is reallocated with at least twice the capacity. So:
//  - a sequence that only grows (full attention's raw keys, the entries) costs amortised O(1)
//    copies per element and reallocates log2(T) times;
//  - a sliding window (the chunked model's n_win raw tokens) settles at a fixed capacity of a few
//    windows and then never allocates again: a compaction copies `length` elements and happens
//    only when it frees at least as many, so at most one extra copy per appended element;
//  - a sliding buffer left much larger than what it keeps (after a long prefill chunk) shrinks
//    back to a few times its kept length.
// Copies of a SeqBuffer share the storage (tensor semantics): do not fork a cache by copying it.
#pragma once
#include <torch/torch.h>

#include <algorithm>

namespace phasekv {

class SeqBuffer {
 public:
  explicit SeqBuffer(int64_t dim = 2) : dim_(dim) {}

  // The used part, a view into the storage (undefined before the first append).
  torch::Tensor view() const;
  bool defined() const { return storage_.defined(); }
  int64_t length() const { return length_; }
  int64_t capacity() const { return storage_.defined() ? storage_.size(dim_) : 0; }

  // Appends x (same shape as the storage except along dim; the first append fixes shape, dtype
  // and device).
  void append(const torch::Tensor& x);
  // Forgets the first n used elements (no copy, unless the buffer shrinks).
  void drop_front(int64_t n);
  // Capacity for at least n elements in total (used part included), allocated now if the storage
  // exists, else at the first append. Lets a caller that knows the final length avoid the
  // doubling (and its up to 2x unused capacity).
  void reserve(int64_t n);

  int64_t used_bytes() const;      // the used part
  int64_t reserved_bytes() const;  // the whole storage

 private:
  void reallocate(int64_t capacity, const torch::Tensor& like);

  int64_t dim_;
  torch::Tensor storage_;
  int64_t start_ = 0, length_ = 0;
  int64_t reserve_hint_ = 0;  // reserve() before the storage exists
};

// Reusable memory for per-step temporaries whose size grows with the context (the decode step's
// attention scores): one flat buffer, handed out as a contiguous tensor of the requested shape.
// It grows by doubling and never shrinks, so a decode step allocates nothing for them once the
// buffer is large enough. A tensor from take() is valid until the next take().
class Scratch {
 public:
  torch::Tensor take(at::IntArrayRef shape, const torch::TensorOptions& options);
  void reserve(int64_t numel) { hint_ = std::max(hint_, numel); }
  int64_t bytes() const;

 private:
  torch::Tensor flat_;
  int64_t hint_ = 0;
};

}  // namespace phasekv
