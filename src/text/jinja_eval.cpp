// text/jinja_eval.cpp — the evaluator: scopes as jinja2 keeps them (a for loop's body gets a fresh
// scope each iteration; macros see the globals), Python's operators, jinja2's getattr/getitem and
// Undefined, the filters, tests and globals chat templates use.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <limits>
#include <unordered_map>

#include "mla/error.h"
#include "text/jinja_ast.h"

namespace mla::text::jinja {
namespace {

constexpr size_t kMaxText = size_t(64) << 20;  // the longest string or output the interpreter makes
constexpr size_t kMaxItems = size_t(1) << 20;  // the longest list (range, repetition)
constexpr int64_t kMaxSteps = 10'000'000;      // statements run plus loop iterations, per render
constexpr int kMaxCallDepth = 100;               // macro recursion

[[noreturn]] void fail_at(Pos p, const std::string& what) { fail("{}:{}: {}", p.line, p.col, what); }

[[noreturn]] void fail_undefined(Pos p, const Value& v) {
  fail_at(p, v.s.empty() ? std::string("undefined value") : v.s);
}

void check_text(Pos p, size_t n) {
  if (n > kMaxText) fail_at(p, fmt::format("string longer than the interpreter's limit of {} bytes", kMaxText));
}

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { Normal, Break, Continue };

bool is_int(const Value& v) { return v.kind == Kind::Int || v.kind == Kind::Bool; }
int64_t as_int(const Value& v) { return v.kind == Kind::Bool ? int64_t(v.b) : v.i; }
double as_float(const Value& v) { return v.kind == Kind::Float ? v.f : double(as_int(v)); }

std::string quoted_type(const Value& v) { return "'" + type_name(v) + "'"; }

// ---- equality and ordering (Python) ----

bool py_eq(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) return as_float(a) == as_float(b);
    return as_int(a) == as_int(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.s == b.s;
    case Kind::List: {
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!py_eq((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !py_eq(v, *o)) return false;
      }
      return true;
    }
    case Kind::Namespace: return a.dict == b.dict;
    case Kind::Callable: return a.fn == b.fn;
    default: return false;
  }
}

// <0, 0, >0; TypeError for values Python does not order.
int py_cmp(const Value& a, const Value& b, const char* op, Pos p) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) {
      const double x = as_float(a), y = as_float(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const int64_t x = as_int(a), y = as_int(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Kind::String && b.kind == Kind::String) return a.s.compare(b.s) < 0 ? -1 : a.s == b.s ? 0 : 1;
  if (a.kind == Kind::List && b.kind == Kind::List && a.tuple == b.tuple) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (py_eq((*a.list)[k], (*b.list)[k])) continue;
      return py_cmp((*a.list)[k], (*b.list)[k], op, p);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  if (a.is_undefined()) fail_undefined(p, a);
  if (b.is_undefined()) fail_undefined(p, b);
  fail_at(p, fmt::format("'{}' not supported between instances of {} and {}", op, quoted_type(a), quoted_type(b)));
}

// ---- iteration ----

std::vector<Value> iterate(const Value& v, Pos p) {
  switch (v.kind) {
    case Kind::Undefined: return {};
    case Kind::List: return *v.list;
    case Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& [k, x] : v.dict->items) keys.push_back(Value::string(k));
      return keys;
    }
    case Kind::String: {
      std::vector<Value> chars;
      for (char32_t c : to_u32(v.s)) {
        std::string one;
        append_utf8(one, c);
        chars.push_back(Value::string(std::move(one)));
      }
      return chars;
    }
    default: fail_at(p, fmt::format("{} object is not iterable", quoted_type(v)));
  }
}

int64_t py_len(const Value& v, Pos p) {
  switch (v.kind) {
    case Kind::Undefined: return 0;
    case Kind::String: return int64_t(to_u32(v.s).size());
    case Kind::List: return int64_t(v.list->size());
    case Kind::Dict: return int64_t(v.dict->items.size());
    default: fail_at(p, fmt::format("object of type {} has no len()", quoted_type(v)));
  }
}

bool py_in(const Value& needle, const Value& hay, Pos p) {
  switch (hay.kind) {
    case Kind::Undefined: return false;
    case Kind::String:
      if (needle.kind != Kind::String)
        fail_at(p, fmt::format("'in <string>' requires string as left operand, not {}", type_name(needle)));
      return hay.s.find(needle.s) != std::string::npos;
    case Kind::List:
      for (const Value& x : *hay.list)
        if (py_eq(needle, x)) return true;
      return false;
    case Kind::Dict:
      if (needle.kind != Kind::String) return false;
      return hay.dict->find(needle.s) != nullptr;
    default: fail_at(p, fmt::format("argument of type {} is not iterable", quoted_type(hay)));
  }
}

// ---- string methods ----

std::u32string strip_chars(const Value& chars, Pos p) {
  if (chars.is_none() || chars.is_undefined()) return U"";
  if (chars.kind != Kind::String) fail_at(p, "strip arg must be None or str");
  return to_u32(chars.s);
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right, Pos p) {
  const bool ws = chars.is_none() || chars.is_undefined();
  const std::u32string set = strip_chars(chars, p);
  auto drop = [&](char32_t c) { return ws ? py_isspace(c) : set.find(c) != std::u32string::npos; };
  const std::u32string u = to_u32(s);
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && drop(u[b])) ++b;
  if (right)
    while (e > b && drop(u[e - 1])) --e;
  return from_u32(std::u32string_view(u).substr(b, e - b));
}

