// `phasekv probe`: the padding probe (probe/probe.h), and `phasekv flips`: the flip search over
// held-out code (probe/flip_search.h), each on an in-process model (--model DIR) or a served one
// (--endpoint URL --model NAME), through the resumable runner.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>
#include <memory>

#include "backend/http_client.h"
#include "backend/local_backend.h"
#include "cli/commands.h"
#include "cli/http_options.h"
#include "cli/path_options.h"
#include "probe/flip_search.h"
#include "probe/probe.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv::cli {
namespace {

struct ProbeArgs {
  std::string spec, model, endpoint, out, lengths;
  int stride = 0, retest = 1, threads = 0, batch = 16, permutations = 1000;
  HttpBackendOptions http;  // with --endpoint (cli/http_options.h)
};

// "A:B" -> {A, B}.
std::pair<int, int> parse_lengths(const std::string& s) {
  const auto colon = s.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    size_t used_a = 0, used_b = 0;
    const int a = std::stoi(s.substr(0, colon), &used_a);
    const int b = std::stoi(s.substr(colon + 1), &used_b);
    if (used_a != colon || used_b != s.size() - colon - 1) throw std::invalid_argument("junk");
    if (a < 0 || b < a) throw std::invalid_argument("range");
    return {a, b};
  } catch (const std::exception&) {
    throw Error("--lengths '" + s + "' (allowed: A:B with 0 <= A <= B, filler tokens)");
  }
}

// The backend of --model DIR (in process) or --endpoint URL, and the stride for the tables:
// --stride, else the in-process model's (0 when it has none or is served).
std::pair<std::unique_ptr<Backend>, int> open_backend(const ProbeArgs& a) {
  if (a.endpoint.empty()) {
    set_threads(a.threads);
    auto local = std::make_unique<LocalBackend>(LocalBackend::from_dir(a.model, a.threads, a.batch));
    const int stride = a.stride > 0 ? a.stride : chunked_stride(local->model()->cfg);
    return {std::move(local), stride};
  }
  HttpBackendOptions o = a.http;
  o.endpoint = a.endpoint;
  o.model = a.model;
  return {HttpBackend::open(o), a.stride};
}

// The options every probe command shares: where the model is and how to reach it.
void add_backend_options(CLI::App* cmd, ProbeArgs& a) {
  cmd->add_option("--model", a.model, "a model directory; with --endpoint the served model's name")
      ->required();
  cmd->add_option("--endpoint", a.endpoint, "server URL (OpenAI-compatible), e.g. http://127.0.0.1:8000");
  cmd->add_option("--out", a.out, "output directory (an existing results.jsonl is resumed)")
      ->required()
      ->check(output_dir());
  cmd->add_option("--threads", a.threads, "libtorch threads for --model DIR (0 = all cores)");
  cmd->add_option("--batch", a.batch, "sequences per forward for --model DIR");
  add_http_backend_options(cmd, a.http);  // with --endpoint
}

void run_flips(const ProbeArgs& a, int control_period, int examples) {
  if (a.stride < 0) throw Error("--stride is " + std::to_string(a.stride) + " (allowed: >= 2, or 0 = the model's)");
  const FlipSearchSpec spec = flip_search_spec_from_file(a.spec);
  auto [backend, stride] = open_backend(a);
  if (stride < 2)
    throw Error(backend->model_id() + " has no stride of its own (a full-attention or served "
                                      "model): give --stride S, the compressed model's, so both "
                                      "are tested at the same period");
  if (control_period == stride)
    throw Error("--control-period " + std::to_string(control_period) +
                " is the stride: give another period (0 = S + 1), the chance baseline");
  const std::vector<FlipSite> sites = pick_flip_sites(spec);
  EvalRecord identity;
  identity.model = backend->model_id();
  identity.task = "flips:" + spec.hash();  // a changed spec is another run
  identity.seed = spec.seed;
  identity.modulus = spec.l_max + 1;  // a record's phase is its filler length L
  identity.padding = "filler";
  FlipSearchMode mode(*backend, spec, sites, identity);
  for (const auto& [family, missing] : mode.unreachable())
    std::cerr << fmt::format("flips: family {}: no k gives L = {} (the tokenizer merges units)\n",
                             family, fmt::join(missing, ", "));
  RunOptions ro;
  ro.out_dir = a.out;
  ro.label = "flips";
  ro.progress = &std::cerr;
  const RunResult run = run_items(*backend, mode, ro);
  FlipSummaryOptions so;
  so.stride = stride;
  so.control_period = control_period;
  so.examples = examples;
  nlohmann::json summary = summarize_flips(spec, sites, run, so);
  summary["backend"] = backend->describe();
  summary["records"] = {{"items", run.items}, {"scored", run.scored}, {"resumed", run.resumed}};
  write_file_atomic(a.out + "/flips.json", summary.dump(2) + "\n");
  // Each example as a probe spec: `phasekv probe --spec OUT/examples/site-N-FAMILY.json` charts it.
  // The examples of an earlier summary go first (a rerun with other options picks others).
  std::filesystem::remove_all(a.out + "/examples");
  for (const auto& ex : summary["examples"])
    write_file_atomic(fmt::format("{}/examples/site-{}-{}.json", a.out, ex["site"].get<int>(),
                                  ex["family"].get<std::string>()),
                      flip_example_probe_spec(ex, spec).dump(2) + "\n");
  std::cout << flips_verdict(summary) << "\n";
  std::cout << "wrote " << a.out << "/{results.jsonl, flips.json, examples/}\n";
}

