// The flip search (probe/flip_search.h): sites drawn from held-out files, the verdicts on greedy
// tokens against the filler length, and the rates on fake backends whose answer follows the
// code's phase mod 4, ignores it, or changes at random. Torch-free: also built under ASan + UBSan.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>

#include "corpus_fixture.h"
#include "probe/flip_search.h"
#include "test_util.h"
#include "util/error.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// One byte = one token. The greedy token after a context of n tokens: 'p' or 'q' by n mod 4
// (periodic), 'p' always (flat), or a hash of n (random: flips with no period).
class GreedyBackend : public Backend {
  // MurmurHash3's finaliser: neighbouring n get unrelated bits (n times a constant would not:
  // its top bits follow a Weyl sequence, which looks periodic).
  static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
  }

 public:
  // kRightHalf: the file's next word (the request's target) when n mod 4 >= 2, else 'p'.
  enum Kind { kPeriodic, kFlat, kRandom, kRightHalf };
  explicit GreedyBackend(Kind kind, int64_t max_context = 4096)
      : kind_(kind), max_context_(max_context) {}
  std::string model_id() const override { return "greedy"; }
  std::vector<int32_t> tokenize(const std::string& text) override {
    return {text.begin(), text.end()};
  }
  std::string detokenize(const std::vector<int32_t>& ids) override {
    return {ids.begin(), ids.end()};
  }
  std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) override {
    std::vector<ScoreResult> out;
    for (const auto& r : requests) {
      const auto n = static_cast<uint64_t>(r.context.size());
      int32_t top = 'p';
      if (kind_ == kPeriodic) top = n % 4 >= 2 ? 'q' : 'p';
      if (kind_ == kRandom) top = mix(n) & 1 ? 'q' : 'p';
      if (kind_ == kRightHalf) top = n % 4 >= 2 ? r.target : 'p';
      ScoreResult s;
      s.argmax = top;
      s.argmax_logprob = std::log(0.6);
      s.target_logprob = std::log(r.target == top ? 0.6 : 0.01);
      out.push_back(s);
    }
    return out;
  }
  std::vector<int32_t> generate(const std::vector<int32_t>&, int) override { return {}; }
  int64_t max_context() const override { return max_context_; }
  json describe() const override { return {{"backend", "greedy"}}; }

 private:
  Kind kind_;
  int64_t max_context_;
};

std::vector<std::string> code_files() {
  std::vector<std::string> files;
  for (int f = 0; f < 6; ++f) {
    std::string text;
    for (int i = 0; i < 30; ++i)
      text += "def f" + std::to_string(f) + "_" + std::to_string(i) + "(x, y):\n    return x." +
              "scale(y) + " + std::to_string(i) + "\n";
    files.push_back(text);
  }
  return files;
}

struct Fixture {
  fs::path dir = test::temp_dir("flips");
  std::string manifest = test::write_manifest(dir, code_files(), 2);
  ~Fixture() { fs::remove_all(dir); }
  json spec(int sites = 12) const {
    return {{"manifest", manifest},
            {"sites", sites},
            {"context_chars", 80},
            {"lengths", {8, 23}},
            {"seed", 3},
            {"family",
             {{{"name", "equals"}, {"head", "\"\"\"\n"}, {"unit", "="}, {"tail", "\n\"\"\"\n"}},
              {{"name", "hashes"}, {"head", ""}, {"unit", "#"}, {"tail", "\n"}}}}};
  }
};

json run_flips(GreedyBackend& b, const FlipSearchSpec& spec, const fs::path& out) {
  const auto sites = pick_flip_sites(spec);
  EvalRecord id;
  id.model = b.model_id();
  id.task = "flips:" + spec.hash();
  id.modulus = spec.l_max + 1;
  id.padding = "filler";
  FlipSearchMode mode(b, spec, sites, id);
  RunOptions ro;
  ro.out_dir = out.string();
  const RunResult run = run_items(b, mode, ro);
  FlipSummaryOptions o;
  o.stride = 4;
  return summarize_flips(spec, sites, run, o);
}

