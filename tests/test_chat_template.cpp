// Chat templates against transformers: every template in tests/data/text/templates/ x every
// conversation in tests/data/text/conversations.json renders byte for byte as transformers 5.17's
// apply_chat_template(..., tokenize=False) rendered it (tests/data/text/template_expected.json, made
// by scripts/template_fixtures.py), and raises where it raised. Plus loading tokenizer_config.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <unistd.h>

#include "mla/error.h"
#include "text/chat_template.h"

namespace mla::text {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
const fs::path kText = fs::path(MLA_TEST_DATA) / "text";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in.good()) << p;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Where two texts first differ, for a readable failure.
std::string first_difference(const std::string& a, const std::string& b) {
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  const size_t from = k > 40 ? k - 40 : 0;
  return "at byte " + std::to_string(k) + ": ours …" + a.substr(from, 80) + "… transformers …" + b.substr(from, 80) + "…";
}

TEST(ChatTemplate, EveryTemplateAndConversationMatchesTransformers) {
  const ojson conversations = ojson::parse(read_file(kText / "conversations.json"));
  const ojson expected = ojson::parse(read_file(kText / "template_expected.json"));
  ASSERT_NE(expected["renderer"].get<std::string>().find("transformers"), std::string::npos);
  std::map<std::string, ojson> by_name;
  for (const auto& c : conversations) by_name[c["name"]] = c;
  std::map<std::string, ChatTemplate> templates;
  int texts = 0, errors = 0;
  for (const auto& e : expected["cases"]) {
    const std::string tname = e["template"], cname = e["conversation"];
    SCOPED_TRACE(tname + " x " + cname);
    if (!templates.count(tname)) {
      ojson cfg = {{"chat_template", read_file(kText / "templates" / tname)},
                   {"bos_token", expected["bos_token"]},
                   {"eos_token", expected["eos_token"]},
                   {"pad_token", expected["pad_token"]}};
      templates.emplace(tname, ChatTemplate::from_config(cfg.dump(), tname));
    }
    const ChatTemplate& t = templates.at(tname);
    const ojson& c = by_name.at(cname);
    const ojson tools = c.contains("tools") ? c["tools"] : ojson(nullptr);
    const ojson extra = c.contains("extra") ? c["extra"] : ojson::object();
    if (e.contains("error")) {
      EXPECT_THROW(t.render(c["messages"], c["add_generation_prompt"].get<bool>(), tools, extra), Error)
          << "transformers raised " << e["error"];
      ++errors;
      continue;
    }
    const std::string want = e["text"];
    std::string got;
    try {
      got = t.render(c["messages"], c["add_generation_prompt"].get<bool>(), tools, extra);
    } catch (const Error& err) {
      ADD_FAILURE() << "raised: " << err.what();
      continue;
    }
    EXPECT_EQ(got, want) << first_difference(got, want);
    ++texts;
  }
  EXPECT_EQ(templates.size(), 5u);
  EXPECT_GE(texts, 120);
  EXPECT_GE(errors, 10);
}

// The real DeepSeek-V3 tokenizer_config.json: the template as a string, AddedToken dicts.
TEST(ChatTemplate, LoadsDeepSeekV3Config) {
  const ChatTemplate t = ChatTemplate::load((kText / "deepseek_v3_config").string());
  EXPECT_EQ(t.bos_token(), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(t.eos_token(), "<｜end▁of▁sentence｜>");
  EXPECT_EQ(t.source(), read_file(kText / "templates" / "deepseek_v3.jinja"));
  const ojson msgs = ojson::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}])");
  EXPECT_EQ(t.render(msgs, true), "<｜begin▁of▁sentence｜>S<｜User｜>Hi<｜Assistant｜>");
  EXPECT_EQ(t.render(msgs, false), "<｜begin▁of▁sentence｜>S<｜User｜>Hi");
  // a plain nlohmann::json works too
  EXPECT_EQ(t.render(nlohmann::json::parse(msgs.dump()), true), "<｜begin▁of▁sentence｜>S<｜User｜>Hi<｜Assistant｜>");
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("mla_chat_template_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ChatTemplate, NamedTemplateListPicksDefault) {
  TempDir d;
  d.write("tokenizer_config.json", R"({"bos_token": "<s>", "eos_token": {"content": "</s>"},
    "chat_template": [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "{{ bos_token }}D{{ eos_token }}"}]})");
  EXPECT_EQ(ChatTemplate::load(d.path.string()).render(ojson::array(), false), "<s>D</s>");
}

TEST(ChatTemplate, ChatTemplateJinjaFileWins) {
  TempDir d;
  d.write("tokenizer_config.json", R"({"bos_token": "<s>", "chat_template": "CONFIG"})");
  d.write("chat_template.jinja", "FILE{{ bos_token }}\n");
  EXPECT_EQ(ChatTemplate::load(d.path.string()).render(ojson::array(), false), "FILE<s>");
}

TEST(ChatTemplate, ExtraVariablesReachTheTemplate) {
  const ChatTemplate t("{{ thinking }}|{{ tools is none }}|{{ tools | length if tools else 0 }}", "", "");
  EXPECT_EQ(t.render(ojson::array(), false, nullptr, ojson{{"thinking", true}}), "True|True|0");
  EXPECT_EQ(t.render(ojson::array(), false, ojson::parse("[1, 2]")), "|False|2");
}

TEST(ChatTemplate, BadConfigsAreNamed) {
  TempDir d;
  EXPECT_NE(error_of([&] { ChatTemplate::load(d.path.string()); }).find("no tokenizer_config.json"), std::string::npos);
  d.write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  EXPECT_NE(error_of([&] { ChatTemplate::load(d.path.string()); }).find("no chat_template"), std::string::npos);
  d.write("tokenizer_config.json", R"({"chat_template": [{"name": "x", "template": "y"}]})");
  EXPECT_NE(error_of([&] { ChatTemplate::load(d.path.string()); }).find("\"default\""), std::string::npos);
  d.write("tokenizer_config.json", R"({"chat_template": "{% for %}"})");
  const std::string e = error_of([&] { ChatTemplate::load(d.path.string()); });
  EXPECT_NE(e.find("tokenizer_config.json: chat template: 1:"), std::string::npos) << e;
  d.write("tokenizer_config.json", R"({"chat_template": "x", "bos_token": 5})");
  EXPECT_NE(error_of([&] { ChatTemplate::load(d.path.string()); }).find("bos_token"), std::string::npos);
  d.write("tokenizer_config.json", "{not json");
  EXPECT_NE(error_of([&] { ChatTemplate::load(d.path.string()); }).find("not valid JSON"), std::string::npos);
  const ChatTemplate t("x", "", "");
  EXPECT_NE(error_of([&] { t.render(ojson::object(), false); }).find("JSON array"), std::string::npos);
}

}  // namespace
}  // namespace mla::text
