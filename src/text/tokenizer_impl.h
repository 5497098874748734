// text/tokenizer_impl.h — the tokenizer's parts (internal): UTF-8 helpers, normalizers,
// pre-tokenizers over Oniguruma regexes, the BPE model, the added-token matcher, post-processing.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace mla::text {

// ---- UTF-8 ----
// The byte offset of the first byte that is not part of a valid UTF-8 sequence, or npos.
size_t first_invalid_utf8(std::string_view s);
// Decodes one code point of valid UTF-8 at s[i]; advances i.
char32_t next_cp(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t c);
// Rust's String::from_utf8_lossy over `bytes`, done incrementally: appends to `out` every complete
// character and U+FFFD for each maximal invalid subpart; returns how many bytes were consumed. When
// `final` is false a trailing incomplete (but so far valid) sequence is left unconsumed.
size_t utf8_lossy(std::string_view bytes, bool final, std::string& out);
bool is_unicode_whitespace(char32_t c);  // Rust's char::is_whitespace / regex \s
bool is_word_char(char32_t c);           // Rust regex \w (Unicode)

// ---- Regex (Oniguruma, UTF-8, Ruby syntax: what HF tokenizers uses) ----
class Regex {
 public:
  explicit Regex(const std::string& pattern, const std::string& field);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Every non-overlapping match in s, as HF's find_iter (an empty match right after the previous
  // match is skipped by one character): pairs of byte offsets.
  void find_all(std::string_view s, std::vector<std::pair<uint32_t, uint32_t>>& out) const;

 private:
  void* re_ = nullptr;  // OnigRegex
};

// ---- Normalizers ----
struct Normalizer {
  enum class Kind { NFC, NFD, NFKC, NFKD, Prepend, Replace };
  Kind kind;
  std::string a, b;  // Prepend: a; Replace: a → b (String pattern)
};
std::vector<Normalizer> parse_normalizer(const nlohmann::json& j);
std::string apply_normalizers(const std::vector<Normalizer>& ns, std::string_view s);

// ---- Pre-tokenizers ----
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
struct PreTokenizer {
  enum class Kind { Split, ByteLevel };
  Kind kind;
  // Split
  std::shared_ptr<Regex> regex;  // null with a String pattern
  std::string literal;           // the String pattern
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  // ByteLevel
  bool add_prefix_space = false;
  bool use_regex = true;
};
std::vector<PreTokenizer> parse_pre_tokenizer(const nlohmann::json& j);
// Splits `s` by one Split pre-tokenizer: the pieces as byte ranges (empty pieces dropped).
void split_piece(const PreTokenizer& p, std::string_view s, std::vector<std::pair<uint32_t, uint32_t>>& out);
const Regex& gpt2_regex();

// The byte-level alphabet: byte → its code point, and back (-1 when not in the alphabet).
char32_t byte_to_cp(uint8_t b);
int cp_to_byte(char32_t c);

// ---- The BPE model ----
struct Bpe {
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> vocab_r;  // id → token ("" for ids the model lacks)
  // (left id, right id) → (rank, merged id), open addressing.
  struct MergeSlot { uint64_t key; uint32_t rank; int32_t id; };
  std::vector<MergeSlot> merge_table;
  uint64_t merge_mask = 0;
  std::optional<int32_t> unk_id;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  int32_t byte_ids[256];  // the id of each byte's byte-level character, or -1
  int32_t fallback_ids[256];  // <0xXX> tokens, or -1

  void add_merge(int32_t a, int32_t b, uint32_t rank, int32_t id);
  const MergeSlot* find_merge(int32_t a, int32_t b) const {
    const uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> 20;
    for (;; ++h) {
      const MergeSlot& s = merge_table[h & merge_mask];
      if (s.id < 0) return nullptr;
      if (s.key == key) return &s;
    }
  }
  // Tokenizes one pre-tokenized word. `byte_level`: the word is raw bytes whose characters are the
  // byte-level alphabet (the ByteLevel pre-tokenizer ran); else the word's characters are its own.
  void tokenize(std::string_view word, bool byte_level, std::vector<int32_t>& out) const;
  void merge_symbols(std::vector<int32_t>& syms) const;
};
void parse_bpe(const nlohmann::json& j, Bpe& bpe);

// ---- Added tokens ----
struct AddedToken {
  int32_t id;
  std::string content;
  bool special = false, normalized = true, lstrip = false, rstrip = false, single_word = false;
  // What decoding sees (HF's normalized_cache): the normalized content for a normalized token the
  // normalizer changes, else the content; skipped by skip_special_tokens when that string is the
  // content of a special token.
  std::string decode_form;
  bool skip_in_decode = false;
};
// Leftmost-longest matching of a set of strings (a byte trie).
class Trie {
 public:
  void add(std::string_view s, int32_t value);
  // The longest pattern starting at s[pos]: its length and value, or length 0.
  std::pair<size_t, int32_t> longest_at(std::string_view s, size_t pos) const;
  bool empty() const { return nodes_.size() <= 1; }
  bool can_start(uint8_t b) const { return first_[b]; }

 private:
  struct Node { std::vector<std::pair<uint8_t, uint32_t>> next; int32_t value = -1; };
  std::vector<Node> nodes_{1};
  bool first_[256] = {};
};

// ---- Post-processing and decoding ----
struct PostProcessor {
  // The ids added around the sequence by add_special_tokens (TemplateProcessing's single template;
  // ByteLevel and null add none).
  std::vector<int32_t> prefix, suffix;
};
enum class DecoderKind { None, ByteLevel };

struct TokenizerImpl {
  uint64_t instance = 0;  // unique per load (keys the per-thread word cache)
  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;
  bool byte_level = false;  // a ByteLevel pre-tokenizer ran: words are raw bytes over the byte alphabet
  Bpe bpe;
  std::vector<AddedToken> added;  // in file order
  std::unordered_map<int32_t, size_t> added_by_id;
  std::unordered_map<std::string, int32_t> added_by_content;
  Trie trie_raw, trie_normalized;  // values: index into `added`
  PostProcessor post;
  DecoderKind decoder = DecoderKind::None;
  int64_t vocab_size = 0;
  std::optional<int32_t> bos_id, eos_id;
  std::string bos, eos;

  void encode_into(std::string_view text, std::vector<int32_t>& out) const;
  const std::string* token_string(int32_t id) const;  // null when the id is not in the vocabulary
  bool skipped_in_decode(int32_t id) const;           // left out by skip_special_tokens
};

}  // namespace mla::text
