// fuzz/fuzz_text_checks.h — what the tokenizer fuzz targets run on one input, shared by the
// libFuzzer targets (fuzz_tokenizer_json.cpp, fuzz_tokenizer_encode.cpp) and the corpus replay in
// tests/test_fuzz_regressions.cpp. A tokenizer.json either loads, and then encodes and decodes
// consistently, or is refused with a one-line mla::Error; any text either tokenizes and decodes
// back to itself (the tiny tokenizer has no normalizer) or, when it is not UTF-8, is refused with
// a one-line mla::Error naming the byte offset.
#pragma once
#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "fuzz_checks.h"
#include "text/tokenizer.h"

namespace mla::fuzz {

// The concatenated StreamDecoder output for `ids`, which must equal decode(ids).
inline std::string streamed(const text::Tokenizer& t, const std::vector<int32_t>& ids, bool skip) {
  text::StreamDecoder sd(t, skip);
  std::string out;
  for (int32_t id : ids) out += sd.push(id);
  return out + sd.flush();
}

inline void tokenizer_json(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  try {
    const text::Tokenizer t = text::Tokenizer::from_json(json);
    for (const char* probe : {"Hello, world! 12345", "<｜User｜>x\n\t  中文😀 e\xcc\x81", ""}) {
      try {
        const auto ids = t.encode(probe, true);
        for (int32_t id : ids) MLA_FUZZ_REQUIRE(id >= 0 && id < t.vocab_size());
        for (bool skip : {false, true}) MLA_FUZZ_REQUIRE(streamed(t, ids, skip) == t.decode(ids, skip));
      } catch (const Error& e) {  // e.g. a regex that exceeds Oniguruma's match limits
        check_one_line(e.what());
      }
    }
  } catch (const Error& e) {
    check_one_line(e.what());
  }
}

inline const text::Tokenizer& tiny_tokenizer() {
  static const text::Tokenizer t = [] {
    std::ifstream f(std::string(MLA_FUZZ_TEXT_DATA) + "/tiny_tokenizer.json", std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return text::Tokenizer::from_json(ss.str());
  }();
  return t;
}

inline void tokenizer_encode(const uint8_t* data, size_t size) {
  const std::string s(reinterpret_cast<const char*>(data), size);
  const text::Tokenizer& t = tiny_tokenizer();
  std::vector<int32_t> ids;
  try {
    ids = t.encode(s, false);
  } catch (const Error& e) {
    check_one_line(e.what());
    MLA_FUZZ_REQUIRE(std::string(e.what()).find("byte offset") != std::string::npos);
    return;
  }
  for (int32_t id : ids) MLA_FUZZ_REQUIRE(id >= 0 && id < t.vocab_size());
  MLA_FUZZ_REQUIRE(t.decode(ids, false) == s);
  const auto with_bos = t.encode(s, true);  // the tiny tokenizer's template: BOS $A
  MLA_FUZZ_REQUIRE(with_bos.size() == ids.size() + 1 && std::equal(ids.begin(), ids.end(), with_bos.begin() + 1));
  for (bool skip : {false, true}) MLA_FUZZ_REQUIRE(streamed(t, ids, skip) == t.decode(ids, skip));
}

}  // namespace mla::fuzz
