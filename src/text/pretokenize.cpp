// text/pretokenize.cpp — UTF-8 helpers, the Oniguruma regex wrapper, normalizers (utf8proc) and the
// pre-tokenizers (Split, ByteLevel) with HF tokenizers' exact splitting semantics.
#include <algorithm>
#include <cstdlib>
#include <mutex>

#include <oniguruma.h>
#include <utf8proc.h>

#include "mla/error.h"
#include "text/tokenizer_impl.h"

namespace mla::text {

// ---- UTF-8 ----

namespace {
// The length of the valid sequence at s[i] (1..4), 0 when it is invalid, or -k when the input ends
// after k bytes of a so-far-valid sequence. `bad` is the length of the maximal invalid subpart.
int utf8_seq(std::string_view s, size_t i, size_t& bad) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return 1;
  int n;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) n = 2;
  else if (b0 == 0xE0) n = 3, lo = 0xA0;
  else if (b0 == 0xED) n = 3, hi = 0x9F;
  else if (b0 >= 0xE1 && b0 <= 0xEF) n = 3;
  else if (b0 == 0xF0) n = 4, lo = 0x90;
  else if (b0 == 0xF4) n = 4, hi = 0x8F;
  else if (b0 >= 0xF1 && b0 <= 0xF3) n = 4;
  else { bad = 1; return 0; }
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -k;
    const auto b = static_cast<uint8_t>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) { bad = size_t(k); return 0; }
  }
  return n;
}
}  // namespace

size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) { ++i; continue; }
    size_t bad = 0;
    const int n = utf8_seq(s, i, bad);
    if (n <= 0) return i;
    i += size_t(n);
  }
  return std::string_view::npos;
}

char32_t next_cp(std::string_view s, size_t& i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) { ++i; return b0; }
  if (b0 < 0xE0) { char32_t c = ((b0 & 0x1F) << 6) | (s[i + 1] & 0x3F); i += 2; return c; }
  if (b0 < 0xF0) {
    char32_t c = ((b0 & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    i += 3;
    return c;
  }
  char32_t c = ((b0 & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
  i += 4;
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

size_t utf8_lossy(std::string_view s, bool final, std::string& out) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  size_t i = 0;
  while (i < s.size()) {
    size_t bad = 0;
    const int n = utf8_seq(s, i, bad);
    if (n > 0) {
      out.append(s.data() + i, size_t(n));
      i += size_t(n);
    } else if (n == 0) {
      out += kReplacement;
      i += bad;
    } else {
      if (!final) return i;
      out += kReplacement;
      i = s.size();
    }
  }
  return i;
}

bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (c == 0x200C || c == 0x200D) return true;
  switch (utf8proc_category(utf8proc_int32_t(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// ---- Regex ----

namespace {
void onig_init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding enc[] = {ONIG_ENCODING_UTF8};
    onig_initialize(enc, 1);
  });
}
}  // namespace

Regex::Regex(const std::string& pattern, const std::string& field) {
  onig_init_once();
  OnigRegex re = nullptr;
  OnigErrorInfo info;
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int r = onig_new(&re, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                         ONIG_SYNTAX_RUBY, &info);
  if (r != ONIG_NORMAL) {
    OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(msg, r, &info);
    fail("tokenizer.json: {}: bad regex '{}': {}", field, pattern, reinterpret_cast<char*>(msg));
  }
  re_ = re;
}

Regex::~Regex() {
  if (re_) onig_free(static_cast<OnigRegex>(re_));
}

void Regex::find_all(std::string_view s, std::vector<std::pair<uint32_t, uint32_t>>& out) const {
  out.clear();
  auto* re = static_cast<OnigRegex>(re_);
  struct RegionHolder {
    OnigRegion* r = onig_region_new();
    ~RegionHolder() { onig_region_free(r, 1); }
  };
  thread_local RegionHolder holder;
  OnigRegion* region = holder.r;
  const auto* str = reinterpret_cast<const OnigUChar*>(s.data());
  const auto* end = str + s.size();
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= s.size()) {
    const int r = onig_search(re, str, end, str + last_end, end, region, ONIG_OPTION_NONE);
    if (r == ONIG_MISMATCH) break;
    if (r < 0) fail("regex search failed (Oniguruma error {})", r);
    const auto b = size_t(region->beg[0]), e = size_t(region->end[0]);
    if (b == e && have_last && last_match_end == e) {
      // An empty match right after the previous match: step one character on.
      if (last_end >= s.size()) break;
      size_t i = last_end;
      next_cp(s, i);
      last_end = i;
      continue;
    }
    last_end = e;
    have_last = true;
    last_match_end = e;
    out.emplace_back(uint32_t(b), uint32_t(e));
    if (b == e) {  // an empty match not after a match: the next search starts here again
      if (last_end >= s.size()) break;
    }
  }
}

// ---- Normalizers ----

namespace {
std::string str_field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_string()) fail("tokenizer.json: {}.{} is missing or not a string", where, key);
  return j[key].get<std::string>();
}

void parse_normalizer_into(const nlohmann::json& j, std::vector<Normalizer>& out, const std::string& where) {
  if (j.is_null()) return;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("tokenizer.json: {} is not an object with a 'type'", where);
  const std::string type = j["type"];
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      fail("tokenizer.json: {}.normalizers is missing or not an array", where);
    size_t k = 0;
    for (const auto& n : j["normalizers"]) parse_normalizer_into(n, out, fmt::format("{}.normalizers[{}]", where, k++));
  } else if (type == "NFC") {
    out.push_back({Normalizer::Kind::NFC, {}, {}});
  } else if (type == "NFD") {
    out.push_back({Normalizer::Kind::NFD, {}, {}});
  } else if (type == "NFKC") {
    out.push_back({Normalizer::Kind::NFKC, {}, {}});
  } else if (type == "NFKD") {
    out.push_back({Normalizer::Kind::NFKD, {}, {}});
  } else if (type == "Prepend") {
    out.push_back({Normalizer::Kind::Prepend, str_field(j, "prepend", where), {}});
  } else if (type == "Replace") {
    const auto& p = j.value("pattern", nlohmann::json());
    if (!p.is_object() || !p.contains("String") || !p["String"].is_string())
      fail("tokenizer.json: {}.pattern {} is not supported (a String pattern is)", where, p.dump());
    const std::string from = p["String"];
    if (from.empty()) fail("tokenizer.json: {}.pattern is an empty string", where);
    out.push_back({Normalizer::Kind::Replace, from, str_field(j, "content", where)});
  } else {
    fail("tokenizer.json: {}.type '{}' is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, "
         "Prepend, Replace)", where, type);
  }
}

