// The f32 GEMM paths and their measured choice (kernels/gemm_choice.h): every path computes the
// same product, a class is measured once and then read back from the shared cache file, fixed
// policies and bad values behave as documented, and a corrupt cache does not stop a run.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "kernels/gemm_choice.h"
#include "util/error.h"
#include "util/fs.h"
#include "test_util.h"

using namespace phasekv;
using namespace phasekv::kernels;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("phasekv-gemm-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// C = op(A) op(B) + beta C in double, row-major with leading dimensions.
std::vector<double> reference(const GemmShape& s, const std::vector<float>& a, int64_t lda,
                              const std::vector<float>& b, int64_t ldb, float beta,
                              const std::vector<float>& c, int64_t ldc) {
  std::vector<double> out(c.begin(), c.end());
  for (int64_t i = 0; i < s.M; ++i)
    for (int64_t j = 0; j < s.N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < s.K; ++k)
        acc += double(s.trans_a ? a[k * lda + i] : a[i * lda + k]) *
               double(s.trans_b ? b[j * ldb + k] : b[k * ldb + j]);
      out[i * ldc + j] = acc + beta * double(c[i * ldc + j]);
    }
  return out;
}

std::vector<float> randoms(int64_t n, int seed) {
  torch::manual_seed(seed);
  auto t = torch::randn({n});
  return {t.data_ptr<float>(), t.data_ptr<float>() + n};
}

TEST(GemmChoice, EveryPathComputesTheSameStridedProduct) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 0.5f}) {
        const GemmShape s{1, 37, 29, 45, ta, tb, false};
        // Leading dimensions wider than the rows: the strides of a cache view or column range.
        const int64_t lda = (ta ? s.M : s.K) + 3, ldb = (tb ? s.K : s.N) + 5, ldc = s.N + 7;
        const auto a = randoms((ta ? s.K : s.M) * lda, 1), b = randoms((tb ? s.N : s.K) * ldb, 2);
        const auto c0 = randoms(s.M * ldc, 3);
        const auto want = reference(s, a, lda, b, ldb, beta, c0, ldc);
        for (auto path : {GemmPath::kOneDnn, GemmPath::kOpenBlas}) {
          auto c = c0;
          gemm_on(path, s, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
          for (int64_t i = 0; i < s.M; ++i)
            for (int64_t j = 0; j < ldc; ++j)  // the padding columns stay untouched
              ASSERT_NEAR(c[i * ldc + j], want[i * ldc + j], 1e-4)
                  << gemm_path_name(path) << " ta " << ta << " tb " << tb << " beta " << beta
                  << " at " << i << "," << j;
        }
      }
}

TEST(GemmChoice, EveryPathComputesTheSamePackedBatch) {
  const GemmShape s{3, 9, 20, 17, true, false, true};
  const int64_t lda = s.M, ldb = s.N, ldc = s.N;
  const auto a = randoms(s.batch * s.M * s.K, 4), b = randoms(s.batch * s.K * s.N, 5);
  std::vector<std::vector<float>> results;
  for (auto path : gemm_candidates(s)) {
    std::vector<float> c(static_cast<size_t>(s.batch * s.M * s.N), 99.0f);
    gemm_on(path, s, a.data(), lda, b.data(), ldb, 0.0f, c.data(), ldc);
    results.push_back(c);
  }
  ASSERT_EQ(results.size(), 3u) << "the small kernel is a candidate for a small packed batch";
  for (int64_t i = 0; i < s.batch; ++i) {
    const std::vector<float> ai(a.begin() + i * s.M * s.K, a.begin() + (i + 1) * s.M * s.K);
    const std::vector<float> bi(b.begin() + i * s.K * s.N, b.begin() + (i + 1) * s.K * s.N);
    const auto want = reference(s, ai, lda, bi, ldb, 0.0f,
                                std::vector<float>(static_cast<size_t>(s.M * s.N)), ldc);
    for (const auto& c : results)
      for (int64_t j = 0; j < s.M * s.N; ++j) ASSERT_NEAR(c[i * s.M * s.N + j], want[j], 1e-4);
  }
  // The small kernel takes no strided or accumulating product.
  std::vector<float> c(static_cast<size_t>(s.batch * s.M * s.N));
  EXPECT_THROW(gemm_on(GemmPath::kSmall, s, a.data(), lda, b.data(), ldb, 1.0f, c.data(), ldc),
               std::logic_error);
}

