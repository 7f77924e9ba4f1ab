// The fused CPU kernels (RMSNorm, SwiGLU, rotary embedding) against the composed libtorch
// versions they replace: outputs and gradients, in f64, f32 and bf16, on shapes that exercise the
// vector tails (odd widths) and the parallel split (more rows/elements than one task's grain).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>

#include "model/attend_fast.h"
#include "model/fused.h"
#include "model/precision.h"
#include "test_util.h"

using namespace phasekv;

namespace {

// Forward and gradients of f on the given inputs (each set to require grad), for upstream grad gy.
struct Result {
  torch::Tensor y;
  std::vector<torch::Tensor> grads;
};

Result run(const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& f,
           std::vector<torch::Tensor> inputs, const torch::Tensor& gy) {
  for (auto& t : inputs) t = t.detach().clone().requires_grad_(true);
  auto y = f(inputs);
  auto grads = torch::autograd::grad({y}, inputs, {gy.to(y.scalar_type())});
  return {y.detach(), grads};
}

double max_rel_err(const torch::Tensor& got, const torch::Tensor& want) {
  auto g = got.to(torch::kFloat64), w = want.to(torch::kFloat64);
  return ((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item<double>();
}

// Checks fused vs reference on the same inputs; in bf16 the reference runs in f32 on the same
// (bf16-valued) inputs, and the tolerance is bf16's.
void expect_match(const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& fused,
                  const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& reference,
                  const std::vector<torch::Tensor>& inputs, const torch::Tensor& gy, double tol,
                  const std::string& what) {
  auto got = run(fused, inputs, gy);
  const bool bf16 = inputs[0].scalar_type() == torch::kBFloat16;
  std::vector<torch::Tensor> ref_in;
  for (const auto& t : inputs) ref_in.push_back(bf16 ? t.to(torch::kFloat32) : t);
  auto want = run(reference, ref_in, gy);
  EXPECT_EQ(got.y.scalar_type(), inputs[0].scalar_type()) << what;
  EXPECT_LT(max_rel_err(got.y, want.y), tol) << what << ": output";
  for (size_t i = 0; i < got.grads.size(); ++i) {
    EXPECT_EQ(got.grads[i].scalar_type(), inputs[i].scalar_type()) << what << ": grad " << i;
    EXPECT_LT(max_rel_err(got.grads[i], want.grads[i]), tol) << what << ": grad " << i;
  }
}

double tolerance(torch::ScalarType t) {
  return t == torch::kFloat64 ? 1e-12 : t == torch::kFloat32 ? 2e-6 : 2e-2;
}

const std::vector<torch::ScalarType> kDtypes{torch::kFloat64, torch::kFloat32, torch::kBFloat16};

}  // namespace

TEST(Fused, RMSNormMatchesReference) {
  torch::manual_seed(1);
  // 37: a vector tail; 1100 x 64: more rows than one task (512 rows of 64), so the weight
  // gradient is summed over several partial sums.
  for (auto shape : {std::vector<int64_t>{3, 5, 37}, std::vector<int64_t>{1100, 64}}) {
    for (auto dt : kDtypes) {
      auto x = (torch::randn(shape, torch::kFloat64) * 3).to(dt);
      // The weight stays f32 (f64 for f64 models) like the module's parameter under autocast.
      auto w = (torch::rand({shape.back()}, torch::kFloat64) + 0.5)
                   .to(dt == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32);
      auto gy = torch::randn(shape, torch::kFloat64);
      auto f = [](const std::vector<torch::Tensor>& in) { return rms_norm(in[0], in[1], 1e-6); };
      auto r = [](const std::vector<torch::Tensor>& in) {
        return rms_norm_reference(in[0], in[1], 1e-6);
      };
      // The weight's gradient is a sum over up to 1100 rows of bf16-rounded products.
      expect_match(f, r, {x, w}, gy, tolerance(dt) * (dt == torch::kBFloat16 ? 2 : 1),
                   "rms_norm " + std::string(c10::toString(dt)));
    }
  }
}

TEST(Fused, SwiGLUMatchesReferenceIncludingSaturation) {
  torch::manual_seed(2);
  // 40001 elements: two parallel tasks and a vector tail. The gate spans +-90, where sigmoid
  // saturates (the fused exp clamps its argument).
  for (auto dt : kDtypes) {
    auto g = (torch::randn({40001}, torch::kFloat64) * 4).to(dt);
    g.narrow(0, 0, 4).copy_(torch::tensor({-90.0, 90.0, -20.0, 0.0}, torch::kFloat64));
    auto u = torch::randn({40001}, torch::kFloat64).to(dt);
    auto gy = torch::randn({40001}, torch::kFloat64);
    auto f = [](const std::vector<torch::Tensor>& in) { return swiglu(in[0], in[1]); };
    auto r = [](const std::vector<torch::Tensor>& in) { return swiglu_reference(in[0], in[1]); };
    expect_match(f, r, {g, u}, gy, tolerance(dt), "swiglu " + std::string(c10::toString(dt)));
  }
}

TEST(Fused, RopeMatchesReferenceOnPartialRotaryAndStridedInput) {
  torch::manual_seed(3);
  const int64_t T = 7, dim = 16, half = 6;  // partial RoPE: channels 12..15 pass through
  auto ang = torch::arange(T, torch::kFloat64).unsqueeze(1) *
             torch::pow(10000.0, -torch::arange(0, 2 * half, 2, torch::kFloat64) / (2 * half))
                 .unsqueeze(0);
  auto cos = torch::cos(ang), sin = torch::sin(ang);
  for (auto dt : kDtypes) {
    // [B, T, H, dim] transposed to [B, H, T, dim]: not contiguous, as after the projections.
    auto x = torch::randn({2, T, 3, dim}, torch::kFloat64).to(dt).transpose(1, 2);
    auto gy = torch::randn({2, 3, T, dim}, torch::kFloat64);
    auto f = [&](const std::vector<torch::Tensor>& in) { return rope_rotate(in[0], cos, sin); };
    auto r = [&](const std::vector<torch::Tensor>& in) {
      return rope_rotate_reference(in[0], cos, sin);
    };
    expect_match(f, r, {x}, gy, tolerance(dt), "rope " + std::string(c10::toString(dt)));
  }
}

TEST(Fused, Bf16RoundingMatchesLibtorchAndKeepsNaN) {
  // The kernels' f32 -> bf16 store must round like libtorch's cast (to nearest, ties to even).
  // For g >= 20, silu(g) is exactly g in f32, and g * u of two bf16 values is exact in f32: the
  // fused bf16 output is then one rounding of an exact product, which must equal libtorch's.
  torch::manual_seed(4);
  auto g = (torch::rand({20000}) * 980 + 20).to(torch::kBFloat16);
  auto u = torch::randn({20000}).to(torch::kBFloat16);
  auto want = (g.to(torch::kFloat32) * u.to(torch::kFloat32)).to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(swiglu(g, u), want));
  auto x = torch::tensor({1.0f, NAN, 2.0f}).to(torch::kBFloat16).view({1, 3});
  auto y = rms_norm(x, torch::ones({3}), 1e-6);
  EXPECT_TRUE(torch::isnan(y).all().item<bool>());  // a NaN in the row poisons the row
}

TEST(Fused, ReferencePathBypassesTheKernels) {
  // Under AttentionPath::kReference the public functions are the composed versions: their
  // backward graph is libtorch's, not one fused node.
  auto x = torch::randn({4, 8}).requires_grad_(true);
  auto w = torch::ones({8});
  auto fused = rms_norm(x, w, 1e-6);
  EXPECT_CONTAINS(fused.grad_fn()->name(), "RMSNormFn");
  AttentionPathGuard guard(AttentionPath::kReference);
  auto ref = rms_norm(x, w, 1e-6);
  EXPECT_NOT_CONTAINS(ref.grad_fn()->name(), "RMSNormFn");
  EXPECT_LT(max_rel_err(fused.detach(), ref.detach()), 1e-6);
}

TEST(Fused, BandedSoftmaxMatchesComposedSoftmaxWithSinkAndMasks) {
  torch::manual_seed(5);
  // R = B * Hkv * Tp * G rows; Tp = 6 positions, 2 KV heads of 3 query heads, batch 2. Row t of
  // the bias masks some columns; one position masks all band columns.
  const int64_t B = 2, Hkv = 2, G = 3, Tp = 6, E = 5, L = 7, R = B * Hkv * Tp * G;
  auto bias = torch::zeros({Tp, E + L});
  bias.masked_fill_(torch::rand({Tp, E + L}) < 0.3, -INFINITY);
  bias.index_put_({0, torch::indexing::Slice()}, 0.0);
  bias.index_put_({2, torch::indexing::Slice(E, E + L)}, -INFINITY);
  auto composed = [&](const std::vector<torch::Tensor>& in) {
    const auto dt = in[0].scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    auto s = torch::cat({in[0], in[1]}, -1).to(dt) +
             bias.to(dt).view({1, 1, Tp, 1, E + L}).expand({B, Hkv, Tp, G, E + L}).reshape({R, -1});
    auto col = in[2].to(dt).view({1, Hkv, 1, G}).expand({B, Hkv, Tp, G}).reshape({R, 1});
    auto p = torch::softmax(torch::cat({s, col}, -1), -1).narrow(-1, 0, E + L);
    // One output carrying both pieces, weighted so that each column's gradient differs.
    return p * torch::arange(1, E + L + 1, p.options());
  };
  auto fused = [&](const std::vector<torch::Tensor>& in) {
    auto [pe, pb] = banded_softmax(in[0], in[1], bias, in[2], G, Tp, Hkv);
    auto p = torch::cat({pe, pb}, -1);
    return p * torch::arange(1, E + L + 1, p.options());
  };
  for (auto dt : kDtypes) {
    auto se = torch::randn({R, E}, torch::kFloat64).to(dt) * 2;
    auto sb = torch::randn({R, L}, torch::kFloat64).to(dt) * 2;
    // The sink keeps the model's parameter dtype (f32, f64 for f64 models).
    auto sink = torch::randn({Hkv * G}, torch::kFloat64)
                    .to(dt == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32);
    auto gy = torch::randn({R, E + L}, torch::kFloat64);
    expect_match(fused, composed, {se, sb, sink}, gy, tolerance(dt),
                 "banded_softmax " + std::string(c10::toString(dt)));
  }
}

TEST(Fused, RMSNormUnderAutocastStoresBf16AndKeepsF32Gradients) {
  // Under bf16 autocast an f32 residual stream is normalised in f32 and stored in bf16 (its
  // consumers are autocast matmuls); the input's gradient stays f32.
  torch::manual_seed(6);
  auto x = torch::randn({700, 48}) * 2;
  auto w = torch::rand({48}) + 0.5;
  auto gy = torch::randn({700, 48});
  Result got, want;
  {
    PrecisionGuard guard(Precision::kBf16, /*force=*/true);
    got = run([](const std::vector<torch::Tensor>& in) { return rms_norm(in[0], in[1], 1e-6); },
              {x, w}, gy);
  }
  want = run([](const std::vector<torch::Tensor>& in) { return rms_norm(in[0], in[1], 1e-6); },
             {x, w}, gy.to(torch::kBFloat16).to(torch::kFloat32));
  EXPECT_EQ(got.y.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(got.y, want.y.to(torch::kBFloat16)));  // one rounding of the f32 norm
  EXPECT_EQ(got.grads[0].scalar_type(), torch::kFloat32);
  EXPECT_EQ(got.grads[1].scalar_type(), torch::kFloat32);
  EXPECT_LT(max_rel_err(got.grads[0], want.grads[0]), 1e-5);
  EXPECT_LT(max_rel_err(got.grads[1], want.grads[1]), 1e-5);
}

TEST(Fused, SlidingBlocksMatchPaddedUnfold) {
  // Blocks of 9 positions every 4, starting 5 before position 0, over T = 23: the first block
  // reaches before 0 and the last past T (both zero-filled), and neighbours overlap.
  torch::manual_seed(7);
  const int64_t T = 23, first = -5, step = 4, length = 9, count = 6;
  auto x = torch::randn({2, 3, T, 4}, torch::kFloat64);
  auto gy = torch::randn({2, 3, count, length, 4}, torch::kFloat64);
  auto f = [&](const std::vector<torch::Tensor>& in) {
    return sliding_blocks(in[0], first, step, count, length);
  };
  auto r = [&](const std::vector<torch::Tensor>& in) {
    const int64_t back = (count - 1) * step + length - (T - first);
    auto padded = torch::constant_pad_nd(in[0], {0, 0, -first, back});
    return padded.unfold(2, length, step).transpose(-1, -2);
  };
  expect_match(f, r, {x}, gy, 1e-15, "sliding_blocks");
}

TEST(Fused, DiagonalBandMatchesShiftedProducts) {
  // L = 2 diagonals over T = 9 positions, 3 query heads per kv head: scores q[t] . k[t - l] and
  // outputs sum_l p[t, l] v[t - l], zero before position 0, with their gradients.
  torch::manual_seed(8);
  const int64_t B = 2, Hkv = 2, T = 9, G = 3, hd = 5, L = 2;
  auto shifted = [&](const torch::Tensor& x, int64_t l) {  // [B, Hkv, T, hd] -> key t - l
    auto s = l == 0 ? x : torch::constant_pad_nd(x.narrow(2, 0, T - l), {0, 0, l, 0});
    return s.unsqueeze(3);
  };
  auto scores_ref = [&](const std::vector<torch::Tensor>& in) {
    std::vector<torch::Tensor> cols;
    for (int64_t l = 0; l < L; ++l) cols.push_back((in[0] * shifted(in[1], l)).sum(-1));
    return torch::stack(cols, -1);
  };
  auto output_ref = [&](const std::vector<torch::Tensor>& in) {
    torch::Tensor o;
    for (int64_t l = 0; l < L; ++l) {
      auto term = in[0].select(-1, l).unsqueeze(-1) * shifted(in[1], l);
      o = o.defined() ? o + term : term;
    }
    return o;
  };
  for (auto dt : kDtypes) {
    auto q = torch::randn({B, Hkv, T, G, hd}, torch::kFloat64).to(dt);
    auto k = torch::randn({B, Hkv, T, hd}, torch::kFloat64).to(dt);
    auto p = torch::rand({B, Hkv, T, G, L}, torch::kFloat64).to(dt);
    const std::string name(c10::toString(dt));
    auto scores = [&](const std::vector<torch::Tensor>& in) {
      return band_diag_scores(in[0], in[1], L);
    };
    auto output = [&](const std::vector<torch::Tensor>& in) {
      return band_diag_output(in[0], in[1], L);
    };
    expect_match(scores, scores_ref, {q, k}, torch::randn({B, Hkv, T, G, L}, torch::kFloat64),
                 tolerance(dt), "band_diag_scores " + name);
    expect_match(output, output_ref, {p, k}, torch::randn({B, Hkv, T, G, hd}, torch::kFloat64),
                 tolerance(dt), "band_diag_output " + name);
  }
}

TEST(Fused, BatchedMatmulMatchesMatmulWithTailsAndTransposes) {
  // Row counts and widths that are not whole register blocks (M = 13, N = 11, K = 7), a
  // contraction longer than one block (M = 40 in the backward's A^T dC), both layouts of b.
  torch::manual_seed(9);
  struct Shape {
    std::vector<int64_t> lead;
    int64_t M, N, K;
  };
  // The last shape (64 x 80 x 96 per matrix) is past the small kernel: oneDNN's sgemm in f32.
  for (const auto& s : {Shape{{2, 3}, 13, 11, 7}, Shape{{5}, 40, 8, 16}, Shape{{1}, 1, 1, 1},
                        Shape{{2}, 64, 80, 96}}) {
    for (auto dt : {torch::kFloat64, torch::kFloat32}) {
      if (dt == torch::kFloat64 && s.M * s.N * s.K > (1 << 18)) continue;  // libtorch's
      for (bool trans_b : {false, true}) {
        auto shape = [&](int64_t r, int64_t c) {
          auto v = s.lead;
          v.push_back(r);
          v.push_back(c);
          return v;
        };
        auto a = torch::randn(shape(s.M, s.K), torch::kFloat64).to(dt);
        auto b = torch::randn(trans_b ? shape(s.N, s.K) : shape(s.K, s.N), torch::kFloat64).to(dt);
        auto gy = torch::randn(shape(s.M, s.N), torch::kFloat64);
        auto f = [&](const std::vector<torch::Tensor>& in) {
          auto y = batched_matmul(in[0], in[1], trans_b);
          EXPECT_CONTAINS(y.grad_fn()->name(), "BatchedMatmulFn");
          return y;
        };
        auto r = [&](const std::vector<torch::Tensor>& in) {
          return torch::matmul(in[0], trans_b ? in[1].transpose(-1, -2) : in[1]);
        };
        const std::string name = std::string(c10::toString(dt)) + " M=" + std::to_string(s.M) +
                                 (trans_b ? " a b^T" : " a b");
        expect_match(f, r, {a, b}, gy, tolerance(dt), "batched_matmul " + name);
      }
    }
  }
}

TEST(Fused, BatchedMatmulOfAnEmptyContractionIsZero) {
  for (bool grad : {false, true}) {
    auto a = torch::randn({2, 3, 0}).requires_grad_(grad), b = torch::randn({2, 0, 5});
    auto y = batched_matmul(a, b, false);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 3, 5}));
    EXPECT_EQ(y.abs().max().item<float>(), 0.0f);
  }
}

