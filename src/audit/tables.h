// The tables of a text audit with more than one cell or needle (--context-tokens LIST, --depths,
// --needles N): audit.json's "cells", "lengths" and "needles", and their printed lines. Each
// pools outcomes across cells as other clusters (a cell's examples are other documents), so the
// intervals stay honest about what was sampled.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/runner.h"
#include "eval/stats.h"
#include "task/doc_grid.h"

namespace phasekv {

// One cell of the long-document grid after the run: its phase summary, for audit.json and the
// depth x length table. The measured depth is read from `depth_condition`'s records: the cell's
// own, or with several needles needle 0's (the one placed at the depth).
nlohmann::json cell_json(const DocCell& c, const std::string& depth_condition,
                         const PhaseSummary& s, const Tally& t, const RunResult& run);

// The depth x length table: per cell the worst phase, its accuracy and the gap.
std::string grid_text(const nlohmann::json& cells);

// Per context length, the outcomes of all its depths pooled (each cell's examples are other
// documents: other clusters): the per-phase accuracy row of each length, for audit.json
// "lengths" and the printed per-phase table. `tallies` is cells' order.
nlohmann::json length_rows(const std::vector<DocCell>& cells, const std::vector<Tally>& tallies,
                           int examples, int modulus, int stride, const SummaryOptions& stats);

// The per-phase table per length: one row of accuracies over r = 0 .. M-1 per context length.
std::string length_text(const nlohmann::json& rows);

// The records' condition of needle n of a grid cell: the cell's own with one needle, else the
// cell's plus "n<needle>" ("n1", "L1024_d50_n1").
std::string needle_condition(const std::string& cell, int needle, int needles);

// Per needle, every grid cell pooled (a cell's examples are other documents: other clusters):
// audit.json "needles". `cell_conditions[i][n]` is cell i's condition of needle n.
nlohmann::json needle_rows(const std::vector<std::vector<std::string>>& cell_conditions,
                           const RunResult& run, int examples, int modulus, int stride,
                           const SummaryOptions& stats);

std::string needle_text(const nlohmann::json& rows);

}  // namespace phasekv
