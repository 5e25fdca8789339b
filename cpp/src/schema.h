// Typed checks of the fields of the files the host reads (manifest.json, drafter.json), as spot/schema.py makes them
// for the Python runtime: each field's JSON type and range, checked once when the file is read, so that a wrong type
// or a number out of range is one SPOT_ERR_CORRUPT naming the field, the value and what was expected — and never
// sizes an allocation. A format's table lives beside its reader (engine.cpp, drafter.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "json.h"

namespace spot {
namespace schema {

// A value that is not what its field expects: where (the field's path, "model.vocab_size", "stop_ids[0]"), the value
// as shown in messages, what was expected; missing: the field is absent; key: a key of a map (a file name).
struct Mismatch {
  std::string where, shown, expected;
  bool missing = false, key = false;

  Mismatch inside(const std::string& parent) const;
  std::string message(const std::string& what) const;   // spot.schema.Mismatch.message's text
};

// One field's type and range: check(value) returns, or throws Mismatch.
struct Field {
  std::string expected;
  std::function<void(const Json&)> check;
};

Field any();
Field integer(int64_t lo, int64_t hi);                                 // a JSON integer (not 4.0) in lo..hi
Field number(double lo, double hi, bool lo_open = false, bool hi_open = false);   // finite, in the interval
Field boolean();
Field text(std::vector<std::string> choices = {}, std::string what = "a string");
Field sha256();                                                        // 64 lowercase hex digits
Field satisfies(std::function<bool(const std::string&)> test, std::string what);  // a string passing `test`
Field list_of(Field item, int64_t max_len);
Field nullable(Field inner);
Field any_of(std::vector<Field> options);
// An object: the `required` keys present, each known key checked by its field in file order, any other by `others`
// (closed: refused).
Field record(std::vector<std::pair<std::string, Field>> fields, std::vector<std::string> required, std::string what,
             bool closed = false, Field others = any());
Field map_of(Field key, Field value, std::string what = "an object");

std::string shown(const Json& v);                // a short rendering of a value (as spot.schema.shown, near enough)
void rule(bool ok, const std::string& where, const std::string& shown, const std::string& expected);

// `value` checked by `field`; SpotException(SPOT_ERR_CORRUPT) with Mismatch::message(what) otherwise
void checked(const Json& value, const Field& field, const std::string& what);

}  // namespace schema
}  // namespace spot
