// text/tokenizer.cpp — loading tokenizer.json (+ tokenizer_config.json), the encode pipeline
// (added tokens → normalizer → pre-tokenizers → BPE with a per-thread word cache → post-processor),
// decoding, the streaming decoder and batch encoding on several threads.
#include "text/tokenizer.h"

#include <atomic>
#include <exception>
#include <fstream>
#include <sstream>
#include <thread>

#include "mla/error.h"
#include "text/tokenizer_impl.h"

namespace mla::text {

namespace {

using json = nlohmann::json;

std::atomic<uint64_t> g_instances{0};

bool opt_bool(const json& j, const char* key, bool dflt, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_boolean()) fail("tokenizer.json: {}.{} is not a boolean", where, key);
  return j[key].get<bool>();
}

void parse_added(const json& j, TokenizerImpl& t) {
  if (j.is_null()) return;
  if (!j.is_array()) fail("tokenizer.json: added_tokens is not an array");
  size_t k = 0;
  int64_t max_added = -1;
  for (const auto& a : j) {
    const std::string where = fmt::format("added_tokens[{}]", k++);
    if (!a.is_object()) fail("tokenizer.json: {} is not an object", where);
    if (!a.contains("id") || !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 ||
        a["id"].get<int64_t>() > INT32_MAX)
      fail("tokenizer.json: {}.id is missing or not a non-negative 32-bit id", where);
    if (!a.contains("content") || !a["content"].is_string()) fail("tokenizer.json: {}.content is missing or not a string", where);
    AddedToken tok;
    tok.id = int32_t(a["id"].get<int64_t>());
    tok.content = a["content"];
    if (first_invalid_utf8(tok.content) != std::string_view::npos)
      fail("tokenizer.json: {}.content is not valid UTF-8", where);
    tok.special = opt_bool(a, "special", false, where);
    tok.normalized = opt_bool(a, "normalized", !tok.special, where);
    tok.lstrip = opt_bool(a, "lstrip", false, where);
    tok.rstrip = opt_bool(a, "rstrip", false, where);
    tok.single_word = opt_bool(a, "single_word", false, where);
    if (tok.content.empty()) continue;  // HF ignores empty added tokens
    if (t.added_by_content.count(tok.content)) fail("tokenizer.json: {}: '{}' is added twice", where, tok.content);
    // The id HF gives the token: its model id, else the next one after the model and the tokens so
    // far. A file that says otherwise would encode differently in HF: refused.
    int64_t hf_id;
    if (auto in_model = t.bpe.vocab.find(tok.content); in_model != t.bpe.vocab.end()) {
      hf_id = in_model->second;
    } else {
      const auto model_size = int64_t(t.bpe.vocab.size());
      hf_id = max_added < 0 ? model_size : (max_added >= model_size || model_size == 0 ? max_added + 1 : model_size);
    }
    if (hf_id != tok.id)
      fail("tokenizer.json: {}.id {} for '{}' is not the id HF tokenizers assigns ({})", where, tok.id, tok.content, hf_id);
    max_added = std::max<int64_t>(max_added, tok.id);
    t.added_by_content[tok.content] = tok.id;
    t.added_by_id[tok.id] = t.added.size();
    t.added.push_back(std::move(tok));
  }
  std::unordered_map<std::string, bool> special_contents;
  for (auto& tok : t.added) {
    tok.decode_form = tok.normalized ? apply_normalizers(t.normalizers, tok.content) : tok.content;
    if (tok.special) special_contents[tok.content] = true;
  }
  for (auto& tok : t.added) tok.skip_in_decode = special_contents.count(tok.decode_form) > 0;
  // The matchers: special tokens first, then the others (HF's order), split by `normalized`.
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < t.added.size(); ++i) {
      const auto& tok = t.added[i];
      if (tok.special != (pass == 0)) continue;
      if (tok.normalized) t.trie_normalized.add(apply_normalizers(t.normalizers, tok.content), int32_t(i));
      else t.trie_raw.add(tok.content, int32_t(i));
    }
}

int32_t special_token_id(const TokenizerImpl& t, const std::string& token, const std::string& where) {
  if (auto it = t.added_by_content.find(token); it != t.added_by_content.end()) return it->second;
  if (auto it = t.bpe.vocab.find(token); it != t.bpe.vocab.end()) return it->second;
  fail("tokenizer.json: {}: token '{}' is not in the vocabulary", where, token);
}

