// --log-samples N: what a server was really sent, for a reader who doubts the prompts. Up to N
// items spread evenly over the (example, phase) grid, each with its prompt as the server
// detokenizes it and, once scored, its record, in OUT/samples.jsonl (replaced on every run).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "audit/options.h"
#include "backend/http_client.h"
#include "eval/runner.h"

namespace phasekv {

// The prompts' token ids of the chosen (example, phase) items.
using SamplePrompts =
    std::function<std::vector<std::vector<int32_t>>(const std::vector<std::pair<int64_t, int>>&)>;

// Writes nothing when a.log_samples is 0. `condition`: the records' condition of the items.
void write_samples(const AuditOptions& a, HttpBackend& http, const RunResult& run,
                   const std::string& condition, const SamplePrompts& prompts);

}  // namespace phasekv
