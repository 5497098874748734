// text/jinja_value.cpp — values, Python's str()/repr(), json.dumps, and UTF-8 code point helpers.
#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include <utf8proc.h>

#include "mla/error.h"

namespace mla::text::jinja {

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void DictData::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

static int nested_depth(int child) {
  if (child + 1 > kMaxNesting) fail("values nested more than {} levels deep are not supported", kMaxNesting);
  return child + 1;
}

Value Value::make_list(ValueList items, bool tuple) {
  Value v;
  v.kind = Kind::List;
  int d = 0;
  for (const Value& x : items) d = std::max(d, x.depth);
  v.depth = nested_depth(d);
  v.list = std::make_shared<ValueList>(std::move(items));
  v.tuple = tuple;
  return v;
}

Value Value::make_dict(std::shared_ptr<DictData> d) {
  Value v;
  v.kind = Kind::Dict;
  v.dict = d ? std::move(d) : std::make_shared<DictData>();
  int depth = 0;
  for (const auto& [k, x] : v.dict->items) depth = std::max(depth, x.depth);
  v.depth = nested_depth(depth);
  return v;
}

Value Value::make_namespace() {
  Value v;
  v.kind = Kind::Namespace;
  v.dict = std::make_shared<DictData>();
  v.depth = 1;
  return v;
}

Value Value::callable(std::string name, std::function<Value(CallArgs&)> fn) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

static Value from_json_at(const nlohmann::ordered_json& j, int level) {
  if (level > kMaxNesting) fail("values nested more than {} levels deep are not supported", kMaxNesting);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) fail("integer {} is too large for the template interpreter", u);
      return Value::integer(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, level + 1));
      return Value::make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<DictData>();
      for (auto it = j.begin(); it != j.end(); ++it) d->items.emplace_back(it.key(), from_json_at(it.value(), level + 1));
      return Value::make_dict(std::move(d));
    }
    default: fail("a JSON value of an unsupported kind (binary) in the template context");
  }
}

Value Value::from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b;
    case Kind::Int: return i != 0;
    case Kind::Float: return f != 0;
    case Kind::String: return !s.empty();
    case Kind::List: return !list->empty();
    case Kind::Dict: return !dict->items.empty();
    case Kind::Namespace:
    case Kind::Callable: return true;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return v.tuple ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Callable: return "function";
  }
  return "?";
}