std::vector<Value> py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right, Pos p) {
  std::vector<std::string> parts;
  if (sep.is_none() || sep.is_undefined()) {
    const std::u32string u = to_u32(s);
    std::vector<std::pair<size_t, size_t>> words;  // [b, e)
    size_t k = 0;
    while (k < u.size()) {
      while (k < u.size() && py_isspace(u[k])) ++k;
      if (k >= u.size()) break;
      size_t e = k;
      while (e < u.size() && !py_isspace(u[e])) ++e;
      words.emplace_back(k, e);
      k = e;
    }
    if (maxsplit >= 0 && int64_t(words.size()) > maxsplit + 1) {
      if (!from_right) {
        // the rest after the maxsplit-th word, with its leading whitespace stripped
        size_t rest = words[size_t(maxsplit)].first;
        for (int64_t w = 0; w < maxsplit; ++w)
          parts.push_back(from_u32(std::u32string_view(u).substr(words[size_t(w)].first,
                                                                   words[size_t(w)].second - words[size_t(w)].first)));
        size_t end = u.size();
        while (end > rest && py_isspace(u[end - 1])) --end;
        parts.push_back(from_u32(std::u32string_view(u).substr(rest, end - rest)));
      } else {
        const size_t first_kept = words.size() - size_t(maxsplit);
        size_t b = 0;
        while (b < u.size() && py_isspace(u[b])) ++b;
        parts.push_back(from_u32(std::u32string_view(u).substr(b, words[first_kept - 1].second - b)));
        for (size_t w = first_kept; w < words.size(); ++w)
          parts.push_back(from_u32(std::u32string_view(u).substr(words[w].first, words[w].second - words[w].first)));
      }
    } else {
      for (auto [b, e] : words) parts.push_back(from_u32(std::u32string_view(u).substr(b, e - b)));
    }
  } else {
    if (sep.kind != Kind::String) fail_at(p, fmt::format("must be str or None, not {}", type_name(sep)));
    if (sep.s.empty()) fail_at(p, "empty separator");
    if (!from_right) {
      size_t b = 0;
      int64_t n = 0;
      while (true) {
        const size_t f = (maxsplit < 0 || n < maxsplit) ? s.find(sep.s, b) : std::string::npos;
        if (f == std::string::npos) {
          parts.push_back(s.substr(b));
          break;
        }
        parts.push_back(s.substr(b, f - b));
        b = f + sep.s.size();
        ++n;
      }
    } else {
      size_t e = s.size();
      int64_t n = 0;
      std::vector<std::string> rev;
      while (true) {
        size_t f = std::string::npos;
        if ((maxsplit < 0 || n < maxsplit) && e >= sep.s.size()) f = s.rfind(sep.s, e - sep.s.size());
        if (f == std::string::npos) {
          rev.push_back(s.substr(0, e));
          break;
        }
        rev.push_back(s.substr(f + sep.s.size(), e - f - sep.s.size()));
        e = f;
        ++n;
      }
      parts.assign(rev.rbegin(), rev.rend());
    }
  }
  std::vector<Value> out;
  for (auto& x : parts) out.push_back(Value::string(std::move(x)));
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count, Pos p) {
  std::string out;
  if (old.empty()) {  // Python inserts `repl` between every code point (and at both ends)
    const std::u32string u = to_u32(s);
    int64_t n = 0;
    for (size_t k = 0; k <= u.size(); ++k) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (k < u.size()) append_utf8(out, u[k]);
      check_text(p, out.size());
    }
    return out;
  }
  size_t b = 0;
  int64_t n = 0;
  while (true) {
    const size_t f = (count < 0 || n < count) ? s.find(old, b) : std::string::npos;
    if (f == std::string::npos) break;
    out.append(s, b, f - b);
    out += repl;
    check_text(p, out.size());
    b = f + old.size();
    ++n;
  }
  out.append(s, b, std::string::npos);
  return out;
}

bool is_cased(char32_t c) { return py_upper(c) != c || py_lower(c) != c; }

std::string py_upper_str(const std::string& s) {
  std::u32string u = to_u32(s);
  for (char32_t& c : u) c = py_upper(c);
  return from_u32(u);
}
std::string py_lower_str(const std::string& s) {
  std::u32string u = to_u32(s);
  for (char32_t& c : u) c = py_lower(c);
  return from_u32(u);
}
std::string py_title(const std::string& s) {
  std::u32string u = to_u32(s);
  bool prev_cased = false;
  for (char32_t& c : u) {
    const bool cased = is_cased(c);
    c = prev_cased ? py_lower(c) : py_upper(c);
    prev_cased = cased;
  }
  return from_u32(u);
}
std::string py_capitalize(const std::string& s) {
  std::u32string u = to_u32(s);
  for (size_t k = 0; k < u.size(); ++k) u[k] = k == 0 ? py_upper(u[k]) : py_lower(u[k]);
  return from_u32(u);
}

// Argument access for builtins: positional `k`, or keyword `name`, or the default.
struct Args {
  CallArgs& a;
  Pos p;
  const char* fn;
  size_t max_pos;
  Args(CallArgs& args, Pos pos, const char* f, size_t maxp) : a(args), p(pos), fn(f), max_pos(maxp) {
    if (a.pos.size() > max_pos)
      fail_at(p, fmt::format("{}() takes at most {} positional argument(s) ({} given)", fn, max_pos, a.pos.size()));
  }
  const Value* get(size_t k, const char* name) const {
    if (k < a.pos.size()) return &a.pos[k];
    for (const auto& [n, v] : a.kw)
      if (n == name) return &v;
    return nullptr;
  }
  Value val(size_t k, const char* name, Value dflt = Value::none()) const {
    const Value* v = get(k, name);
    return v ? *v : dflt;
  }
  const Value& need(size_t k, const char* name) const {
    const Value* v = get(k, name);
    if (!v) fail_at(p, fmt::format("{}() missing required argument '{}'", fn, name));
    return *v;
  }
  std::string str(size_t k, const char* name) const {
    const Value& v = need(k, name);
    if (v.kind != Kind::String) fail_at(p, fmt::format("{}() argument '{}' must be str, not {}", fn, name, type_name(v)));
    return v.s;
  }
  int64_t integer(size_t k, const char* name, int64_t dflt) const {
    const Value* v = get(k, name);
    if (!v || v->is_none()) return dflt;
    if (!is_int(*v)) fail_at(p, fmt::format("{}() argument '{}' must be int, not {}", fn, name, type_name(*v)));
    return as_int(*v);
  }
  void only_kw(std::initializer_list<const char*> names) const {
    for (const auto& [n, v] : a.kw) {
      bool ok = false;
      for (const char* x : names) ok = ok || n == x;
      if (!ok) fail_at(p, fmt::format("{}() got an unexpected keyword argument '{}'", fn, n));
    }
  }
};

