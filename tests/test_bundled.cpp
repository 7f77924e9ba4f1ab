// The bundled models (models/, trained by scripts/train-bundled.sh from configs/train/) must show
// what the README's first command promises, here on a smaller sweep through the real CLI:
//  - the chunked model (S = 4) has a weak spot whose gap CI excludes 0, with detected period 4;
//  - the full-attention control retrieves (mean > shortcut + 0.5) and shows no significant period;
//  - `phasekv serve` + a blind `phasekv audit` (no stride given) find period 4 and predict exactly
//    what the in-process sweep predicts for the same examples.
// If these fail after retraining, the models or the method are wrong: do not tune the statistics.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>
#include <tuple>

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kBin = PHASEKV_BINARY;

std::string model(const std::string& name) {
  return std::string(PHASEKV_SOURCE_DIR) + "/models/" + name;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("phasekv_bundled_" + name + "_" +
                                            std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// Runs `phasekv sweep` and returns summary.json.
json sweep(const std::string& name, const fs::path& out, int examples) {
  const std::string cmd = kBin + " sweep --model " + model(name) +
                          " --task kv --modulus 8 --padding prefix --threads 2 --examples " +
                          std::to_string(examples) + " --out " + out.string() + " > " +
                          (out.string() + ".log") + " 2>&1";
  if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << cmd << "\n" << slurp(out.string() + ".log");
  return json::parse(slurp(out / "summary.json"));
}

// (example, phase) -> prediction, from a results.jsonl.
std::map<std::pair<int64_t, int>, int> predictions(const fs::path& results) {
  std::map<std::pair<int64_t, int>, int> out;
  std::ifstream in(results);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const json r = json::parse(line);
    out[{r["example_id"].get<int64_t>(), r["phase"].get<int>()}] =
        r["prediction"].is_null() ? -1 : r["prediction"].get<int>();
  }
  return out;
}

TEST(Bundled, ChunkedModelHasAPeriod4WeakSpot) {
  const fs::path dir = fresh_dir("chunked");
  const json s = sweep("kv-chunked", dir / "sweep", 150);
  EXPECT_GT(s["gap_ci_pp"][0].get<double>(), 0.0) << s["gap_ci_pp"];
  EXPECT_EQ(s["period"]["detected"].get<int>(), 4);
  EXPECT_LT(s["period"]["p_value"].get<double>(), 0.01);
  // The worst phase is a boundary phase (key at r mod 4 = 3: its value opens the next entry).
  EXPECT_EQ(s["worst_phase"].get<int>() % 4, 3);
  // Clearly above the no-retrieval shortcut, not saturated.
  const double mean = s["mean_acc"].get<double>();
  EXPECT_GT(mean, s["meta"]["shortcut_ceiling"].get<double>() + 0.2);
  EXPECT_LT(mean, 0.95);
  fs::remove_all(dir);
}

// The control must retrieve (well above the no-retrieval shortcut, 1/3) and be flat: otherwise the
// comparison with the chunked model means nothing. One sweep checks both.
TEST(Bundled, FullAttentionControlRetrievesAndHasNoSignificantPeriod) {
  const fs::path dir = fresh_dir("full");
  const json s = sweep("kv-full", dir / "sweep", 150);
  EXPECT_GT(s["mean_acc"].get<double>(), s["meta"]["shortcut_ceiling"].get<double>() + 0.5);
  EXPECT_GE(s["period"]["p_value"].get<double>(), 0.05);
  fs::remove_all(dir);
}

// `phasekv serve` as a child process on a free loopback port; SIGTERM on destruction.
class ServeProcess {
 public:
  ServeProcess(const std::string& model_dir, const fs::path& log) {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDERR_FILENO);
      execl(kBin.c_str(), kBin.c_str(), "serve", "--model", model_dir.c_str(), "--port", "0",
            "--torch-threads", "1", static_cast<char*>(nullptr));
      _exit(127);
    }
    const std::regex url("http://127\\.0\\.0\\.1:[0-9]+");
    for (int i = 0; i < 600 && endpoint_.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::smatch m;
      const std::string text = slurp(log);
      if (std::regex_search(text, m, url)) endpoint_ = m[0];
    }
  }
  ~ServeProcess() { stop(); }
  // SIGTERM, then the exit status (0 = graceful shutdown).
  int stop() {
    if (pid_ <= 0) return status_;
    kill(pid_, SIGTERM);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return status_;
  }
  const std::string& endpoint() const { return endpoint_; }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  std::string endpoint_;
};

TEST(Bundled, BlindAuditOfTheServedChunkedModelFindsPeriod4AndMatchesTheSweep) {
  const fs::path dir = fresh_dir("audit");
  const int examples = 60;
  sweep("kv-chunked", dir / "sweep", examples);

  ServeProcess server(model("kv-chunked"), dir / "serve.log");
  ASSERT_FALSE(server.endpoint().empty()) << slurp(dir / "serve.log");
  // The served name, as `phasekv serve` prints it (and GET /v1/models lists it).
  std::smatch m;
  const std::string log = slurp(dir / "serve.log");
  ASSERT_TRUE(std::regex_search(log, m, std::regex("model '([^']+)'"))) << log;
  const std::string name = m[1];
  const std::string cmd = kBin + " audit --endpoint " + server.endpoint() + " --model '" + name +
                          "' --modulus 8 --examples " + std::to_string(examples) +
                          " --concurrency 8 --out " + (dir / "audit").string() + " > " +
                          (dir / "audit.log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(dir / "audit.log");
  EXPECT_EQ(server.stop(), 0) << "phasekv serve did not stop cleanly on SIGTERM\n"
                              << slurp(dir / "serve.log");

  const json audit = json::parse(slurp(dir / "audit" / "audit.json"));
  EXPECT_TRUE(audit["stride_given"].is_null());
  EXPECT_EQ(audit["period"]["detected_period"].get<int>(), 4) << audit["period"];
  EXPECT_LT(audit["period"]["p_value"].get<double>(), 0.01);
  EXPECT_EQ(audit["records"]["errors"].get<int>(), 0);

  const auto local = predictions(dir / "sweep" / "results.jsonl");
  const auto served = predictions(dir / "audit" / "results.jsonl");
  ASSERT_EQ(local.size(), static_cast<size_t>(examples * 8));
  EXPECT_EQ(served, local);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace phasekv