TEST(Fused, BatchedMatmulLeavesBf16AutocastAndLargeF64ProductsToLibtorch) {
  auto node = [](const torch::Tensor& a, const torch::Tensor& b) {
    return batched_matmul(a.requires_grad_(true), b, false).grad_fn()->name();
  };
  const std::string fused = "BatchedMatmulFn";
  EXPECT_CONTAINS(node(torch::randn({2, 8, 4}), torch::randn({2, 4, 8})), fused);
  // 128 x 64 x 64 multiply-adds per matrix: past the small kernel, f32 through oneDNN, f64
  // (gradient checks only) through libtorch.
  EXPECT_CONTAINS(node(torch::randn({2, 128, 64}), torch::randn({2, 64, 64})), fused);
  EXPECT_NOT_CONTAINS(
      node(torch::randn({2, 128, 64}, torch::kFloat64), torch::randn({2, 64, 64}, torch::kFloat64)),
      fused);
  EXPECT_NOT_CONTAINS(
      node(torch::randn({2, 8, 4}, torch::kBFloat16), torch::randn({2, 4, 8}, torch::kBFloat16)),
      fused);
  {
    PrecisionGuard autocast(Precision::kBf16, /*force=*/true);
    auto y = batched_matmul(torch::randn({2, 8, 4}), torch::randn({2, 4, 8}), false);
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);  // libtorch's autocast matmul ran
  }
  AttentionPathGuard guard(AttentionPath::kReference);
  EXPECT_NOT_CONTAINS(node(torch::randn({2, 8, 4}), torch::randn({2, 4, 8})), fused);
}