Value string_method(const std::string& s, const std::string& name, CallArgs& ca, Pos p) {
  const char* fn = name.c_str();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Args a(ca, p, fn, 1);
    a.only_kw({"chars"});
    return Value::string(py_strip(s, a.val(0, "chars"), name != "rstrip", name != "lstrip", p));
  }
  if (name == "split" || name == "rsplit") {
    Args a(ca, p, fn, 2);
    a.only_kw({"sep", "maxsplit"});
    return Value::make_list(py_split(s, a.val(0, "sep"), a.integer(1, "maxsplit", -1), name == "rsplit", p));
  }
  if (name == "startswith" || name == "endswith") {
    Args a(ca, p, fn, 1);
    a.only_kw({});
    const Value& x = a.need(0, name == "startswith" ? "prefix" : "suffix");
    std::vector<std::string> options;
    if (x.kind == Kind::String) {
      options.push_back(x.s);
    } else if (x.kind == Kind::List && x.tuple) {
      for (const Value& o : *x.list) {
        if (o.kind != Kind::String) fail_at(p, fmt::format("tuple for {} must only contain str", name));
        options.push_back(o.s);
      }
    } else {
      fail_at(p, fmt::format("{} first arg must be str or a tuple of str, not {}", name, type_name(x)));
    }
    for (const std::string& o : options) {
      if (o.size() > s.size()) continue;
      if (name == "startswith" ? s.compare(0, o.size(), o) == 0 : s.compare(s.size() - o.size(), o.size(), o) == 0)
        return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    Args a(ca, p, fn, 0);
    a.only_kw({});
    if (name == "upper") return Value::string(py_upper_str(s));
    if (name == "lower") return Value::string(py_lower_str(s));
    if (name == "title") return Value::string(py_title(s));
    return Value::string(py_capitalize(s));
  }
  if (name == "replace") {
    Args a(ca, p, fn, 3);
    a.only_kw({"count"});
    return Value::string(py_replace(s, a.str(0, "old"), a.str(1, "new"), a.integer(2, "count", -1), p));
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "index") {
    Args a(ca, p, fn, 1);
    a.only_kw({});
    const std::string sub = a.str(0, "sub");
    if (name == "count") {
      if (sub.empty()) return Value::integer(int64_t(to_u32(s).size()) + 1);
      int64_t n = 0;
      for (size_t b = s.find(sub); b != std::string::npos; b = s.find(sub, b + sub.size())) ++n;
      return Value::integer(n);
    }
    const size_t f = name == "rfind" ? s.rfind(sub) : s.find(sub);
    if (f == std::string::npos) {
      if (name == "index") fail_at(p, "substring not found");
      return Value::integer(-1);
    }
    return Value::integer(int64_t(to_u32(std::string_view(s).substr(0, f)).size()));
  }
  if (name == "join") {
    Args a(ca, p, fn, 1);
    a.only_kw({});
    std::string out;
    bool first = true;
    for (const Value& x : iterate(a.need(0, "iterable"), p)) {
      if (x.kind != Kind::String) fail_at(p, fmt::format("sequence item: expected str instance, {} found", type_name(x)));
      if (!first) out += s;
      first = false;
      out += x.s;
      check_text(p, out.size());
    }
    return Value::string(out);
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
      name == "islower") {
    Args a(ca, p, fn, 0);
    a.only_kw({});
    const std::u32string u = to_u32(s);
    if (u.empty()) return Value::boolean(false);
    if (name == "isspace") return Value::boolean(std::all_of(u.begin(), u.end(), py_isspace));
    if (name == "isupper" || name == "islower") {
      bool any = false;
      for (char32_t c : u) {
        if (!is_cased(c)) continue;
        any = true;
        if (name == "isupper" ? py_upper(c) != c : py_lower(c) != c) return Value::boolean(false);
      }
      return Value::boolean(any);
    }
    for (char32_t c : u) {
      if (c >= 0x80) fail_at(p, fmt::format("str.{}() on non-ASCII text is not supported", name));
      const bool d = c >= '0' && c <= '9', al = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      if (name == "isdigit" && !d) return Value::boolean(false);
      if (name == "isalpha" && !al) return Value::boolean(false);
      if (name == "isalnum" && !(d || al)) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  fail_at(p, fmt::format("str.{}() is not supported", name));
}

bool is_string_method(const std::string& n) {
  static const char* names[] = {"strip",   "lstrip", "rstrip",     "split",   "rsplit", "startswith", "endswith",
                                "upper",   "lower",  "title",      "capitalize", "replace", "find",  "rfind",
                                "count",   "index",  "join",       "isdigit", "isalpha", "isalnum", "isspace",
                                "isupper", "islower", "format",    "splitlines", "center", "ljust", "rjust",
                                "zfill",   "encode", "partition", "rpartition", "casefold", "swapcase", "expandtabs"};
  for (const char* x : names)
    if (n == x) return true;
  return false;
}

bool is_dict_method(const std::string& n) {
  return n == "get" || n == "items" || n == "keys" || n == "values" || n == "copy" || n == "pop" ||
         n == "update" || n == "setdefault" || n == "popitem" || n == "clear";
}

bool is_list_mutator(const std::string& n) {
  return n == "append" || n == "extend" || n == "insert" || n == "pop" || n == "remove" || n == "clear" ||
         n == "sort" || n == "reverse";
}

Value items_of(const Value& d) {
  ValueList items;
  for (const auto& [k, v] : d.dict->items) items.push_back(Value::make_list({Value::string(k), v}, true));
  return Value::make_list(std::move(items));
}

Value dict_method(const Value& d, const std::string& name, CallArgs& ca, Pos p) {
  const char* fn = name.c_str();
  if (name == "get") {
    Args a(ca, p, fn, 2);
    a.only_kw({});
    const Value& key = a.need(0, "key");
    if (key.kind == Kind::String)
      if (const Value* v = d.dict->find(key.s)) return *v;
    return a.val(1, "default");
  }
  if (name == "items" || name == "keys" || name == "values") {
    Args a(ca, p, fn, 0);
    a.only_kw({});
    Value out;
    if (name == "items") {
      out = items_of(d);
      out.view = "dict_items";
    } else {
      ValueList xs;
      for (const auto& [k, v] : d.dict->items) xs.push_back(name == "keys" ? Value::string(k) : v);
      out = Value::make_list(std::move(xs));
      out.view = name == "keys" ? "dict_keys" : "dict_values";
    }
    return out;
  }
  if (name == "copy") return Value::make_dict(std::make_shared<DictData>(*d.dict));
  fail_at(p, fmt::format("dict.{}() modifies the dict, which the immutable sandbox forbids", name));
}

Value bound(const Value& self, const std::string& name, Pos p) {
  if (self.kind == Kind::String) {
    if (!is_string_method(name)) return Value::undefined(fmt::format("'str object' has no attribute '{}'", name));
    return Value::callable("str." + name, [s = self.s, name, p](CallArgs& a) { return string_method(s, name, a, p); });
  }
  return Value::callable("dict." + name, [self, name, p](CallArgs& a) { return dict_method(self, name, a, p); });
}

std::string obj_desc(const Value& v) {
  if (v.is_none()) return "'None'";
  return "'" + type_name(v) + " object'";
}

// jinja2's environment.getattr: the attribute, else the item.
Value get_attr(const Value& obj, const std::string& name, Pos p) {
  switch (obj.kind) {
    case Kind::Undefined: fail_undefined(p, obj);
    case Kind::String: return bound(obj, name, p);
    case Kind::Dict:
      if (is_dict_method(name)) return bound(obj, name, p);
      if (const Value* v = obj.dict->find(name)) return *v;
      break;
    case Kind::Namespace:
      if (const Value* v = obj.dict->find(name)) return *v;
      break;
    case Kind::List:
      if (is_list_mutator(name))
        return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(obj)));
      break;
    default: break;
  }
  return Value::undefined(fmt::format("{} has no attribute '{}'", obj_desc(obj), name));
}

int64_t norm_index(int64_t k, int64_t n) { return k < 0 ? k + n : k; }

// jinja2's environment.getitem: the item, else the attribute.
Value get_item(const Value& obj, const Value& key, Pos p) {
  if (obj.is_undefined()) fail_undefined(p, obj);
  if (key.is_undefined() && obj.kind != Kind::Dict) fail_undefined(p, key);
  switch (obj.kind) {
    case Kind::Dict:
    case Kind::Namespace:
      if (key.kind == Kind::String) {
        if (const Value* v = obj.dict->find(key.s)) return *v;
        if (obj.kind == Kind::Dict && is_dict_method(key.s)) return bound(obj, key.s, p);
        return Value::undefined(fmt::format("{} has no attribute '{}'", obj_desc(obj), key.s));
      }
      return Value::undefined(fmt::format("{} has no attribute {}", obj_desc(obj), py_repr(key)));
    case Kind::List:
      if (is_int(key)) {
        const int64_t n = int64_t(obj.list->size()), k = norm_index(as_int(key), n);
        if (k >= 0 && k < n) return (*obj.list)[size_t(k)];
        return Value::undefined(fmt::format("{} has no element {}", obj_desc(obj), as_int(key)));
      }
      if (key.kind == Kind::String) return get_attr(obj, key.s, p);
      fail_at(p, fmt::format("list indices must be integers or slices, not {}", type_name(key)));
    case Kind::String:
      if (is_int(key)) {
        const std::u32string u = to_u32(obj.s);
        const int64_t n = int64_t(u.size()), k = norm_index(as_int(key), n);
        if (k >= 0 && k < n) {
          std::string one;
          append_utf8(one, u[size_t(k)]);
          return Value::string(one);
        }
        return Value::undefined(fmt::format("{} has no element {}", obj_desc(obj), as_int(key)));
      }
      if (key.kind == Kind::String) return get_attr(obj, key.s, p);
      fail_at(p, fmt::format("string indices must be integers, not {}", type_name(key)));
    default:
      if (key.kind == Kind::String) return get_attr(obj, key.s, p);
      return Value::undefined(fmt::format("{} has no element {}", obj_desc(obj), py_repr(key)));
  }
}

