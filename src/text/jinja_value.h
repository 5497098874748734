// text/jinja_value.h — the interpreter's values with Python's semantics: undefined (jinja2's
// default Undefined), none, bool, int, float, str, list/tuple, dict (insertion order), namespace
// and callables; str(), repr() and json.dumps as Python writes them.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace mla::text::jinja {

struct Value;
using ValueList = std::vector<Value>;

// Lists and dicts nest at most this deep (the recursive printers, comparisons and destructors stay
// within the stack); deeper → mla::Error.
inline constexpr int kMaxNesting = 512;

struct DictData {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, as Python's dict
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> fn;
};

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

struct Value {
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                     // String; for Undefined: the name that was looked up
  std::shared_ptr<ValueList> list;   // List (tuple when `tuple`)
  bool tuple = false;
  const char* view = nullptr;        // List made by dict.items()/keys()/values(): "dict_items", ...
  std::shared_ptr<DictData> dict;    // Dict and Namespace
  std::shared_ptr<Callable> fn;
  int depth = 0;                     // nesting of lists and dicts (bounded: see kMaxNesting)

  static Value undefined(std::string name = "") { Value v; v.s = std::move(name); return v; }
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
  static Value real(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::String; v.s = std::move(x); return v; }
  static Value make_list(ValueList items, bool tuple = false);
  static Value make_dict(std::shared_ptr<DictData> d = nullptr);
  static Value make_namespace();
  static Value callable(std::string name, std::function<Value(CallArgs&)> fn);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_mapping() const { return kind == Kind::Dict || kind == Kind::Namespace; }
  bool truthy() const;
};

// Python's type name of a value ("str", "int", "NoneType", "Undefined", ...), for error messages.
std::string type_name(const Value& v);
// str(v) (undefined prints as ""), repr(v).
std::string py_str(const Value& v);
std::string py_repr(const Value& v);
std::string py_float_repr(double d);
// json.dumps(v, ensure_ascii, indent, separators, sort_keys) — indent: none, an int or a string.
struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // the indentation unit, when indenting
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
};
std::string json_dumps(const Value& v, const JsonOptions& o);

// UTF-8 helpers: text as code points (invalid bytes are kept one code point each, as surrogate
// escapes would be), and back.
std::u32string to_u32(std::string_view s);
std::string from_u32(std::u32string_view s);
void append_utf8(std::string& out, char32_t c);
bool py_isspace(char32_t c);
bool py_isprintable(char32_t c);
char32_t py_upper(char32_t c);
char32_t py_lower(char32_t c);

}  // namespace mla::text::jinja
