// A model directory's task.json: the TaskConfig a trained model was trained on, so that sweeps,
// audits and the server pose the same task (task_config_to_json, strict parsing on load).
#pragma once
#include <string>

#include "task/tasks.h"

namespace phasekv {

// Validates the config first (a bad config writes nothing), creates DIR if missing and writes
// DIR/task.json atomically.
void save_task_config(const std::string& dir, const TaskConfig& task);
// Reads DIR/task.json; throws phasekv::Error when it is missing or invalid, naming the file.
TaskConfig load_task_config(const std::string& dir);

}  // namespace phasekv