// Python's slice indices for a sequence of length n.
std::vector<int64_t> slice_indices(const Value& start, const Value& stop, const Value& step, int64_t n, Pos p) {
  auto get = [&](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (!is_int(v)) fail_at(p, fmt::format("slice {} must be an integer or None, not {}", what, type_name(v)));
    return as_int(v);
  };
  const int64_t st = get(step, "step").value_or(1);
  if (st == 0) fail_at(p, "slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t v = *x;
    if (v < 0) {
      v += n;
      if (v < 0) v = st < 0 ? -1 : 0;
    } else if (v >= n) {
      v = st < 0 ? n - 1 : n;
    }
    return v;
  };
  const int64_t b = clamp(get(start, "start"), st < 0 ? n - 1 : 0);
  const int64_t e = clamp(get(stop, "stop"), st < 0 ? -1 : n);
  std::vector<int64_t> idx;
  if (st > 0)
    for (int64_t k = b; k < e; k += st) idx.push_back(k);
  else
    for (int64_t k = b; k > e; k += st) idx.push_back(k);
  return idx;
}

// ---- arithmetic ----

[[noreturn]] void bad_operands(const char* op, const Value& a, const Value& b, Pos p) {
  if (a.is_undefined()) fail_undefined(p, a);
  if (b.is_undefined()) fail_undefined(p, b);
  if (std::string(op) == "+" && a.kind == Kind::String)
    fail_at(p, fmt::format("can only concatenate str (not \"{}\") to str", type_name(b)));
  if (std::string(op) == "+" && a.kind == Kind::List && !a.tuple)
    fail_at(p, fmt::format("can only concatenate list (not \"{}\") to list", type_name(b)));
  fail_at(p, fmt::format("unsupported operand type(s) for {}: {} and {}", op, quoted_type(a), quoted_type(b)));
}

Value int_result(__int128 r, Pos p) {
  if (r > std::numeric_limits<int64_t>::max() || r < std::numeric_limits<int64_t>::min())
    fail_at(p, "integer result outside the interpreter's 64-bit range");
  return Value::integer(int64_t(r));
}

Value repeat(const Value& seq, int64_t n, Pos p) {
  if (n < 0) n = 0;
  if (seq.kind == Kind::String) {
    if (n > 0 && seq.s.size() > kMaxText / size_t(n)) check_text(p, kMaxText + 1);
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += seq.s;
    return Value::string(out);
  }
  if (n > 0 && seq.list->size() > kMaxItems / size_t(n))
    fail_at(p, fmt::format("list longer than the interpreter's limit of {} items", kMaxItems));
  ValueList out;
  for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return Value::make_list(std::move(out), seq.tuple);
}

Value arith(const std::string& op, const Value& a, const Value& b, Pos p) {
  const char* o = op.c_str();
  if (op == "+") {
    if (a.kind == Kind::String && b.kind == Kind::String) {
      check_text(p, a.s.size() + b.s.size());
      return Value::string(a.s + b.s);
    }
    if (a.kind == Kind::List && b.kind == Kind::List && a.tuple == b.tuple) {
      ValueList out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(out), a.tuple);
    }
  }
  if (op == "*") {
    if ((a.kind == Kind::String || a.kind == Kind::List) && is_int(b)) return repeat(a, as_int(b), p);
    if ((b.kind == Kind::String || b.kind == Kind::List) && is_int(a)) return repeat(b, as_int(a), p);
  }
  if (op == "%" && a.kind == Kind::String) fail_at(p, "printf-style string formatting ('%' on a string) is not supported");
  if (!a.is_number() || !b.is_number()) bad_operands(o, a, b, p);
  const bool ints = is_int(a) && is_int(b);
  if (op == "/") {
    if (as_float(b) == 0) fail_at(p, "division by zero");
    return Value::real(as_float(a) / as_float(b));
  }
  if (ints) {
    const __int128 x = as_int(a), y = as_int(b);
    if (op == "+") return int_result(x + y, p);
    if (op == "-") return int_result(x - y, p);
    if (op == "*") return int_result(x * y, p);
    if (op == "//" || op == "%") {
      if (y == 0) fail_at(p, "integer division or modulo by zero");
      __int128 q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        q -= 1;
        r += y;
      }
      return int_result(op == "//" ? q : r, p);
    }
    if (op == "**") {
      if (y < 0) return Value::real(std::pow(double(x), double(y)));
      __int128 r = 1;
      for (__int128 k = 0; k < y; ++k) {
        r *= x;
        if (r > std::numeric_limits<int64_t>::max() || r < std::numeric_limits<int64_t>::min()) int_result(r, p);
        if (r == 0 || r == 1) break;
        if (r == -1) {
          r = (y % 2 == 0) ? 1 : -1;
          break;
        }
      }
      return int_result(r, p);
    }
  }
  const double x = as_float(a), y = as_float(b);
  if (op == "+") return Value::real(x + y);
  if (op == "-") return Value::real(x - y);
  if (op == "*") return Value::real(x * y);
  if (op == "//" || op == "%") {
    if (y == 0) fail_at(p, "float division or modulo by zero");
    double mod = std::fmod(x, y), div = (x - mod) / y;
    if (mod != 0) {
      if ((y < 0) != (mod < 0)) {
        mod += y;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, y);
    }
    if (op == "%") return Value::real(mod);
    double floordiv;
    if (div != 0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
      floordiv = std::copysign(0.0, x / y);
    }
    return Value::real(floordiv);
  }
  if (op == "**") {
    if (x == 0 && y < 0) fail_at(p, "0.0 cannot be raised to a negative power");
    if (x < 0 && y != std::floor(y)) fail_at(p, "a negative number raised to a fractional power is complex");
    return Value::real(std::pow(x, y));
  }
  bad_operands(o, a, b, p);
}

// ---- the interpreter ----

class Interp;

struct LoopState {
  int64_t index0, length;
};

class Interp {
 public:
  explicit Interp(Scope& root) : root_(root) {}