// ---- UTF-8 ------------------------------------------------------------------------------------

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t k = 0;
  while (k < s.size()) {
    utf8proc_int32_t c;
    const utf8proc_ssize_t n =
        utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + k), utf8proc_ssize_t(s.size() - k), &c);
    if (n <= 0) {  // an invalid byte stands for itself (as Python's surrogateescape)
      out.push_back(char32_t(0xDC00 + static_cast<unsigned char>(s[k])));
      ++k;
    } else {
      out.push_back(char32_t(c));
      k += size_t(n);
    }
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c >= 0xDC80 && c <= 0xDCFF) {
    out.push_back(char(c - 0xDC00));
    return;
  }
  if (c < 0x80) {
    out.push_back(char(c));
  } else if (c < 0x800) {
    out.push_back(char(0xC0 | (c >> 6)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(char(0xE0 | (c >> 12)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (c >> 18)));
    out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  }
}

std::string from_u32(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool py_isspace(char32_t c) {
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85) return true;
  if (c < 0xA0 || c > 0x10FFFF) return false;
  const auto cat = utf8proc_category(utf8proc_int32_t(c));
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

bool py_isprintable(char32_t c) {
  if (c == ' ') return true;
  if (c > 0x10FFFF) return false;
  switch (utf8proc_category(utf8proc_int32_t(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}

char32_t py_upper(char32_t c) {
  return c > 0x10FFFF ? c : char32_t(utf8proc_toupper(utf8proc_int32_t(c)));
}
char32_t py_lower(char32_t c) {
  return c > 0x10FFFF ? c : char32_t(utf8proc_tolower(utf8proc_int32_t(c)));
}

// ---- str / repr -------------------------------------------------------------------------------

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);  // shortest
  std::string sci(buf, r.ptr);
  bool neg = false;
  if (!sci.empty() && sci[0] == '-') {
    neg = true;
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (int(digits.size()) <= exp + 1) {
        out += digits + std::string(size_t(exp + 1 - int(digits.size())), '0') + ".0";
      } else {
        out += digits.substr(0, size_t(exp + 1)) + "." + digits.substr(size_t(exp + 1));
      }
    } else {
      out += "0." + std::string(size_t(-exp - 1), '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exp < 0 ? "e-" : "e+";
    const int a = exp < 0 ? -exp : exp;
    if (a < 10) out += "0";
    out += std::to_string(a);
  }
  return out;
}

static std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : to_u32(s)) {
    if (c == char32_t(q) || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c >= 0xDC80 && c <= 0xDCFF) {  // an invalid byte (surrogate escape)
      out += fmt::format("\\udc{:02x}", unsigned(c & 0xFF));
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", unsigned(c));
    } else if (c < 0x80 || py_isprintable(c)) {
      append_utf8(out, c);
    } else if (c < 0x100) {
      out += fmt::format("\\x{:02x}", unsigned(c));
    } else if (c < 0x10000) {
      out += fmt::format("\\u{:04x}", unsigned(c));
    } else {
      out += fmt::format("\\U{:08x}", unsigned(c));
    }
  }
  out += q;
  return out;
}

std::string py_repr(const Value& v) {
  switch (v.kind) {
    case Kind::String: return repr_string(v.s);
    case Kind::List: {
      if (v.view) {
        Value plain = v;
        plain.view = nullptr;
        return std::string(v.view) + "(" + py_repr(plain) + ")";
      }
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += py_repr((*v.list)[k]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Kind::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + py_repr(x);
      }
      return out + "}";
    }
    case Kind::Namespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + py_repr(x);
      }
      return out + "}>";
    }
    default: return py_str(v);
  }
}

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return v.b ? "True" : "False";
    case Kind::Int: return std::to_string(v.i);
    case Kind::Float: return py_float_repr(v.f);
    case Kind::String: return v.s;
    case Kind::Callable: return "<function " + v.fn->name + ">";
    default: return py_repr(v);
  }
}

// ---- json.dumps -------------------------------------------------------------------------------

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : to_u32(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", unsigned(c));
        } else if (ensure_ascii && c >= 0x7F) {
          if (c >= 0x10000) {
            const unsigned u = unsigned(c) - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF));
          } else if (c >= 0xDC80 && c <= 0xDCFF) {
            out += fmt::format("\\u{:04x}", unsigned(c));
          } else if (c >= 0x80) {
            out += fmt::format("\\u{:04x}", unsigned(c));
          } else {
            out += char(c);
          }
        } else {
          append_utf8(out, c);
        }
    }
  }
  out += '"';
}

static void json_dump(std::string& out, const Value& v, const JsonOptions& o, int level) {
  const std::string item_sep = o.separators ? o.separators->first : (o.indent ? "," : ", ");
  const std::string key_sep = o.separators ? o.separators->second : ": ";
  auto newline = [&](int lv) {
    if (!o.indent) return;
    out += '\n';
    for (int k = 0; k < lv; ++k) out += *o.indent;
  };
  switch (v.kind) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.b ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.i); return;
    case Kind::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f < 0 ? "-Infinity" : "Infinity";
      else out += py_float_repr(v.f);
      return;
    case Kind::String: json_string(out, v.s, o.ensure_ascii); return;
    case Kind::List: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(level + 1);
        json_dump(out, (*v.list)[k], o, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& it : v.dict->items) items.push_back(&it);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        newline(level + 1);
        json_string(out, items[k]->first, o.ensure_ascii);
        out += key_sep;
        json_dump(out, items[k]->second, o, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default: fail("Object of type {} is not JSON serializable", type_name(v));
  }
}

std::string json_dumps(const Value& v, const JsonOptions& o) {
  std::string out;
  json_dump(out, v, o, 0);
  return out;
}

}  // namespace mla::text::jinja
