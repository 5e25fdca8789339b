// JSON values of manifest.json and drafter.json, read with nlohmann/json (RFC 8259, plus the NaN / Infinity
// Python's json module writes; objects keep their key order). What it refuses, spot.descriptors.parse_json refuses
// too (nesting deeper than kMaxJsonDepth, duplicate keys, NUL or a lone surrogate in a string, a number beyond
// double's range), so that both hosts read the same files alike.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace spot {

class Json {
 public:
  enum class Kind { Null, Bool, Number, String, Array, Object };

  Json() = default;
  static Json parse(const std::string& text);   // throws SpotException(SPOT_ERR_CORRUPT) on malformed input

  Kind kind() const { return kind_; }
  static Json string_value(std::string s);           // a JSON string holding s

  bool is_null() const { return kind_ == Kind::Null; }
  bool is_number() const { return kind_ == Kind::Number; }
  bool is_integer() const { return kind_ == Kind::Number && num_is_int_; }   // written without fraction or exponent
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }

  bool has(const std::string& key) const;
  const Json& at(const std::string& key) const;     // throws naming the key when absent
  const Json* find(const std::string& key) const;   // nullptr when absent (or not an object)
  const std::vector<Json>& items() const;            // array elements
  const std::vector<std::pair<std::string, Json>>& members() const;  // object members in file order

  double number() const;
  int64_t integer() const;                           // is_integer()'s value (Python's json reads 4.0 as a float)
  bool boolean() const;
  const std::string& str() const;

 private:
  friend class JsonParser;
  Kind kind_ = Kind::Null;
  bool bool_ = false;
  double num_ = 0.0;
  bool num_is_int_ = false;
  int64_t int_ = 0;
  std::string str_;
  std::vector<Json> arr_;
  std::vector<std::pair<std::string, Json>> obj_;
};

std::string read_text_file(const std::string& path);  // throws SpotException(SPOT_ERR_NOT_FOUND) when unreadable

}  // namespace spot
