// An in-process `phasekv serve` for the HTTP tests (test_http.cpp, test_chat.cpp,
// test_serve_sentencepiece.cpp): a tiny random kv model (or a directory the test writes) on a
// random loopback port, and small helpers to post JSON and check error bodies.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/local_backend.h"
#include "io/tokenizer.h"
#include "model/model_dir.h"
#include "server/server.h"
#include "test_util.h"

namespace phasekv::test {

// A phasekv server on a random loopback port, serving a tiny random model, for one test suite.
class Served {
 public:
  // `fill` (if given) writes the model directory instead of the tiny kv model and its task (its
  // task.json, when it writes one, is served).
  explicit Served(ServerOptions o = {}, int max_context = 40,
                  const std::function<void(const std::string& dir)>& fill = nullptr)
      : dir_(temp_dir("served_" + std::to_string(max_context))) {
    model_dir_ = (dir_ / "tiny").string();
    std::optional<TaskConfig> task;
    if (fill) {
      fill(model_dir_);
      if (std::filesystem::exists(std::filesystem::path(model_dir_) / "task.json"))
        task = load_task_config(model_dir_);  // served as `phasekv serve` would
    } else {
      Decoder model = make_model(small_kv_model_config(max_context), 11);
      save_model_dir(model_dir_, model);
      save_task_files(model_dir_, small_kv_task());
      task = load_task_config(model_dir_);
    }
    local_ = std::make_unique<LocalBackend>(LocalBackend::from_dir(model_dir_, 2));
    o.port = 0;
    o.threads = 24;
    server_ =
        std::make_unique<CompletionServer>(*local_, load_tokenizer_if_present(model_dir_), task, o);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->serve(); });
    while (!server_->running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~Served() {
    server_->stop();
    thread_.join();
    std::filesystem::remove_all(dir_);
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  LocalBackend& local() { return *local_; }
  const std::string& name() const { return server_->served_name(); }
  int port() const { return port_; }
  const std::string& model_dir() const { return model_dir_; }
  CompletionServer& server() { return *server_; }

 private:
  std::filesystem::path dir_;
  std::string model_dir_;
  std::unique_ptr<LocalBackend> local_;
  std::unique_ptr<CompletionServer> server_;
  std::thread thread_;
  int port_ = 0;
};

struct Reply {
  int status = 0;
  nlohmann::json body;
};

inline Reply post(int port, const std::string& path, const std::string& body) {
  httplib::Client c("127.0.0.1", port);
  auto res = c.Post(path.c_str(), body, "application/json");
  if (!res) return {};
  Reply r;
  r.status = res->status;
  r.body = res->body.empty() ? nlohmann::json() : nlohmann::json::parse(res->body, nullptr, false);
  return r;
}

// The data lines of a server-sent-event body, in order.
inline std::vector<std::string> events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  return out;
}

// The raw body of a 200 answer ("" otherwise): a stream's events.
inline std::string post_raw(int port, const std::string& path, const nlohmann::json& body) {
  httplib::Client c("127.0.0.1", port);
  auto res = c.Post(path.c_str(), body.dump(), "application/json");
  return res && res->status == 200 ? res->body : "";
}

inline void expect_error(const Reply& r, int status, const std::string& param,
                         const std::string& part) {
  EXPECT_EQ(r.status, status) << r.body.dump();
  ASSERT_TRUE(r.body.is_object() && r.body.contains("error")) << r.body.dump();
  const nlohmann::json& e = r.body["error"];
  EXPECT_EQ(e["code"], status);
  EXPECT_TRUE(e["type"].is_string());
  if (!param.empty()) {
    EXPECT_EQ(e["param"], param) << e.dump();
  }
  EXPECT_CONTAINS(e["message"].get<std::string>(), part);
}

}  // namespace phasekv::test
