// Internal errors: thrown inside the library, turned into (status, message) at the C API boundary.
#pragma once

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

}  // namespace spot
