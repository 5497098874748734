// test_tokenizer.cpp — the tokenizer.json tokenizer against Hugging Face `tokenizers`: ids on the
// whole corpus for DeepSeek-V3's real vocabulary, the tiny trained one and variants of both
// (expected ids from scripts/text_fixtures.py), decode and streaming decode, added-token flags,
// unsupported features, invalid UTF-8, long runs.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mla/error.h"
#include "text/tokenizer.h"

using json = nlohmann::json;
using mla::text::StreamDecoder;
using mla::text::Tokenizer;

namespace {

std::string env_or(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : dflt;
}
// Expected ids and the tiny tokenizer (MLA_TEXT_DATA overrides, for fresh fixtures).
std::string text_data() { return env_or("MLA_TEXT_DATA", std::string(MLA_TEST_DATA) + "/text"); }
// The real DeepSeek-V3 tokenizer, fetched by scripts/fetch_tokenizers.sh.
std::string v3_dir() { return env_or("MLA_TOKENIZER_CACHE", MLA_TOKENIZER_CACHE) + "/deepseek_v3"; }

bool exists(const std::string& p) { return std::ifstream(p).good(); }
std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + p);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> corpus() {
  std::vector<std::string> out;
  std::istringstream in(slurp(text_data() + "/corpus.jsonl"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line).get<std::string>());
  return out;
}

bool valid_utf8(const std::string& s) {
  try {
    (void)json(s).dump();  // nlohmann refuses invalid UTF-8
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

// The same patch language as scripts/text_fixtures.py.
json apply_patch(json j, const json& patch) {
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    const std::string& key = it.key();
    if (key.rfind("model.", 0) == 0) {
      j["model"][key.substr(6)] = it.value();
    } else if (key == "added_tokens_flags") {
      for (auto& t : j["added_tokens"])
        if (it.value().contains(t["content"].get<std::string>())) t.update(it.value()[t["content"].get<std::string>()]);
    } else if (key == "added_tokens_extra") {
      for (const auto& t : it.value()) j["added_tokens"].push_back(t);
    } else {
      j[key] = it.value();
    }
  }
  return j;
}

std::string base_json(const std::string& base) {
  return base == "v3" ? slurp(v3_dir() + "/tokenizer.json") : slurp(text_data() + "/tiny_tokenizer.json");
}

std::string show(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size() && i < 40; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + (v.size() > 40 ? ",...]" : "]");
}

// ---- Every text of the corpus, against HF's ids and decodes ----

class HfExpected : public testing::TestWithParam<std::string> {};

TEST_P(HfExpected, IdsDecodeAndStreamEqualHf) {
  const std::string name = GetParam();
  const std::string path = text_data() + "/expected_" + name + ".json";
  ASSERT_TRUE(exists(path)) << path << " is missing (scripts/text_fixtures.py writes it)";
  const json doc = json::parse(slurp(path));
  const std::string base = doc.contains("base") ? doc["base"].get<std::string>() : name;
  if (base == "v3" && !exists(v3_dir() + "/tokenizer.json"))
    GTEST_SKIP() << "the DeepSeek-V3 tokenizer is not in " << v3_dir() << " (scripts/fetch_tokenizers.sh fetches it; "
                 << "it failed or had no network)";
  std::string tj = base_json(base);
  if (doc.contains("patch")) tj = apply_patch(json::parse(tj), doc["patch"]).dump();
  const Tokenizer tok = Tokenizer::from_json(tj);
  const auto texts = corpus();
  const auto& cases = doc["cases"];
  ASSERT_EQ(cases.size(), texts.size()) << "expected_" << name << ".json is for another corpus.jsonl";
  int bad_ids = 0, bad_special = 0, bad_decode = 0, bad_stream = 0;
  std::vector<std::vector<int32_t>> all;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto& c = cases[i];
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto got = tok.encode(texts[i], false);
    all.push_back(got);
    if (got != want && ++bad_ids <= 5)
      ADD_FAILURE() << name << " text " << i << " " << json(texts[i].substr(0, 80)).dump() << ": ids " << show(got)
                    << " != HF " << show(want);
    std::vector<int32_t> want_sp;
    if (c.contains("ids_special")) {
      want_sp = c["ids_special"].get<std::vector<int32_t>>();
    } else {
      want_sp = c["prefix"].get<std::vector<int32_t>>();
      want_sp.insert(want_sp.end(), want.begin(), want.end());
      for (int32_t x : c["suffix"].get<std::vector<int32_t>>()) want_sp.push_back(x);
    }
    const auto got_sp = tok.encode(texts[i], true);
    if (got_sp != want_sp && ++bad_special <= 5)
      ADD_FAILURE() << name << " text " << i << " with special tokens: " << show(got_sp) << " != HF " << show(want_sp);
    for (bool skip : {false, true}) {
      const std::string want_text = c[skip ? "decoded_skip" : "decoded"];
      const std::string dec = tok.decode(want_sp, skip);
      if (dec != want_text && ++bad_decode <= 5)
        ADD_FAILURE() << name << " text " << i << " decode(skip=" << skip << ") " << json(dec).dump()
                      << " != HF " << json(want_text).dump();
      StreamDecoder sd(tok, skip);
      std::string streamed;
      bool valid = true;
      for (int32_t id : want_sp) {
        const std::string piece = sd.push(id);
        valid = valid && valid_utf8(piece);
        streamed += piece;
      }
      const std::string tail = sd.flush();
      valid = valid && valid_utf8(tail);
      streamed += tail;
      if ((streamed != dec || !valid) && ++bad_stream <= 5)
        ADD_FAILURE() << name << " text " << i << " stream(skip=" << skip << ") " << json(streamed).dump()
                      << (valid ? "" : " (emitted invalid UTF-8)") << " != decode " << json(dec).dump();
    }
  }
  EXPECT_EQ(bad_ids, 0);
  EXPECT_EQ(bad_special, 0);
  EXPECT_EQ(bad_decode, 0);
  EXPECT_EQ(bad_stream, 0);
  EXPECT_EQ(tok.encode_batch(texts, false, 3), all) << "encode_batch differs from encode";
}

