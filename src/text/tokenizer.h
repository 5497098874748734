// text/tokenizer.h — the Hugging Face tokenizer.json tokenizer (byte-level BPE as DeepSeek ships it):
// ids equal to HF `tokenizers`, token for token, and incremental detokenization for streaming.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mla::text {

struct TokenizerImpl;

// Loaded from an HF model folder (tokenizer.json, and tokenizer_config.json when present) or from
// the JSON texts. Immutable once loaded; every method is safe to call from several threads.
// A feature of tokenizer.json that is not supported is an mla::Error naming the field and value.
class Tokenizer {
 public:
  // DIR/tokenizer.json (+ DIR/tokenizer_config.json if present: bos/eos tokens, add_bos_token,
  // add_eos_token — which, when given, decide what add_special_tokens adds, as transformers does).
  static Tokenizer load(const std::string& dir);
  static Tokenizer from_json(const std::string& tokenizer_json, const std::string& tokenizer_config_json = "");

  // Invalid UTF-8 → mla::Error naming the byte offset of the first bad byte.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // threads <= 0: all hardware threads. Results in the order of `texts`.
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string>& texts, bool add_special_tokens,
                                                 int threads = 0) const;
  // An id outside the vocabulary → mla::Error naming it. Invalid UTF-8 from byte tokens → U+FFFD.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;

  int64_t vocab_size() const;  // model vocabulary + added tokens (largest id + 1)
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // mla::Error for an id outside the vocabulary
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;
  std::string bos_token() const;  // "" when there is none
  std::string eos_token() const;
  bool is_special(int32_t id) const;  // an added token marked special

  // The decoded bytes of one token before UTF-8 repair (byte-level tokens map back to raw bytes);
  // "" for a special token when skip_special_tokens. For StreamDecoder.
  std::string token_bytes(int32_t id, bool skip_special_tokens) const;

  const TokenizerImpl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const TokenizerImpl> impl_;
};

// Incremental detokenization: emits text as tokens arrive, never a broken UTF-8 sequence.
// The concatenation of every push() and the final flush() equals decode(all ids).
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& t, bool skip_special_tokens);
  std::string push(int32_t id);  // the new text that became final with this token ("" if mid-character)
  std::string flush();           // whatever remains (invalid trailing bytes as U+FFFD, as HF does)

 private:
  const Tokenizer* tok_;
  bool skip_;
  std::string pending_;  // bytes not yet emitted (an incomplete UTF-8 sequence)
  bool first_ = true;    // no text emitted yet (decoders that strip a leading space act here)
};

}  // namespace mla::text