TEST(GemmChoice, CandidatesAndClassKeys) {
  EXPECT_EQ(gemm_candidates({4, 128, 8, 16, false, true, true}).front(), GemmPath::kSmall);
  EXPECT_EQ(gemm_candidates({1, 2048, 2048, 2048, false, false, true}).size(), 2u);
  EXPECT_EQ(gemm_candidates({1, 8, 8, 8, false, false, false}).size(), 2u);  // strided: no small
  EXPECT_EQ(gemm_class_key({1, 100, 64, 65, false, true, false}, 1), "b0_m7_n6_k7_NT_t1");
  EXPECT_EQ(gemm_class_key({128, 128, 8, 16, true, false, true}, 2), "b7_m7_n3_k4_TN_packed_t2");
}

TEST(GemmChoice, AClassIsMeasuredOnceAndSharedThroughTheCacheFile) {
  const auto file = (fresh_dir("share") / "gemm.json").string();
  GemmChooser first(file, "auto");
  const GemmShape s{1, 200, 96, 64, false, true, false};
  const auto chosen = first.choose(s);
  EXPECT_EQ(first.measurements(), 1);
  // Another shape of the same class (every dimension in the same power-of-two bucket): no timing.
  EXPECT_EQ(first.choose({1, 250, 80, 60, false, true, false}), chosen);
  EXPECT_EQ(first.measurements(), 1);
  // A second process's chooser reads the decision instead of measuring again.
  GemmChooser second(file, "auto");
  EXPECT_EQ(second.choose(s), chosen);
  EXPECT_EQ(second.measurements(), 0);
  const auto j = read_json_file(file);
  const auto key = gemm_class_key(s, at::get_num_threads());
  ASSERT_TRUE(j.at("classes").contains(key)) << j.dump();
  EXPECT_EQ(j["classes"][key]["chosen"], gemm_path_name(chosen));
  EXPECT_EQ(j["classes"][key]["seconds"].size(), 2u);  // onednn and openblas were both timed
  // The chosen path is the fastest of those timed.
  double best = 1e9;
  for (const auto& [name, sec] : j["classes"][key]["seconds"].items())
    best = std::min(best, sec.get<double>());
  EXPECT_EQ(j["classes"][key]["seconds"][gemm_path_name(chosen)].get<double>(), best);
  // recalibrate measures again.
  second.recalibrate(s);
  EXPECT_EQ(second.measurements(), 1);
}

TEST(GemmChoice, ACorruptCacheIsRewrittenNotFatal) {
  const auto file = (fresh_dir("corrupt") / "gemm.json").string();
  std::ofstream(file) << "{\"classes\": {\"b0\": {\"chosen\": \"fastest\"";
  GemmChooser chooser(file, "auto");
  chooser.choose({1, 64, 64, 64, false, false, false});
  EXPECT_EQ(chooser.measurements(), 1);
  EXPECT_EQ(read_json_file(file).at("classes").size(), 1u);
}

TEST(GemmChoice, FixedPoliciesAndAnUnknownOne) {
  GemmChooser blas("", "openblas"), dnn("", "onednn");
  const GemmShape big{1, 512, 512, 512, false, false, false};
  EXPECT_EQ(blas.choose(big), GemmPath::kOpenBlas);
  EXPECT_EQ(dnn.choose(big), GemmPath::kOneDnn);
  // Tiny packed batches keep the small kernel under a fixed policy (the rule before measuring).
  EXPECT_EQ(blas.choose({128, 128, 8, 16, false, true, true}), GemmPath::kSmall);
  EXPECT_EQ(blas.measurements() + dnn.measurements(), 0);
  try {
    GemmChooser bad("", "fastest");
    FAIL() << "an unknown policy was accepted";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "PHASEKV_GEMM");
    EXPECT_CONTAINS(e.what(), "auto, onednn, openblas");
  }
}

}  // namespace
