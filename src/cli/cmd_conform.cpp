// `phasekv conform`: does the engine in front of you compute the model it claims to, phase by
// phase? (eval/conform.h, docs/CONFORM.md). One call measures one engine condition:
//   OUT/reference/     the sweep through the model in process (scored once, then resumed as is)
//   OUT/<condition>/   the same items through the served engine, and its conform.json
//   OUT/conform.json, OUT/conform.csv   every condition measured so far in OUT, side by side
// Both sweeps are ordinary resumable runs (eval/sweep.h), so an interrupted call resumes.
// Conditions the server fixes at start-up (its micro-batch -ub, flash attention) are measured by
// restarting it and calling conform again with another --condition; conditions of the requests
// by conform's flags (--concurrency N: continuous batching on a server with several slots;
// --prefill-pieces K: the prompt arrives in K pieces through the server's prompt cache).
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <regex>

#include "backend/http_client.h"
#include "backend/in_process.h"
#include "cli/commands.h"
#include "cli/http_options.h"
#include "cli/path_options.h"
#include "eval/conform.h"
#include "eval/sweep.h"
#include "report/report.h"
#include "task/task_file.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv::cli {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

struct ConformArgs {
  std::string model, endpoint, served_model, condition, padding = "prefix", out;
  int examples = 10, modulus = 0, stride = 0, threads = 1, batch = 16;
  uint64_t seed = 0;
  ConformOptions conform;
  bool require_conform = false;
  HttpBackendOptions http;
};

// A condition names a directory of OUT and a row of the report.
void check_condition(const std::string& c) {
  static const std::regex allowed("[A-Za-z0-9][A-Za-z0-9._-]{0,63}");
  if (!std::regex_match(c, allowed) || c == "reference")
    throw Error("--condition '" + c +
                "': a label such as ub512-fa-off (allowed: letters, digits, '.', '_', '-', up to "
                "64 characters, not starting with a sign; not 'reference', the in-process run's "
                "directory)");
}

void validate(const ConformArgs& a) {
  check_condition(a.condition);
  check_phase_grid(a.examples, a.modulus, "--examples", "--modulus");
  if (a.stride < 0) throw Error(fmt::format("--stride is {} (allowed: >= 0)", a.stride));
  if (a.stride > 0 && a.modulus % a.stride != 0)
    throw Error(fmt::format("--stride {} must divide --modulus {}", a.stride, a.modulus));
  if (!(a.conform.tolerance > 0))
    throw Error(fmt::format("--tolerance {:g} (allowed: > 0 nats)", a.conform.tolerance));
  if (!(a.conform.phase_factor >= 1))
    throw Error(fmt::format("--phase-factor {:g} (allowed: >= 1)", a.conform.phase_factor));
  if (a.batch < 1) throw Error(fmt::format("--batch is {} (allowed: >= 1)", a.batch));
}

// The same items for both runs; only the directory and the description of the scorer differ.
SweepOptions sweep_options(const ConformArgs& a, const TaskConfig& task, int stride,
                           const std::string& dir) {
  SweepOptions o;
  o.task = task;
  o.examples = a.examples;
  o.modulus = a.modulus;
  o.padding = padding_mode_from_string(a.padding, "--padding");
  o.seed = a.seed;
  o.stride = stride;
  o.stride_given = true;  // a model stride that does not divide M means no split, not an error
  o.out_dir = dir;
  o.batch = a.batch;
  o.stats.bootstrap_reps = 0;  // the deviations are conform's result, not the accuracy's CI
  o.stats.permutations = 200;
  o.progress = &std::cerr;
  return o;
}

// `stride` receives the stride of both sweeps' summaries, as run_sweep chooses it: --stride,
// else the model's when it divides M, else none.
SweepResult run_reference(const ConformArgs& a, const TaskConfig& task, int& stride) {
  const std::unique_ptr<Backend> model = open_model_dir(a.model, a.threads, a.batch);
  const json described = model->describe();
  SweepOptions o = sweep_options(a, task, a.stride, (fs::path(a.out) / "reference").string());
  o.model_meta = {{"model_dir", a.model},
                  {"config_hash", described["config_hash"]},
                  {"stride", described["stride"]}};
  stride = sweep_stride(*model, o);
  o.stride = stride;
  o.progress_label = "conform reference";
  SweepResult r = run_sweep(*model, o);
  write_sweep_outputs(o.out_dir, r.label, r.summary, r.meta);
  return r;
}

struct EngineRun {
  SweepResult sweep;
  json engine;  // HttpBackend::describe() and the server's token counts
};

