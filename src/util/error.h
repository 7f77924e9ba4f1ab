// One exception type for every user-facing failure. Messages name the file, key, line or endpoint
// and what is allowed; the CLI prints them and exits non-zero.
#pragma once
#include <stdexcept>
#include <string>

namespace phasekv {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace phasekv
