#include "json.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "errors.h"

namespace spot {

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}

  Json parse_document() {
    Json v = value(0);
    skip_ws();
    if (i_ != s_.size()) error("trailing characters after the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 256;   // deeper nesting is refused rather than overflowing the stack
  const std::string& s_;
  size_t i_ = 0;

  [[noreturn]] void error(const std::string& what) const {
    fail(SPOT_ERR_CORRUPT, "invalid JSON at byte " + std::to_string(i_) + ": " + what);
  }

  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }

  bool consume(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(i_, n, word) == 0) {
      i_ += n;
      return true;
    }
    return false;
  }

  Json value(int depth) {
    if (depth > kMaxDepth) error("nesting deeper than 256");
    skip_ws();
    if (i_ >= s_.size()) error("unexpected end of input");
    Json v;
    char c = s_[i_];
    if (c == '{') {
      v.kind_ = Json::Kind::Object;
      ++i_;
      skip_ws();
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return v;
      }
      while (true) {
        skip_ws();
        if (i_ >= s_.size() || s_[i_] != '"') error("expected a string key");
        std::string key = string_literal();
        skip_ws();
        if (i_ >= s_.size() || s_[i_] != ':') error("expected ':'");
        ++i_;
        v.obj_.emplace_back(std::move(key), value(depth + 1));
        skip_ws();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == '}') {
          ++i_;
          return v;
        }
        error("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.kind_ = Json::Kind::Array;
      ++i_;
      skip_ws();
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return v;
      }
      while (true) {
        v.arr_.push_back(value(depth + 1));
        skip_ws();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == ']') {
          ++i_;
          return v;
        }
        error("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.kind_ = Json::Kind::String;
      v.str_ = string_literal();
      return v;
    }
    if (consume("true")) {
      v.kind_ = Json::Kind::Bool;
      v.bool_ = true;
      return v;
    }
    if (consume("false")) {
      v.kind_ = Json::Kind::Bool;
      return v;
    }
    if (consume("null")) return v;
    // Python's json writes NaN / Infinity / -Infinity for non-finite floats
    if (consume("NaN")) return number_value(std::nan(""), false, 0);
    if (consume("Infinity")) return number_value(HUGE_VAL, false, 0);
    if (consume("-Infinity")) return number_value(-HUGE_VAL, false, 0);
    return number();
  }

  static Json number_value(double d, bool is_int, int64_t n) {
    Json v;
    v.kind_ = Json::Kind::Number;
    v.num_ = d;
    v.num_is_int_ = is_int;
    v.int_ = n;
    return v;
  }

  Json number() {
    size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    if (i_ >= s_.size() || !isdigit(static_cast<unsigned char>(s_[i_]))) error("unexpected character");
    bool is_int = true;
    while (i_ < s_.size() && isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (i_ < s_.size() && s_[i_] == '.') {
      is_int = false;
      ++i_;
      while (i_ < s_.size() && isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      is_int = false;
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      while (i_ < s_.size() && isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    std::string text = s_.substr(start, i_ - start);
    // strtod is correctly rounded in glibc: the same double Python's json module reads
    double d = std::strtod(text.c_str(), nullptr);
    int64_t n = 0;
    if (is_int) {
      errno = 0;
      long long ll = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) is_int = false;
      n = ll;
    }
    return number_value(d, is_int, n);
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t hex4() {
    if (i_ + 4 > s_.size()) error("truncated \\u escape");
    uint32_t cp = 0;
    for (int k = 0; k < 4; ++k) {
      char h = s_[i_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') cp |= h - '0';
      else if (h >= 'a' && h <= 'f') cp |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') cp |= h - 'A' + 10;
      else error("bad \\u escape");
    }
    return cp;
  }

  std::string string_literal() {
    ++i_;  // opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size()) error("unterminated string");
      char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) error("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) error("unterminated escape");
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && i_ + 6 <= s_.size() && s_[i_] == '\\' && s_[i_ + 1] == 'u') {
            i_ += 2;
            uint32_t lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else error("bad surrogate pair");
          }
          // a NUL would cut the string wherever it reaches C (file names, messages): no manifest needs one
          if (cp == 0) error("NUL (\\u0000) in a string");
          append_utf8(out, cp);
          break;
        }
        default: error("unknown escape");
      }
    }
  }
};

Json Json::parse(const std::string& text) { return JsonParser(text).parse_document(); }

bool Json::has(const std::string& key) const { return find(key) != nullptr; }

const Json* Json::find(const std::string& key) const {
  if (kind_ != Kind::Object) return nullptr;
  for (const auto& kv : obj_)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

const Json& Json::at(const std::string& key) const {
  const Json* v = find(key);
  if (v == nullptr) fail(SPOT_ERR_CORRUPT, "lacks field '" + key + "'");
  return *v;
}

const std::vector<Json>& Json::items() const {
  if (kind_ != Kind::Array) fail(SPOT_ERR_CORRUPT, "expected a JSON array");
  return arr_;
}

const std::vector<std::pair<std::string, Json>>& Json::members() const {
  if (kind_ != Kind::Object) fail(SPOT_ERR_CORRUPT, "expected a JSON object");
  return obj_;
}

double Json::number() const {
  if (kind_ != Kind::Number) fail(SPOT_ERR_CORRUPT, "expected a number");
  return num_;
}

int64_t Json::integer() const {
  if (kind_ != Kind::Number) fail(SPOT_ERR_CORRUPT, "expected an integer");
  if (num_is_int_) return int_;
  if (std::isfinite(num_) && std::floor(num_) == num_ && std::fabs(num_) < 9.0e15) return static_cast<int64_t>(num_);
  fail(SPOT_ERR_CORRUPT, "expected an integer");
}

bool Json::boolean() const {
  if (kind_ != Kind::Bool) fail(SPOT_ERR_CORRUPT, "expected true or false");
  return bool_;
}

const std::string& Json::str() const {
  if (kind_ != Kind::String) fail(SPOT_ERR_CORRUPT, "expected a string");
  return str_;
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(SPOT_ERR_NOT_FOUND, "cannot read " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace spot
