// The one set of test helpers: temp directories, files, `phasekv serve` as a child process, tiny
// configs for every attention variant, seeded models and tokens.
#pragma once
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "config/model_config.h"
#include "eval/stats.h"
// PHASEKV_BASE_ONLY: the sanitizer build of the torch-free library and its tests (fuzz/), where
// the libtorch helpers below do not exist.
#ifndef PHASEKV_BASE_ONLY
#include "model/decoder.h"
#endif
#include "task/tasks.h"
#include "util/error.h"

namespace phasekv::test {

// EXPECT_CONTAINS(haystack, needle) and its negation: on failure both strings are printed, so a
// test shows the message it got instead of "find(...) != npos". Either may be a std::string, a
// string_view or a C string.
inline ::testing::AssertionResult contains_format(const char* haystack_expr,
                                                  const char* needle_expr,
                                                  std::string_view haystack,
                                                  std::string_view needle) {
  if (haystack.find(needle) != std::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << haystack_expr << " does not contain " << needle_expr << "\n  needle:   \""
         << needle << "\"\n  haystack: \"" << haystack << "\"";
}
inline ::testing::AssertionResult not_contains_format(const char* haystack_expr,
                                                      const char* needle_expr,
                                                      std::string_view haystack,
                                                      std::string_view needle) {
  const size_t at = haystack.find(needle);
  if (at == std::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << haystack_expr << " contains " << needle_expr << " at offset " << at
         << "\n  needle:   \"" << needle << "\"\n  haystack: \"" << haystack << "\"";
}
#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_PRED_FORMAT2(::phasekv::test::contains_format, haystack, needle)
#define ASSERT_CONTAINS(haystack, needle) \
  ASSERT_PRED_FORMAT2(::phasekv::test::contains_format, haystack, needle)
#define EXPECT_NOT_CONTAINS(haystack, needle) \
  EXPECT_PRED_FORMAT2(::phasekv::test::not_contains_format, haystack, needle)
#define ASSERT_NOT_CONTAINS(haystack, needle) \
  ASSERT_PRED_FORMAT2(::phasekv::test::not_contains_format, haystack, needle)

// Success when `f()` throws an E (phasekv::Error unless named) whose message contains `fragment`;
// otherwise a failure that says what happened (no error, or the message it got). Use as
// EXPECT_TRUE(test::throws_containing([&] { ... }, "fragment")): the failure names the caller's
// line. Any other exception propagates and fails the test.
template <class E = Error, class F>
::testing::AssertionResult throws_containing(F&& f, std::string_view fragment) {
  try {
    f();
  } catch (const E& e) {
    const std::string_view what = e.what();
    if (what.find(fragment) != std::string_view::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "the error does not contain \"" << fragment
                                         << "\"\n  error: \"" << what << "\"";
  }
  return ::testing::AssertionFailure() << "no error; wanted one containing \"" << fragment
                                       << "\"";
}

// The message of the phasekv::Error that `f()` throws, for a test that checks several parts of it
// (EXPECT_CONTAINS each); "" and a failure when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error (a phasekv::Error was expected)";
  return "";
}

// A new empty directory under the system temp dir, unique per process and call.
inline std::filesystem::path temp_dir(const std::string& name) {
  static int counter = 0;
  const auto p = std::filesystem::temp_directory_path() /
                 ("phasekv_test_" + name + "_" + std::to_string(::getpid()) + "_" +
                  std::to_string(counter++));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

// How many times needle occurs in text (overlapping matches counted): elements of an SVG or
// HTML page, rows of a table.
inline size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1))
    ++n;
  return n;
}

// The whole file ("" when it cannot be read: tests print it on failure).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The file's lines, sorted: records of a resumed run compared with an uninterrupted run's (a
// rerun appends in another order).
inline std::vector<std::string> sorted_lines(const std::filesystem::path& p) {
  std::vector<std::string> lines;
  std::istringstream in(slurp(p));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  return lines;
}

inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

// A shell command's exit status (128 + signal when killed) and its stdout and stderr, apart.
struct CommandResult {
  int status = -1;
  std::string out, err;
};
inline CommandResult run_command(const std::string& cmd) {
  const auto dir = temp_dir("cmd");
  const int st =
      std::system((cmd + " > " + (dir / "out").string() + " 2> " + (dir / "err").string()).c_str());
  CommandResult r{WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), slurp(dir / "out"),
                  slurp(dir / "err")};
  std::filesystem::remove_all(dir);
  return r;
}

