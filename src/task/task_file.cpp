#include "task/task_file.h"

#include <filesystem>

#include "util/error.h"
#include "util/fs.h"

namespace phasekv {

void save_task_config(const std::string& dir, const TaskConfig& task) {
  validate(task, "task config");
  std::filesystem::create_directories(dir);
  write_file_atomic(dir + "/task.json", task_config_to_json(task).dump(2) + "\n");
}

TaskConfig load_task_config(const std::string& dir) {
  const std::string path = dir + "/task.json";
  if (!std::filesystem::exists(path))
    throw Error("model directory " + dir +
                " has no task.json (the task config a trained model carries; models made by "
                "`phasekv init` have none)");
  return task_config_from_json(read_json_file(path), path);
}

}  // namespace phasekv