void run_probe(const ProbeArgs& a) {
  if (a.retest < 1) throw Error("--retest is " + std::to_string(a.retest) + " (allowed: >= 1)");
  if (a.stride < 0) throw Error("--stride is " + std::to_string(a.stride) + " (allowed: >= 0, 0 = the model's or the detected period)");
  if (a.permutations < 0) throw Error("--permutations must be >= 0");
  ProbeSpec spec = probe_spec_from_file(a.spec);
  if (!a.lengths.empty()) std::tie(spec.l_min, spec.l_max) = parse_lengths(a.lengths);

  auto [backend, stride] = open_backend(a);
  const int l_hi = spec.l_max + a.retest - 1;
  ProbePlan plan = plan_probe(*backend, spec, l_hi);
  for (const auto& [family, missing] : plan.unreachable)
    std::cerr << fmt::format("probe: family {}: no k gives L = {} (the tokenizer merges units)\n",
                             family, fmt::join(missing, ", "));
  EvalRecord identity;
  identity.model = backend->model_id();
  identity.task = "probe:" + spec.hash();  // a changed spec is another run
  identity.modulus = l_hi + 1;  // a record's phase is its filler length L, in [0, l_hi]
  identity.padding = "filler";
  ProbeMode mode(spec, plan, identity);
  RunOptions ro;
  ro.out_dir = a.out;
  ro.label = "probe";
  ro.progress = &std::cerr;
  const RunResult run = run_items(*backend, mode, ro);

  ProbeSummaryOptions so;
  so.stride = stride;
  so.retest = a.retest;
  so.permutations = a.permutations;
  nlohmann::json summary = summarize_probe(spec, run, so);
  summary["backend"] = backend->describe();
  summary["code_ids"] = plan.code_ids;
  nlohmann::json unreachable = nlohmann::json::object();
  for (const auto& [family, missing] : plan.unreachable) unreachable[family] = missing;
  summary["unreachable_lengths"] = unreachable;
  summary["records"] = {{"items", run.items}, {"scored", run.scored}, {"resumed", run.resumed}};
  write_file_atomic(a.out + "/probe.json", summary.dump(2) + "\n");
  write_probe_charts(a.out, summary);
  std::cout << probe_verdict(summary) << "\n";
  if (summary.contains("retest")) {
    const auto& r = summary["retest"];
    std::cout << fmt::format(
        "retest K = {}: all {} answers agree at {} of {} lengths; the first answer is right at {}, "
        "the majority at {}\n",
        r["k"].get<int>(), r["k"].get<int>(), r["all_agree"].get<int>(), r["items"].get<int>(),
        r["single_correct"].get<int>(), r["majority_correct"].get<int>());
  }
  std::cout << "wrote " << a.out << "/{results.jsonl, probe.json, probe.svg, probe-FAMILY.svg}\n";
}

}  // namespace

void register_probe(CLI::App& app) {
  auto a = std::make_shared<ProbeArgs>();
  auto* cmd = app.add_subcommand(
      "probe", "the padding probe: candidate continuations against the filler length before code");
  cmd->add_option("--spec", a->spec, "probe spec (TOML or JSON: code, candidates, correct, lengths, families)")
      ->required()
      ->transform(bundled_path());
  add_backend_options(cmd, *a);
  cmd->add_option("--stride", a->stride,
                  "S for the tables by L mod S (0: the model's stride, else the detected period)");
  cmd->add_option("--retest", a->retest, "K: compare the answers at L, L+1, ..., L+K-1");
  cmd->add_option("--lengths", a->lengths, "A:B, overrides the spec's filler lengths");
  cmd->add_option("--permutations", a->permutations, "permutations of the period test");
  cmd->callback([a] { run_probe(*a); });

  auto f = std::make_shared<ProbeArgs>();
  auto control = std::make_shared<int>(0), examples = std::make_shared<int>(6);
  auto* flips = app.add_subcommand(
      "flips", "the flip search: sites in held-out code whose greedy token changes with the "
               "filler length, periodically with the stride or not");
  flips->add_option("--spec", f->spec, "flip-search spec (TOML or JSON: manifest, sites, lengths, families)")
      ->required()
      ->transform(bundled_path());
  add_backend_options(flips, *f);
  flips->add_option("--stride", f->stride, "S (0: the model's; a full-attention control needs it)");
  flips->add_option("--control-period", *control, "the chance baseline's period (0: S + 1)");
  flips->add_option("--examples", *examples, "periodic sites written as probe specs");
  flips->callback([f, control, examples] {
    if (*control == 1 || *control < 0)
      throw Error("--control-period is " + std::to_string(*control) + " (allowed: >= 2, 0 = S + 1)");
    if (*examples < 0) throw Error("--examples must be >= 0");
    run_flips(*f, *control, *examples);
  });
}

}  // namespace phasekv::cli
