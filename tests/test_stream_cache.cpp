// The in-place streaming cache (model/seq_buffer.h, model/kv_cache.h) and the session's attention
// core (model/attend_cached.h): buffers that grow, compact and keep their contents in order, the
// interval form of the visibility rules the core relies on, and long decodes through many
// compactions and regrowths that still reproduce the full-sequence forward.
#include <gtest/gtest.h>

#include "model/attend_fast.h"
#include "model/seq_buffer.h"
#include "model/visibility.h"
#include "runtime/session.h"
#include "test_util.h"

namespace phasekv {
namespace {

// Values 0, 1, 2, ... along dim 1 of a [2, n, 3] tensor, so that order errors show.
torch::Tensor ramp(int64_t from, int64_t n) {
  auto v = torch::arange(from, from + n, torch::kFloat32).view({1, n, 1});
  return v.expand({2, n, 3}).contiguous();
}

TEST(StreamCache, SeqBufferGrowsByDoublingAndKeepsOrder) {
  SeqBuffer b(1);
  int64_t capacity_changes = 0, last = 0;
  for (int64_t t = 0; t < 1000; t += 7) {
    b.append(ramp(t, 7));
    if (b.capacity() != last) ++capacity_changes, last = b.capacity();
  }
  ASSERT_EQ(b.length(), 1001);
  EXPECT_TRUE(torch::equal(b.view(), ramp(0, 1001)));
  EXPECT_LE(capacity_changes, 10);  // 7, 14, 28, ..., 1792: log2(1001/7) + 1 regrowths
  EXPECT_LT(b.capacity(), 2 * 1001);
  EXPECT_EQ(b.used_bytes(), 1001 * 2 * 3 * 4);
  EXPECT_EQ(b.reserved_bytes(), b.capacity() * 2 * 3 * 4);
}

TEST(StreamCache, SeqBufferSlidingWindowSettlesAtAFixedCapacity) {
  const int64_t window = 5;
  SeqBuffer b(1);
  int64_t first = 0;
  for (int64_t t = 0; t < 500; ++t) {
    b.append(ramp(t, 1));
    if (b.length() > window) {
      b.drop_front(b.length() - window);
      first = t + 1 - window;
    }
    ASSERT_TRUE(torch::equal(b.view(), ramp(first, b.length()))) << "t = " << t;
  }
  EXPECT_LE(b.capacity(), 4 * window);  // it compacts instead of growing
}

TEST(StreamCache, SeqBufferReserveAllocatesOnceAndExactly) {
  SeqBuffer b(1);
  b.reserve(100);
  for (int64_t t = 0; t < 100; ++t) b.append(ramp(t, 1));
  b.drop_front(0);  // the session drops nothing from full attention's raw keys: no shrink
  EXPECT_EQ(b.capacity(), 100);
  EXPECT_TRUE(torch::equal(b.view(), ramp(0, 100)));
}

TEST(StreamCache, SeqBufferShrinksOnceAfterALargeFeed) {
  SeqBuffer b(1);
  b.append(ramp(0, 1000));  // a prefill chunk
  b.drop_front(996);        // a window of 4 is kept
  EXPECT_LE(b.capacity(), 64);
  EXPECT_TRUE(torch::equal(b.view(), ramp(996, 4)));
  const int64_t settled = b.capacity();
  for (int64_t t = 1000; t < 1200; ++t) {  // decode: append one, keep 4
    b.append(ramp(t, 1));
    b.drop_front(1);
  }
  EXPECT_EQ(b.capacity(), settled);
  EXPECT_TRUE(torch::equal(b.view(), ramp(1196, 4)));
}

// attend_cached relies on visibility being an interval per query: entries [0, (t+1)/S) and raw
// tokens [raw_keep_from(a, t), t].
TEST(StreamCache, VisibilityIsAnIntervalPerQuery) {
  for (const auto& v : test::all_variants()) {
    for (const auto& a : v.cfg.layers) {
      const int64_t T = 40;
      auto q = torch::arange(T, torch::kInt64), r = torch::arange(T, torch::kInt64);
      auto raw = raw_visibility(a, q, r);
      auto ent = entry_visibility(a, q, 0, T);
      for (int64_t t = 0; t < T; ++t) {
        auto p = torch::arange(T, torch::kInt64);
        auto interval = (p >= raw_keep_from(a, t)) & (p <= t);
        EXPECT_TRUE(torch::equal(raw[t], interval)) << v.name << " t = " << t;
        EXPECT_TRUE(torch::equal(ent[t], p < visible_entries(a, t))) << v.name << " t = " << t;
      }
    }
  }
}

// Prefill `first` tokens in one feed, then decode one token at a time.
torch::Tensor prefill_then_decode(Decoder& m, const torch::Tensor& tokens, int64_t first,
                                  Session* out_session = nullptr) {
  Session s(m);
  const int64_t T = tokens.size(0);
  std::vector<int64_t> ids(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + T);
  std::vector<torch::Tensor> rows{s.feed({ids.begin(), ids.begin() + first})};
  for (int64_t t = first; t < T; ++t)
    rows.push_back(s.decode(ids[static_cast<size_t>(t)]).unsqueeze(0));
  if (out_session) *out_session = s;
  return torch::cat(rows, 0);
}

// A few hundred tokens: the raw windows compact many times, full attention's raw buffer and the
// entries regrow several times; the logits must still equal the full forward and the masked
// reference path, for every attention variant (full, window, chunked W = S and W > S, n_win 0, 1
// and > S, sink, uncompressed tail, ...).
TEST(StreamCache, LongDecodeEqualsFullForwardAndReference) {
  const int64_t T = 300;
  auto variants = test::all_variants();
  {
    AttentionConfig a;  // a window several strides wide
    a.kind = AttentionKind::kChunked;
    a.stride = 4;
    a.width = 8;
    a.n_win = 19;
    variants.push_back({"chunked_W8_nwin19", test::tiny_config(a)});
  }
  for (const auto& v : variants) {
    auto m = test::make_model(v.cfg, 31);
    auto tokens = test::random_tokens(T, v.cfg.vocab_size, 4)[0];
    torch::Tensor full;
    {
      torch::NoGradGuard g;
      full = m->forward(tokens.unsqueeze(0)).squeeze(0);
    }
    Session session(m);
    auto fast = prefill_then_decode(m, tokens, 37, &session);
    torch::Tensor reference;
    {
      AttentionPathGuard path(AttentionPath::kReference);
      reference = prefill_then_decode(m, tokens, 37);
    }
    ASSERT_EQ(fast.sizes(), full.sizes()) << v.name;
    EXPECT_LE((fast - full).abs().max().item<double>(), 1e-4) << v.name;
    EXPECT_LE((fast - reference).abs().max().item<double>(), 1e-5) << v.name;
    // One 300-token feed: several query blocks with ragged masks.
    Session one(m);
    std::vector<int64_t> ids(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + T);
    EXPECT_LE((one.feed(ids) - full).abs().max().item<double>(), 1e-4) << v.name;
    // The sliding raw windows compacted instead of growing with T.
    for (size_t l = 0; l < v.cfg.layers.size(); ++l) {
      const auto& a = v.cfg.layers[l];
      const auto& c = session.caches()[l];
      if (a.kind == AttentionKind::kFull) {
        EXPECT_GE(c.raw_k.capacity(), T) << v.name;
      } else {
        EXPECT_LE(c.raw_k.capacity(), 4 * (std::max(a.n_win, a.stride) + 37)) << v.name;
      }
    }
  }
}

}  // namespace
}  // namespace phasekv