// `phasekv serve --model DIR --port 0` as a child process (stderr to `log`); the endpoint and the
// served name are read from what it prints. SIGTERM on destruction.
class ServeProcess {
 public:
  ServeProcess(const std::string& binary, const std::string& model_dir,
               const std::filesystem::path& log)
      : log_(log) {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDERR_FILENO);
      execl(binary.c_str(), binary.c_str(), "serve", "--model", model_dir.c_str(), "--port", "0",
            "--torch-threads", "1", static_cast<char*>(nullptr));
      _exit(127);
    }
    const std::regex url("http://127\\.0\\.0\\.1:[0-9]+");
    const std::regex name("model '([^']+)'");
    for (int i = 0; i < 600 && endpoint_.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::smatch m;
      const std::string text = slurp(log);
      if (std::regex_search(text, m, url)) endpoint_ = m[0];
      if (std::regex_search(text, m, name)) name_ = m[1];
    }
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;
  ~ServeProcess() { stop(); }
  // SIGTERM, then the exit status (0 = graceful shutdown).
  int stop() {
    if (pid_ <= 0) return status_;
    kill(pid_, SIGTERM);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return status_;
  }
  const std::string& endpoint() const { return endpoint_; }  // "" when it did not start
  const std::string& name() const { return name_; }          // the served model name
  std::string log() const { return slurp(log_); }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  int status_ = -1;
  std::string endpoint_, name_;
};

inline ModelConfig tiny_config(const AttentionConfig& a, int n_kv_heads = 2) {
  ModelConfig c;
  c.vocab_size = 32;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = 8;
  c.d_ff = 48;
  c.max_context = 512;
  c.layers.assign(2, a);
  return c;
}

// The [model] and [task] sections of a training config that trains in well under a second (d_model
// 16, one chunked layer with S = W = 4, a 2-record kv task); a test appends its own [train].
inline const char* const kTinyModelAndTaskToml = R"(
[model]
vocab_size = 29
d_model = 16
n_layers = 1
n_heads = 2
n_kv_heads = 1
head_dim = 8
d_ff = 32
max_context = 64
[model.attention]
kind = "chunked"
stride = 4
width = 4
n_win = 1
[task]
name = "kv"
n_keys = 8
n_values = 8
n_filler = 8
n_records = 2
context_len = 16
)";

// A small key-value task: vocabulary 5 + 8 + 8 + 8 = 29, 3 records, 24 tokens; a sweep context
// is context_len - 1 + M - 1 = 22 + M tokens.
inline TaskConfig small_kv_task() {
  TaskConfig c;
  c.n_keys = 8;
  c.n_values = 8;
  c.n_filler = 8;
  c.n_records = 3;
  c.context_len = 24;
  return c;
}

// A small lookup task: 6 records, 2 demonstrations, context_len 19 (its minimum) plus
// `extra_fill` body fillers; a sweep context is context_len - 1 + 4M - 2 tokens.
inline TaskConfig small_lookup(int extra_fill = 0) {
  TaskConfig c;
  c.kind = TaskKind::kLookup;
  c.n_keys = 16;
  c.n_values = 16;
  c.n_filler = 8;
  c.n_records = 6;
  c.n_demos = 2;
  c.context_len = 2 * (6 + 2) + 3 + extra_fill;
  return c;
}

// A tiny chunked model (S = W = 4, n_win 1) over small_kv_task()'s vocabulary.
inline ModelConfig small_kv_model_config(int max_context) {
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.stride = 4;
  a.width = 4;
  a.n_win = 1;
  ModelConfig cfg = tiny_config(a);
  cfg.vocab_size = task_vocab(small_kv_task()).vocab_size();
  cfg.max_context = max_context;
  return cfg;
}

// A tiny DeepSeek-V4-style stack: a raw-window layer, a CSA layer (S4/W8, vector gates, shared
// K = V latent, top-2 of its entries chosen by an indexer, a 4-token raw window, a sink) and an
// HCA layer (S = W = 8, all entries), one KV head, partial RoPE.
inline ModelConfig v4_style_config() {
  AttentionConfig win;
  win.kind = AttentionKind::kWindow;
  win.n_win = 4;
  AttentionConfig csa;
  csa.kind = AttentionKind::kChunked;
  csa.stride = 4;
  csa.width = 8;
  csa.gate = GateKind::kVector;
  csa.tied_kv = true;
  csa.n_win = 4;
  csa.sink = true;
  csa.index_topk = 2;
  csa.index_heads = 2;
  csa.index_dim = 8;
  AttentionConfig hca = csa;
  hca.stride = 8;
  hca.width = 8;
  hca.index_topk = 0;
  ModelConfig cfg = tiny_config(csa, 1);
  cfg.n_layers = 3;
  cfg.layers = {win, csa, hca};
  cfg.rope_dims = 4;
  return cfg;
}