  Flow exec(const Body& body, Scope& sc, std::string& out) {
    for (const NodePtr& n : body) {
      step(n->pos);
      const Flow f = exec_node(*n, sc, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

 private:
  Scope& root_;
  int call_depth_ = 0;
  int64_t steps_ = 0;

  void step(Pos p) {
    if (++steps_ > kMaxSteps)
      fail_at(p, fmt::format("the template ran more than the interpreter's limit of {} steps", kMaxSteps));
  }

  // Namespaces are the only mutable values: one may not hold another (no cycles).
  static bool holds_namespace(const Value& v) {
    if (v.kind == Kind::Namespace) return true;
    if (v.kind == Kind::List)
      for (const Value& x : *v.list)
        if (holds_namespace(x)) return true;
    if (v.kind == Kind::Dict)
      for (const auto& [k, x] : v.dict->items)
        if (holds_namespace(x)) return true;
    return false;
  }

  static void emit(std::string& out, const std::string& s, Pos p) {
    out += s;
    check_text(p, out.size());
  }

  void assign(Scope& sc, const Node& n, const Value& v) {
    if (!n.target_tuple) {
      sc.vars[n.targets[0]] = v;
      return;
    }
    if (v.kind != Kind::List) fail_at(n.pos, fmt::format("cannot unpack non-iterable {} object", type_name(v)));
    if (v.list->size() != n.targets.size())
      fail_at(n.pos, fmt::format("cannot unpack {} values into {} names", v.list->size(), n.targets.size()));
    for (size_t k = 0; k < n.targets.size(); ++k) sc.vars[n.targets[k]] = (*v.list)[k];
  }

  Flow exec_node(const Node& n, Scope& sc, std::string& out) {
    switch (n.type) {
      case NodeType::Text: emit(out, n.text, n.pos); return Flow::Normal;
      case NodeType::Output: emit(out, py_str(eval(*n.expr, sc)), n.pos); return Flow::Normal;
      case NodeType::If:
        for (const auto& [cond, body] : n.branches)
          if (eval(*cond, sc).truthy()) return exec(body, sc, out);
        return exec(n.else_body, sc, out);
      case NodeType::For: return exec_for(n, sc, out);
      case NodeType::Set: assign(sc, n, eval(*n.expr, sc)); return Flow::Normal;
      case NodeType::SetAttr: {
        const Value* obj = sc.find(n.targets[0]);
        if (!obj || obj->kind != Kind::Namespace || obj->view)
          fail_at(n.pos, fmt::format("cannot assign attribute '{}' on {}: not a namespace object", n.targets[1],
                                     obj ? type_name(*obj) : "an undefined name '" + n.targets[0] + "'"));
        Value v = eval(*n.expr, sc);
        if (holds_namespace(v))
          fail_at(n.pos, fmt::format("storing a namespace in a namespace attribute ('{}') is not supported", n.targets[1]));
        obj->dict->set(n.targets[1], std::move(v));
        return Flow::Normal;
      }
      case NodeType::SetBlock: {
        std::string text;
        Scope inner{{}, &sc};
        exec(n.body, inner, text);
        sc.vars[n.targets[0]] = Value::string(std::move(text));
        return Flow::Normal;
      }
      case NodeType::Macro: sc.vars[n.name] = make_macro(n); return Flow::Normal;
      case NodeType::Break: return Flow::Break;
      case NodeType::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  Value make_macro(const Node& n) {
    const Node* node = &n;
    return Value::callable(n.name, [this, node](CallArgs& a) -> Value {
      if (a.pos.size() > node->params.size())
        fail_at(node->pos, fmt::format("macro '{}' takes not more than {} argument(s)", node->name, node->params.size()));
      if (++call_depth_ > kMaxCallDepth) {
        call_depth_ = 0;
        fail_at(node->pos, fmt::format("macro '{}': calls nested more than {} deep", node->name, kMaxCallDepth));
      }
      Scope sc{{}, &root_};
      for (size_t k = 0; k < node->params.size(); ++k) {
        const std::string& name = node->params[k];
        const Value* given = k < a.pos.size() ? &a.pos[k] : nullptr;
        for (const auto& [kn, kv] : a.kw)
          if (kn == name) {
            if (given) fail_at(node->pos, fmt::format("macro '{}' got multiple values for argument '{}'", node->name, name));
            given = &kv;
          }
        if (given) sc.vars[name] = *given;
        else if (node->defaults[k]) sc.vars[name] = eval(*node->defaults[k], sc);
        else sc.vars[name] = Value::undefined(fmt::format("'{}' is undefined", name));
      }
      for (const auto& [kn, kv] : a.kw)
        if (std::find(node->params.begin(), node->params.end(), kn) == node->params.end())
          fail_at(node->pos, fmt::format("macro '{}' takes no keyword argument '{}'", node->name, kn));
      std::string text;
      exec(node->body, sc, text);
      --call_depth_;
      return Value::string(std::move(text));
    });
  }

  Flow exec_for(const Node& n, Scope& sc, std::string& out) {
    const Value seq = eval(*n.expr, sc);
    std::vector<Value> items = iterate(seq, n.expr->pos);
    if (n.filter) {
      std::vector<Value> kept;
      for (const Value& it : items) {
        Scope f{{}, &sc};
        assign(f, n, it);
        if (eval(*n.filter, f).truthy()) kept.push_back(it);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(n.else_body, sc, out);
    const int64_t len = int64_t(items.size());
    for (int64_t k = 0; k < len; ++k) {
      step(n.pos);
      Scope it{{}, &sc};
      assign(it, n, items[size_t(k)]);
      auto loop = std::make_shared<DictData>();
      loop->items = {{"index", Value::integer(k + 1)},
                     {"index0", Value::integer(k)},
                     {"revindex", Value::integer(len - k)},
                     {"revindex0", Value::integer(len - k - 1)},
                     {"first", Value::boolean(k == 0)},
                     {"last", Value::boolean(k == len - 1)},
                     {"length", Value::integer(len)},
                     {"depth", Value::integer(1)},
                     {"depth0", Value::integer(0)},
                     {"previtem", k > 0 ? items[size_t(k - 1)] : Value::undefined("there is no previous item")},
                     {"nextitem", k + 1 < len ? items[size_t(k + 1)] : Value::undefined("there is no next item")}};
      const Pos lp = n.pos;
      loop->items.emplace_back("cycle", Value::callable("loop.cycle", [k, lp](CallArgs& a) {
                                 if (a.pos.empty()) fail_at(lp, "no items for cycling given");
                                 return a.pos[size_t(k) % a.pos.size()];
                               }));
      Value lv;
      lv.kind = Kind::Namespace;
      lv.view = "LoopContext";  // not a namespace to {% set loop.x = ... %}
      lv.dict = std::move(loop);
      it.vars["loop"] = std::move(lv);
      const Flow f = exec(n.body, it, out);
      if (f == Flow::Break) break;
    }
    return Flow::Normal;
  }

 public:
  Value eval(const Expr& e, Scope& sc) {
    switch (e.type) {
      case ExprType::Literal: return e.value;
      case ExprType::Name: {
        if (const Value* v = sc.find(e.name)) return *v;
        return Value::undefined(fmt::format("'{}' is undefined", e.name));
      }
      case ExprType::List:
      case ExprType::Tuple: {
        ValueList xs;
        for (const auto& a : e.args) xs.push_back(eval(*a, sc));
        return Value::make_list(std::move(xs), e.type == ExprType::Tuple);
      }
      case ExprType::Dict: {
        auto d = std::make_shared<DictData>();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k], sc);
          if (key.kind != Kind::String)
            fail_at(e.args[k]->pos, fmt::format("dict keys other than strings ({}) are not supported", type_name(key)));
          d->set(key.s, eval(*e.args[k + 1], sc));
        }
        return Value::make_dict(std::move(d));
      }
      case ExprType::Attr: return get_attr(eval(*e.args[0], sc), e.name, e.pos);
      case ExprType::Item: return get_item(eval(*e.args[0], sc), eval(*e.args[1], sc), e.pos);
      case ExprType::Slice: {
        const Value obj = eval(*e.args[0], sc);
        Value parts[3];
        for (int k = 0; k < 3; ++k) parts[k] = e.args[size_t(k) + 1] ? eval(*e.args[size_t(k) + 1], sc) : Value::none();
        if (obj.is_undefined()) fail_undefined(e.pos, obj);
        if (obj.kind == Kind::String) {
          const std::u32string u = to_u32(obj.s);
          std::u32string r;
          for (int64_t k : slice_indices(parts[0], parts[1], parts[2], int64_t(u.size()), e.pos)) r += u[size_t(k)];
          return Value::string(from_u32(r));
        }
        if (obj.kind == Kind::List) {
          ValueList r;
          for (int64_t k : slice_indices(parts[0], parts[1], parts[2], int64_t(obj.list->size()), e.pos))
            r.push_back((*obj.list)[size_t(k)]);
          return Value::make_list(std::move(r), obj.tuple);
        }
        fail_at(e.pos, fmt::format("{} object is not subscriptable", quoted_type(obj)));
      }
      case ExprType::Call: {
        const Value callee = eval(*e.args[0], sc);
        CallArgs a = eval_args(e, sc, 1);
        if (callee.is_undefined()) fail_undefined(e.pos, callee);
        if (callee.kind != Kind::Callable) fail_at(e.pos, fmt::format("{} object is not callable", quoted_type(callee)));
        return callee.fn->fn(a);
      }
      case ExprType::Filter: {
        const Value input = eval(*e.args[0], sc);
        CallArgs a = eval_args(e, sc, 1);
        return apply_filter(e.name, input, a, e.pos, sc);
      }
      case ExprType::Test: {
        const Value input = eval(*e.args[0], sc);
        CallArgs a = eval_args(e, sc, 1);
        const bool r = apply_test(e.name, input, a, e.pos, sc);
        return Value::boolean(e.negated ? !r : r);
      }
      case ExprType::Unary: {
        const Value v = eval(*e.args[0], sc);
        if (e.name == "not") return Value::boolean(!v.truthy());
        if (v.is_undefined()) fail_undefined(e.pos, v);
        if (!v.is_number()) fail_at(e.pos, fmt::format("bad operand type for unary {}: {}", e.name, quoted_type(v)));
        if (e.name == "+") return v.kind == Kind::Bool ? Value::integer(as_int(v)) : v;
        if (v.kind == Kind::Float) return Value::real(-v.f);
        return int_result(-__int128(as_int(v)), e.pos);
      }
      case ExprType::Binary: {
        if (e.name == "and") {
          Value a = eval(*e.args[0], sc);
          return a.truthy() ? eval(*e.args[1], sc) : a;
        }
        if (e.name == "or") {
          Value a = eval(*e.args[0], sc);
          return a.truthy() ? a : eval(*e.args[1], sc);
        }
        const Value a = eval(*e.args[0], sc), b = eval(*e.args[1], sc);
        if (e.name == "~") {
          std::string s = py_str(a);
          s += py_str(b);
          check_text(e.pos, s.size());
          return Value::string(std::move(s));
        }
        return arith(e.name, a, b, e.pos);
      }
      case ExprType::Compare: {
        Value left = eval(*e.args[0], sc);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.args[k + 1], sc);
          const std::string& op = e.ops[k];
          bool r;
          if (op == "==") r = py_eq(left, right);
          else if (op == "!=") r = !py_eq(left, right);
          else if (op == "in") r = py_in(left, right, e.pos);
          else if (op == "notin") r = !py_in(left, right, e.pos);
          else {
            const int c = py_cmp(left, right, op.c_str(), e.pos);
            r = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
          }
          if (!r) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case ExprType::Cond: {
        if (eval(*e.args[1], sc).truthy()) return eval(*e.args[0], sc);
        if (e.args[2]) return eval(*e.args[2], sc);
        return Value::undefined("the inline if expression's condition was false and it has no else");
      }
    }
    fail_at(e.pos, "unknown expression");
  }

 private:
  CallArgs eval_args(const Expr& e, Scope& sc, size_t first) {
    CallArgs a;
    for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k], sc));
    for (size_t k = 0; k < e.kwargs.size(); ++k) a.kw.emplace_back(e.kwnames[k], eval(*e.kwargs[k], sc));
    return a;
  }

  // attribute path "a.b" lookups, as jinja2's make_attrgetter (getitem per part, ints for digits)
  static Value attr_path(const Value& v, const std::string& path, Pos p) {
    Value cur = v;
    size_t b = 0;
    while (true) {
      const size_t d = path.find('.', b);
      const std::string part = path.substr(b, d == std::string::npos ? std::string::npos : d - b);
      const bool digits =
          !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (digits && part.size() > 18) return Value::undefined(fmt::format("no element {}", part));  // past any list
      cur = get_item(cur, digits ? Value::integer(std::stoll(part)) : Value::string(part), p);
      if (d == std::string::npos) return cur;
      b = d + 1;
    }
  }

  Value apply_filter(const std::string& name, const Value& v, CallArgs& ca, Pos p, Scope& sc);
  bool apply_test(const std::string& name, const Value& v, CallArgs& ca, Pos p, Scope& sc);
};

Value Interp::apply_filter(const std::string& name, const Value& v, CallArgs& ca, Pos p, Scope& sc) {
  const char* fn = name.c_str();
  auto need_str = [&](const Value& x) -> std::string {
    if (x.is_undefined()) return "";
    return py_str(x);
  };
  if (name == "trim") {
    Args a(ca, p, fn, 1);
    a.only_kw({"chars"});
    return Value::string(py_strip(need_str(v), a.val(0, "chars"), true, true, p));
  }
  if (name == "length" || name == "count") {
    Args a(ca, p, fn, 0);
    a.only_kw({});
    return Value::integer(py_len(v, p));
  }
  if (name == "tojson") {
    Args a(ca, p, fn, 4);
    a.only_kw({"ensure_ascii", "indent", "separators", "sort_keys"});
    JsonOptions o;
    o.ensure_ascii = a.val(0, "ensure_ascii", Value::boolean(false)).truthy();
    const Value ind = a.val(1, "indent");
    if (is_int(ind)) o.indent = std::string(size_t(std::clamp<int64_t>(as_int(ind), 0, 1 << 16)), ' ');
    else if (ind.kind == Kind::String) o.indent = ind.s;
    else if (!ind.is_none()) fail_at(p, fmt::format("tojson: indent must be an int, a str or None, not {}", type_name(ind)));
    const Value sep = a.val(2, "separators");
    if (sep.kind == Kind::List && sep.list->size() == 2 && (*sep.list)[0].kind == Kind::String &&
        (*sep.list)[1].kind == Kind::String)
      o.separators = std::make_pair((*sep.list)[0].s, (*sep.list)[1].s);
    else if (!sep.is_none()) fail_at(p, "tojson: separators must be a pair of strings or None");
    o.sort_keys = a.val(3, "sort_keys", Value::boolean(false)).truthy();
    try {
      std::string s = json_dumps(v, o);
      check_text(p, s.size());
      return Value::string(std::move(s));
    } catch (const Error& e) {
      fail_at(p, e.what());
    }
  }
  if (name == "string") return Value::string(need_str(v));
  if (name == "first" || name == "last") {
    Args a(ca, p, fn, 0);
    a.only_kw({});
    std::vector<Value> xs = iterate(v, p);
    if (xs.empty()) return Value::undefined(fmt::format("No {} item, sequence was empty.", name));
    return name == "first" ? xs.front() : xs.back();
  }
  if (name == "join") {
    Args a(ca, p, fn, 2);
    a.only_kw({"d", "attribute"});
    const Value sep = a.val(0, "d", Value::string(""));
    const Value attr = a.val(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& x : iterate(v, p)) {
      if (!first) out += need_str(sep);
      first = false;
      out += need_str(attr.is_none() ? x : attr_path(x, py_str(attr), p));
      check_text(p, out.size());
    }
    return Value::string(out);
  }
  if (name == "default" || name == "d") {
    Args a(ca, p, fn, 2);
    a.only_kw({"default_value", "boolean"});
    const Value dflt = a.val(0, "default_value", Value::string(""));
    const bool boolean = a.val(1, "boolean", Value::boolean(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return dflt;
    return v;
  }
  if (name == "upper") return Value::string(py_upper_str(need_str(v)));
  if (name == "lower") return Value::string(py_lower_str(need_str(v)));
  if (name == "title") return Value::string(py_title(need_str(v)));
  if (name == "capitalize") return Value::string(py_capitalize(need_str(v)));
  if (name == "replace") {
    Args a(ca, p, fn, 3);
    a.only_kw({"old", "new", "count"});
    return Value::string(py_replace(need_str(v), a.str(0, "old"), a.str(1, "new"), a.integer(2, "count", -1), p));
  }
  if (name == "list") return Value::make_list(iterate(v, p));
  if (name == "items") {
    if (v.is_undefined()) return Value::make_list({});
    if (v.kind != Kind::Dict) fail_at(p, fmt::format("Can only get item pairs from a mapping, not {}", type_name(v)));
    return items_of(v);
  }
  if (name == "int" || name == "float") {
    Args a(ca, p, fn, name == "int" ? 2 : 1);
    a.only_kw({"default", "base"});
    const Value dflt = a.val(0, "default", name == "int" ? Value::integer(0) : Value::real(0));
    if (name == "int" && a.integer(1, "base", 10) != 10) fail_at(p, "int filter: only base 10 is supported");
    if (v.kind == Kind::Int || v.kind == Kind::Bool) return name == "int" ? Value::integer(as_int(v)) : Value::real(as_float(v));
    if (v.kind == Kind::Float) {
      if (name == "float") return v;
      if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return dflt;
      return Value::integer(int64_t(v.f));
    }
    if (v.kind == Kind::String) {
      std::string t = py_strip(v.s, Value::none(), true, true, p);
      if (t.find('_') != std::string::npos) {  // Python's int() takes "1_000" (one _ between digits)
        bool ok = true;
        for (size_t k = 0; k < t.size(); ++k)
          if (t[k] == '_' && !(k > 0 && k + 1 < t.size() && std::isdigit(static_cast<unsigned char>(t[k - 1])) &&
                               std::isdigit(static_cast<unsigned char>(t[k + 1]))))
            ok = false;
        if (!ok) return dflt;
        t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
      }
      if (!t.empty()) {
        char* end = nullptr;
        errno = 0;
        if (name == "int") {
          const long long x = std::strtoll(t.c_str(), &end, 10);
          if (end && *end == 0 && errno == 0) return Value::integer(x);
        }
        errno = 0;
        const double d = std::strtod(t.c_str(), &end);
        const bool hex = t.find_first_of("xX") != std::string::npos;
        if (end && *end == 0 && !hex) {
          if (name == "float") return Value::real(d);
          if (std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(int64_t(d));
        }
      }
      return dflt;
    }
    return dflt;
  }
  if (name == "abs") {
    if (v.kind == Kind::Float) return Value::real(std::fabs(v.f));
    if (is_int(v)) return int_result(as_int(v) < 0 ? -__int128(as_int(v)) : __int128(as_int(v)), p);
    fail_at(p, fmt::format("bad operand type for abs(): {}", quoted_type(v)));
  }
  if (name == "reverse") {
    if (v.kind == Kind::String) {
      std::u32string u = to_u32(v.s);
      std::reverse(u.begin(), u.end());
      return Value::string(from_u32(u));
    }
    std::vector<Value> xs = iterate(v, p);
    std::reverse(xs.begin(), xs.end());
    return Value::make_list(std::move(xs));
  }
  if (name == "safe") return v;
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "selectattr" || name == "select";
    if (!ca.kw.empty()) fail_at(p, fmt::format("{}: keyword arguments are not supported", name));
    size_t k = 0;
    std::string attr;
    if (by_attr) {
      if (ca.pos.empty() || ca.pos[0].kind != Kind::String) fail_at(p, fmt::format("{}: an attribute name is required", name));
      attr = ca.pos[0].s;
      k = 1;
    }
    std::string test;
    if (k < ca.pos.size()) {
      if (ca.pos[k].kind != Kind::String) fail_at(p, fmt::format("{}: the test name must be a string", name));
      test = ca.pos[k].s;
      if (!is_known_test(test)) fail_at(p, fmt::format("unsupported test '{}'", test));
      ++k;
    }
    CallArgs rest;
    rest.pos.assign(ca.pos.begin() + std::ptrdiff_t(k), ca.pos.end());
    ValueList out;
    for (const Value& x : iterate(v, p)) {
      const Value subject = by_attr ? attr_path(x, attr, p) : x;
      CallArgs targs = rest;
      const bool r = test.empty() ? subject.truthy() : apply_test(test, subject, targs, p, sc);
      if (r == keep_if) out.push_back(x);
    }
    return Value::make_list(std::move(out));
  }
  if (name == "map") {
    ValueList out;
    std::string attr;
    Value dflt;
    bool has_default = false;
    for (const auto& [kn, kv] : ca.kw) {
      if (kn == "attribute") attr = py_str(kv);
      else if (kn == "default") {
        dflt = kv;
        has_default = true;
      } else fail_at(p, fmt::format("map: unexpected keyword argument '{}'", kn));
    }
    if (!attr.empty()) {
      for (const Value& x : iterate(v, p)) {
        Value r = attr_path(x, attr, p);
        out.push_back(r.is_undefined() && has_default ? dflt : r);
      }
      return Value::make_list(std::move(out));
    }
    if (ca.pos.empty() || ca.pos[0].kind != Kind::String) fail_at(p, "map: a filter name or attribute= is required");
    const std::string filter = ca.pos[0].s;
    if (!is_known_filter(filter)) fail_at(p, fmt::format("unsupported filter '{}'", filter));
    for (const Value& x : iterate(v, p)) {
      CallArgs fa;
      fa.pos.assign(ca.pos.begin() + 1, ca.pos.end());
      out.push_back(apply_filter(filter, x, fa, p, sc));
    }
    return Value::make_list(std::move(out));
  }
  fail_at(p, fmt::format("unsupported filter '{}'", name));
}

bool Interp::apply_test(const std::string& name, const Value& v, CallArgs& ca, Pos p, Scope& sc) {
  (void)sc;
  auto arg = [&]() -> const Value& {
    if (ca.pos.empty()) fail_at(p, fmt::format("test '{}' needs an argument", name));
    return ca.pos[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.kind == Kind::String;
  if (name == "mapping") return v.kind == Kind::Dict;
  if (name == "iterable") return v.kind == Kind::String || v.kind == Kind::List || v.kind == Kind::Dict || v.is_undefined();
  if (name == "sequence") return v.kind == Kind::String || v.kind == Kind::List || v.kind == Kind::Dict || v.is_undefined();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Kind::Int;
  if (name == "float") return v.kind == Kind::Float;
  if (name == "boolean") return v.kind == Kind::Bool;
  if (name == "true") return v.kind == Kind::Bool && v.b;
  if (name == "false") return v.kind == Kind::Bool && !v.b;
  if (name == "callable") return v.kind == Kind::Callable;
  if (name == "eq" || name == "equalto" || name == "==") return py_eq(v, arg());
  if (name == "ne" || name == "!=") return !py_eq(v, arg());
  if (name == "lt" || name == "lessthan" || name == "<") return py_cmp(v, arg(), "<", p) < 0;
  if (name == "le" || name == "<=") return py_cmp(v, arg(), "<=", p) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return py_cmp(v, arg(), ">", p) > 0;
  if (name == "ge" || name == ">=") return py_cmp(v, arg(), ">=", p) >= 0;
  if (name == "in") return py_in(v, arg(), p);
  if (name == "sameas") {
    const Value& o = arg();
    if (v.kind != o.kind) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.kind == Kind::Bool) return v.b == o.b;
    if (v.kind == Kind::List) return v.list == o.list;
    if (v.is_mapping()) return v.dict == o.dict;
    fail_at(p, fmt::format("test 'sameas' on {} values is not supported", type_name(v)));
  }
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (v.is_undefined()) fail_undefined(p, v);
    if (!is_int(v)) fail_at(p, fmt::format("test '{}' needs an integer, not {}", name, type_name(v)));
    if (name == "divisibleby") {
      const Value& d = arg();
      if (!is_int(d)) fail_at(p, "test 'divisibleby' needs an integer divisor");
      if (as_int(d) == 0) fail_at(p, "integer division or modulo by zero");
      return arith("%", v, d, p).i == 0;
    }
    const int64_t r = as_int(v) % 2;
    return name == "even" ? r == 0 : r != 0;
  }
  if (name == "lower" || name == "upper") {
    if (v.kind != Kind::String) fail_at(p, fmt::format("test '{}' needs a string", name));
    CallArgs none;
    return string_method(v.s, name == "lower" ? "islower" : "isupper", none, p).b;
  }
  fail_at(p, fmt::format("unsupported test '{}'", name));
}

Value builtin_range(CallArgs& ca, Pos p) {
  if (!ca.kw.empty()) fail_at(p, "range() takes no keyword arguments");
  if (ca.pos.empty() || ca.pos.size() > 3) fail_at(p, fmt::format("range expected 1 to 3 arguments, got {}", ca.pos.size()));
  for (const Value& x : ca.pos)
    if (!is_int(x)) fail_at(p, fmt::format("{} object cannot be interpreted as an integer", quoted_type(x)));
  int64_t start = 0, stop, step = 1;
  if (ca.pos.size() == 1) {
    stop = as_int(ca.pos[0]);
  } else {
    start = as_int(ca.pos[0]);
    stop = as_int(ca.pos[1]);
    if (ca.pos.size() == 3) step = as_int(ca.pos[2]);
  }
  if (step == 0) fail_at(p, "range() arg 3 must not be zero");
  const __int128 span = step > 0 ? __int128(stop) - start : __int128(start) - stop;
  const __int128 n = span <= 0 ? 0 : (span + (step > 0 ? step : -__int128(step)) - 1) / (step > 0 ? step : -__int128(step));
  if (n > __int128(kMaxItems)) fail_at(p, fmt::format("range of more than the interpreter's limit of {} items", kMaxItems));
  ValueList xs;
  for (__int128 k = 0; k < n; ++k) xs.push_back(Value::integer(int64_t(start + k * step)));
  return Value::make_list(std::move(xs));
}

void add_globals(Scope& root) {
  const Pos none{0, 0};
  root.vars["range"] = Value::callable("range", [none](CallArgs& a) { return builtin_range(a, none); });
  root.vars["namespace"] = Value::callable("namespace", [](CallArgs& a) {
    Value ns = Value::make_namespace();
    for (const Value& x : a.pos) {
      if (x.kind != Kind::Dict) fail("namespace() takes a mapping as its positional argument, not {}", type_name(x));
      for (const auto& [k, v] : x.dict->items) ns.dict->set(k, v);
    }
    for (const auto& [k, v] : a.kw) ns.dict->set(k, v);
    ns.depth = Value::make_dict(ns.dict).depth;  // its nesting, counted as a dict's
    return ns;
  });
  root.vars["dict"] = Value::callable("dict", [](CallArgs& a) {
    Value d = Value::make_dict();
    for (const Value& x : a.pos) {
      if (x.kind != Kind::Dict) fail("dict() takes a mapping as its positional argument, not {}", type_name(x));
      for (const auto& [k, v] : x.dict->items) d.dict->set(k, v);
    }
    for (const auto& [k, v] : a.kw) d.dict->set(k, v);
    return Value::make_dict(d.dict);  // its depth counted
  });
  root.vars["raise_exception"] = Value::callable("raise_exception", [](CallArgs& a) -> Value {
    const std::string msg = a.pos.empty() ? std::string() : py_str(a.pos[0]);
    if (msg.empty()) throw Error("the template called raise_exception() without a message");
    throw Error(printable_line(msg, kMaxErrorBytes));  // cut before escaping: the text may be 64 MB
  });
  root.vars["strftime_now"] = Value::callable("strftime_now", [](CallArgs& a) -> Value {
    if (a.pos.size() != 1 || a.pos[0].kind != Kind::String) fail("strftime_now() takes one format string");
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
    if (n == 0 && !a.pos[0].s.empty()) fail("strftime_now(): the formatted time is empty or too long");
    return Value::string(std::string(buf, n));
  });
}

}  // namespace

bool is_known_filter(std::string_view n) {
  static const char* names[] = {"trim",   "length",  "count",   "tojson",  "string", "first",   "last",
                                "join",   "default", "d",       "upper",   "lower",  "title",   "capitalize",
                                "replace", "list",   "items",   "int",     "float",  "abs",     "reverse",
                                "safe",   "selectattr", "rejectattr", "select", "reject", "map"};
  for (const char* x : names)
    if (n == x) return true;
  return false;
}

bool is_known_test(std::string_view n) {
  static const char* names[] = {"defined", "undefined", "none",     "string",  "mapping",     "iterable",
                                "sequence", "number",   "integer",  "float",   "boolean",     "true",
                                "false",   "callable",  "eq",       "equalto", "==",          "ne",
                                "!=",      "lt",        "lessthan", "<",       "le",          "<=",
                                "gt",      "greaterthan", ">",      "ge",      ">=",          "in",
                                "sameas",  "even",      "odd",      "divisibleby", "lower",   "upper"};
  for (const char* x : names)
    if (n == x) return true;
  return false;
}

std::string Template::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object() && !context.is_null()) fail("the template context must be a JSON object");
  Scope root;
  add_globals(root);
  if (context.is_object())
    for (auto it = context.begin(); it != context.end(); ++it) root.vars[it.key()] = Value::from_json(it.value());
  Scope top{{}, &root};  // the template's own variables ({% set %} at top level) shadow the context
  Interp in(top);
  std::string out;
  try {
    in.exec(program_->body, top, out);
  } catch (const Error& e) {  // messages quote template values: kept to one line
    throw Error(printable_line(e.what(), kMaxErrorBytes));
  }
  return out;
}

}  // namespace mla::text::jinja