std::string utf8proc_normalize(std::string_view s, int options) {
  utf8proc_uint8_t* res = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()), &res,
                              utf8proc_option_t(options | UTF8PROC_STABLE));
  if (n < 0) fail("normalization failed: {}", utf8proc_errmsg(n));
  std::string out(reinterpret_cast<char*>(res), size_t(n));
  std::free(res);
  return out;
}
}  // namespace

std::vector<Normalizer> parse_normalizer(const nlohmann::json& j) {
  std::vector<Normalizer> out;
  parse_normalizer_into(j, out, "normalizer");
  return out;
}

std::string apply_normalizers(const std::vector<Normalizer>& ns, std::string_view in) {
  std::string s(in);
  for (const auto& n : ns) {
    switch (n.kind) {
      case Normalizer::Kind::NFC: s = utf8proc_normalize(s, UTF8PROC_COMPOSE); break;
      case Normalizer::Kind::NFD: s = utf8proc_normalize(s, UTF8PROC_DECOMPOSE); break;
      case Normalizer::Kind::NFKC: s = utf8proc_normalize(s, UTF8PROC_COMPOSE | UTF8PROC_COMPAT); break;
      case Normalizer::Kind::NFKD: s = utf8proc_normalize(s, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT); break;
      case Normalizer::Kind::Prepend:
        if (!s.empty()) s = n.a + s;
        break;
      case Normalizer::Kind::Replace: {
        std::string r;
        size_t pos = 0;
        for (size_t f; (f = s.find(n.a, pos)) != std::string::npos; pos = f + n.a.size()) {
          r.append(s, pos, f - pos);
          r += n.b;
        }
        r.append(s, pos, std::string::npos);
        s = std::move(r);
        break;
      }
    }
  }
  return s;
}

// ---- Pre-tokenizers ----

const Regex& gpt2_regex() {
  static const Regex re(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
                        "ByteLevel regex");
  return re;
}

namespace {
bool bool_field(const nlohmann::json& j, const char* key, bool dflt, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_boolean()) fail("tokenizer.json: {}.{} is not a boolean", where, key);
  return j[key].get<bool>();
}

