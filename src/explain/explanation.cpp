#include "explain/explanation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

double num(const json& j) { return j.is_number() ? j.get<double>() : std::nan(""); }

std::string f2(const json& j, int decimals = 2) {
  const double v = num(j);
  return std::isnan(v) ? std::string("n/a") : fmt::format("{:.{}f}", v, decimals);
}

std::string ci(const json& j, int decimals = 1) {
  if (!j.is_array() || j.size() != 2) return "[n/a]";
  return fmt::format("[{}, {}]", f2(j[0], decimals), f2(j[1], decimals));
}

// The model and run description: knockout and gate_cycle keep it at the top of meta, gates in
// meta.model.
const json& run_meta(const LoadedAnalysis& a) {
  const json& meta = a.summary.at("meta");
  return meta.contains("model") && meta["model"].is_object() ? meta["model"] : meta;
}

std::string model_name(const LoadedAnalysis& a) {
  const json& m = run_meta(a);
  return m.contains("model_dir") ? m["model_dir"].get<std::string>() : a.dir;
}

std::string provenance(const LoadedAnalysis& a) {
  const json& m = run_meta(a);
  return fmt::format("Measured with `{}` on {}.",
                     m.value("command", std::string("(command not recorded)")),
                     m.value("cpu", std::string("(CPU not recorded)")));
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

std::string ints(const json& arr) {
  std::vector<std::string> parts;
  for (const auto& v : arr) parts.push_back(v.dump());
  return join(parts, ", ");
}

// ---- knockout ----

// What the phases were folded mod: `stride` (null: unknown, not folded, the modulus `modulus`),
// or "fold" in files written before the key followed the glossary.
int folded_mod(const json& j, int modulus) {
  if (j.contains("stride")) return j["stride"].is_null() ? modulus : j["stride"].get<int>();
  return j.at("fold").get<int>();
}

std::string knockout_findings(const LoadedAnalysis& a) {
  const json& s = a.summary;
  std::map<std::string, std::vector<std::string>> by_verdict;
  for (const auto& u : s["units"]) {
    const json& sp = u["specialisation"];
    if (sp["verdict"] == "no effect") {
      by_verdict["no effect"].push_back(fmt::format("{} (drop {} pp {})",
                                                    u["condition"].get<std::string>(),
                                                    f2(u["mean_drop_pp"], 1), ci(u["mean_drop_ci_pp"])));
      continue;
    }
    by_verdict[sp["verdict"].get<std::string>()].push_back(fmt::format(
        "{} (drop {} pp {}, index {} {}, p = {}{})", u["condition"].get<std::string>(),
        f2(u["mean_drop_pp"], 1), ci(u["mean_drop_ci_pp"]), f2(sp["index"]), ci(sp["index_ci"], 2),
        f2(sp["p_value"], 3),
        sp["verdict"] == "phase-specific"
            ? fmt::format(", loss at phases {} mod {}", ints(sp["worst_phases"]),
                          folded_mod(sp, s["modulus"].get<int>()))
            : ""));
  }
  std::string out = fmt::format("- **{}, knockout**: ", model_name(a));
  std::vector<std::string> parts;
  for (const char* v : {"phase-specific", "phase-agnostic", "no effect"})
    if (by_verdict.count(v)) parts.push_back(fmt::format("{} {}", v, join(by_verdict[v], "; ")));
  return out + join(parts, ". ") + ".\n";
}

std::string knockout_section(const LoadedAnalysis& a, const std::vector<std::string>& links) {
  const json& s = a.summary;
  const json& k = s["meta"]["knockout"];
  const json& clean = s["clean"];
  std::string out = fmt::format(
      "### {}: knockout\n\n{} unit, {} examples at every phase r mod {}, {} padding, mean "
      "replacement over {} calibration prompts, folded mod {} for the index.\n\n",
      model_name(a), k["unit"].get<std::string>(), k["examples"].get<int>(),
      s["modulus"].get<int>(), k["padding"].get<std::string>(), k["calibration"].get<int>(),
      folded_mod(s, s["modulus"].get<int>()));
  out += fmt::format("Clean: mean accuracy {}, worst phase r = {} at {}, gap {} pp {}.\n\n",
                     f2(clean["mean_acc"], 3), clean["worst_phase"].get<int>(),
                     f2(clean["worst_acc"], 3), f2(clean["gap_pp"], 1), ci(clean["gap_ci_pp"]));
  out += "| unit | mean drop, pp [95 % CI] | specialisation index [95 % CI] | permutation p | "
         "verdict | largest relative loss at phases (mod S) |\n|---|---|---|---|---|---|\n";
  for (const auto& u : s["units"]) {
    const json& sp = u["specialisation"];
    out += fmt::format("| {} | {} {} | {} {} | {} | {} | {} |\n", u["condition"].get<std::string>(),
                       f2(u["mean_drop_pp"], 1), ci(u["mean_drop_ci_pp"]), f2(sp["index"]),
                       ci(sp["index_ci"], 2), f2(sp["p_value"], 3),
                       sp["verdict"].get<std::string>(), ints(sp["worst_phases"]));
  }
  out += "\nRelative change of accuracy, 100 (knockout - clean) / clean, per phase [paired "
         "cluster-bootstrap 95 % CI]:\n\n| unit |";
  const int M = s["modulus"].get<int>();
  for (int r = 0; r < M; ++r) out += fmt::format(" r = {} |", r);
  out += "\n|---|";
  for (int r = 0; r < M; ++r) out += "---|";
  out += "\n| clean accuracy |";
  for (const auto& p : clean["phases"]) out += fmt::format(" {} |", f2(p["acc"], 3));
  out += "\n";
  for (const auto& u : s["units"]) {
    out += fmt::format("| {} |", u["condition"].get<std::string>());
    for (const auto& p : u["phases"])
      out += fmt::format(" {} {} |", f2(p["rel_change_pct"], 0), ci(p["rel_change_ci_pct"], 0));
    out += "\n";
  }
  for (const auto& l : links) out += fmt::format("\n![knockout heatmap, {}]({})\n", model_name(a), l);
  return out + "\n" + provenance(a) + "\n\n";
}

// ---- gates ----

struct GateView {
  std::string name;
  int layer, kv_head, width, peak;
  std::string side;
  double stat, per_entry;
  bool shared;
};

// A gate's mean concentration per entry: `per_entry`, or "per_window" in files written before
// the key followed the glossary ("window" is n_win only).
double per_entry(const json& g) {
  return num(g.contains("per_entry") ? g["per_entry"] : g.value("per_window", json()));
}

std::vector<GateView> gate_views(const json& gates) {
  std::vector<GateView> out;
  for (const auto& g : gates)
    out.push_back({g["name"].get<std::string>(), g["layer"].get<int>(), g["kv_head"].get<int>(),
                   g["width"].get<int>(), g["peak_slot"].get<int>(), g["side"].get<std::string>(),
                   num(g["static"]), per_entry(g), g["shared_with_key"].get<bool>()});
  return out;
}

// Statically concentrated: at most half the slots on average; content-selective: concentrated
// per entry but not on average.
std::string gate_class(const GateView& g) {
  const double half = g.width / 2.0;
  if (g.stat <= half) return "statically concentrated";
  if (g.per_entry <= half) return "concentrated per entry only";
  return "spread";
}

std::string gates_findings(const LoadedAnalysis& a) {
  std::map<std::string, std::vector<std::string>> by_class;
  for (const auto& g : gate_views(a.summary["gates"]))
    if (!g.shared)
      by_class[gate_class(g)].push_back(fmt::format("{} (static {:.2f}, per-entry {:.2f} of W = "
                                                    "{}, peak slot {})",
                                                    g.name, g.stat, g.per_entry, g.width, g.peak));
  std::vector<std::string> parts;
  for (const char* c : {"statically concentrated", "concentrated per entry only", "spread"})
    if (by_class.count(c)) parts.push_back(fmt::format("{}: {}", c, join(by_class[c], "; ")));
  std::string out = fmt::format("- **{}, gates**: {}.", model_name(a), join(parts, ". "));
  std::vector<std::string> offsets;
  for (const auto& o : a.summary["peak_offsets"])
    offsets.push_back(fmt::format("L{}.h{} {:+d}", o["layer"].get<int>(), o["kv_head"].get<int>(),
                                  o["value_minus_key"].get<int>()));
  if (!offsets.empty())
    out += fmt::format(" Value-gate peak minus key-gate peak (slots, mod W): {}.", join(offsets, ", "));
  return out + "\n";
}

std::string gates_section(const LoadedAnalysis& a, const std::vector<std::string>& links) {
  const json& s = a.summary;
  const json& m = s["meta"];
  std::string out = fmt::format(
      "### {}: gates\n\nOver the entries of {} task contexts (phases mod {}, {} padding). static = "
      "exp(H(E[a])), per-entry = E[exp(H(a))]; both run from 1 (one slot) to W (uniform).\n\n"
      "| gate | static | per-entry | peak slot | mean profile over slots | reading |\n"
      "|---|---|---|---|---|---|\n",
      model_name(a), m["contexts"].get<int>(), m["modulus"].get<int>(),
      m["padding"].get<std::string>());
  for (const auto& g : s["gates"]) {
    std::vector<std::string> prof;
    for (const auto& p : g["profile"]) prof.push_back(fmt::format("{:.2f}", p.get<double>()));
    const GateView v = gate_views(json::array({g}))[0];
    out += fmt::format("| {} | {} | {} | {} | {} | {} |\n", v.name, f2(g["static"]),
                       f2(json(per_entry(g))), v.peak, join(prof, " "),
                       v.shared ? "the key gate's weights" : gate_class(v));
  }
  if (!s["trajectory"].empty()) {
    out += "\nOver training (static / per-entry per checkpoint):\n\n| checkpoint | step |";
    for (const auto& g : s["gates"]) out += fmt::format(" {} |", g["name"].get<std::string>());
    out += "\n|---|---|";
    for (size_t i = 0; i < s["gates"].size(); ++i) out += "---|";
    out += "\n";
    for (const auto& c : s["trajectory"]) {
      out += fmt::format("| {} | {} |", c["checkpoint"].get<std::string>(),
                         c["step"].is_null() ? std::string("-") : c["step"].dump());
      for (const auto& g : c["gates"])
        out += fmt::format(" {} / {} |", f2(g["static"]), f2(json(per_entry(g))));
      out += "\n";
    }
  }
  for (const auto& l : links) out += fmt::format("\n![gates, {}]({})\n", model_name(a), l);
  return out + "\n" + provenance(a) + "\n\n";
}

// ---- gate cycling ----

std::string cycle_findings(const LoadedAnalysis& a) {
  const json& f = a.summary["fit"];
  const int S = f["stride"].get<int>();
  // Does the boundary phase stay weak: no better under a shift than unshifted (+ 5 pp)?
  const double unshifted = f["boundary_acc_by_delta"]["0"].get<double>();
  std::vector<std::string> weak, recovered, all;
  for (const auto& [d, acc] : f["boundary_acc_by_delta"].items()) {
    const int delta = std::stoi(d);
    const std::string text = fmt::format("D = {:+d}: {:.3f}", delta, acc.get<double>());
    all.push_back(text);
    if (delta != 0) (acc.get<double>() <= unshifted + 0.05 ? weak : recovered).push_back(text);
  }
  return fmt::format(
      "- **{}, gate cycling** (layers {}, D = {}): R^2 of observed vs predicted accuracy changes {} {} "
      "without the boundary ({} points), {} {} over all phases. Boundary phase {} accuracy {}; "
      "it does not recover under {} of {} shifts{}.\n",
      model_name(a), ints(a.summary["layers"]), ints(f["deltas"]), f2(f["r2_interior"]),
      ci(f["r2_interior_ci"], 2), f["n_interior"].get<int>(), f2(f["r2_all"]),
      ci(f["r2_all_ci"], 2), S - 1, join(all, ", "),
      weak.size(), weak.size() + recovered.size(),
      recovered.empty() ? "" : fmt::format(" (it rises above its unshifted accuracy + 5 pp under {})",
                                           join(recovered, ", ")));
}

std::string cycle_section(const LoadedAnalysis& a, const std::vector<std::string>& links) {
  const json& s = a.summary;
  const json& f = s["fit"];
  const json& g = s["meta"]["gate_cycle"];
  const int S = f["stride"].get<int>();
  std::string out = fmt::format(
      "### {}: gate cycling\n\nGates of layers {} and KV heads {} cycled by D slots (W = S = {}); "
      "{} examples at every phase mod {}, {} padding; accuracies folded mod S.\n\n"
      "| D | quantity |",
      model_name(a), ints(g["layers"]), ints(g["heads"]), S, g["examples"].get<int>(),
      s["modulus"].get<int>(), g["padding"].get<std::string>());
  for (int r = 0; r < S; ++r) out += fmt::format(" r = {}{} |", r, r == S - 1 ? " (boundary)" : "");
  out += fmt::format(" R^2 interior |\n|---|---|{}---|\n| 0 | observed |", [&] {
    std::string d;
    for (int r = 0; r < S; ++r) d += "---|";
    return d;
  }());
  for (const auto& v : f["reference_acc"]) out += fmt::format(" {} |", f2(v, 3));
  out += " |\n";
  for (const auto& d : f["deltas"]) {
    const int delta = d.get<int>();
    for (const char* q : {"observed", "predicted"}) {
      out += fmt::format("| {:+d} | {} |", delta, q);
      for (const auto& p : f["points"])
        if (p["delta"].get<int>() == delta)
          out += fmt::format(" {} |", f2(p[std::string(q) + "_acc"], 3));
      out += q == std::string("observed")
                 ? fmt::format(" {} |\n", f2(f["r2_interior_by_delta"][std::to_string(delta)]))
                 : " |\n";
    }
  }
  out += fmt::format(
      "\nR^2 without the boundary: {} {} ({} points); over all phases: {} {} (cluster bootstrap "
      "over examples).\n",
      f2(f["r2_interior"]), ci(f["r2_interior_ci"], 2), f["n_interior"].get<int>(), f2(f["r2_all"]),
      ci(f["r2_all_ci"], 2));
  for (const auto& l : links) out += fmt::format("\n![gate cycling, {}]({})\n", model_name(a), l);
  return out + "\n" + provenance(a) + "\n\n";
}

// Knockouts against gates of the same model: does a phase-specific head have a statically
// concentrated key gate?
std::string match_findings(const std::vector<LoadedAnalysis>& analyses) {
  std::string out;
  for (const auto& k : analyses) {
    if (k.kind != "knockout") continue;
    const std::string hash = run_meta(k).value("config_hash", std::string());
    for (const auto& g : analyses) {
      if (g.kind != "gates" || run_meta(g).value("config_hash", std::string()) != hash ||
          model_name(g) != model_name(k))
        continue;
      const auto views = gate_views(g.summary["gates"]);
      std::vector<std::string> parts;
      for (const auto& u : k.summary["units"]) {
        if (u["kv_head"].is_null()) continue;
        const int layer = u["layer"].get<int>(), head = u["kv_head"].get<int>();
        for (const auto& v : views)
          if (v.layer == layer && v.kv_head == head && v.side == "key")
            parts.push_back(fmt::format(
                "{} is {} (worst phases {}) and its key gate is {} (static {:.2f}, peak slot {})",
                u["condition"].get<std::string>(), u["specialisation"]["verdict"].get<std::string>(),
                ints(u["specialisation"]["worst_phases"]), gate_class(v), v.stat, v.peak));
      }
      if (!parts.empty())
        out += fmt::format("- **{}, knockouts vs gates**: {}.\n", model_name(k), join(parts, "; "));
    }
  }
  return out;
}

}  // namespace

