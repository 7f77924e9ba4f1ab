// Correctness of the benchmark machinery (no timing assertions): the FLOP counter, the exponent
// fit, the allocation counter, bf16 training, and the streaming cache (no recomputation of
// finished entries, bytes equal to theory).
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "model/precision.h"
#include "perf/alloc_count.h"
#include "perf/fit.h"
#include "perf/flops.h"
#include "perf/op_profile.h"
#include "perf/train_step.h"
#include "perf/stream_bench.h"
#include "runtime/session.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;

AttentionConfig chunked(int S, int W, int n_win, bool tail = false) {
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.stride = S;
  a.width = W;
  a.n_win = n_win;
  a.uncompressed_tail = tail;
  return a;
}

TEST(PerfFlops, VisibleKeysFollowTheVisibilityRules) {
  AttentionConfig full;
  EXPECT_EQ(visible_keys(full, 0), 1);
  EXPECT_EQ(visible_keys(full, 99), 100);
  AttentionConfig win;
  win.kind = AttentionKind::kWindow;
  win.n_win = 8;
  EXPECT_EQ(visible_keys(win, 3), 4);
  EXPECT_EQ(visible_keys(win, 99), 8);
  // S=4, n_win=128 at t=1023: 256 entries + 128 raw.
  EXPECT_EQ(visible_keys(chunked(4, 8, 128), 1023), 256 + 128);
  EXPECT_EQ(visible_keys(chunked(4, 8, 0), 2), 0);  // nothing visible yet
  // Tail, n_win 1: t = 6 sees entry 0 (tokens 0..3) and raw 4, 5, 6.
  EXPECT_EQ(visible_keys(chunked(4, 4, 1, true), 6), 1 + 3);
  EXPECT_EQ(visible_keys(chunked(4, 4, 1, true), 7), 2 + 1);
}

TEST(PerfFlops, ForwardCountMatchesAHandCount) {
  ModelConfig m;
  m.vocab_size = 10;
  m.d_model = 8;
  m.n_heads = 2;
  m.n_kv_heads = 1;
  m.head_dim = 4;
  m.d_ff = 16;
  m.n_layers = 1;
  m.layers = {chunked(2, 4, 1)};  // two lanes, scalar gates, untied
  const int64_t B = 3, T = 4;
  auto f = forward_flops(m, B, T);
  // Linear MACs per token: wq 8*8, wk/wv 2*8*4, wo 8*8, MLP 3*8*16, lane-1 wk/wv 2*8*4,
  // gates k and v 2 * (W*Hkv = 4) * 8.
  const double macs = 64 + 64 + 64 + 384 + 64 + 64;
  EXPECT_DOUBLE_EQ(f.linear, 2 * macs * B * T);
  // Keys per t = entries floor((t+1)/2) + 1 raw: 1, 2, 2, 3 -> 8.
  EXPECT_DOUBLE_EQ(f.attention, 2.0 * 2 * m.n_heads * m.head_dim * 8 * B);
  EXPECT_DOUBLE_EQ(f.lm_head, 2.0 * 8 * 10 * B * T);
  EXPECT_DOUBLE_EQ(train_step_flops(m, B, T), 3 * f.total());
}

TEST(PerfFit, RecoversAnExactPowerLaw) {
  std::vector<double> x{1024, 4096, 16384, 65536}, y;
  for (double v : x) y.push_back(3e-9 * std::pow(v, 1.75));
  auto f = fit_power_law(x, y);
  EXPECT_NEAR(f.exponent, 1.75, 1e-12);
  EXPECT_NEAR(f.scale, 3e-9, 1e-18);
  EXPECT_NEAR(f.r2, 1.0, 1e-12);
  EXPECT_THROW(fit_power_law({1}, {1}), Error);
  EXPECT_THROW(fit_power_law({2, 2}, {1, 3}), Error);
  EXPECT_THROW(fit_power_law({1, 2}, {0, 3}), Error);
}

TEST(PerfAllocCounter, CountsTensorAllocationsOnlyWhileInScope) {
  AllocStats s;
  {
    AllocCounter c;
    auto t = torch::empty({1000}, torch::kFloat32);
    s = c.stats();
  }
  EXPECT_GE(s.count, 1);
  EXPECT_GE(s.bytes, 4000);
  auto after = torch::empty({10});  // the default allocator is back
  EXPECT_EQ(after.numel(), 10);
}

