// phasekv-llama-logits: every position's logits of a token sequence through llama.cpp.
//
// Why it exists: phasekv's DeepSeek-V4 model is checked logit for logit against llama.cpp's
// independent deepseek4 implementation (issue 40). This driver links the prebuilt libllama of
// npm's @node-llama-cpp/linux-x64 (no llama.cpp build at all) and compiles against the headers of
// the same release's source, so what it runs is exactly what a node-llama-cpp user runs. The
// CPU backend (one libggml-cpu-<isa>.so per ISA) is picked at run time by
// ggml_backend_load_all_from_path, as node-llama-cpp does.
//
// Why these knobs: the engine's numerics depend on how a prompt is cut. -ub sets the physical
// micro-batch, --split/--chunk the llama_decode calls (each resumes from the KV cache), and
// --flash-attn the attention kernel (llama.cpp's default "auto" turns it on for the CPU). The
// KV cache is f32 by default so that nothing is rounded between the two engines.
//
// Output: --out X.npy writes float32 [n_tokens, n_vocab] (numpy's .npy v1.0); --out X.json writes
// {"tokens", "mode", "logits"} as `phasekv logits` does. One JSON line of timings goes to stdout.

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

#ifndef PHASEKV_LLAMACPP_BINS
#define PHASEKV_LLAMACPP_BINS ""
#endif

namespace {

struct Options {
  std::string model;
  std::string tokens;
  std::string tokens_file;
  int random_tokens = 0;
  uint32_t seed = 0;
  int ubatch = 512;
  int batch = 0;  // 0: the largest piece
  std::string flash_attn = "off";
  std::string split;
  int chunk = 0;
  int threads = 1;
  int ctx = 0;  // 0: the prompt rounded up to 256
  std::string cache_type = "f32";
  std::string out;
  std::string backends = PHASEKV_LLAMACPP_BINS;
  bool verbose = false;
};

struct Fail : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<int> parse_ints(const std::string& s, const std::string& flag) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(" \n\r\t") == std::string::npos) continue;
    try {
      size_t used = 0;
      out.push_back(std::stoi(item, &used));
      if (item.find_first_not_of(" \n\r\t", used) != std::string::npos)
        throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw Fail(flag + ": '" + item + "' is not an integer");
    }
  }
  return out;
}

std::vector<llama_token> read_tokens(const Options& o, int n_vocab) {
  std::vector<int> ids;
  if (!o.tokens.empty()) {
    ids = parse_ints(o.tokens, "--tokens");
  } else if (!o.tokens_file.empty()) {
    std::ifstream f(o.tokens_file);
    if (!f) throw Fail("--tokens-file: cannot read " + o.tokens_file);
    std::stringstream text;
    text << f.rdbuf();
    ids = parse_ints(text.str(), "--tokens-file " + o.tokens_file);
  } else {
    // A seeded uniform draw: the same --seed gives the same prompt on every machine.
    std::mt19937 gen(o.seed);
    std::uniform_int_distribution<int> dis(0, n_vocab - 1);
    for (int i = 0; i < o.random_tokens; ++i) ids.push_back(dis(gen));
  }
  if (ids.empty()) throw Fail("no tokens: give --tokens, --tokens-file or --random N");
  for (int id : ids)
    if (id < 0 || id >= n_vocab)
      throw Fail("token id " + std::to_string(id) + " out of range [0, " + std::to_string(n_vocab) +
                 ") of the model's vocabulary");
  return {ids.begin(), ids.end()};
}

// The [begin, end) ranges of the llama_decode calls: cut at --split positions, or every --chunk.
std::vector<std::pair<int, int>> make_pieces(const Options& o, int n) {
  std::vector<int> cuts;
  if (!o.split.empty()) {
    cuts = parse_ints(o.split, "--split");
    int prev = 0;
    for (int c : cuts) {
      if (c <= prev || c >= n)
        throw Fail("--split: cut " + std::to_string(c) + " must increase and lie inside (0, " +
                   std::to_string(n) + ")");
      prev = c;
    }
  } else if (o.chunk > 0) {
    for (int c = o.chunk; c < n; c += o.chunk) cuts.push_back(c);
  }
  cuts.push_back(n);
  std::vector<std::pair<int, int>> pieces;
  int begin = 0;
  for (int c : cuts) {
    pieces.emplace_back(begin, c);
    begin = c;
  }
  return pieces;
}

