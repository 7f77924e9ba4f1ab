#include "model/seq_buffer.h"

#include <algorithm>

namespace phasekv {
namespace {
// Sliding buffers at most this large are never shrunk.
constexpr int64_t kMinShrinkCapacity = 64;
}  // namespace

torch::Tensor SeqBuffer::view() const {
  return storage_.defined() ? storage_.narrow(dim_, start_, length_) : storage_;
}

void SeqBuffer::append(const torch::Tensor& x) {
  const int64_t n = x.size(dim_);
  if (!storage_.defined()) {
    reallocate(std::max(n, reserve_hint_), x);
  } else if (start_ + length_ + n > capacity()) {
    TORCH_CHECK(x.scalar_type() == storage_.scalar_type(), "SeqBuffer: dtype changed");
    // Moving the used part to the front is safe only when source and destination do not
    // overlap (start >= length); it pays off when it makes room for x.
    if (start_ >= length_ && length_ + n <= capacity()) {
      if (length_ > 0) storage_.narrow(dim_, 0, length_).copy_(view());
      start_ = 0;
    } else {
      reallocate(std::max(2 * capacity(), length_ + n), x);
    }
  }
  storage_.narrow(dim_, start_ + length_, n).copy_(x);
  length_ += n;
}

void SeqBuffer::drop_front(int64_t n) {
  TORCH_CHECK(n >= 0 && n <= length_, "SeqBuffer: dropping ", n, " of ", length_);
  if (n == 0) return;  // a buffer that only grows (and may have been reserved) never shrinks
  start_ += n;
  length_ -= n;
  // A large feed (a prefill chunk) leaves a sliding buffer much bigger than what it keeps: give
  // the memory back, keeping room for a few times the kept part (the hysteresis between 8x and
  // 4x means a steady decode never shrinks and regrows).
  if (capacity() > std::max<int64_t>(8 * length_, kMinShrinkCapacity))
    reallocate(std::max<int64_t>(4 * length_, kMinShrinkCapacity / 2), storage_);
}

void SeqBuffer::reserve(int64_t n) {
  if (!storage_.defined()) {
    reserve_hint_ = std::max(reserve_hint_, n);
  } else if (n > capacity()) {
    reallocate(n, storage_);
  }
}

void SeqBuffer::reallocate(int64_t capacity, const torch::Tensor& like) {
  auto shape = like.sizes().vec();
  shape[static_cast<size_t>(dim_)] = capacity;
  auto fresh = torch::empty(shape, like.options());
  if (length_ > 0) fresh.narrow(dim_, 0, length_).copy_(view());
  storage_ = fresh;
  start_ = 0;
}

int64_t SeqBuffer::used_bytes() const {
  return storage_.defined() ? view().numel() * static_cast<int64_t>(storage_.element_size()) : 0;
}

int64_t SeqBuffer::reserved_bytes() const {
  return storage_.defined() ? storage_.numel() * static_cast<int64_t>(storage_.element_size()) : 0;
}

torch::Tensor Scratch::take(at::IntArrayRef shape, const torch::TensorOptions& options) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  const bool fits = flat_.defined() && flat_.numel() >= numel &&
                    flat_.scalar_type() == options.dtype().toScalarType() &&
                    flat_.device() == options.device();
  if (!fits) {
    const int64_t grown = flat_.defined() ? 2 * flat_.numel() : 0;
    flat_ = torch::empty({std::max({numel, grown, hint_})}, options);
  }
  return flat_.narrow(0, 0, numel).view(shape);
}

int64_t Scratch::bytes() const {
  return flat_.defined() ? flat_.numel() * static_cast<int64_t>(flat_.element_size()) : 0;
}

}  // namespace phasekv