TEST(Fused, LinearMatchesFunctionalLinearWithAndWithoutBias) {
  // f32 through oneDNN against libtorch's linear (OpenBLAS): values and the three gradients, on
  // 3-d input and widths that are not multiples of a vector.
  torch::manual_seed(10);
  auto x = torch::randn({3, 37, 29}), w = torch::randn({19, 29}), b = torch::randn({19});
  auto gy = torch::randn({3, 37, 19}, torch::kFloat64);
  auto with_bias = [](const std::vector<torch::Tensor>& in) {
    auto y = linear(in[0], in[1], in[2]);
    EXPECT_CONTAINS(y.grad_fn()->name(), "LinearFn");
    return y;
  };
  auto ref_bias = [](const std::vector<torch::Tensor>& in) {
    return torch::nn::functional::linear(in[0], in[1], in[2]);
  };
  expect_match(with_bias, ref_bias, {x, w, b}, gy, 1e-5, "linear with bias");
  auto no_bias = [](const std::vector<torch::Tensor>& in) {
    return linear(in[0], in[1], torch::Tensor());
  };
  auto ref_no_bias = [](const std::vector<torch::Tensor>& in) {
    return torch::matmul(in[0], in[1].t());
  };
  expect_match(no_bias, ref_no_bias, {x, w}, gy, 1e-5, "linear without bias");
  {  // Without a graph (decode, evaluation) the same product runs without an autograd node.
    torch::NoGradGuard no_grad;
    auto y = linear(x, w, b);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_LT(max_rel_err(y, torch::nn::functional::linear(x, w, b)), 1e-5);
  }
  // An empty contraction (in = 0) gives the bias alone.
  auto empty = linear(torch::randn({5, 0}), torch::randn({4, 0}), b.narrow(0, 0, 4));
  EXPECT_TRUE(torch::equal(empty, b.narrow(0, 0, 4).expand({5, 4})));
  // Under autocast the product is libtorch's bf16 one.
  PrecisionGuard autocast(Precision::kBf16, /*force=*/true);
  EXPECT_EQ(linear(x, w, b).scalar_type(), torch::kBFloat16);
}