// The op table counts each (op, input shapes) once per call; the warm-up runs the function
// once and leaves the profiler off, so the table that follows it records only its own run.
TEST(PerfOpProfile, TableCountsCallsPerOpAndShapeAfterAWarmUp) {
  auto a = torch::randn({8, 16}), b = torch::randn({16, 4}), c = torch::randn({4, 8});
  int runs = 0;
  auto f = [&] {
    ++runs;
    for (int i = 0; i < 3; ++i) (void)torch::mm(a, b);
    (void)torch::mm(c, a);
  };
  warm_up_op_profiler(f);
  EXPECT_EQ(runs, 1);
  const auto path = (std::filesystem::temp_directory_path() / "phasekv_op_profile.tsv").string();
  write_op_profile(f, path);
  EXPECT_EQ(runs, 2);
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "self_ms\tshare\tcalls\top\tinput_shapes");
  std::map<std::string, int> calls;  // "op shapes" -> calls
  double share = 0;
  while (std::getline(in, line)) {
    std::vector<std::string> cols;
    std::stringstream ss(line);
    for (std::string col; std::getline(ss, col, '\t');) cols.push_back(col);
    ASSERT_EQ(cols.size(), 5u) << line;
    share += std::stod(cols[1]);
    calls[cols[3] + " " + cols[4]] += std::stoi(cols[2]);
  }
  EXPECT_EQ(calls["aten::mm [8,16] [16,4]"], 3);
  EXPECT_EQ(calls["aten::mm [4,8] [8,16]"], 1);
  EXPECT_NEAR(share, 1.0, 1e-3);
  std::filesystem::remove(path);
}

// The trainer runs bf16 where the CPU has native bf16 (else f32), records it, and learns.
// The component profile charges forward and backward time to the components that ran: a chunked
// model has compressor time in both directions, a full-attention one none; nothing is charged
// twice (the rows sum to at most the step).
TEST(PerfComponents, ChargesForwardAndBackwardToTheComponentsThatRan) {
  ModelConfig m;
  m.vocab_size = 31;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 2;
  m.n_kv_heads = 1;
  m.head_dim = 16;
  m.d_ff = 64;
  m.max_context = 64;
  for (bool compressed : {true, false}) {
    AttentionConfig a = compressed ? chunked(4, 8, 4) : AttentionConfig{};
    m.layers.assign(2, a);
    validate(m, "test");
    auto r = time_train_step({"t", m, 4, 32}, Precision::kF32, 1, 1, 0, "", true);
    std::map<std::string, ComponentTime> by;
    double sum = 0;
    for (const auto& c : r.components.rows) {
      by[c.name] = c;
      sum += c.forward_s + c.backward_s;
    }
    ASSERT_EQ(by.size(), 5u);
    for (const char* name : {"attention", "mlp"}) {
      EXPECT_GT(by[name].forward_s, 0) << name;
      EXPECT_GT(by[name].backward_s, 0) << name;
    }
    EXPECT_GT(by["optimizer"].forward_s, 0);
    EXPECT_EQ(by["optimizer"].backward_s, 0);
    if (compressed) {
      EXPECT_GT(by["compressor"].forward_s, 0);
      EXPECT_GT(by["compressor"].backward_s, 0);
    } else {
      EXPECT_EQ(by["compressor"].forward_s + by["compressor"].backward_s, 0);
    }
    EXPECT_LE(sum, r.components.step_s * 1.0001);
  }
}

TEST(PerfTrain, Bf16TrainingReducesTheLossAndRecordsItsPrecision) {
  auto j = nlohmann::json::parse(R"({
    "model": {"vocab_size": 29, "d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
              "head_dim": 16, "d_ff": 64, "max_context": 64,
              "attention": {"kind": "chunked", "stride": 4, "width": 4, "n_win": 1}},
    "task": {"name": "kv", "n_keys": 8, "n_values": 8, "n_filler": 8, "n_records": 2,
             "context_len": 16},
    "train": {"steps": 30, "batch": 16, "lr": 0.003, "warmup": 2, "seed": 3, "threads": 1,
              "log_every": 1, "eval_every": 30, "eval_examples": 16, "checkpoint_every": 30,
              "precision": "bf16"}})");
  auto cfg = train_config_from_json(j, "t", ".");
  auto dir = (fs::temp_directory_path() / ("phasekv_perf_bf16_" + std::to_string(::getpid())));
  fs::remove_all(dir);
  train(cfg, dir.string(), false);
  auto meta = nlohmann::json::parse(read_file((dir / "train.json").string()));
  EXPECT_EQ(meta.at("runtime").at("precision"), bf16_native() ? "bf16" : "f32");
  std::ifstream in(dir / "train_log.jsonl");
  std::vector<double> loss;
  for (std::string line; std::getline(in, line);)
    loss.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  ASSERT_EQ(loss.size(), 30u);
  double first = (loss[0] + loss[1] + loss[2]) / 3, last = (loss[27] + loss[28] + loss[29]) / 3;
  EXPECT_LT(last, first);
  fs::remove_all(dir);
}

