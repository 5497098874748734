// JSON field reading with one-line errors that name the field, shared by the config readers.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "mla/error.h"

namespace mla::detail {

using json = nlohmann::json;

// One-line rendering of a JSON value for error messages, shortened if long.
inline std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Reads the fields of one JSON object; `src` names the input in errors ("config.json" or a path)
// and `prefix` the object inside it ("" or "rope_scaling.").
class Fields {
 public:
  Fields(const json& obj, std::string src, std::string prefix)
      : obj_(obj), src_(std::move(src)), prefix_(std::move(prefix)) {}

  // Null counts as absent.
  const json* find(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool has(const char* key) const { return find(key) != nullptr; }

  [[noreturn]] void missing(const char* key) const {
    fail("{}: field '{}{}' is missing", src_, prefix_, key);
  }
  [[noreturn]] void bad(const char* key, const char* what, const json& v) const {
    fail("{}: field '{}{}' must be {} (got {})", src_, prefix_, key, what, show(v));
  }

  // Every count and size in a config fits int32 (token ids and positions are int32), so that
  // products of a few of them cannot overflow int64.
  static constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

  int64_t integer(const char* key, const json& v, const char* what) const {
    int64_t x = 0;
    if (v.is_number_integer()) {
      if (v.is_number_unsigned() &&
          v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        too_large(key, v);
      x = v.get<int64_t>();
    } else if (v.is_number_float()) {  // 4096.0 is accepted; 1.5, strings, booleans are not
      double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d) || d < -double(kMaxInt)) bad(key, what, v);
      if (d > double(kMaxInt)) too_large(key, v);
      x = int64_t(d);
    } else {
      bad(key, what, v);
    }
    if (x > kMaxInt) too_large(key, v);
    return x;
  }
  [[noreturn]] void too_large(const char* key, const json& v) const {
    fail("{}: field '{}{}' must be at most {} (got {})", src_, prefix_, key, kMaxInt, show(v));
  }
  int64_t positive_int(const char* key) const {
    const json* v = find(key);
    if (!v) missing(key);
    int64_t x = integer(key, *v, "a positive integer");
    if (x <= 0) bad(key, "a positive integer", *v);
    return x;
  }
  // Absent or null → `dflt`; otherwise a positive integer.
  int64_t optional_positive_int(const char* key, int64_t dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    int64_t x = integer(key, *v, "a positive integer");
    if (x <= 0) bad(key, "a positive integer", *v);
    return x;
  }
  double number(const char* key, double dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    if (!v->is_number()) bad(key, "a number", *v);
    double d = v->get<double>();
    if (!std::isfinite(d)) bad(key, "a finite number", *v);
    return d;
  }
  bool boolean(const char* key, bool dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    if (!v->is_boolean()) bad(key, "true or false", *v);
    return v->get<bool>();
  }
  std::string string(const char* key) const {
    const json* v = find(key);
    if (!v) missing(key);
    if (!v->is_string()) bad(key, "a string", *v);
    return v->get<std::string>();
  }

  const std::string& src() const { return src_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const json& obj_;
  std::string src_, prefix_;
};

// The text of a config.json (a checkpoint folder means its config.json) and the file's path.
std::pair<std::string, std::string> read_config_text(const std::string& path);

}  // namespace mla::detail