LoadedAnalysis load_analysis(const std::string& dir) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> kinds = {
      {"knockout", {"knockout.svg"}},
      {"gates", {"gates_plane.svg", "gates_profile.svg"}},
      {"gate_cycle", {"gate_cycle.svg"}}};
  for (const auto& [kind, figures] : kinds) {
    const fs::path file = fs::path(dir) / (kind + ".json");
    if (!fs::exists(file)) continue;
    LoadedAnalysis a;
    a.kind = kind;
    a.dir = dir;
    a.summary = read_json_file(file.string());
    if (!a.summary.contains("meta"))
      throw Error(file.string() + " has no \"meta\": not written by phasekv " + kind);
    for (const auto& f : figures)
      if (fs::exists(fs::path(dir) / f)) a.figures.push_back(f);
    return a;
  }
  throw Error(dir + " holds no knockout.json, gates.json or gate_cycle.json (give output "
              "directories of phasekv knockout, gates or gate-cycle)");
}

std::string explanation_markdown(const std::vector<LoadedAnalysis>& analyses,
                                 const std::vector<std::vector<std::string>>& links,
                                 const std::string& notes, const std::string& command) {
  std::string out =
      "# Explaining the weak spots: knockouts, gate concentration, gate cycling\n\n"
      "Generated by `phasekv explain report` from the output directories of `phasekv knockout`, "
      "`phasekv gates` and `phasekv gate-cycle`; do not edit by hand, rerun:\n\n```sh\n" +
      command +
      "\n```\n\nThe methods are the study's (docs/BACKGROUND.md, section 3), the commands are in "
      "the README. Every number below is read from the analyses' JSON files; each section names "
      "the command that measured it and the CPU. Intervals are 95 % cluster-bootstrap intervals "
      "over logical examples (paired where two conditions are compared). A knockout's verdict is "
      "\"no effect\" unless its mean drop's interval lies above 0, then \"phase-specific\" when its "
      "specialisation index is at least 0.25 and the permutation test gives p < 0.05, else "
      "\"phase-agnostic\" (eval/stats.h, Specialisation). A gate counts as statically concentrated when "
      "exp(H(E[a])) <= W/2.\n\n## Findings\n\n";
  for (const auto& a : analyses) {
    if (a.kind == "knockout") out += knockout_findings(a);
    if (a.kind == "gates") out += gates_findings(a);
    if (a.kind == "gate_cycle") out += cycle_findings(a);
  }
  out += match_findings(analyses);
  if (!notes.empty()) out += "\n## Reading\n\n" + notes + (notes.back() == '\n' ? "" : "\n");
  const std::vector<std::pair<std::string, std::string>> order = {
      {"knockout", "## Knockouts: which heads carry which phases"},
      {"gates", "## Gate concentration"},
      {"gate_cycle", "## Gate cycling: do the gates move the weak spots?"}};
  for (const auto& [kind, heading] : order) {
    bool any = false;
    for (size_t i = 0; i < analyses.size(); ++i) {
      if (analyses[i].kind != kind) continue;
      if (!any) out += "\n" + heading + "\n\n";
      any = true;
      if (kind == "knockout") out += knockout_section(analyses[i], links[i]);
      if (kind == "gates") out += gates_section(analyses[i], links[i]);
      if (kind == "gate_cycle") out += cycle_section(analyses[i], links[i]);
    }
  }
  while (out.size() > 1 && out[out.size() - 1] == '\n' && out[out.size() - 2] == '\n') out.pop_back();
  return out;
}

