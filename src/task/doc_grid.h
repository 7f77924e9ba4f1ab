// The long-document grid of a text audit (`phasekv audit --context-tokens LIST --depths LIST`):
// every document length crossed with every depth of the target record, each cell audited at
// every phase, as needle-in-a-haystack harnesses sweep context length x needle depth.
#pragma once
#include <string>
#include <vector>

namespace phasekv {

struct DocCell {
  int context_tokens = 0;
  double depth_pct = -1;  // 0..100; negative: the records at random places (no depth asked)
  std::string condition;  // the records' condition: "" for a single cell, else "L<len>_d<depth>"
};

// "512" or "1024,4096,16384": token counts >= 16, each once; throws phasekv::Error naming `flag`.
std::vector<int> parse_token_list(const std::string& text, const std::string& flag);
// Depths in percent of the document: "0,25,50,75,100", or "linear:N" (N evenly spaced from 0 to
// 100) or "sigmoid:N" (N points of a logistic curve 100 / (1 + exp(-0.1 (x - 50))) at x evenly
// spaced from 0 to 100, ends kept at 0 and 100, so depths crowd near the document's start and
// end, as NIAH's sigmoid spacing does); rounded to 0.1 %. "" = no depth. Throws naming `flag`.
std::vector<double> parse_depths(const std::string& text, const std::string& flag);
// lengths x depths in that order (an empty depth list: one cell per length, random placement).
std::vector<DocCell> doc_grid(const std::vector<int>& lengths, const std::vector<double>& depths);

}  // namespace phasekv
