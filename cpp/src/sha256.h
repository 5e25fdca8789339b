// SHA-256 (FIPS 180-4) for the manifest checks: full file hashes and spot's sampled hash of large files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace spot {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hexdigest();   // finalises; call once

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_file(const std::string& path);          // full sha256, hex
std::string sample_sha256_file(const std::string& path);   // spot.export.manifest.sample_sha256, hex

}  // namespace spot