void parse_post(const json& j, TokenizerImpl& t, const std::string& where) {
  if (j.is_null()) return;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("tokenizer.json: {} is not an object with a 'type'", where);
  const std::string type = j["type"];
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array())
      fail("tokenizer.json: {}.processors is missing or not an array", where);
    size_t k = 0;
    for (const auto& p : j["processors"]) parse_post(p, t, fmt::format("{}.processors[{}]", where, k++));
    return;
  }
  if (type != "TemplateProcessing")
    fail("tokenizer.json: {}.type '{}' is not supported (supported: TemplateProcessing, ByteLevel, Sequence)", where, type);
  if (!t.post.prefix.empty() || !t.post.suffix.empty())
    fail("tokenizer.json: {}: two TemplateProcessing post-processors are not supported", where);
  if (!j.contains("single") || !j["single"].is_array()) fail("tokenizer.json: {}.single is missing or not an array", where);
  const json specials = j.value("special_tokens", json::object());
  bool seen_a = false;
  size_t k = 0;
  for (const auto& piece : j["single"]) {
    const std::string pw = fmt::format("{}.single[{}]", where, k++);
    if (piece.is_object() && piece.contains("Sequence")) {
      const auto& s = piece["Sequence"];
      if (!s.is_object() || s.value("id", json()) != "A") fail("tokenizer.json: {}: only sequence A is supported", pw);
      if (seen_a) fail("tokenizer.json: {}: sequence A appears twice", pw);
      seen_a = true;
    } else if (piece.is_object() && piece.contains("SpecialToken")) {
      const auto& s = piece["SpecialToken"];
      if (!s.is_object() || !s.contains("id") || !s["id"].is_string()) fail("tokenizer.json: {}.SpecialToken.id is not a string", pw);
      const std::string name = s["id"];
      if (!specials.is_object() || !specials.contains(name))
        fail("tokenizer.json: {}: special token '{}' is not in special_tokens", pw, name);
      const auto& ids = specials[name].value("ids", json());
      if (!ids.is_array()) fail("tokenizer.json: {}.special_tokens['{}'].ids is not an array", where, name);
      for (const auto& id : ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
          fail("tokenizer.json: {}.special_tokens['{}'].ids holds a bad id", where, name);
        (seen_a ? t.post.suffix : t.post.prefix).push_back(int32_t(id.get<int64_t>()));
      }
    } else {
      fail("tokenizer.json: {} is neither a Sequence nor a SpecialToken", pw);
    }
  }
  if (!seen_a) fail("tokenizer.json: {}.single has no sequence A", where);
}

DecoderKind parse_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return DecoderKind::None;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("tokenizer.json: {} is not an object with a 'type'", where);
  const std::string type = j["type"];
  if (type == "ByteLevel") return DecoderKind::ByteLevel;
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array() || j["decoders"].size() != 1)
      fail("tokenizer.json: {}.decoders is supported only as one ByteLevel decoder", where);
    const auto k = parse_decoder(j["decoders"][0], where + ".decoders[0]");
    if (k != DecoderKind::ByteLevel) fail("tokenizer.json: {}.decoders is supported only as one ByteLevel decoder", where);
    return k;
  }
  fail("tokenizer.json: {}.type '{}' is not supported (supported: ByteLevel, Sequence of ByteLevel)", where, type);
}

// bos_token / eos_token in tokenizer_config.json: a string, or an AddedToken object with content.
std::optional<std::string> config_token(const json& c, const char* key) {
  if (!c.contains(key) || c[key].is_null()) return std::nullopt;
  if (c[key].is_string()) return c[key].get<std::string>();
  if (c[key].is_object() && c[key].contains("content") && c[key]["content"].is_string())
    return c[key]["content"].get<std::string>();
  fail("tokenizer_config.json: {} is neither a string nor an object with content", key);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot read", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The per-thread word cache, for the tokenizer that used this thread last.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
};
constexpr size_t kCacheMaxWords = 1 << 16;
constexpr size_t kCacheMaxWordBytes = 256;

struct Piece {
  uint32_t b, e;
  int32_t id;  // an added token's id, or -1
};