llama_flash_attn_type flash_attn_of(const std::string& s) {
  if (s == "off") return LLAMA_FLASH_ATTN_TYPE_DISABLED;
  if (s == "on") return LLAMA_FLASH_ATTN_TYPE_ENABLED;
  if (s == "auto") return LLAMA_FLASH_ATTN_TYPE_AUTO;
  throw Fail("--flash-attn: '" + s + "' (allowed: off, on, auto)");
}

ggml_type cache_type_of(const std::string& s) {
  if (s == "f32") return GGML_TYPE_F32;
  if (s == "f16") return GGML_TYPE_F16;
  if (s == "bf16") return GGML_TYPE_BF16;
  throw Fail("--cache-type: '" + s + "' (allowed: f32, f16, bf16)");
}

void quiet_log(ggml_log_level level, const char* text, void* verbose) {
  if (*static_cast<bool*>(verbose) || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

llama_context* make_context(llama_model* model, const Options& o, int n_tokens, int max_piece) {
  llama_context_params p = llama_context_default_params();
  p.n_ctx = o.ctx > 0 ? o.ctx : (n_tokens + 255) / 256 * 256;
  p.n_batch = o.batch > 0 ? o.batch : max_piece;
  p.n_ubatch = o.ubatch;
  p.n_seq_max = 1;
  p.n_threads = o.threads;
  p.n_threads_batch = o.threads;
  p.flash_attn_type = flash_attn_of(o.flash_attn);
  p.type_k = cache_type_of(o.cache_type);
  p.type_v = p.type_k;  // the DSV4 cache needs K and V of one type
  p.no_perf = true;
  if (static_cast<int>(p.n_ctx) < n_tokens)
    throw Fail("--ctx " + std::to_string(p.n_ctx) + " is shorter than the " +
               std::to_string(n_tokens) + "-token prompt");
  if (static_cast<int>(p.n_batch) < max_piece)
    throw Fail("--batch " + std::to_string(p.n_batch) + " is smaller than the largest piece (" +
               std::to_string(max_piece) + " tokens)");
  llama_context* ctx = llama_init_from_model(model, p);
  if (!ctx) throw Fail(o.model + ": llama.cpp could not create a context (see its log above)");
  return ctx;
}

// Decodes one piece and appends its rows of logits.
void decode_piece(llama_context* ctx, const std::vector<llama_token>& ids, int begin, int end,
                  int n_vocab, std::vector<float>& logits) {
  llama_batch batch = llama_batch_init(end - begin, 0, 1);
  for (int i = begin; i < end; ++i) {
    const int k = i - begin;
    batch.token[k] = ids[i];
    batch.pos[k] = i;
    batch.n_seq_id[k] = 1;
    batch.seq_id[k][0] = 0;
    batch.logits[k] = 1;  // every position's logits: the comparison is per position
  }
  batch.n_tokens = end - begin;
  const int rc = llama_decode(ctx, batch);
  if (rc != 0) {
    llama_batch_free(batch);
    throw Fail("llama_decode failed (code " + std::to_string(rc) + ") on tokens [" +
               std::to_string(begin) + ", " + std::to_string(end) + ")");
  }
  for (int k = 0; k < end - begin; ++k) {
    const float* row = llama_get_logits_ith(ctx, k);
    logits.insert(logits.end(), row, row + n_vocab);
  }
  llama_batch_free(batch);
}

void write_npy(const std::string& path, const std::vector<float>& data, size_t rows, size_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       std::to_string(rows) + ", " + std::to_string(cols) + "), }";
  // magic (6) + version (2) + length (2) + header + '\n', padded to 64 bytes
  header.append(63 - (10 + header.size()) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Fail("--out: cannot write " + path);
  const uint16_t len = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&len), 2);  // little-endian on x86-64
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(data.data()),
          static_cast<std::streamsize>(data.size() * sizeof(float)));
  if (!f) throw Fail("--out: writing " + path + " failed");
}

void write_json(const std::string& path, const std::vector<llama_token>& ids,
                const std::vector<float>& data, size_t cols) {
  std::ofstream f(path);
  if (!f) throw Fail("--out: cannot write " + path);
  f << "{\"tokens\":[";
  for (size_t i = 0; i < ids.size(); ++i) f << (i ? "," : "") << ids[i];
  f << "],\"mode\":\"llama.cpp\",\"logits\":[";
  char buf[32];
  for (size_t r = 0; r < ids.size(); ++r) {
    f << (r ? ",[" : "[");
    for (size_t c = 0; c < cols; ++c) {
      std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(data[r * cols + c]));
      f << (c ? "," : "") << buf;
    }
    f << "]";
  }
  f << "]}\n";
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

