// Shared by the libFuzzer targets of fuzz/ (docs/RELIABILITY.md). The oracle of every target is
// phasekv's error contract: bad input throws phasekv::Error (or the HTTP layer's ProtocolError)
// with a sentence naming the source. Any other exception (a nlohmann type_error, std::out_of_range,
// std::bad_alloc from a size nobody checked), a crash, a leak or undefined behaviour (the targets
// run under ASan + UBSan) is a finding: it aborts, and libFuzzer saves the input.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "backend/http_dialect.h"
#include "util/error.h"

namespace phasekv::fuzz {

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// Runs `f`; the expected errors are swallowed, anything else aborts with its message.
template <class F>
void expect_only_phasekv_errors(F&& f) {
  try {
    f();
  } catch (const Error&) {
  } catch (const ProtocolError&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz finding: unexpected %s\n", e.what());
    std::abort();
  }
}

// The file readers take paths: each process writes its input to one file of its own and reuses
// it (a fresh name per input would fill /tmp during an hours-long run).
inline std::string input_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("phasekv_fuzz_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace phasekv::fuzz