struct Variant {
  std::string name;
  ModelConfig cfg;
};

// Every attention variant the engine supports, each in a tiny 2-layer model.
inline std::vector<Variant> all_variants() {
  std::vector<Variant> v;
  AttentionConfig full;
  v.push_back({"full", tiny_config(full)});
  AttentionConfig win;
  win.kind = AttentionKind::kWindow;
  win.n_win = 3;
  v.push_back({"window3", tiny_config(win)});
  for (GateKind g : {GateKind::kScalar, GateKind::kVector, GateKind::kMean}) {
    for (int width : {4, 8}) {
      AttentionConfig a;
      a.kind = AttentionKind::kChunked;
      a.stride = 4;
      a.width = width;
      a.gate = g;
      a.n_win = 1;
      v.push_back({"chunked_" + to_string(g) + "_W" + std::to_string(width), tiny_config(a)});
    }
  }
  AttentionConfig c;
  c.kind = AttentionKind::kChunked;
  c.stride = 4;
  c.width = 4;
  auto add = [&](const std::string& name, AttentionConfig a, int kv = 2) {
    v.push_back({name, tiny_config(a, kv)});
  };
  {
    auto a = c;
    a.n_win = 0;
    add("chunked_nwin0", a);
  }
  {
    auto a = c;
    a.n_win = 5;
    a.sink = true;
    add("chunked_sink_nwin5", a);
  }
  {
    auto a = c;
    a.uncompressed_tail = true;
    a.n_win = 0;
    add("chunked_tail", a);
  }
  {
    auto a = c;
    a.gate_bias = false;
    a.tied_kv_gates = true;
    add("chunked_nobias_tied", a);
  }
  {
    auto a = c;
    a.entry_norm = false;
    a.entry_rope = EntryRope::kNone;
    add("chunked_nonorm_norope", a);
  }
  {
    auto a = c;
    a.entry_rope = EntryRope::kPrev;
    a.n_win = 2;
    add("chunked_rope_prev", a);
  }
  {
    // q/k/v projection biases (Qwen2 style), also on the lane >= 1 projections of W = 2S.
    auto a = c;
    a.width = 8;
    auto cfg = tiny_config(a);
    cfg.qkv_bias = true;
    v.push_back({"chunked_W8_qkv_bias", cfg});
    auto f = tiny_config(AttentionConfig{});
    f.qkv_bias = true;
    v.push_back({"full_qkv_bias", f});
  }
  {
    auto a = c;
    a.entry_rope = EntryRope::kLast;
    add("chunked_rope_last", a, 1);
  }
  {
    auto a = c;
    a.stride = 6;
    a.width = 8;
    a.gate = GateKind::kVector;
    add("chunked_W8S6_vector", a);
  }
  {
    auto a = c;
    a.stride = 3;
    a.width = 9;
    add("chunked_W9S3_3lanes", a, 4);
  }
  {
    // The study's default kernel: a payload map C_i per slot (scalar gates, own value branch).
    auto a = c;
    a.payload = PayloadKind::kPerSlot;
    add("chunked_per_slot", a);
    auto cfg = tiny_config(a);
    cfg.qkv_bias = true;
    v.push_back({"chunked_per_slot_qkv_bias", cfg});
  }
  {
    // Per-slot maps over two lanes, with the study's post-norm.
    auto a = c;
    a.width = 8;
    a.payload = PayloadKind::kPerSlot;
    a.payload_norm = true;
    add("chunked_per_slot_W8_post_norm", a);
  }
  {
    // The DeepSeek-style kernel of the study: W8/S4, vector gates, tied K/V, partial RoPE.
    auto a = c;
    a.width = 8;
    a.gate = GateKind::kVector;
    a.tied_kv = true;
    auto cfg = tiny_config(a, 1);
    cfg.rope_dims = 4;
    v.push_back({"deepseek_style_W8S4_vector_tied_kv", cfg});
    a.gate = GateKind::kScalar;  // its scalar-gate twin, per-slot
    a.payload = PayloadKind::kPerSlot;
    auto twin = tiny_config(a, 1);
    twin.rope_dims = 4;
    v.push_back({"deepseek_style_scalar_twin_per_slot", twin});
  }
  {
    // Staggered grids (issue 19): layer 1's grid moved 2 tokens earlier, per-slot maps; and a
    // moved grid with two lanes and an uncompressed tail (its tail starts at S*e - o).
    auto a = c;
    a.payload = PayloadKind::kPerSlot;
    a.n_win = 2;
    auto cfg = tiny_config(a);
    cfg.layers[1].grid_offset = 2;
    v.push_back({"chunked_staggered_offset2_per_slot", cfg});
    auto b = c;
    b.width = 8;
    b.grid_offset = 3;
    b.uncompressed_tail = true;
    b.n_win = 0;
    add("chunked_W8_offset3_tail", b);
  }
  {
    // Per-KV-head grids (issue 19's staggered heads and multi-grid): two heads at offsets 0 and
    // 2 with per-slot maps and a sink; four heads in three grid groups (offsets 0, 0, 1, 3) over
    // two lanes with vector gates and an uncompressed tail.
    auto a = c;
    a.payload = PayloadKind::kPerSlot;
    a.kv_head_offsets = {0, 2};
    a.n_win = 2;
    a.sink = true;
    add("chunked_kv_head_offsets_0_2_per_slot_sink", a);
    auto b = c;
    b.width = 8;
    b.gate = GateKind::kVector;
    b.kv_head_offsets = {0, 0, 1, 3};
    b.uncompressed_tail = true;
    b.n_win = 0;
    add("chunked_W8_kv_head_offsets_4kv_tail_vector", b, 4);
  }
  v.push_back({"v4_hybrid_window_csa_topk_hca", v4_style_config()});
  {
    // An indexed layer with per-slot maps, two KV heads, no raw window (early queries see
    // nothing) and top-1: the selection changes at almost every entry.
    auto a = c;
    a.payload = PayloadKind::kPerSlot;
    a.n_win = 0;
    a.index_topk = 1;
    a.index_heads = 3;
    a.index_dim = 6;
    add("chunked_per_slot_indexed_top1_nwin0", a);
  }
  {
    auto a = c;
    auto cfg = tiny_config(a);
    cfg.layers[0] = AttentionConfig{};  // hybrid: full then chunked
    cfg.rope_dims = 4;                  // partial RoPE
    cfg.qk_norm = false;
    v.push_back({"hybrid_partial_rope_noqknorm", cfg});
  }
  return v;
}

