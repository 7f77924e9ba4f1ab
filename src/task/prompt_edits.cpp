#include "task/prompt_edits.h"

#include <string>

#include "task/task_detail.h"
#include "util/error.h"

namespace phasekv {

std::vector<int32_t> shifted_context(const LogicalExample& lg, const std::vector<int32_t>& tokens,
                                     int n) {
  if (n < 0) throw Error("shifted_context: shift " + std::to_string(n) + " (allowed: >= 0)");
  if (tokens.empty() || tokens.front() != TaskVocab::kBos)
    throw Error("shifted_context: the context does not start with <bos>");
  const std::vector<int32_t> fill =
      task_detail::padding_fillers(lg, task_detail::kPadShiftStream, n);
  std::vector<int32_t> out;
  out.reserve(tokens.size() + static_cast<size_t>(n));
  out.push_back(TaskVocab::kBos);
  out.insert(out.end(), fill.begin(), fill.end());
  out.insert(out.end(), tokens.begin() + 1, tokens.end());
  return out;
}

TaskExample with_recent_copy(TaskExample ex) {
  if (ex.kind != TaskKind::kLookup)
    throw Error("recent copy: the task is " + to_string(ex.kind) +
                " (allowed: lookup, whose context ends at the target key)");
  TaskQuery& target = ex.queries.back();
  const TaskRecord& record = ex.records.at(static_cast<size_t>(target.record));
  if (ex.with_answer || target.query_pos + 1 != static_cast<int>(ex.tokens.size()) ||
      ex.tokens.back() != record.key)
    throw Error("recent copy: the context does not end at the target key");
  ex.tokens.insert(ex.tokens.end() - 1, {record.key, record.value});
  target.query_pos += 2;
  return ex;
}

}  // namespace phasekv
