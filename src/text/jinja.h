// text/jinja.h — a Jinja interpreter for chat templates, rendering as transformers renders them:
// jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols
// extension, transformers' tojson / raise_exception / strftime_now, and jinja2's default
// Undefined. Python's semantics for values (str(), repr(), json.dumps, arithmetic, slicing).
// A construct it does not support is an mla::Error naming it and its line:column — never a
// silently different rendering.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace mla::text::jinja {

struct Program;  // the parsed template (jinja_ast.h)

class Template {
 public:
  // Bad syntax or an unsupported tag, filter, test or operator → mla::Error "line:col: ...".
  static Template parse(std::string_view source);

  // `context` is a JSON object whose members become the template's variables (objects keep their
  // insertion order, as nlohmann::ordered_json keeps it; a plain nlohmann::json is sorted by key).
  // Globals: range, namespace, dict, raise_exception, strftime_now. An error at render time
  // (raise_exception, a type error, an undefined value used) → mla::Error.
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  explicit Template(std::shared_ptr<const Program> p) : program_(std::move(p)) {}
  std::shared_ptr<const Program> program_;
};

}  // namespace mla::text::jinja
