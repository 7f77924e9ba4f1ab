#include "suite/runner.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>

#include "suite/commands.h"
#include "util/cpu_info.h"
#include "util/duration.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string run_dir(const SuiteOptions& o, const SuiteRun& r) {
  return (fs::path(o.out_dir) / r.name).string();
}

std::string depth_label(double d) {
  std::string s = fmt::format("{:g}", d);
  return "depth-" + s;
}

// Starts argv with stdout and stderr appended to `log`; returns the child's pid. The child gets
// SIGTERM when this process dies (even by SIGKILL), so a killed `repro` leaves no training or
// sweep running on behind it, writing into the run directory that its rerun resumes. Called from
// the scheduling thread, which lives as long as the suite (the signal follows the forking thread).
pid_t spawn(const std::vector<std::string>& argv, const std::string& log) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw Error("fork failed: cannot start " + argv.front());
  if (pid == 0) {
    // If the parent died between fork and prctl, no signal would ever come: stop here.
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(125);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// One run's progress through its steps, on one job slot.
struct Job {
  const SuiteRun* run = nullptr;
  std::vector<SuiteStep> steps;
  size_t next = 0;
  pid_t pid = -1;
  std::chrono::steady_clock::time_point started;
  bool failed = false;
};

void write_run_config(const SuiteRun& r, const SuiteOptions& o) {
  const std::string dir = run_dir(o, r), path = dir + "/config.json";
  const std::string text = r.config.dump(2) + "\n";
  if (fs::exists(path) && read_json_file(path) != r.config)
    throw Error(path + " holds another config than run '" + r.name +
                "' of the suite now resolves to (the suite or its base changed): use another "
                "--out, or move " + dir + " away");
  if (!fs::exists(path)) write_file_atomic(path, text);
}

// run.done: every step of the run finished (what scripts/keep-runs.sh keeps), with the CPU and
// the wall time of the invocation that finished it (null when an earlier one did).
void write_run_done(const SuiteOptions& o, const SuiteRun& r, std::optional<double> wall_s) {
  const nlohmann::json j = {{"cpu", cpu_description()},
                            {"jobs", o.jobs},
                            {"wall_s", wall_s ? nlohmann::json(*wall_s) : nlohmann::json()}};
  write_file_atomic(run_done_path(o, r), j.dump() + "\n");
}

}  // namespace

std::string run_done_path(const SuiteOptions& o, const SuiteRun& r) {
  return run_dir(o, r) + "/run.done";
}

std::vector<SuiteStep> run_steps(const Suite& s, const SuiteRun& r, const SuiteOptions& o) {
  const std::string dir = run_dir(o, r), model = dir + "/model";
  std::vector<SuiteStep> steps;
  const TrainCommand train{.binary = o.binary,
                           .config = dir + "/config.json",
                           .out = model,
                           .resume = fs::exists(model + "/checkpoint")};
  steps.push_back({"train", train_argv(train), dir + "/train.done", dir + "/train.log"});
  auto sweep = [&](const std::string& label, const std::string& padding,
                   std::optional<double> depth) {
    const std::string out = dir + "/" + label;
    const SweepCommand c{.binary = o.binary,
                         .model = model,
                         .task = r.config["task"].value("name", "kv"),
                         .examples = s.examples,
                         .modulus = s.modulus,
                         .padding = padding,
                         .seed = s.seed,
                         .threads = 1,
                         .out = out,
                         .target_depth = depth};
    steps.push_back({label, sweep_argv(c), out + "/summary.json", dir + "/" + label + ".log"});
  };
  for (const auto& p : s.paddings) sweep("sweep-" + p, p, std::nullopt);
  if (r.depth_grid)
    for (double d : s.depths) sweep(depth_label(d), "prefix", d);
  return steps;
}

std::vector<const SuiteRun*> selected_runs(const Suite& s, const std::vector<std::string>& only) {
  for (const auto& name : only) {
    bool found = false;
    for (const auto& r : s.runs) found = found || r.name == name;
    if (!found) throw Error("--only " + name + ": the suite " + s.path + " has no such run");
  }
  std::vector<const SuiteRun*> runs;
  for (const auto& r : s.runs)
    if (only.empty() || std::find(only.begin(), only.end(), r.name) != only.end())
      runs.push_back(&r);
  return runs;
}

std::vector<std::string> suite_commands(const Suite& s, const SuiteOptions& o) {
  std::vector<std::string> out;
  for (const auto& r : s.runs)
    out.push_back(shell_command(
        {o.binary, "repro", "--suite", s.path, "--out", o.out_dir, "--only", r.name}));
  return out;
}