std::vector<std::string> expected_names() {
  std::vector<std::string> names{"v3", "tiny"};
  for (const auto& v : json::parse(slurp(text_data() + "/variants.json")))
    names.push_back(v["name"].get<std::string>());
  return names;
}
INSTANTIATE_TEST_SUITE_P(Corpus, HfExpected, testing::ValuesIn(expected_names()),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

// No normalizer: decoding the ids gives the text back, byte for byte.
TEST(Tokenizer, DecodeRoundTripsEveryText) {
  std::vector<std::pair<std::string, std::string>> toks{{"tiny", slurp(text_data() + "/tiny_tokenizer.json")}};
  if (exists(v3_dir() + "/tokenizer.json")) toks.emplace_back("v3", slurp(v3_dir() + "/tokenizer.json"));
  for (const auto& [name, tj] : toks) {
    const Tokenizer tok = Tokenizer::from_json(tj);
    for (const auto& t : corpus()) EXPECT_EQ(tok.decode(tok.encode(t, false), false), t) << name;
  }
}

// ---- The folder: tokenizer_config.json decides BOS/EOS ----

TEST(Tokenizer, LoadsV3FolderWithConfig) {
  if (!exists(v3_dir() + "/tokenizer.json")) GTEST_SKIP() << "the DeepSeek-V3 tokenizer is not in " << v3_dir();
  const Tokenizer tok = Tokenizer::load(v3_dir());
  EXPECT_EQ(tok.vocab_size(), 128815);
  EXPECT_EQ(tok.bos_token(), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(tok.eos_token(), "<｜end▁of▁sentence｜>");
  EXPECT_EQ(tok.bos_token_id(), 0);
  EXPECT_EQ(tok.eos_token_id(), 1);
  EXPECT_TRUE(tok.is_special(0));
  EXPECT_FALSE(tok.is_special(128803));  // <｜User｜> is an added token, not special, in V3
  EXPECT_EQ(tok.token_to_id("<｜User｜>"), 128803);
  EXPECT_EQ(tok.id_to_token(128803), "<｜User｜>");
  EXPECT_FALSE(tok.token_to_id("no such token"));
  const auto ids = tok.encode("Hello world", false);
  auto with = ids;
  with.insert(with.begin(), 0);  // add_bos_token: true
  EXPECT_EQ(tok.encode("Hello world", true), with);
  // The same file without the config: what tokenizer.json's ByteLevel post-processor adds (nothing),
  // which is what HF tokenizers' Tokenizer.from_file gives. (transformers 5's AutoTokenizer is no
  // reference here: it rebuilds DeepSeek-V3's tokenizer as a Llama one and differs on most texts.)
  EXPECT_EQ(Tokenizer::from_json(slurp(v3_dir() + "/tokenizer.json")).encode("Hello world", true), ids);
}

// ---- Added-token flags on a hand-made character-level tokenizer (HF's own cases) ----

// A BPE over single characters (no pre-tokenizer, no merges): each character is its own id, so the
// ids show exactly where the added tokens matched and which spaces they took.
json char_tokenizer(const std::string& chars, const json& added) {
  json vocab = json::object();
  int32_t id = 0;
  for (size_t i = 0; i < chars.size();) {
    size_t n = 1;
    const auto b = uint8_t(chars[i]);
    if (b >= 0xF0) n = 4; else if (b >= 0xE0) n = 3; else if (b >= 0xC0) n = 2;
    const std::string c = chars.substr(i, n);
    if (!vocab.contains(c)) vocab[c] = id++;
    i += n;
  }
  json a = json::array();
  for (auto t : added) {
    t["id"] = id++;
    a.push_back(t);
  }
  return {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", a},
          {"normalizer", nullptr}, {"pre_tokenizer", nullptr}, {"post_processor", nullptr}, {"decoder", nullptr},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                     {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
                     {"vocab", vocab}, {"merges", json::array()}}}};
}

json added_token(const std::string& content, bool single_word, bool lstrip, bool rstrip, bool special = false) {
  return {{"content", content}, {"single_word", single_word}, {"lstrip", lstrip}, {"rstrip", rstrip},
          {"normalized", false}, {"special", special}};
}

// Renders ids as text with the added token as [M]: shows where it matched and what it swallowed.
std::string render(const Tokenizer& t, const std::vector<int32_t>& ids, int32_t mask) {
  std::string s;
  for (int32_t id : ids) s += id == mask ? "[M]" : t.id_to_token(id);
  return s;
}

TEST(Tokenizer, AddedTokenSingleWord) {
  const std::string text = "<mask> My name <mask> A<mask> <mask>ony <mask>";
  const Tokenizer t = Tokenizer::from_json(char_tokenizer(text, json::array({added_token("<mask>", true, false, false)})).dump());
  const int32_t m = *t.token_to_id("<mask>");
  // HF: <mask> | " My name " | <mask> | " A<mask> <mask>ony " | <mask>
  EXPECT_EQ(render(t, t.encode(text, false), m), "[M] My name [M] A<mask> <mask>ony [M]");
  const std::string uni = "<mask>, <mask>- \u25cc\u0330<mask>";  // a combining mark is a word character
  const Tokenizer u = Tokenizer::from_json(char_tokenizer(uni, json::array({added_token("<mask>", true, false, false)})).dump());
  EXPECT_EQ(render(u, u.encode(uni, false), *u.token_to_id("<mask>")), "[M], [M]- \u25cc\u0330<mask>");
}

TEST(Tokenizer, AddedTokenLstripRstrip) {
  const std::string text = "Hi <mask> there\t<mask>\t<mask>\u2000";
  const Tokenizer t = Tokenizer::from_json(char_tokenizer(text, json::array({added_token("<mask>", true, true, true)})).dump());
  // HF: "Hi" | " <mask> " | "there" | "\t<mask>\t" | "<mask>\u2000": the spaces go with the token.
  EXPECT_EQ(render(t, t.encode(text, false), *t.token_to_id("<mask>")), "Hi[M]there[M][M]");
  const Tokenizer l = Tokenizer::from_json(char_tokenizer(text, json::array({added_token("<mask>", false, true, false)})).dump());
  EXPECT_EQ(render(l, l.encode(text, false), *l.token_to_id("<mask>")), "Hi[M] there[M][M]\u2000");  // the second takes the tab the first left
  const Tokenizer r = Tokenizer::from_json(char_tokenizer(text, json::array({added_token("<mask>", false, false, true)})).dump());
  EXPECT_EQ(render(r, r.encode(text, false), *r.token_to_id("<mask>")), "Hi [M]there\t[M][M]");
}

TEST(Tokenizer, AddedTokensLeftmostLongestAndSpecialSkip) {
  const std::string text = "xabcdx abx ab";
  json added = json::array({added_token("ab", false, false, false), added_token("abcd", false, false, false, true),
                            added_token("bcdx", false, false, false)});
  const Tokenizer t = Tokenizer::from_json(char_tokenizer(text, added).dump());
  const int32_t ab = *t.token_to_id("ab"), abcd = *t.token_to_id("abcd");
  const auto x = *t.token_to_id("x"), sp = *t.token_to_id(" ");
  // Leftmost first ("abcd" starts before "bcdx"), then longest ("abcd" over "ab").
  EXPECT_EQ(t.encode(text, false), (std::vector<int32_t>{x, abcd, x, sp, ab, x, sp, ab}));
  EXPECT_TRUE(t.is_special(abcd));
  EXPECT_FALSE(t.is_special(ab));
  // The null decoder joins the tokens with spaces, the special one left out.
  EXPECT_EQ(t.decode(t.encode(text, false), true), "x x   ab x   ab");
}

// ---- Unsupported features and broken files: errors that name the field ----

TEST(Tokenizer, UnsupportedFeaturesAreErrorsNamingThem) {
  const json base = char_tokenizer("abc", json::array());
  struct Case { std::string pointer; json value; std::string needle; };
  const std::vector<Case> cases{
      {"/model/type", "Unigram", "model.type"},
      {"/model/dropout", 0.1, "model.dropout"},
      {"/model/continuing_subword_prefix", "##", "model.continuing_subword_prefix"},
      {"/model/end_of_word_suffix", "</w>", "model.end_of_word_suffix"},
      {"/model/merges", json::array({"a zz"}), "model.merges[0]"},
      {"/model/merges", json::array({"abc"}), "model.merges[0]"},
      {"/model/vocab", json::array(), "model.vocab"},
      {"/model/unk_token", "<unk>", "model.unk_token"},
      {"/normalizer", {{"type", "Lowercase"}}, "normalizer.type 'Lowercase'"},
      {"/normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Strip"}}}}}, "normalizer.normalizers[1].type 'Strip'"},
      {"/pre_tokenizer", {{"type", "Whitespace"}}, "pre_tokenizer.type 'Whitespace'"},
      {"/pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "("}}}, {"behavior", "Isolated"}}, "pre_tokenizer.pattern.Regex"},
      {"/pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Glued"}}, "pre_tokenizer.behavior"},
      // A range that is empty (U+1FD0-U+0390): HF's Oniguruma refuses it too.
      {"/pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "[\u1fd0-\u0390]"}}}, {"behavior", "Isolated"}},
       "empty range in char class"},
      {"/pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {{{"type", "ByteLevel"}}, {{"type", "Digits"}}}}}, "after ByteLevel"},
      {"/post_processor", {{"type", "BertProcessing"}}, "post_processor.type 'BertProcessing'"},
      {"/decoder", {{"type", "WordPiece"}}, "decoder.type 'WordPiece'"},
      {"/truncation", {{"max_length", 8}}, "truncation"},
      {"/padding", {{"strategy", "BatchLongest"}}, "padding"},
      {"/added_tokens", {{{"id", 7}, {"content", "zz"}}}, "added_tokens[0].id 7"},
      {"/added_tokens", {{{"id", 3}}}, "added_tokens[0].content"},
  };
  for (const auto& c : cases) {
    json j = base;
    j[json::json_pointer(c.pointer)] = c.value;
    try {
      Tokenizer::from_json(j.dump());
      ADD_FAILURE() << c.pointer << " = " << c.value.dump() << " was accepted";
    } catch (const mla::Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << e.what() << " does not name " << c.needle;
    }
  }
  EXPECT_THROW(Tokenizer::from_json("{not json"), mla::Error);
  EXPECT_THROW(Tokenizer::from_json("[]"), mla::Error);
  EXPECT_THROW(Tokenizer::from_json(base.dump(), "{\"bos_token\": \"<nope>\"}"), mla::Error);
  EXPECT_THROW(Tokenizer::load("/nonexistent/folder"), mla::Error);
}

