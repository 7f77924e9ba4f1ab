// The streaming session (prefill in chunks of any size, then decode) must reproduce the
// full-sequence forward for every attention variant, and hold the bytes the theory says.
#include <gtest/gtest.h>

#include "runtime/session.h"
#include "test_util.h"

namespace phasekv {
namespace {

torch::Tensor run_stream(Decoder& m, const torch::Tensor& tokens,
                         const std::vector<int64_t>& splits) {
  Session s(m);
  std::vector<int64_t> ids(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + tokens.numel());
  std::vector<torch::Tensor> parts;
  size_t i = 0, k = 0;
  while (i < ids.size()) {
    size_t n = std::min(ids.size() - i, static_cast<size_t>(splits[k % splits.size()]));
    parts.push_back(
        s.feed({ids.begin() + static_cast<long>(i), ids.begin() + static_cast<long>(i + n)}));
    i += n;
    ++k;
  }
  return torch::cat(parts, 0);
}

TEST(Streaming, EqualsFullForwardForEveryVariantAndSplit) {
  const int64_t T = 43;
  const std::vector<std::vector<int64_t>> splits = {{1}, {3, 5}, {7}, {4}, {T}, {10, 1, 2}};
  for (const auto& v : test::all_variants()) {
    auto m = test::make_model(v.cfg, 21);
    auto tokens = test::random_tokens(T, v.cfg.vocab_size, 8);
    torch::Tensor full;
    {
      torch::NoGradGuard g;
      full = m->forward(tokens).squeeze(0);
    }
    for (const auto& sp : splits) {
      auto streamed = run_stream(m, tokens[0], sp);
      ASSERT_EQ(streamed.sizes(), full.sizes());
      double diff = (streamed - full).abs().max().item<double>();
      EXPECT_LE(diff, 1e-4) << v.name << " split[0]=" << sp[0];
    }
  }
}

TEST(Streaming, CacheBytesMatchTheoryAndStayBounded) {
  for (const auto& v : test::all_variants()) {
    auto m = test::make_model(v.cfg, 2);
    Session s(m);
    auto tokens = test::random_tokens(50, v.cfg.vocab_size, 3)[0];
    for (int64_t t = 0; t < 50; ++t) {
      s.decode(tokens[t].item<int64_t>());
      auto measured = s.cache_bytes();
      for (size_t l = 0; l < measured.size(); ++l) {
        auto theory = cache_bytes_theory(v.cfg, v.cfg.layers[l], t + 1, 4);
        ASSERT_EQ(measured[l].raw, theory.raw) << v.name << " layer " << l << " T=" << t + 1;
        ASSERT_EQ(measured[l].entries, theory.entries)
            << v.name << " layer " << l << " T=" << t + 1;
        ASSERT_EQ(measured[l].pending, theory.pending)
            << v.name << " layer " << l << " T=" << t + 1;
      }
    }
  }
}

TEST(Streaming, ChunkedCacheIsSmallerThanFull) {
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.stride = 4;
  a.width = 8;
  a.n_win = 16;
  auto cfg = test::tiny_config(a);
  AttentionConfig full;
  const int64_t T = 4096;
  auto c = cache_bytes_theory(cfg, a, T, 4).total();
  auto f = cache_bytes_theory(cfg, full, T, 4).total();
  // T/S entries + n_win raw + a partial window, vs T raw tokens.
  const int64_t token = 2 * cfg.n_kv_heads * cfg.head_dim * 4;
  EXPECT_EQ(f, T * token);
  EXPECT_EQ(c, (T / 4 + 15) * token + 4 * (2 * token + 2 * 8 * cfg.n_kv_heads * 4));
}

}  // namespace
}  // namespace phasekv
