// Internal errors: thrown inside the library, turned into (status, message) at the C API boundary.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "spot/spot.h"

namespace spot {

class SpotException : public std::runtime_error {
 public:
  SpotException(spot_status code, const std::string& message) : std::runtime_error(message), code_(code) {}
  spot_status code() const { return code_; }

 private:
  spot_status code_;
};

[[noreturn]] inline void fail(spot_status code, const std::string& message) { throw SpotException(code, message); }

// A double in a message as Python's repr writes it: the shortest of %.15g .. %.17g that reads back exactly
// (std::to_string's six fixed places printed -1e-9 as "-0.000000" and 1.0000001 as "1.000000")
inline std::string number_text(double v) {
  char buf[32];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace spot