TEST(FlipSearch, ClassifiesConstantFlipAndPeriodicSeries) {
  const auto P = [](std::vector<int32_t> v) { return classify_flips(v, 8, 4, 0.9); };
  EXPECT_EQ(P({1, 1, 1, 1, 1, 1, 1, 1}), "constant");
  EXPECT_EQ(P({1, 1, 2, 2, 1, 1, 2, 2, 1, 1, 2, 2}), "periodic");  // L = 8.. : residues 0,1 -> 1
  EXPECT_EQ(P({1, 1, 2, 2, 1, 1, 2, 2, 1, 1, 2, 1}), "periodic");  // 11 of 12 follow: >= 0.9
  EXPECT_EQ(P({1, 1, 2, 2, 1, 1, 2, 2, 1, 2, 2, 1}), "flip");      // 10 of 12: < 0.9
  EXPECT_EQ(classify_flips({1, 1, 2, 2, 1, 1, 2, 2, 1, 2, 2, 1}, 8, 4, 0.8), "periodic");
  EXPECT_EQ(P({1, 1, 1, 1, 2, 2, 2, 2}), "flip");        // a step, not a period
  EXPECT_EQ(P({1, -1, 2, 2, 1, 1, -1, 2}), "periodic");  // -1: a length not measured
  EXPECT_EQ(classify_flips({1, 2, 1, 2, 1, 2, 1, 2}, 8, 2, 1.0), "periodic");
  EXPECT_EQ(classify_flips({1, 2, 1, 2, 1, 2, 1, 2}, 8, 4, 1.0), "periodic");  // period 2 divides 4
  EXPECT_EQ(classify_flips({1, 2, 1, 2, 1, 2, 1, 2, 1}, 8, 3, 0.9), "flip");
  EXPECT_THROW(classify_flips({1, 2}, 0, 1, 0.9), Error);
}

TEST(FlipSearch, SitesAreWordStartsInHeldOutFilesTheSameOnEveryRun) {
  const Fixture fx;
  const FlipSearchSpec spec = flip_search_spec_from_json(fx.spec(), "flips.toml", ".");
  const auto a = pick_flip_sites(spec), b = pick_flip_sites(spec);
  ASSERT_EQ(a.size(), 12u);
  const auto files = code_files();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].file, b[i].file);
    EXPECT_EQ(a[i].offset, b[i].offset);
    EXPECT_EQ(a[i].id, static_cast<int>(i));
    // Held-out files only: m4.py and m5.py.
    const int f = a[i].file.back() == 'y' ? a[i].file[a[i].file.size() - 4] - '0' : -1;
    ASSERT_TRUE(f == 4 || f == 5) << a[i].file;
    const std::string& text = files[static_cast<size_t>(f)];
    const auto at = static_cast<size_t>(a[i].offset);
    EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(text[at])));
    EXPECT_FALSE(std::isalnum(static_cast<unsigned char>(text[at - 1])) || text[at - 1] == '_');
    EXPECT_GE(a[i].code.size(), 80u);
    EXPECT_EQ(text.substr(at - a[i].code.size(), a[i].code.size()), a[i].code);
    EXPECT_TRUE(a[i].code.size() == at || text[at - a[i].code.size() - 1] == '\n');  // whole lines
    EXPECT_EQ(text.compare(at, a[i].next_word.size(), a[i].next_word), 0);
  }
  json other = fx.spec();
  other["seed"] = 4;
  const auto c = pick_flip_sites(flip_search_spec_from_json(other, "flips.toml", "."));
  int same = 0;
  for (size_t i = 0; i < c.size(); ++i)
    same += c[i].offset == a[i].offset && c[i].file == a[i].file;
  EXPECT_LT(same, 12) << "another seed draws other sites";
  try {
    pick_flip_sites(flip_search_spec_from_json(fx.spec(100000), "flips.toml", "."));
    ADD_FAILURE() << "drew more sites than there are cursors";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "fewer than sites = 100000");
  }
}