int run_suite(const Suite& s, const SuiteOptions& o) {
  if (o.jobs < 1 || o.jobs > 256)
    throw Error("--jobs is " + std::to_string(o.jobs) + " (allowed: 1..256)");
  const std::vector<const SuiteRun*> todo = selected_runs(s, o.only);
  fs::create_directories(o.out_dir);
  json suite_json = {{"name", s.name},     {"path", s.path},         {"modulus", s.modulus},
                     {"examples", s.examples}, {"seed", s.seed},     {"paddings", s.paddings},
                     {"depths", s.depths}, {"runs", json::array()}};
  for (const auto& r : s.runs) {
    json jr = {{"name", r.name}, {"config", r.config}, {"depth_grid", r.depth_grid}};
    if (r.study) {
      const StudyRow& st = *r.study;
      jr["study"] = {{"label", st.label}};
      if (st.val_loss) jr["study"]["val_loss"] = *st.val_loss;
      if (st.mean) jr["study"]["mean"] = *st.mean;
      if (st.worst) jr["study"]["worst"] = *st.worst;
      if (st.gap) jr["study"]["gap"] = *st.gap;
    }
    suite_json["runs"].push_back(jr);
  }
  write_file_atomic(o.out_dir + "/suite.json", suite_json.dump(2) + "\n");
  for (const auto* r : todo) {
    fs::create_directories(run_dir(o, *r));
    write_run_config(*r, o);
  }

  std::deque<Job> queue;
  for (const auto* r : todo) {
    Job j;
    j.run = r;
    j.steps = run_steps(s, *r, o);
    while (j.next < j.steps.size() && fs::exists(j.steps[j.next].done_marker)) ++j.next;
    if (j.next < j.steps.size())
      queue.push_back(std::move(j));
    else if (!fs::exists(run_done_path(o, *r)))  // finished by a build before run.done existed
      write_run_done(o, *r, std::nullopt);
  }
  const size_t total_runs = queue.size();
  if (o.progress)
    *o.progress << fmt::format("repro {}: {} of {} runs to do, {} at a time -> {}\n", s.name,
                               total_runs, todo.size(), o.jobs, o.out_dir);
  std::map<pid_t, Job> running;
  int failed = 0;
  size_t finished = 0;
  double run_secs_sum = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto start_next_step = [&](Job& j) {
    SuiteStep& st = j.steps[j.next];
    // A train step decides --resume when it starts, not when it was planned.
    if (st.label == "train" && fs::exists(run_dir(o, *j.run) + "/model/checkpoint") &&
        std::find(st.argv.begin(), st.argv.end(), "--resume") == st.argv.end())
      st.argv.push_back("--resume");
    if (o.progress) *o.progress << fmt::format("  {}: {} ...\n", j.run->name, st.label);
    j.pid = spawn(st.argv, st.log);
  };
  while (!queue.empty() || !running.empty()) {
    while (!queue.empty() && static_cast<int>(running.size()) < o.jobs) {
      Job j = std::move(queue.front());
      queue.pop_front();
      j.started = std::chrono::steady_clock::now();
      start_next_step(j);
      running.emplace(j.pid, std::move(j));
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;
    auto it = running.find(pid);
    if (it == running.end()) continue;
    Job j = std::move(it->second);
    running.erase(it);
    SuiteStep& st = j.steps[j.next];
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok && st.label == "train") write_file_atomic(st.done_marker, "done\n");
    if (!ok) {
      ++failed;
      ++finished;
      if (o.progress)
        *o.progress << fmt::format("  {}: {} FAILED (see {})\n", j.run->name, st.label, st.log);
      continue;
    }
    if (++j.next < j.steps.size()) {
      start_next_step(j);
      running.emplace(j.pid, std::move(j));
      continue;
    }
    ++finished;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - j.started).count();
    write_run_done(o, *j.run, secs);
    run_secs_sum += secs;
    const double per_run = run_secs_sum / static_cast<double>(finished - failed);
    const double left =
        per_run * static_cast<double>(total_runs - finished) / static_cast<double>(o.jobs);
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.progress)
      *o.progress << fmt::format("repro: {} done in {} ({}/{} runs, {} elapsed, ETA {})\n",
                                 j.run->name, format_duration(secs), finished, total_runs,
                                 format_duration(elapsed), format_duration(left));
  }
  return failed;
}

}  // namespace phasekv
