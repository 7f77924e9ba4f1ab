// phasekv plan (eval/plan.h): the examples needed to detect a dip and to certify a flat model,
// from simulated sweeps, and the named errors of its options.
#include <gtest/gtest.h>

#include <cmath>

#include "eval/plan.h"
#include "util/error.h"

namespace phasekv {
namespace {

PlanRequest small(double gap) {
  PlanRequest r;
  r.modulus = 8, r.stride = 4, r.min_gap = gap, r.accuracy = 0.9;
  r.datasets = 40, r.max_examples = 400, r.threads = 2, r.seed = 7;
  return r;
}

TEST(Plan, AWideDipNeedsFewExamplesANarrowOneMore) {
  const Plan wide = plan_examples(small(0.5));
  EXPECT_EQ(wide.examples_to_detect, 25);  // a 50 pp dip: every simulated sweep detects it
  ASSERT_FALSE(wide.curve.empty());
  EXPECT_GE(wide.curve.front().detect, 0.8);
  const Plan narrow = plan_examples(small(0.15));
  EXPECT_GT(narrow.examples_to_detect, 25);
  // Detection power grows with the examples until the target is reached.
  double last = -1;
  for (const auto& pt : narrow.curve)
    if (!std::isnan(pt.detect)) {
      EXPECT_GE(pt.detect, last - 0.15);  // Monte-Carlo noise of 40 datasets
      last = pt.detect;
    }
  // Certifying the absence of a 15 pp gap takes more examples than certifying 50 pp.
  EXPECT_TRUE(narrow.examples_to_certify == 0 ||
              narrow.examples_to_certify > wide.examples_to_certify);
  const std::string text = plan_text(narrow, 300);
  EXPECT_NE(text.find("to detect the dip: "), std::string::npos) << text;
  EXPECT_NE(text.find("prompt tokens"), std::string::npos) << text;
  EXPECT_EQ(narrow.to_json()["modulus"], 8);
}

TEST(Plan, OptionsOutOfRangeNameTheFlag) {
  auto message = [](PlanRequest r) {
    try {
      validate(r);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  PlanRequest r = small(0.1);
  r.stride = 5;  // 2 x 5 > 8
  EXPECT_NE(message(r).find("--stride 5 must lie in [2, --modulus / 2 = 4]"), std::string::npos);
  r = small(0.1);
  r.accuracy = 0.05;
  EXPECT_NE(message(r).find("--accuracy 0.05"), std::string::npos);
  r = small(0.1);
  r.power = 1.0;
  EXPECT_NE(message(r).find("--power"), std::string::npos);
  EXPECT_EQ(message(small(0.1)), "");
}

}  // namespace
}  // namespace phasekv