void write_explanation(const ExplanationOptions& o) {
  if (o.out.empty()) throw Error("--out: no output file given");
  std::vector<LoadedAnalysis> analyses;
  for (const auto& d : o.dirs) analyses.push_back(load_analysis(d));
  const fs::path out(o.out);
  const fs::path figures = o.figures.empty() ? fs::path(out).replace_extension("") : fs::path(o.figures);
  fs::create_directories(figures);
  const fs::path base = out.has_parent_path() ? out.parent_path() : fs::path(".");
  std::vector<std::vector<std::string>> links;
  std::map<std::string, int> used;
  for (const auto& a : analyses) {
    std::vector<std::string> l;
    // Figures are named after the model directory; a suite run's model sits in RUN/model
    // (phasekv repro), so there the run's name is used.
    fs::path model = fs::path(model_name(a)).lexically_normal();
    if (model.filename().empty()) model = model.parent_path();
    if (model.filename() == "model" && model.has_parent_path()) model = model.parent_path();
    const std::string stem = model.filename().string();
    for (const auto& f : a.figures) {
      std::string name = stem + "-" + f;
      if (used[name]++ > 0) name = fmt::format("{}-{}-{}", stem, used[name] - 1, f);
      write_file_atomic((figures / name).string(), read_file((fs::path(a.dir) / f).string()));
      l.push_back(fs::relative(figures / name, base).generic_string());
    }
    links.push_back(l);
  }
  std::string notes;
  if (!o.notes.empty()) notes = read_file(o.notes);
  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  write_file_atomic(o.out, explanation_markdown(analyses, links, notes, o.command));
}

}  // namespace phasekv
