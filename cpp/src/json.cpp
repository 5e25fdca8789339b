#include "json.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "bounds.h"
#include "errors.h"

namespace spot {
namespace {

// (the readers say "<file> is not valid JSON (<what>)", as spot.descriptors.parse_json does)
[[noreturn]] void invalid(const std::string& what) { fail(SPOT_ERR_CORRUPT, what); }

bool delimits(const std::string& text, size_t i) {   // a value may end / begin next to position i
  return i >= text.size() || std::strchr(" \t\n\r,:[]{}", text[i]) != nullptr;
}

// Python's json module writes NaN, Infinity and -Infinity for non-finite floats (drafter.json's accuracy over an
// empty selection is NaN); RFC 8259, and nlohmann/json, have no such literals. Outside strings each one standing
// alone is replaced by a number of the same length (byte offsets in messages stay the file's), and `nonfinite`
// records its value under the number's ordinal among the document's numbers, for the reader to put back.
std::string with_python_literals_replaced(const std::string& text, std::map<size_t, double>& nonfinite) {
  struct Literal {
    const char* text;
    const char* stand_in;
    double value;
  };
  static const Literal kLiterals[] = {{"NaN", "0.0", std::numeric_limits<double>::quiet_NaN()},
                                      {"Infinity", "0.000000", HUGE_VAL},
                                      {"-Infinity", "-0.000000", -HUGE_VAL}};
  std::string out = text;
  size_t numbers = 0;
  for (size_t i = 0; i < out.size();) {
    if (out[i] == '"') {   // a string: skipped whole, escaped characters included
      for (++i; i < out.size() && out[i] != '"'; ++i)
        if (out[i] == '\\') ++i;
      ++i;
      continue;
    }
    const Literal* found = nullptr;
    for (const Literal& l : kLiterals) {
      const size_t n = std::strlen(l.text);
      if (out.compare(i, n, l.text) == 0 && (i == 0 || delimits(out, i - 1)) && delimits(out, i + n)) found = &l;
    }
    if (found != nullptr) {
      const size_t n = std::strlen(found->text);
      out.replace(i, n, found->stand_in);
      nonfinite[numbers++] = found->value;
      i += n;
    } else if (out[i] == '-' || (out[i] >= '0' && out[i] <= '9')) {   // a number token: counted, skipped
      ++numbers;
      while (i < out.size() && out[i] != '\0' && std::strchr("+-.eE0123456789", out[i]) != nullptr) ++i;
    } else {
      ++i;
    }
  }
  return out;
}

}  // namespace

// nlohmann/json's SAX events -> a Json tree (objects keep their key order; the first of duplicate keys is found)
class JsonParser {
 public:

  explicit JsonParser(std::map<size_t, double> nonfinite) : nonfinite_(std::move(nonfinite)) {}

  Json take() { return std::move(root_); }

  bool null() { return put(Json()); }
  bool boolean(bool b) {
    Json v;
    v.kind_ = Json::Kind::Bool;
    v.bool_ = b;
    return put(std::move(v));
  }
  bool number_integer(int64_t n) { return number(static_cast<double>(n), true, n); }
  bool number_unsigned(uint64_t n) {
    const bool fits = n <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    return number(static_cast<double>(n), fits, fits ? static_cast<int64_t>(n) : 0);
  }
  bool number_float(double d, const std::string& /*text*/) { return number(d, false, 0); }
  bool string(std::string& s) {
    refuse_nul(s);
    Json v;
    v.kind_ = Json::Kind::String;
    v.str_ = std::move(s);
    return put(std::move(v));
  }
  template <class Binary>
  bool binary(Binary& /*bytes*/) {   // only binary formats (CBOR, ...) produce these
    invalid("binary value");
  }
  bool start_object(size_t /*elements*/) { return open(Json::Kind::Object); }
  bool key(std::string& k) {
    refuse_nul(k);
    // Python's json module keeps the last of duplicate keys, this reader the first: neither is read
    if (!seen_.back().insert(k).second) invalid("duplicate key '" + k.substr(0, 60) + "'");
    keys_.back() = std::move(k);
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(size_t /*elements*/) { return open(Json::Kind::Array); }
  bool end_array() { return close(); }
  template <class Exception>
  bool parse_error(size_t byte, const std::string& /*last_token*/, const Exception& e) {
    std::string what = e.what();   // "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
    const size_t tag = what.find("] ");
    fail(SPOT_ERR_CORRUPT, "at byte " + std::to_string(byte) + ": " +
                               (tag == std::string::npos ? what : what.substr(tag + 2)));
  }

 private:
  // a NUL would cut the string wherever it reaches C (file names, messages): no manifest needs one
  static void refuse_nul(const std::string& s) {
    if (s.find('\0') != std::string::npos) invalid("NUL (\\u0000) in a string");
  }

  bool number(double d, bool is_int, int64_t n) {
    auto it = nonfinite_.find(numbers_++);
    Json v;
    v.kind_ = Json::Kind::Number;
    v.num_ = it == nonfinite_.end() ? d : it->second;
    v.num_is_int_ = is_int && it == nonfinite_.end();
    v.int_ = n;
    return put(std::move(v));
  }

  bool open(Json::Kind kind) {
    if (open_.size() >= kMaxJsonDepth) invalid("nesting deeper than " + std::to_string(kMaxJsonDepth));
    Json v;
    v.kind_ = kind;
    open_.push_back(std::move(v));
    keys_.emplace_back();
    seen_.emplace_back();
    return true;
  }

  bool close() {
    Json v = std::move(open_.back());
    open_.pop_back();
    keys_.pop_back();
    seen_.pop_back();
    return put(std::move(v));
  }

  bool put(Json v) {
    if (open_.empty()) {
      root_ = std::move(v);
    } else if (open_.back().kind_ == Json::Kind::Object) {
      open_.back().obj_.emplace_back(std::move(keys_.back()), std::move(v));
    } else {
      open_.back().arr_.push_back(std::move(v));
    }
    return true;
  }

  std::map<size_t, double> nonfinite_;   // number ordinal -> its value (with_python_literals_replaced)
  size_t numbers_ = 0;
  std::vector<Json> open_;               // the arrays and objects being read, outermost first
  std::vector<std::string> keys_;        // per open object, the key its next value goes under
  std::vector<std::unordered_set<std::string>> seen_;   // per open object, its keys so far
  Json root_;
};

Json Json::parse(const std::string& text) {
  std::map<size_t, double> nonfinite;
  const std::string json = with_python_literals_replaced(text, nonfinite);
  JsonParser reader(std::move(nonfinite));
  // strict: trailing characters are an error too; errors throw from the reader, which never stops the parse itself
  nlohmann::json::sax_parse(json, &reader);
  return reader.take();
}

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

Json Json::string_value(std::string s) {
  Json v;
  v.kind_ = Kind::String;
  v.str_ = std::move(s);
  return v;
}

int64_t Json::integer() const {
  if (!is_integer()) fail(SPOT_ERR_CORRUPT, "expected an integer");
  return int_;
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
