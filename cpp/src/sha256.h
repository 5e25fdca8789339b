// SHA-256 for the manifest checks (OpenSSL's libcrypto): full file hashes and spot's sampled hash of large files.
#pragma once

#include <string>

namespace spot {

std::string sha256_file(const std::string& path);          // full sha256, hex
std::string sample_sha256_file(const std::string& path);   // spot.folder.manifest.sample_sha256, hex

}  // namespace spot