EngineRun run_engine(const ConformArgs& a, const TaskConfig& task, int stride) {
  HttpBackendOptions h = a.http;
  h.endpoint = a.endpoint;
  h.model = a.served_model;
  const std::unique_ptr<HttpBackend> http = HttpBackend::open(h);
  SweepOptions o = sweep_options(a, task, stride, (fs::path(a.out) / a.condition).string());
  o.batch = std::max(a.batch, 4 * h.concurrency);
  const json described = http->describe();
  o.model_meta = {{"endpoint", described["endpoint"]}, {"condition", a.condition}};
  o.progress_label = "conform " + a.condition;
  EngineRun run{run_sweep(*http, o), described};
  write_sweep_outputs(o.out_dir, run.sweep.label, run.sweep.summary, run.sweep.meta);
  // The server's token counts over every call that scored this condition (a resumed call adds
  // its own to the earlier ones): cached_prompt_tokens says whether --prefill-pieces' pieces
  // were served from the prompt cache.
  const UsageTotals u = http->usage();
  json usage = {{"prompt_tokens", u.prompt_tokens},
                {"cached_prompt_tokens", u.cached_tokens},
                {"answers", u.answers_with_usage + u.answers_without_usage}};
  const fs::path prior = fs::path(o.out_dir) / "conform.json";
  if (fs::exists(prior)) {
    const json before = read_json_file(prior.string());
    if (before.contains("engine") && before["engine"].contains("usage"))
      for (auto& [key, value] : usage.items())
        value = value.get<int64_t>() + before["engine"]["usage"].value(key, int64_t{0});
  }
  run.engine["usage"] = usage;
  return run;
}

// A condition's conform.json holds every key the report reads (one written by an older phasekv
// may not: rerunning its condition rewrites it without scoring anything again).
void check_conform_file(const json& row, const std::string& file) {
  const auto refuse = [&](const std::string& key) {
    throw Error(file + ": no '" + key +
                "' (written by another phasekv version?); rerun `phasekv conform` with its "
                "--condition to rewrite it (its results.jsonl is resumed, nothing is rescored)");
  };
  if (!row.is_object() || !row.contains("conform") || !row["conform"].is_object())
    refuse("conform");
  const json& s = row["conform"];
  for (const char* key :
       {"condition", "items", "max_dlogprob", "greedy_flips", "verdict_flips", "verdict", "phases"})
    if (!s.contains(key)) refuse(std::string("conform.") + key);
  for (const json& p : s["phases"]) {
    for (const char* key : {"n", "scored", "max_dlogprob", "mean_dlogprob", "median_dlogprob",
                            "beyond_tolerance", "greedy_flips", "verdict_flips"})
      if (!p.is_object() || !p.contains(key)) refuse(std::string("conform.phases[].") + key);
    if (!p.contains("phase") && !p.contains("r")) refuse("conform.phases[].phase");
  }
}

// A phase row's phase: "phase", or "r" in files written before the key followed the glossary.
int phase_of(const json& p) { return (p.contains("phase") ? p["phase"] : p["r"]).get<int>(); }

