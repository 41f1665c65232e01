// tessera/core/json_fields.h — the fields of a JSON object read from a file, with errors that name the field.
//
// nlohmann's at() and get<>() throw their own exceptions, whose text ("[json.exception.out_of_range.403] key
// 'vocab' not found") is the library's, not the user's; and get<int>() quietly truncates 2.5 to 2 and 2^32 + 128
// to 128. These check first and throw Error "<where>: missing field 'vocab'" or "<where>: field 'vocab' must be
// an integer, got \"abc\"".
#pragma once
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tessera/core/error.h"

namespace tessera {

// A value as the messages show it: its JSON text, cut short (a field may hold a whole object).
inline std::string json_shown(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// What a value is, for messages: "a number", "an array", "null".
inline const char* json_kind(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  return "a number";
}

inline const nlohmann::json& json_field(const nlohmann::json& j, const char* key, std::string_view where) {
  TS_CHECK(j.is_object(), where, ": expected a JSON object, got ", json_kind(j));
  const auto it = j.find(key);
  TS_CHECK(it != j.end(), where, ": missing field '", key, "'");
  return *it;
}

// A JSON integer in [lo, hi].
inline int64_t json_int64(const nlohmann::json& j, const char* key, std::string_view where,
                          int64_t lo = std::numeric_limits<int64_t>::min(),
                          int64_t hi = std::numeric_limits<int64_t>::max()) {
  const nlohmann::json& v = json_field(j, key, where);
  TS_CHECK(v.is_number_integer(), where, ": field '", key, "' must be an integer, got ", json_shown(v));
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(hi)
                                           : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  TS_CHECK(fits, where, ": field '", key, "' ", json_shown(v), " is out of range");
  return v.get<int64_t>();
}

inline int json_int(const nlohmann::json& j, const char* key, std::string_view where) {
  return static_cast<int>(json_int64(j, key, where, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}

inline uint64_t json_u64(const nlohmann::json& j, const char* key, std::string_view where) {
  const nlohmann::json& v = json_field(j, key, where);
  TS_CHECK(v.is_number_unsigned(), where, ": field '", key, "' must be an integer >= 0, got ", json_shown(v));
  return v.get<uint64_t>();
}

// Any JSON number (an integer too: 10 for 10.0).
inline double json_number(const nlohmann::json& j, const char* key, std::string_view where) {
  const nlohmann::json& v = json_field(j, key, where);
  TS_CHECK(v.is_number(), where, ": field '", key, "' must be a number, got ", json_shown(v));
  return v.get<double>();
}

inline bool json_bool(const nlohmann::json& j, const char* key, std::string_view where) {
  const nlohmann::json& v = json_field(j, key, where);
  TS_CHECK(v.is_boolean(), where, ": field '", key, "' must be true or false, got ", json_shown(v));
  return v.get<bool>();
}

inline std::string json_string(const nlohmann::json& j, const char* key, std::string_view where) {
  const nlohmann::json& v = json_field(j, key, where);
  TS_CHECK(v.is_string(), where, ": field '", key, "' must be a string, got ", json_shown(v));
  return v.get<std::string>();
}

}  // namespace tessera
