// Filesystem helpers shared by the manifest reader, the drafter loader and the C API (POSIX stat, '/' paths).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <utility>

namespace spot {

inline bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// A regular file; its size in *size when given.
inline bool is_file(const std::string& p, uint64_t* size = nullptr) {
  struct stat st;
  if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (size) *size = static_cast<uint64_t>(st.st_size);
  return true;
}

// What a folder path names now (device, inode; 0, 0 when absent): a folder replaced by rename, or a link
// re-pointed, names another one.
inline std::pair<uint64_t, uint64_t> folder_identity(const std::string& p) {
  struct stat st;
  if (::stat(p.c_str(), &st) != 0) return {0, 0};
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

inline std::string join(const std::string& a, const std::string& b) {
  return (!a.empty() && a.back() == '/') ? a + b : a + "/" + b;
}

inline std::string parent_dir(const std::string& p) {
  size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

}  // namespace spot
