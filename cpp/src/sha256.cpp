#include "sha256.h"

#include <openssl/evp.h>
#include <sys/types.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "errors.h"

namespace spot {
namespace {

// spot.folder.manifest: SAMPLE_COUNT chunks of SAMPLE_BYTES
constexpr int kSampleCount = 16;
constexpr uint64_t kSampleBytes = 64 * 1024;

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

File open_file(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) fail(SPOT_ERR_NOT_FOUND, "cannot open " + path);
  return f;
}

// One SHA-256 computation through libcrypto's EVP interface (its SHA-NI / ARMv8 crypto code where the CPU has it).
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1) failed("init");
  }
  void update(const void* data, size_t n) {
    if (EVP_DigestUpdate(ctx_.get(), data, n) != 1) failed("update");
  }
  std::string hexdigest() {   // finalises; call once
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), digest, &n) != 1) failed("final");
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < n; ++i) {
      out += hex[digest[i] >> 4];
      out += hex[digest[i] & 0xF];
    }
    return out;
  }

 private:
  [[noreturn]] static void failed(const char* step) {
    fail(SPOT_ERR_RUNTIME, std::string("OpenSSL SHA-256 ") + step + " failed");
  }
  struct Free {
    void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> ctx_;
};

}  // namespace

std::string sha256_file(const std::string& path) {
  File f = open_file(path);
  Sha256 h;
  std::vector<uint8_t> buf(4 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) h.update(buf.data(), n);
  if (std::ferror(f.get())) fail(SPOT_ERR_CORRUPT, "read error in " + path);
  return h.hexdigest();
}

std::string sample_sha256_file(const std::string& path) {
  File f = open_file(path);
  if (std::fseek(f.get(), 0, SEEK_END) != 0) fail(SPOT_ERR_CORRUPT, "cannot seek in " + path);
  uint64_t size = static_cast<uint64_t>(std::ftell(f.get()));
  Sha256 h;
  uint8_t size_le[8];
  for (int i = 0; i < 8; ++i) size_le[i] = uint8_t(size >> (8 * i));
  h.update(size_le, 8);
  uint64_t span = size > kSampleBytes ? size - kSampleBytes : 0;
  std::vector<uint8_t> buf(kSampleBytes);
  for (int i = 0; i < kSampleCount; ++i) {
    // Python: round(i * span / 15): a correctly rounded quotient, then round-half-even
    double q = static_cast<double>(static_cast<uint64_t>(i) * span) / double(kSampleCount - 1);
    uint64_t off = static_cast<uint64_t>(std::nearbyint(q));
    if (fseeko(f.get(), static_cast<off_t>(off), SEEK_SET) != 0) fail(SPOT_ERR_CORRUPT, "cannot seek in " + path);
    size_t n = std::fread(buf.data(), 1, buf.size(), f.get());
    h.update(buf.data(), n);
  }
  return h.hexdigest();
}

}  // namespace spot