void parse_pre_into(const nlohmann::json& j, std::vector<PreTokenizer>& out, const std::string& where) {
  if (j.is_null()) return;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("tokenizer.json: {} is not an object with a 'type'", where);
  const std::string type = j["type"];
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      fail("tokenizer.json: {}.pretokenizers is missing or not an array", where);
    size_t k = 0;
    for (const auto& p : j["pretokenizers"]) parse_pre_into(p, out, fmt::format("{}.pretokenizers[{}]", where, k++));
    return;
  }
  if (!out.empty() && out.back().kind == PreTokenizer::Kind::ByteLevel)
    fail("tokenizer.json: {}: a pre-tokenizer after ByteLevel is not supported", where);
  PreTokenizer p;
  if (type == "Split") {
    p.kind = PreTokenizer::Kind::Split;
    const auto& pat = j.value("pattern", nlohmann::json());
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      p.regex = std::make_shared<Regex>(pat["Regex"].get<std::string>(), where + ".pattern.Regex");
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      p.literal = pat["String"].get<std::string>();
    } else {
      fail("tokenizer.json: {}.pattern {} is not {{\"Regex\": ...}} or {{\"String\": ...}}", where, pat.dump());
    }
    const std::string b = j.value("behavior", nlohmann::json()).is_string() ? j["behavior"].get<std::string>() : "";
    if (b == "Removed") p.behavior = SplitBehavior::Removed;
    else if (b == "Isolated") p.behavior = SplitBehavior::Isolated;
    else if (b == "MergedWithPrevious") p.behavior = SplitBehavior::MergedWithPrevious;
    else if (b == "MergedWithNext") p.behavior = SplitBehavior::MergedWithNext;
    else if (b == "Contiguous") p.behavior = SplitBehavior::Contiguous;
    else fail("tokenizer.json: {}.behavior '{}' is not supported", where, j.value("behavior", nlohmann::json()).dump());
    p.invert = bool_field(j, "invert", false, where);
  } else if (type == "Digits") {
    // HF splits on char::is_numeric (Nd, Nl, No): one piece per digit, or per run of digits.
    p.kind = PreTokenizer::Kind::Split;
    p.regex = std::make_shared<Regex>(bool_field(j, "individual_digits", false, where) ? "\\p{N}" : "\\p{N}+", where);
  } else if (type == "ByteLevel") {
    p.kind = PreTokenizer::Kind::ByteLevel;
    p.add_prefix_space = bool_field(j, "add_prefix_space", true, where);
    p.use_regex = bool_field(j, "use_regex", true, where);
  } else {
    fail("tokenizer.json: {}.type '{}' is not supported (supported: Sequence, Split, Digits, ByteLevel)", where, type);
  }
  out.push_back(std::move(p));
}
}  // namespace

std::vector<PreTokenizer> parse_pre_tokenizer(const nlohmann::json& j) {
  std::vector<PreTokenizer> out;
  parse_pre_into(j, out, "pre_tokenizer");
  return out;
}

void split_piece(const PreTokenizer& p, std::string_view s, std::vector<std::pair<uint32_t, uint32_t>>& out) {
  out.clear();
  thread_local std::vector<std::pair<uint32_t, uint32_t>> found;
  found.clear();
  if (p.regex) {
    p.regex->find_all(s, found);
  } else if (!p.literal.empty()) {
    for (size_t f, pos = 0; (f = s.find(p.literal, pos)) != std::string_view::npos; pos = f + p.literal.size())
      found.emplace_back(uint32_t(f), uint32_t(f + p.literal.size()));
  }
  // The whole string as (range, is_match) parts, HF's Pattern::find_matches.
  struct Part { uint32_t b, e; bool m; };
  thread_local std::vector<Part> parts;
  parts.clear();
  uint32_t prev = 0;
  for (auto [b, e] : found) {
    if (prev != b) parts.push_back({prev, b, false});
    parts.push_back({b, e, true});
    prev = e;
  }
  if (prev != s.size()) parts.push_back({prev, uint32_t(s.size()), false});
  if (p.invert)
    for (auto& x : parts) x.m = !x.m;
  // (range, remove) per behaviour.
  thread_local std::vector<Part> res;
  res.clear();
  switch (p.behavior) {
    case SplitBehavior::Isolated:
      for (const auto& x : parts) res.push_back({x.b, x.e, false});
      break;
    case SplitBehavior::Removed:
      res = parts;
      break;
    case SplitBehavior::Contiguous: {
      bool prev_match = false;
      for (const auto& x : parts) {
        if (x.m == prev_match && !res.empty()) res.back().e = x.e;
        else res.push_back({x.b, x.e, false});
        prev_match = x.m;
      }
      break;
    }
    case SplitBehavior::MergedWithPrevious: {
      bool prev_match = false;
      for (const auto& x : parts) {
        if (x.m && !prev_match && !res.empty()) res.back().e = x.e;
        else res.push_back({x.b, x.e, false});
        prev_match = x.m;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool prev_match = false;
      for (size_t k = parts.size(); k-- > 0;) {
        const auto& x = parts[k];
        if (x.m && !prev_match && !res.empty()) res.back().b = x.b;
        else res.push_back({x.b, x.e, false});
        prev_match = x.m;
      }
      std::reverse(res.begin(), res.end());
      break;
    }
  }
  for (const auto& x : res)
    if (!x.m && x.e > x.b) out.emplace_back(x.b, x.e);
}

// ---- The byte-level alphabet (GPT-2's bytes_to_unicode) ----

namespace {
struct ByteAlphabet {
  char32_t to_cp[256];
  int from_cp[324];
  ByteAlphabet() {
    for (int& x : from_cp) x = -1;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = keep ? char32_t(b) : char32_t(256 + n++);
      from_cp[to_cp[b]] = b;
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}
}  // namespace

char32_t byte_to_cp(uint8_t b) { return alphabet().to_cp[b]; }
int cp_to_byte(char32_t c) { return c < 324 ? alphabet().from_cp[c] : -1; }

}  // namespace mla::text
