// Runs the PyTorch-Python reference (bench/torch_reference.py) as a child process, so that
// `phasekv bench train` times phasekv and PyTorch side by side in one run on the same machine.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace phasekv {

struct TorchReference {
  std::string python = "/usr/bin/python3";  // Debian's python3 with python3-torch
  std::string script = "bench/torch_reference.py";
};

// `python script args...`; returns the JSON object on the last line of its stdout. Throws Error
// with the command line if it fails or prints no JSON.
nlohmann::json run_torch_reference(const TorchReference& ref, const std::string& args);

}  // namespace phasekv
