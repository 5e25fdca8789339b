#include "schema.h"

#include <algorithm>
#include <cmath>

#include "errors.h"

namespace spot {
namespace schema {
namespace {

[[noreturn]] void refuse(const Field& f, const Json& v) { throw Mismatch{"", shown(v), f.expected}; }

bool hex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string range_text(double v) {   // 0, 1, 1e-06 as Python's {:g} writes them
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

Mismatch Mismatch::inside(const std::string& parent) const {
  Mismatch m = *this;
  m.where = where.empty() ? parent : where[0] == '[' ? parent + where : parent + "." + where;
  return m;
}

std::string Mismatch::message(const std::string& what) const {
  if (missing) return what + " lacks field '" + where + "'";
  if (key) return what + ": " + where + " lists " + shown + ", expected " + expected;
  return what + ": " + (where.empty() ? std::string("the value") : where) + " is " + shown + ", expected " + expected;
}

std::string shown(const Json& v) {
  switch (v.kind()) {
    case Json::Kind::Null: return "None";
    case Json::Kind::Bool: return v.boolean() ? "True" : "False";
    case Json::Kind::Number: {
      if (v.is_integer()) return std::to_string(v.integer());
      const double d = v.number();
      return std::isnan(d) ? "nan" : std::isinf(d) ? (d > 0 ? "inf" : "-inf") : number_text(d);
    }
    case Json::Kind::String: {
      const std::string& s = v.str();
      return "'" + (s.size() > 60 ? s.substr(0, 28) + "..." + s.substr(s.size() - 29) : s) + "'";
    }
    case Json::Kind::Array: {
      std::string out = "[";
      const auto& items = v.items();
      for (size_t i = 0; i < items.size() && i < 4; ++i) out += (i ? ", " : "") + shown(items[i]);
      return out + (items.size() > 4 ? ", ...]" : "]");
    }
    case Json::Kind::Object: return v.members().empty() ? "{}" : "{...}";
  }
  return "?";
}

Field any() { return {"a value", [](const Json&) {}}; }

Field integer(int64_t lo, int64_t hi) {
  Field f{"an integer in " + std::to_string(lo) + ".." + std::to_string(hi), nullptr};
  f.check = [f, lo, hi](const Json& v) {
    if (!v.is_integer() || v.integer() < lo || v.integer() > hi) refuse(f, v);
  };
  return f;
}

Field number(double lo, double hi, bool lo_open, bool hi_open) {
  std::string expected;
  if (std::isinf(hi))
    expected = std::isinf(lo) ? "a finite number" : std::string("a number ") + (lo_open ? ">" : ">=") + " " +
                                                        range_text(lo);
  else
    expected = std::string("a number in ") + (lo_open ? "(" : "[") + range_text(lo) + ", " + range_text(hi) +
               (hi_open ? ")" : "]");
  Field f{expected, nullptr};
  f.check = [f, lo, hi, lo_open, hi_open](const Json& v) {
    if (!v.is_number() || !std::isfinite(v.number())) refuse(f, v);
    const double x = v.number();
    if (!(lo_open ? x > lo : x >= lo) || !(hi_open ? x < hi : x <= hi)) refuse(f, v);
  };
  return f;
}

Field boolean() {
  Field f{"true or false", nullptr};
  f.check = [f](const Json& v) {
    if (v.kind() != Json::Kind::Bool) refuse(f, v);
  };
  return f;
}

Field text(std::vector<std::string> choices, std::string what) {
  std::string expected = what;
  if (!choices.empty()) {
    expected = "one of ";
    for (size_t i = 0; i < choices.size(); ++i) expected += (i ? ", " : "") + choices[i];
  }
  Field f{expected, nullptr};
  f.check = [f, choices](const Json& v) {
    if (!v.is_string() || (!choices.empty() && std::find(choices.begin(), choices.end(), v.str()) == choices.end()))
      refuse(f, v);
  };
  return f;
}

Field sha256() { return satisfies(hex64, "a sha256 (64 lowercase hex digits)"); }

Field satisfies(std::function<bool(const std::string&)> test, std::string what) {
  Field f{std::move(what), nullptr};
  f.check = [f, test](const Json& v) {
    if (!v.is_string() || !test(v.str())) refuse(f, v);
  };
  return f;
}

Field list_of(Field item, int64_t max_len) {
  Field f{"a list of at most " + std::to_string(max_len) + " items, each " + item.expected, nullptr};
  f.check = [f, item, max_len](const Json& v) {
    if (!v.is_array() || static_cast<int64_t>(v.items().size()) > max_len) refuse(f, v);
    for (size_t i = 0; i < v.items().size(); ++i) {
      try {
        item.check(v.items()[i]);
      } catch (const Mismatch& m) {
        throw m.inside("[" + std::to_string(i) + "]");
      }
    }
  };
  return f;
}

Field nullable(Field inner) {
  Field f{"null or " + inner.expected, nullptr};
  f.check = [f, inner](const Json& v) {
    if (v.is_null()) return;
    try {
      inner.check(v);
    } catch (const Mismatch& m) {
      if (!m.where.empty()) throw;   // inside the value: that field's own mismatch
      refuse(f, v);
    }
  };
  return f;
}

Field any_of(std::vector<Field> options) {
  std::string expected;
  for (const Field& o : options) expected += (expected.empty() ? "" : " or ") + o.expected;
  Field f{expected, nullptr};
  f.check = [f, options](const Json& v) {
    for (const Field& o : options) {
      try {
        o.check(v);
        return;
      } catch (const Mismatch&) {
      }
    }
    refuse(f, v);
  };
  return f;
}

Field record(std::vector<std::pair<std::string, Field>> fields, std::vector<std::string> required, std::string what,
             bool closed, Field others) {
  std::string names;
  for (const auto& kv : fields) names += (names.empty() ? "" : ", ") + kv.first;
  Field f{what, nullptr};
  f.check = [f, fields, required, closed, others, names](const Json& v) {
    if (!v.is_object()) refuse(f, v);
    for (const std::string& key : required)
      if (!v.has(key)) throw Mismatch{key, "", "", true};
    for (const auto& [key, value] : v.members()) {
      auto known = std::find_if(fields.begin(), fields.end(), [&](const auto& kv) { return kv.first == key; });
      if (known == fields.end() && closed)
        throw Mismatch{key, shown(value), "no such field (the fields of " + f.expected + ": " + names + ")"};
      try {
        (known == fields.end() ? others : known->second).check(value);
      } catch (const Mismatch& m) {
        throw m.inside(key);
      }
    }
  };
  return f;
}

Field map_of(Field key, Field value, std::string what) {
  Field f{std::move(what), nullptr};
  f.check = [f, key, value](const Json& v) {
    if (!v.is_object()) refuse(f, v);
    for (const auto& [k, x] : v.members()) {
      Json name = Json::string_value(k);
      try {
        key.check(name);
      } catch (const Mismatch& m) {
        throw Mismatch{"", shown(name), m.expected, false, true};
      }
      try {
        value.check(x);
      } catch (const Mismatch& m) {
        throw m.inside(k);
      }
    }
  };
  return f;
}

void rule(bool ok, const std::string& where, const std::string& shown_value, const std::string& expected) {
  if (!ok) throw Mismatch{where, shown_value, expected};
}

void checked(const Json& value, const Field& field, const std::string& what) {
  try {
    field.check(value);
  } catch (const Mismatch& m) {
    fail(SPOT_ERR_CORRUPT, m.message(what));
  }
}

}  // namespace schema
}  // namespace spot