// Every OUT/<condition>/conform.json, in name order.
std::vector<json> measured_conditions(const std::string& out) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(out))
    if (entry.is_directory() && fs::exists(entry.path() / "conform.json"))
      files.push_back(entry.path() / "conform.json");
  std::sort(files.begin(), files.end());
  std::vector<json> rows;
  for (const auto& f : files) {
    json row = read_json_file(f.string());
    check_conform_file(row, f.string());
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string conditions_table(const std::vector<json>& rows) {
  std::string t = fmt::format("{:<20} {:>6} {:>14} {:>14} {:>7} {:>8}  {}\n", "condition", "items",
                              "max |dlogp|", "mean |dlogp|", "greedy", "verdict", "summary");
  for (const json& c : rows) {
    const json& s = c["conform"];
    double mean = 0;
    int64_t n = 0;
    for (const json& p : s["phases"]) {
      mean += p["mean_dlogprob"].get<double>() * p["scored"].get<double>();
      n += p["scored"].get<int64_t>();
    }
    t += fmt::format("{:<20} {:>6} {:>14.3e} {:>14.3e} {:>7} {:>8}  {}\n",
                     s["condition"].get<std::string>(), s["items"].get<int64_t>(),
                     s["max_dlogprob"].get<double>(), n > 0 ? mean / static_cast<double>(n) : 0.0,
                     s["greedy_flips"].get<int64_t>(), s["verdict_flips"].get<int64_t>(),
                     s["verdict"].get<std::string>());
  }
  return t;
}

// One row per condition and phase: what a plot of deviation against phase needs.
std::string conditions_csv(const std::vector<json>& rows) {
  std::string csv =
      "condition,phase,n,scored,max_dlogprob,mean_dlogprob,median_dlogprob,beyond_tolerance,"
      "greedy_flips,verdict_flips\n";
  for (const json& c : rows)
    for (const json& p : c["conform"]["phases"])
      csv += fmt::format("{},{},{},{},{:.6e},{:.6e},{:.6e},{},{},{}\n",
                         c["conform"]["condition"].get<std::string>(), phase_of(p),
                         p["n"].get<int64_t>(), p["scored"].get<int64_t>(),
                         p["max_dlogprob"].get<double>(), p["mean_dlogprob"].get<double>(),
                         p["median_dlogprob"].get<double>(), p["beyond_tolerance"].get<int64_t>(),
                         p["greedy_flips"].get<int64_t>(), p["verdict_flips"].get<int64_t>());
  return csv;
}

void run_conform(const ConformArgs& a) {
  validate(a);
  set_threads(a.threads);
  const TaskConfig task = load_task_config(a.model);
  int stride = 0;
  const SweepResult reference = run_reference(a, task, stride);
  const EngineRun engine = run_engine(a, task, stride);
  const ConformSummary s =
      conform_summary(reference.run, engine.sweep.run, a.condition, a.modulus, a.conform);
  const json record = {{"conform", s.to_json()},
                       {"phase_factor", a.conform.phase_factor},
                       {"reference", {{"model_dir", a.model}, {"results", reference.run.path}}},
                       {"engine", engine.engine},
                       {"sweep",
                        {{"examples", a.examples},
                         {"modulus", a.modulus},
                         {"padding", a.padding},
                         {"seed", a.seed},
                         {"task", task_config_to_json(task)}}}};
  write_file_atomic((fs::path(a.out) / a.condition / "conform.json").string(),
                    record.dump(2) + "\n");
  const std::vector<json> rows = measured_conditions(a.out);
  write_file_atomic((fs::path(a.out) / "conform.json").string(),
                    json({{"conditions", rows}}).dump(2) + "\n");
  write_file_atomic((fs::path(a.out) / "conform.csv").string(), conditions_csv(rows));
  std::cout << conditions_table(rows) << a.condition << ": " << s.verdict << "\n"
            << "wrote " << a.out << "/{" << a.condition
            << "/conform.json, conform.json, conform.csv}\n";
  if (s.missing > 0) {
    std::cout << fmt::format(
        "conform: {} items have no outcome from both runs (see 'error' in {}/results.jsonl); "
        "rerun the same command to retry them (exit {})\n",
        s.missing, (fs::path(a.out) / a.condition).string(), kAuditErrorsExit);
    throw AuditHadErrors{};
  }
  if (a.require_conform && s.verdict.rfind("conforms", 0) != 0) {
    std::cout << "conform: --require-conform: " << a.condition << " does not conform\n";
    throw SlaGateFailed{};
  }
}

}  // namespace

void register_conform(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "conform",
      "hold a served engine against the same model in process, phase by phase (resumable)");
  auto a = std::make_shared<ConformArgs>();
  a->http.concurrency = 1;  // one request at a time unless continuous batching is the condition
  a->http.timeout_s = 300;
  cmd->add_option("--model", a->model, "the model directory the engine serves (the reference)")
      ->required()
      ->transform(bundled_path());
  cmd->add_option("--endpoint", a->endpoint, "the engine's URL, e.g. http://127.0.0.1:8080")
      ->required();
  cmd->add_option("--served-model", a->served_model, "the engine's name for it (GET /v1/models)")
      ->required();
  cmd->add_option("--condition", a->condition,
                  "LABEL of the engine's setting (e.g. ub512-fa-off): its directory in --out")
      ->required();
  cmd->add_option("--out", a->out, "output directory, shared by every condition of one model")
      ->required()
      ->check(output_dir());
  cmd->add_option("--modulus", a->modulus, "M: phases r = key position mod M")->required();
  cmd->add_option("--examples", a->examples, "logical examples, each at every phase");
  cmd->add_option("--padding", a->padding, "prefix|in_sequence");
  cmd->add_option("--seed", a->seed, "names the logical examples")->check(non_negative());
  cmd->add_option("--stride", a->stride,
                  "S for the sweeps' summaries (0: the model's when it divides M)");
  cmd->add_option("--threads", a->threads, "libtorch threads of the reference (0 = all cores)")
      ->check(compute_threads());
  cmd->add_option("--batch", a->batch, "sequences per forward and per results flush");
  cmd->add_option("--tolerance", a->conform.tolerance,
                  "nats of target log-probability within which the engine conforms");
  cmd->add_option("--phase-factor", a->conform.phase_factor,
                  "a phase is flagged when its largest deviation exceeds the tolerance and this "
                  "many times the median phase's");
  cmd->add_option("--prefill-pieces", a->http.prefill_pieces,
                  "K: send each prompt first as K - 1 growing prefixes through the prompt cache "
                  "(llama.cpp, --concurrency 1)");
  cmd->add_flag("--require-conform", a->require_conform,
                "exit 4 unless the condition conforms within --tolerance");
  add_http_backend_options(cmd, a->http);
  cmd->footer(
      "Exit status: 0 done; 2 an error; 4 --require-conform and the condition does not conform; "
      "5 some items ended as errors (no verdict; a rerun retries them); 6 the server stopped "
      "answering (results kept; a rerun resumes).");
  cmd->callback([a] { run_conform(*a); });
}

}  // namespace phasekv::cli