TEST(Fused, BmmIntoReadsCacheViewsWritesColumnRangesAndAccumulates) {
  // Decode's use: keys are a narrowed view of a larger cache buffer [n, capacity, hd], the scores
  // a column range of a wider scratch, and the second product accumulates into the first's out.
  torch::manual_seed(11);
  const int64_t n = 3, M = 5, hd = 7, cap = 20, E = 13, R = 4;
  auto cache = torch::randn({n, cap, hd});
  auto keys = cache.narrow(1, 2, E), raw = cache.narrow(1, 15, R);
  auto q = torch::randn({n, M, hd});
  auto scratch = torch::zeros({n, M, E + R + 1});
  bmm_into(scratch.narrow(2, 0, E), q, keys, true, false);
  bmm_into(scratch.narrow(2, E, R), q, raw, true, false);
  EXPECT_LT(max_rel_err(scratch.narrow(2, 0, E), torch::bmm(q, keys.transpose(1, 2))), 1e-5);
  EXPECT_LT(max_rel_err(scratch.narrow(2, E, R), torch::bmm(q, raw.transpose(1, 2))), 1e-5);
  EXPECT_EQ(scratch.select(2, E + R).abs().max().item<float>(), 0.0f);  // untouched column
  auto p = torch::rand({n, M, E + R});
  auto out = torch::empty({n, M, hd});
  bmm_into(out, p.narrow(2, 0, E), keys, false, false);
  bmm_into(out, p.narrow(2, E, R), raw, false, true);
  auto want = torch::bmm(p.narrow(2, 0, E), keys) + torch::bmm(p.narrow(2, E, R), raw);
  EXPECT_LT(max_rel_err(out, want), 1e-5);
  // A single query row whose row stride libtorch left at 1 (a transposed [n, hd, 1]): the
  // leading dimension passed on must still cover the row.
  auto q1 = torch::randn({n, hd, 1}).transpose(1, 2);
  auto s1 = torch::empty({n, 1, E});
  bmm_into(s1, q1, keys, true, false);
  EXPECT_LT(max_rel_err(s1, torch::bmm(q1, keys.transpose(1, 2))), 1e-5);
  // f64 takes libtorch's bmm, with the same result.
  auto out64 = torch::empty({n, M, hd}, torch::kFloat64);
  bmm_into(out64, p.narrow(2, 0, E).to(torch::kFloat64), keys.to(torch::kFloat64), false, false);
  EXPECT_LT(max_rel_err(out64, torch::bmm(p.narrow(2, 0, E), keys)), 1e-5);
}