#ifndef PHASEKV_BASE_ONLY
inline Decoder make_model(const ModelConfig& cfg, uint64_t seed,
                          torch::ScalarType dtype = torch::kFloat32) {
  torch::manual_seed(seed);
  Decoder m(cfg);
  m->init_weights(seed);
  // Non-zero biases and sinks so the tests exercise them (init leaves them at 0).
  torch::NoGradGuard g;
  for (auto& p : m->named_parameters()) {
    const std::string& k = p.key();
    const bool proj_bias = k.size() > 5 && k.compare(k.size() - 5, 5, ".bias") == 0;
    if (proj_bias || k.find(".bias_") != std::string::npos || k.find(".sink") != std::string::npos)
      p.value().copy_(torch::randn(p.value().sizes()) * 0.5);
  }
  m->to(dtype);
  m->eval();
  return m;
}

#endif  // PHASEKV_BASE_ONLY

// Every example evaluated at every phase, with independent Bernoulli(profile[r]) outcomes.
inline std::vector<PhaseOutcome> simulate_outcomes(const std::vector<double>& profile,
                                                   int examples, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<PhaseOutcome> out;
  for (int e = 0; e < examples; ++e) {
    for (int r = 0; r < static_cast<int>(profile.size()); ++r) {
      const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
      out.push_back({e, r, u < profile[static_cast<size_t>(r)]});
    }
  }
  return out;
}

#ifndef PHASEKV_BASE_ONLY
// max |a - b| in f64.
inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

inline torch::Tensor random_tokens(int64_t T, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randint(vocab, {1, T}, gen, torch::kInt64);
}

#endif  // PHASEKV_BASE_ONLY

}  // namespace phasekv::test