// ---- Bad input ----

TEST(Tokenizer, InvalidUtf8NamesTheByteOffset) {
  const Tokenizer t = Tokenizer::from_json(slurp(text_data() + "/tiny_tokenizer.json"));
  const std::vector<std::pair<std::string, size_t>> cases{
      {"\xff", 0}, {"ab\xc3(", 2}, {"abc\xe2\x82", 3}, {"\xc0\xaf", 0}, {"ok \xed\xa0\x80", 3},
      {"\xf4\x90\x80\x80", 0}, {"caf\xc3\xa9 \x80", 6}, {std::string("a\0b\xfe", 4), 3}};
  for (const auto& [text, offset] : cases) {
    try {
      t.encode(text, false);
      ADD_FAILURE() << "accepted " << json::binary_t(std::vector<uint8_t>(text.begin(), text.end())).size() << " bytes";
    } catch (const mla::Error& e) {
      EXPECT_NE(std::string(e.what()).find("byte offset " + std::to_string(offset)), std::string::npos) << e.what();
    }
  }
  try {
    t.encode_batch({"fine", "also fine", "bad \xff"}, false, 2);
    ADD_FAILURE() << "encode_batch accepted invalid UTF-8";
  } catch (const mla::Error& e) {
    EXPECT_NE(std::string(e.what()).find("text 2"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  const Tokenizer t = Tokenizer::from_json(slurp(text_data() + "/tiny_tokenizer.json"));
  for (int32_t id : {-1, 512, 1 << 30}) {
    try {
      t.decode({5, id}, false);
      ADD_FAILURE() << "decoded id " << id;
    } catch (const mla::Error& e) {
      EXPECT_NE(std::string(e.what()).find("token id " + std::to_string(id)), std::string::npos) << e.what();
    }
    StreamDecoder sd(t, false);
    EXPECT_THROW(sd.push(id), mla::Error);
  }
}

// ---- Streaming ----

TEST(Tokenizer, StreamDecoderHoldsBackPartialCharacters) {
  const Tokenizer t = Tokenizer::from_json(slurp(text_data() + "/tiny_tokenizer.json"));
  const auto ids = t.encode("\xf0\x9f\x98\x80", false);  // 😀: four byte tokens in a 512 vocabulary
  ASSERT_GT(ids.size(), 1u);
  StreamDecoder sd(t, false);
  std::string out;
  for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_EQ(sd.push(ids[i]), "") << i;
  EXPECT_EQ(sd.push(ids.back()), "\xf0\x9f\x98\x80");
  EXPECT_EQ(sd.flush(), "");
  // A dangling lead byte: held back, then U+FFFD at the end, as decode gives it.
  StreamDecoder sd2(t, false);
  EXPECT_EQ(sd2.push(ids[0]), "");
  EXPECT_EQ(sd2.push(*t.token_to_id("a")), "\xef\xbf\xbd" "a");
  EXPECT_EQ(sd2.push(ids[0]), "");
  EXPECT_EQ(sd2.flush(), "\xef\xbf\xbd");
  EXPECT_EQ(t.decode({ids[0], *t.token_to_id("a"), ids[0]}, false), "\xef\xbf\xbd" "a\xef\xbf\xbd");
}

// ---- Speed: long runs are linear (a quadratic merge loop takes seconds here) ----

TEST(Tokenizer, LongRunsTokenizeFast) {
  std::vector<std::pair<std::string, std::string>> toks{{"tiny", slurp(text_data() + "/tiny_tokenizer.json")}};
  if (exists(v3_dir() + "/tokenizer.json")) toks.emplace_back("v3", slurp(v3_dir() + "/tokenizer.json"));
  const std::vector<std::string> runs{std::string(100000, 'a'), std::string(100000, ' '), std::string(50000, '7'),
                                      [] { std::string s; for (int i = 0; i < 25000; ++i) s += "\xe4\xb8\xad"; return s; }(),
                                      [] { std::string s; for (int i = 0; i < 50000; ++i) s += "ab"; return s; }()};
  for (const auto& [name, tj] : toks) {
    const Tokenizer t = Tokenizer::from_json(tj);
    for (const auto& r : runs) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto ids = t.encode(r, false);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_LT(s, 2.0) << name << ": " << r.size() << " bytes of one run took " << s << " s";
      EXPECT_EQ(t.decode(ids, false), r) << name;
    }
  }
}

}  // namespace