// Decode never recomputes a finished entry: a marker written into entry 0 survives the later
// steps that pool new entries (they append in place; a regrowth only copies the old entries).
TEST(PerfStream, DecodeNeverRecomputesFinishedEntries) {
  auto cfg = stream_model(/*chunked=*/true, 64, 1);
  cfg.layers[0].n_win = 4;
  Decoder m(cfg);
  m->init_weights(5);
  m->eval();
  Session s(m);
  std::vector<int64_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 7) % cfg.vocab_size);
  s.feed(prompt);
  const auto& c = s.caches()[0];
  ASSERT_EQ(c.n_entries(), 10);
  {
    c10::InferenceMode guard;  // the session's tensors may be inference tensors
    c.entry_keys().narrow(2, 0, 1).fill_(3.0);
    c.entry_values().narrow(2, 0, 1).fill_(-2.0);
  }
  for (int i = 0; i < 9; ++i) s.decode(i);
  const auto& after = s.caches()[0];
  EXPECT_EQ(after.n_entries(), 12);
  EXPECT_TRUE(torch::all(after.entry_keys().narrow(2, 0, 1) == 3.0).item<bool>());
  EXPECT_TRUE(torch::all(after.entry_values().narrow(2, 0, 1) == -2.0).item<bool>());
}

// Bytes (and tensor allocations) one decode step allocates, averaged over `steps` steps after
// a prefill of `context` tokens. The session reserves its final length first, as the benchmark
// does, so no step regrows a buffer.
AllocStats decode_allocations(const ModelConfig& cfg, int64_t context, int steps) {
  Decoder m(cfg);
  m->init_weights(3);
  m->eval();
  Session s(m);
  s.reserve(context + 2 + steps);
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < context; ++i) prompt.push_back((i * 13) % cfg.vocab_size);
  for (int64_t i = 0; i < context; i += 128)
    s.feed({prompt.begin() + i, prompt.begin() + std::min<int64_t>(i + 128, context)});
  for (int i = 0; i < 2; ++i) s.decode(i);
  AllocCounter counter;
  for (int i = 0; i < steps; ++i) s.decode(i % cfg.vocab_size);
  auto st = counter.stats();
  return {st.count / steps, st.bytes / steps};
}

// The cache grows in place and the decode scores live in reusable scratch: what a decode step
// allocates does not depend on the context. (Before, every step concatenated a new copy of the
// raw cache, every S-th step one of the entries, and the scores were fresh [G, E + R] tensors:
// here full attention allocated about 1 KB more per step for every token of context, i.e.
// ~0.75 MB more at T = 1024 than at T = 256. Fresh score tensors alone add 48 KB: a first version
// of this change sent full attention's decode down the masked prefill path, and this test failed.)
TEST(PerfStream, DecodeAllocationsDoNotGrowWithContext) {
  for (bool is_chunked : {false, true}) {
    const auto cfg = stream_model(is_chunked, 64, 2);
    const int steps = 16;  // a multiple of S: as many pooling steps at both contexts
    auto at256 = decode_allocations(cfg, 256, steps);
    auto at1024 = decode_allocations(cfg, 1024, steps);
    const char* kind = is_chunked ? "chunked" : "full";
    EXPECT_EQ(at1024.count, at256.count) << kind;
    EXPECT_LE(std::abs(at1024.bytes - at256.bytes), 256)
        << kind << ": " << at256.bytes << " B/token at T=256, " << at1024.bytes << " at T=1024";
    // Nothing proportional to the cache is copied: a step allocates far less than full
    // attention's cache at T = 1024 (2 layers x 1024 tokens x 512 B = 1 MB).
    EXPECT_LT(at1024.bytes, 128 * 1024) << kind;
  }
}

TEST(PerfStream, MeasuredCacheBytesEqualTheory) {
  for (bool is_chunked : {false, true}) {
    auto r = run_stream(stream_model(is_chunked, 64, 2), 203, 50, 3, 1);
    EXPECT_EQ(r.cache_bytes, r.theory_bytes) << (is_chunked ? "chunked" : "full");
    EXPECT_GT(r.allocs_per_token, 0);
  }
}

}  // namespace
}  // namespace phasekv