// HF's AddedVocabulary::find_matches over arena[p.b, p.e): pushes the resulting pieces to `out`.
void split_added(const TokenizerImpl& t, const Trie& trie, const std::string& arena, const Piece& p,
                 std::vector<Piece>& out) {
  const std::string_view s(arena.data() + p.b, p.e - p.b);
  size_t start_offset = 0;
  for (size_t pos = 0; pos < s.size();) {
    if (!trie.can_start(uint8_t(s[pos]))) { ++pos; continue; }
    const auto [len, idx] = trie.longest_at(s, pos);
    if (len == 0) { ++pos; continue; }
    size_t start = pos, stop = pos + len;
    pos = stop;
    const AddedToken& tok = t.added[size_t(idx)];
    if (tok.single_word) {
      bool word_before = false, word_after = false;
      if (start > 0) {
        size_t i = start - 1;
        while (i > 0 && (uint8_t(s[i]) & 0xC0) == 0x80) --i;
        word_before = is_word_char(next_cp(s, i));
      }
      if (stop < s.size()) {
        size_t i = stop;
        word_after = is_word_char(next_cp(s, i));
      }
      if (word_before || word_after) continue;
    }
    if (tok.lstrip) {
      size_t ns = start;
      while (ns > 0) {
        size_t i = ns - 1;
        while (i > 0 && (uint8_t(s[i]) & 0xC0) == 0x80) --i;
        size_t j = i;
        if (!is_unicode_whitespace(next_cp(s, j))) break;
        ns = i;
      }
      start = std::max(ns, start_offset);
    }
    if (tok.rstrip) {
      while (stop < s.size()) {
        size_t j = stop;
        if (!is_unicode_whitespace(next_cp(s, j))) break;
        stop = j;
      }
    }
    if (start_offset < start) out.push_back({uint32_t(p.b + start_offset), uint32_t(p.b + start), -1});
    out.push_back({uint32_t(p.b + start), uint32_t(p.b + stop), tok.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({uint32_t(p.b + start_offset), p.e, -1});
}

}  // namespace

const std::string* TokenizerImpl::token_string(int32_t id) const {
  if (auto it = added_by_id.find(id); it != added_by_id.end()) return &added[it->second].content;
  if (id >= 0 && size_t(id) < bpe.vocab_r.size() && !bpe.vocab_r[size_t(id)].empty()) return &bpe.vocab_r[size_t(id)];
  return nullptr;
}

void TokenizerImpl::encode_into(std::string_view text, std::vector<int32_t>& out) const {
  if (const size_t bad = first_invalid_utf8(text); bad != std::string_view::npos)
    fail("text is not valid UTF-8: bad byte 0x{:02x} at byte offset {}", uint8_t(text[bad]), bad);
  if (text.size() > UINT32_MAX / 4) fail("text of {} bytes is too long to tokenize", text.size());
  // Per-thread scratch, reused from call to call.
  thread_local std::string arena;
  thread_local std::vector<Piece> pieces, next;
  thread_local std::vector<std::pair<uint32_t, uint32_t>> ranges;
  arena.assign(text);
  pieces.clear();
  next.clear();
  if (!text.empty()) pieces.push_back({0, uint32_t(text.size()), -1});

  // 1. Added tokens that match the raw text.
  if (!trie_raw.empty()) {
    for (const auto& p : pieces) split_added(*this, trie_raw, arena, p, next);
    pieces.swap(next);
    next.clear();
  }
  // 2. The normalizer, then added tokens that match the normalized text.
  if (!normalizers.empty() || !trie_normalized.empty()) {
    for (const auto& p : pieces) {
      if (p.id >= 0) { next.push_back(p); continue; }
      Piece q = p;
      if (!normalizers.empty()) {
        const std::string n = apply_normalizers(normalizers, std::string_view(arena.data() + p.b, p.e - p.b));
        q.b = uint32_t(arena.size());
        arena += n;
        q.e = uint32_t(arena.size());
        if (q.e == q.b) continue;
      }
      if (trie_normalized.empty()) next.push_back(q);
      else split_added(*this, trie_normalized, arena, q, next);
    }
    pieces.swap(next);
    next.clear();
  }
  // 3. The pre-tokenizers, each over the pieces the previous one left.
  for (const auto& pre : pre_tokenizers) {
    for (const auto& p : pieces) {
      if (p.id >= 0) { next.push_back(p); continue; }
      Piece q = p;
      if (pre.kind == PreTokenizer::Kind::ByteLevel) {
        if (pre.add_prefix_space && arena[q.b] != ' ') {
          const uint32_t b = uint32_t(arena.size());
          arena += ' ';
          arena.append(arena, q.b, q.e - q.b);
          q = {b, uint32_t(arena.size()), -1};
        }
        if (!pre.use_regex) { next.push_back(q); continue; }
        gpt2_regex().find_all(std::string_view(arena.data() + q.b, q.e - q.b), ranges);
        // Isolated: matches and the gaps between them, each a piece.
        uint32_t prev = 0;
        for (auto [b, e] : ranges) {
          if (b > prev) next.push_back({q.b + prev, q.b + b, -1});
          if (e > b) next.push_back({q.b + b, q.b + e, -1});
          prev = e;
        }
        if (q.b + prev < q.e) next.push_back({q.b + prev, q.e, -1});
      } else {
        split_piece(pre, std::string_view(arena.data() + q.b, q.e - q.b), ranges);
        for (auto [b, e] : ranges) next.push_back({q.b + b, q.b + e, -1});
      }
    }
    pieces.swap(next);
    next.clear();
  }
  // 4. The model, word by word, through the cache.
  thread_local WordCache cache;
  if (cache.owner != instance) {
    cache.map.clear();
    cache.owner = instance;
  }
  for (const auto& p : pieces) {
    if (p.id >= 0) { out.push_back(p.id); continue; }
    const std::string_view w(arena.data() + p.b, p.e - p.b);
    if (w.size() > kCacheMaxWordBytes) { bpe.tokenize(w, byte_level, out); continue; }
    if (auto it = cache.map.find(w); it != cache.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      continue;
    }
    const size_t before = out.size();
    bpe.tokenize(w, byte_level, out);
    if (cache.map.size() >= kCacheMaxWords) cache.map.clear();
    cache.map.emplace(std::string(w), std::vector<int32_t>(out.begin() + std::ptrdiff_t(before), out.end()));
  }
}

Tokenizer Tokenizer::from_json(const std::string& tokenizer_json, const std::string& tokenizer_config_json) {
  try {
    return from_json_unchecked(tokenizer_json, tokenizer_config_json);
  } catch (const Error& e) {
    throw Error(printable_line(e.what(), 400));  // a quoted token of a broken file can be huge
  }
}

Tokenizer Tokenizer::from_json_unchecked(const std::string& tokenizer_json, const std::string& tokenizer_config_json) {
  auto t = std::make_shared<TokenizerImpl>();
  t->instance = ++g_instances;
  try {
    json j;
    try {
      j = json::parse(tokenizer_json);
    } catch (const json::parse_error& e) {
      fail("tokenizer.json: not valid JSON: {}", e.what());
    }
    if (!j.is_object()) fail("tokenizer.json: not a JSON object");
    for (const char* key : {"truncation", "padding"})
      if (j.contains(key) && !j[key].is_null()) fail("tokenizer.json: {} {} is not supported (only null)", key, j[key].dump());
    t->normalizers = parse_normalizer(j.value("normalizer", json()));
    t->pre_tokenizers = parse_pre_tokenizer(j.value("pre_tokenizer", json()));
    t->byte_level = !t->pre_tokenizers.empty() && t->pre_tokenizers.back().kind == PreTokenizer::Kind::ByteLevel;
    if (!j.contains("model")) fail("tokenizer.json: model is missing");
    parse_bpe(j["model"], t->bpe);
    parse_added(j.value("added_tokens", json()), *t);
    parse_post(j.value("post_processor", json()), *t, "post_processor");
    t->decoder = parse_decoder(j.value("decoder", json()), "decoder");
    int64_t max_id = int64_t(t->bpe.vocab_r.size()) - 1;
    for (const auto& a : t->added) max_id = std::max<int64_t>(max_id, a.id);
    t->vocab_size = max_id + 1;
    for (int32_t id : t->post.prefix)
      if (!t->token_string(id)) fail("tokenizer.json: post_processor adds id {}, which is not in the vocabulary", id);
    for (int32_t id : t->post.suffix)
      if (!t->token_string(id)) fail("tokenizer.json: post_processor adds id {}, which is not in the vocabulary", id);

    if (!tokenizer_config_json.empty()) {
      json c;
      try {
        c = json::parse(tokenizer_config_json);
      } catch (const json::parse_error& e) {
        fail("tokenizer_config.json: not valid JSON: {}", e.what());
      }
      if (!c.is_object()) fail("tokenizer_config.json: not a JSON object");
      if (auto b = config_token(c, "bos_token")) {
        t->bos = *b;
        t->bos_id = special_token_id(*t, *b, "tokenizer_config.json bos_token");
      }
      if (auto e = config_token(c, "eos_token")) {
        t->eos = *e;
        t->eos_id = special_token_id(*t, *e, "tokenizer_config.json eos_token");
      }
      // add_bos_token / add_eos_token, when given, decide what add_special_tokens adds (transformers'
      // Llama tokenizers rebuild the post-processor from them).
      const bool has_bos_flag = c.contains("add_bos_token") && !c["add_bos_token"].is_null();
      const bool has_eos_flag = c.contains("add_eos_token") && !c["add_eos_token"].is_null();
      if (has_bos_flag || has_eos_flag) {
        auto flag = [&](const char* key) {
          if (!c.contains(key) || c[key].is_null()) return false;
          if (!c[key].is_boolean()) fail("tokenizer_config.json: {} is not a boolean", key);
          return c[key].get<bool>();
        };
        const bool add_bos = flag("add_bos_token"), add_eos = flag("add_eos_token");
        if (add_bos && !t->bos_id) fail("tokenizer_config.json: add_bos_token is true but there is no bos_token");
        if (add_eos && !t->eos_id) fail("tokenizer_config.json: add_eos_token is true but there is no eos_token");
        t->post.prefix.clear();
        t->post.suffix.clear();
        if (add_bos) t->post.prefix.push_back(*t->bos_id);
        if (add_eos) t->post.suffix.push_back(*t->eos_id);
      }
    }
  } catch (const json::exception& e) {
    fail("tokenizer.json: unexpected structure: {}", e.what());
  }
  return Tokenizer(std::move(t));
}

Tokenizer Tokenizer::load(const std::string& dir) {
  const std::string tj = read_file(dir + "/tokenizer.json");
  std::string cj;
  if (std::ifstream(dir + "/tokenizer_config.json").good()) cj = read_file(dir + "/tokenizer_config.json");
  try {
    return from_json(tj, cj);
  } catch (const Error& e) {
    fail("{}: {}", dir, e.what());
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  if (add_special_tokens) out = impl_->post.prefix;
  impl_->encode_into(text, out);
  if (add_special_tokens) out.insert(out.end(), impl_->post.suffix.begin(), impl_->post.suffix.end());
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts,
                                                          bool add_special_tokens, int threads) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  size_t n = threads > 0 ? size_t(threads) : std::max(1u, std::thread::hardware_concurrency());
  n = std::min(n, texts.size());
  if (n <= 1) {
    for (size_t i = 0; i < texts.size(); ++i) out[i] = encode(texts[i], add_special_tokens);
    return out;
  }
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> errors(texts.size());
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < texts.size();) {
      try {
        out[i] = encode(texts[i], add_special_tokens);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t k = 1; k < n; ++k) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  for (size_t i = 0; i < texts.size(); ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const Error& e) {
      fail("text {}: {}", i, e.what());
    }
  }
  return out;
}

bool TokenizerImpl::skipped_in_decode(int32_t id) const {
  auto it = added_by_id.find(id);
  return it != added_by_id.end() && added[it->second].skip_in_decode;
}

std::string Tokenizer::token_bytes(int32_t id, bool skip_special_tokens) const {
  const std::string* tok = impl_->token_string(id);
  if (!tok) fail("token id {} is not in the vocabulary (size {})", id, impl_->vocab_size);
  if (skip_special_tokens && impl_->skipped_in_decode(id)) return {};
  if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) tok = &impl_->added[it->second].decode_form;
  if (impl_->decoder != DecoderKind::ByteLevel) return *tok;
  std::string bytes;
  for (size_t i = 0; i < tok->size();) {
    const int b = cp_to_byte(next_cp(*tok, i));
    if (b < 0) return *tok;  // a character outside the byte alphabet: the token as it is
    bytes += char(b);
  }
  return bytes;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    std::string b = token_bytes(id, skip_special_tokens);
    if (skip_special_tokens && impl_->skipped_in_decode(id)) continue;
    if (impl_->decoder == DecoderKind::None && !first) bytes += ' ';
    bytes += b;
    first = false;
  }
  std::string out;
  utf8_lossy(bytes, true, out);
  return out;
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const std::string s(token);
  if (auto it = impl_->added_by_content.find(s); it != impl_->added_by_content.end()) return it->second;
  if (auto it = impl_->bpe.vocab.find(s); it != impl_->bpe.vocab.end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  const std::string* tok = impl_->token_string(id);
  if (!tok) fail("token id {} is not in the vocabulary (size {})", id, impl_->vocab_size);
  return *tok;
}

std::optional<int32_t> Tokenizer::bos_token_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_token_id() const { return impl_->eos_id; }
std::string Tokenizer::bos_token() const { return impl_->bos; }
std::string Tokenizer::eos_token() const { return impl_->eos; }

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

// ---- StreamDecoder ----

StreamDecoder::StreamDecoder(const Tokenizer& t, bool skip_special_tokens) : tok_(t), skip_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  std::string b = tok_.token_bytes(id, skip_);
  if (skip_ && tok_.impl().skipped_in_decode(id)) return {};
  if (tok_.impl().decoder == DecoderKind::None && !first_) pending_ += ' ';
  first_ = false;
  pending_ += b;
  std::string out;
  const size_t used = utf8_lossy(pending_, false, out);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8_lossy(pending_, true, out);
  pending_.clear();
  return out;
}

}  // namespace mla::text