TEST(FlipSearch, PeriodicAnswersArePeriodicAtTheStrideOnly) {
  const Fixture fx;
  const FlipSearchSpec spec = flip_search_spec_from_json(fx.spec(), "flips.toml", ".");
  GreedyBackend periodic(GreedyBackend::kPeriodic);
  const json sm = run_flips(periodic, spec, fx.dir / "periodic");
  EXPECT_EQ(sm["rates"]["site_families"], 24);
  EXPECT_EQ(sm["rates"]["flip"]["k"], 24);
  EXPECT_EQ(sm["rates"]["periodic_at_stride"]["k"], 24);
  EXPECT_EQ(sm["rates"]["periodic_at_control"]["k"], 0) << sm["rates"].dump();
  EXPECT_EQ(sm["control_period"], 5);
  ASSERT_FALSE(sm["examples"].empty());
  const json probe = flip_example_probe_spec(sm["examples"][0], spec);
  const ProbeSpec ps = probe_spec_from_json(probe, "example");  // a valid probe spec
  EXPECT_EQ(ps.candidates.size(), 2u);
  EXPECT_EQ(ps.families.size(), 1u);

  EXPECT_EQ(sm["rates"]["right_and_wrong"]["k"], 0);  // 'p' and 'q' start no word of the files

  GreedyBackend half(GreedyBackend::kRightHalf);
  const json hf = run_flips(half, spec, fx.dir / "half");
  EXPECT_EQ(hf["rates"]["periodic_right_and_wrong"]["k"], 24);
  for (const auto& row :
       hf["next_word_by_residue"])  // right exactly where L + |code| is 2, 3 mod 4
    EXPECT_GT(row["k"].get<int>(), 0);
  ASSERT_FALSE(hf["examples"].empty());
  EXPECT_TRUE(hf["examples"][0]["right_and_wrong"].get<bool>());
  const json right = flip_example_probe_spec(hf["examples"][0], spec);
  const std::string word = hf["examples"][0]["next_word"].get<std::string>();
  EXPECT_EQ(word.rfind(right["correct"].get<std::string>(), 0), 0u) << right.dump();

  GreedyBackend flat(GreedyBackend::kFlat);
  const json fl = run_flips(flat, spec, fx.dir / "flat");
  EXPECT_EQ(fl["rates"]["flip"]["k"], 0);
  EXPECT_EQ(fl["rates"]["periodic_at_stride"]["k"], 0);
  EXPECT_TRUE(fl["examples"].empty());

  GreedyBackend random(GreedyBackend::kRandom);
  const json rn = run_flips(random, spec, fx.dir / "random");
  EXPECT_EQ(rn["rates"]["flip"]["k"], 24);
  EXPECT_LE(rn["rates"]["periodic_at_stride"]["k"].get<int>(), 2) << rn["rates"].dump();
}

// A family that reaches only a few lengths (here: a head of 20 tokens leaves L = 20 ... 23) gives
// no verdict: its sites are counted in too_few_lengths, not as constant.
TEST(FlipSearch, FamiliesWithTooFewLengthsAreLeftOutOfTheRates) {
  const Fixture fx;
  json j = fx.spec();
  j["family"].push_back(
      {{"name", "long"}, {"head", std::string(20, '#')}, {"unit", "#"}, {"tail", ""}});
  const FlipSearchSpec spec = flip_search_spec_from_json(j, "flips.toml", ".");
  GreedyBackend flat(GreedyBackend::kFlat);
  const json sm = run_flips(flat, spec, fx.dir / "few");
  EXPECT_EQ(sm["too_few_lengths"], 12);
  EXPECT_EQ(sm["rates"]["site_families"], 24);
  EXPECT_EQ(sm["families"][2]["site_families"], 0);
}

TEST(FlipSearch, BadInputsGetClearErrors) {
  const Fixture fx;
  auto refused_with = [](const json& j, const std::string& fragment) {
    return test::throws_containing([&] { flip_search_spec_from_json(j, "flips.toml", "."); },
                                   fragment);
  };
  json j = fx.spec();
  j["agree"] = 0.4;
  EXPECT_TRUE(refused_with(j, "key 'agree' is 0.4"));
  j = fx.spec();
  j["lengths"] = {9, 3};
  EXPECT_TRUE(refused_with(j, "key 'lengths' is [9,3]"));
  j = fx.spec();
  j["sites"] = 0;
  EXPECT_TRUE(refused_with(j, "key 'sites' must be >= 1"));
  j = fx.spec();
  j.erase("manifest");
  EXPECT_TRUE(refused_with(j, "manifest"));
  j = fx.spec();
  j["stride"] = 4;
  EXPECT_TRUE(refused_with(j, "unknown key 'stride'"));
  // A context longer than the model's, and a range too short for two cycles of the period.
  const FlipSearchSpec spec = flip_search_spec_from_json(fx.spec(), "flips.toml", ".");
  GreedyBackend small(GreedyBackend::kFlat, 60);
  try {
    FlipSearchMode(small, spec, pick_flip_sites(spec), EvalRecord{});
    ADD_FAILURE() << "accepted contexts longer than the model's";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "context of 60");
  }
  json short_range = fx.spec();
  short_range["lengths"] = {8, 15};
  const FlipSearchSpec ss = flip_search_spec_from_json(short_range, "flips.toml", ".");
  GreedyBackend flat(GreedyBackend::kFlat);
  EXPECT_THROW(run_flips(flat, ss, fx.dir / "short"), Error);
  // A control period equal to the stride is no baseline.
  const auto sites = pick_flip_sites(spec);
  FlipSummaryOptions same;
  same.stride = 4;
  same.control_period = 4;
  EXPECT_THROW(summarize_flips(spec, sites, RunResult{}, same), Error);
}

}  // namespace
}  // namespace phasekv