int run(const Options& o) {
  if (!o.out.empty() && !ends_with(o.out, ".npy") && !ends_with(o.out, ".json"))
    throw Fail("--out: '" + o.out + "' must end in .npy or .json");
  llama_log_set(quiet_log, const_cast<bool*>(&o.verbose));
  if (o.backends.empty()) throw Fail("--backends: no directory of libggml-cpu-*.so given");
  ggml_backend_load_all_from_path(o.backends.c_str());
  if (ggml_backend_reg_count() == 0)
    throw Fail("--backends " + o.backends + ": no ggml backend could be loaded from it");
  llama_backend_init();

  auto t0 = std::chrono::steady_clock::now();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(o.model.c_str(), mp);
  if (!model) throw Fail(o.model + ": llama.cpp could not load this GGUF (rerun with -v)");
  const double load_ms = ms_since(t0);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  const std::vector<llama_token> ids = read_tokens(o, n_vocab);
  const int n = static_cast<int>(ids.size());
  const auto pieces = make_pieces(o, n);
  int max_piece = 0;
  for (const auto& [b, e] : pieces) max_piece = std::max(max_piece, e - b);
  llama_context* ctx = make_context(model, o, n, max_piece);

  std::vector<float> logits;
  logits.reserve(static_cast<size_t>(n) * static_cast<size_t>(n_vocab));
  t0 = std::chrono::steady_clock::now();
  for (const auto& [b, e] : pieces) decode_piece(ctx, ids, b, e, n_vocab, logits);
  const double decode_ms = ms_since(t0);

  if (ends_with(o.out, ".npy")) write_npy(o.out, logits, ids.size(), n_vocab);
  if (ends_with(o.out, ".json")) write_json(o.out, ids, logits, n_vocab);
  std::printf(
      "{\"model\":\"%s\",\"n_tokens\":%d,\"n_vocab\":%d,\"pieces\":%zu,\"ubatch\":%d,"
      "\"flash_attn\":\"%s\",\"cache_type\":\"%s\",\"threads\":%d,\"load_ms\":%.1f,"
      "\"decode_ms\":%.1f,\"ms_per_token\":%.3f,\"system\":\"%s\"}\n",
      json_escape(o.model).c_str(), n, n_vocab, pieces.size(), o.ubatch, o.flash_attn.c_str(),
      o.cache_type.c_str(), o.threads, load_ms, decode_ms, decode_ms / n,
      json_escape(llama_print_system_info()).c_str());
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"every position's logits of a token sequence through llama.cpp (prebuilt libllama)"};
  Options o;
  app.add_option("-m,--model", o.model, "the GGUF file")->required()->check(CLI::ExistingFile);
  auto* src = app.add_option_group("prompt", "the token ids (exactly one)");
  src->add_option("--tokens", o.tokens, "comma-separated token ids");
  src->add_option("--tokens-file", o.tokens_file, "a file of comma-separated token ids");
  src->add_option("--random", o.random_tokens, "N seeded uniform token ids (with --seed)")
      ->check(CLI::Range(1, 1 << 20));
  src->require_option(1);
  app.add_option("--seed", o.seed, "seed of --random (default 0)");
  app.add_option("-u,--ub,--ubatch", o.ubatch, "physical micro-batch size (default 512)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("-b,--batch", o.batch, "logical batch size (default: the largest piece)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--flash-attn", o.flash_attn, "off (default), on or auto (llama.cpp's default)");
  auto* split = app.add_option("--split", o.split,
                               "comma-separated positions where a new llama_decode "
                               "call starts, e.g. 100,350");
  app.add_option("--chunk", o.chunk, "tokens per llama_decode call")
      ->check(CLI::Range(1, 1 << 20))
      ->excludes(split);
  app.add_option("-t,--threads", o.threads, "CPU threads (default 1)")->check(CLI::Range(1, 256));
  app.add_option("-c,--ctx", o.ctx, "context size (default: the prompt rounded up to 256)");
  app.add_option("--cache-type", o.cache_type, "KV cache type: f32 (default), f16, bf16");
  app.add_option("-o,--out", o.out, "write the logits: X.npy (float32 [n, vocab]) or X.json");
  app.add_option("--backends", o.backends,
                 "directory of the prebuilt libggml-cpu-*.so (default: the one built against)");
  app.add_flag("-v,--verbose", o.verbose, "print llama.cpp's log");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const Fail& e) {
    std::fprintf(stderr, "phasekv-llama-logits: error: %s\n", e.what());
    return 2;
  }
}
