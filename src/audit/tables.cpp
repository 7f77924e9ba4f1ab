#include "audit/tables.h"

#include <fmt/format.h>

#include <map>

namespace phasekv {

using json = nlohmann::json;

namespace {

// The phase summary of a set of outcomes as audit.json's "cells" and "needles" rows give it.
json summary_row(const PhaseSummary& s, int64_t outcomes, int64_t errors) {
  return {{"outcomes", outcomes},
          {"errors", errors},
          {"mean_acc", s.mean_acc},
          {"worst_phase", s.worst_phase},
          {"worst_acc", s.worst_acc},
          {"best_phase", s.best_phase},
          {"gap_pp", s.gap_pp},
          {"detected_period", s.period.detected > 0 ? json(s.period.detected) : json(nullptr)},
          {"period_p_value", s.period.p_value}};
}

}  // namespace

json cell_json(const DocCell& c, const std::string& depth_condition, const PhaseSummary& s,
               const Tally& t, const RunResult& run) {
  double depth = 0;
  int64_t n = 0;
  for (const auto& [key, r] : run.latest)
    if (r.condition == depth_condition && r.extra.contains("depth_measured")) {
      depth += r.extra["depth_measured"].get<double>();
      ++n;
    }
  json row = {
      {"condition", c.condition},
      {"context_len", c.context_tokens},
      {"depth_pct", c.depth_pct < 0 ? json(nullptr) : json(c.depth_pct)},
      {"depth_measured_pct", n > 0 ? json(100.0 * depth / static_cast<double>(n)) : json(nullptr)}};
  row.update(summary_row(s, static_cast<int64_t>(t.outcomes.size()), t.errors));
  return row;
}

std::string grid_text(const json& cells) {
  std::string t = "depth x length (worst phase: accuracy, gap pp):\n";
  for (const auto& c : cells)
    t +=
        fmt::format("  {:>7} tokens  depth {:>6}  worst r={:<3} {:.3f}  gap {:5.1f}  mean {:.3f}\n",
                    c["context_len"].get<int>(),
                    c["depth_pct"].is_null() ? std::string("random")
                                             : fmt::format("{}%", c["depth_pct"].get<double>()),
                    c["worst_phase"].get<int>(), c["worst_acc"].get<double>(),
                    c["gap_pp"].get<double>(), c["mean_acc"].get<double>());
  return t;
}

json length_rows(const std::vector<DocCell>& cells, const std::vector<Tally>& tallies, int examples,
                 int modulus, int stride, const SummaryOptions& stats) {
  std::map<int64_t, Tally> by_length;
  for (size_t i = 0; i < cells.size(); ++i)
    for (PhaseOutcome o : tallies[i].outcomes) {
      o.example_id += static_cast<int64_t>(i) * examples;
      by_length[cells[i].context_tokens].outcomes.push_back(o);
    }
  json rows = json::array();
  for (const auto& [length, t] : by_length) {
    const PhaseSummary s = summarize(t.outcomes, modulus, stride, stats);
    json acc = json::array(), n = json::array();
    for (const auto& p : s.phases) {
      acc.push_back(p.acc);
      n.push_back(p.n);
    }
    rows.push_back({{"context_len", length},
                    {"phase_acc", acc},
                    {"phase_n", n},
                    {"mean_acc", s.mean_acc},
                    {"worst_phase", s.worst_phase},
                    {"worst_acc", s.worst_acc},
                    {"gap_pp", s.gap_pp}});
  }
  return rows;
}

std::string length_text(const json& rows) {
  if (rows.empty()) return "";
  std::string t = "per-phase accuracy by context length (all depths pooled):\n   tokens ";
  for (size_t r = 0; r < rows.front()["phase_acc"].size(); ++r) t += fmt::format(" r={:<3}", r);
  t += "\n";
  for (const auto& row : rows) {
    t += fmt::format("  {:>7} ", row["context_len"].get<int64_t>());
    for (const auto& acc : row["phase_acc"]) t += fmt::format(" {:5.3f}", acc.get<double>());
    t += "\n";
  }
  return t;
}

std::string needle_condition(const std::string& cell, int needle, int needles) {
  if (needles == 1) return cell;
  return (cell.empty() ? "" : cell + "_") + "n" + std::to_string(needle);
}

json needle_rows(const std::vector<std::vector<std::string>>& cell_conditions, const RunResult& run,
                 int examples, int modulus, int stride, const SummaryOptions& stats) {
  json rows = json::array();
  const size_t needles = cell_conditions.front().size();
  for (size_t n = 0; n < needles; ++n) {
    std::vector<PhaseOutcome> outcomes;
    int64_t errors = 0;
    for (size_t i = 0; i < cell_conditions.size(); ++i) {
      const Tally t = tally(run, cell_conditions[i][n], modulus);
      errors += t.errors;
      for (PhaseOutcome o : t.outcomes) {
        o.example_id += static_cast<int64_t>(i) * examples;
        outcomes.push_back(o);
      }
    }
    json row = {{"needle", n}};
    row.update(summary_row(summarize(outcomes, modulus, stride, stats),
                           static_cast<int64_t>(outcomes.size()), errors));
    rows.push_back(row);
  }
  return rows;
}

std::string needle_text(const json& rows) {
  std::string t = "per needle (each scored by its own question; all cells pooled):\n";
  for (const auto& r : rows)
    t += fmt::format(
        "  needle {:<2}  mean {:.3f}  worst r={:<3} {:.3f}  gap {:5.1f}  period {}\n",
        r["needle"].get<int>(), r["mean_acc"].get<double>(), r["worst_phase"].get<int>(),
        r["worst_acc"].get<double>(), r["gap_pp"].get<double>(),
        r["detected_period"].is_null() ? std::string("none")
                                       : std::to_string(r["detected_period"].get<int>()));
  return t;
}

}  // namespace phasekv
