// text/chat_template.cpp — loading tokenizer_config.json's chat template and rendering it with the
// context transformers builds.
#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "mla/error.h"

namespace mla::text {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail("cannot read {}", p.string());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A special token as a string: "..." or {"content": "...", ...}; absent or null → nullopt.
std::optional<std::string> token_of(const nlohmann::ordered_json& cfg, const char* key, const std::string& what) {
  if (!cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
  const auto& t = cfg[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  fail("{}: {} must be a string or an object with a string \"content\"", what, key);
}

jinja::Template parse_named(const std::string& source, const std::string& what) {
  try {
    return jinja::Template::parse(source);
  } catch (const Error& e) {
    fail("{}: chat template: {}", what, e.what());
  }
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token)
    : source_(source), tmpl_(parse_named(source, "chat template")), bos_(std::move(bos_token)), eos_(std::move(eos_token)) {}

ChatTemplate ChatTemplate::from_config(const std::string& config_json, const std::string& what) {
  nlohmann::ordered_json cfg;
  try {
    cfg = nlohmann::ordered_json::parse(config_json);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON ({})", what, e.what());
  }
  if (!cfg.is_object()) fail("{}: not a JSON object", what);
  if (!cfg.contains("chat_template") || cfg["chat_template"].is_null()) fail("{}: no chat_template", what);
  const auto& ct = cfg["chat_template"];
  std::string source;
  if (ct.is_string()) {
    source = ct.get<std::string>();
  } else if (ct.is_array()) {
    bool found = false;
    for (const auto& t : ct) {
      if (!t.is_object() || !t.contains("name") || !t.contains("template") || !t["name"].is_string() ||
          !t["template"].is_string())
        fail("{}: chat_template list items must be {{\"name\": string, \"template\": string}}", what);
      if (t["name"] == "default") {
        source = t["template"].get<std::string>();
        found = true;
      }
    }
    if (!found) fail("{}: chat_template list has no template named \"default\"", what);
  } else {
    fail("{}: chat_template must be a string or a list of named templates", what);
  }
  ChatTemplate c(std::string(), "", "");
  c.source_ = source;
  c.tmpl_ = parse_named(source, what);
  c.bos_ = token_of(cfg, "bos_token", what).value_or("");
  c.eos_ = token_of(cfg, "eos_token", what).value_or("");
  if (auto u = token_of(cfg, "unk_token", what)) {
    c.unk_ = *u;
    c.has_unk_ = true;
  }
  if (auto p = token_of(cfg, "pad_token", what)) {
    c.pad_ = *p;
    c.has_pad_ = true;
  }
  return c;
}

ChatTemplate ChatTemplate::load(const std::string& dir) {
  const fs::path cfg_path = fs::path(dir) / "tokenizer_config.json";
  const fs::path jinja_path = fs::path(dir) / "chat_template.jinja";
  std::string cfg_text = fs::exists(cfg_path) ? read_text(cfg_path) : std::string("{}");
  if (fs::exists(jinja_path)) {
    nlohmann::ordered_json cfg;
    try {
      cfg = nlohmann::ordered_json::parse(cfg_text);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON ({})", cfg_path.string(), e.what());
    }
    if (!cfg.is_object()) fail("{}: not a JSON object", cfg_path.string());
    cfg["chat_template"] = read_text(jinja_path);
    return from_config(cfg.dump(), jinja_path.string());
  }
  if (!fs::exists(cfg_path)) fail("{}: no tokenizer_config.json (nor chat_template.jinja)", dir);
  return from_config(cfg_text, cfg_path.string());
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& tools, const nlohmann::ordered_json& extra) const {
  if (!messages.is_array()) fail("chat messages must be a JSON array");
  if (!extra.is_object() && !extra.is_null()) fail("extra template variables must be a JSON object");
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = messages;
  ctx["tools"] = tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  ctx["bos_token"] = bos_;
  ctx["eos_token"] = eos_;
  if (has_unk_) ctx["unk_token"] = unk_;
  if (has_pad_) ctx["pad_token"] = pad_;
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
  return tmpl_.render(ctx);
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt, const nlohmann::json& tools,
                                 const nlohmann::json& extra) const {
  return render(nlohmann::ordered_json::parse(messages.dump()), add_generation_prompt,
                nlohmann::ordered_json::parse(tools.dump()), nlohmann::ordered_json::parse(extra.dump()));
}

}  // namespace mla::text
