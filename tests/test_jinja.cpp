// The Jinja interpreter: every language case of tests/data/text/jinja_cases.json (made by
// scripts/jinja_cases.py: jinja2 in transformers' environment) renders the same text, or raises
// where jinja2 raised; plus syntax errors and unsupported constructs, named with their line:column.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "mla/error.h"
#include "text/jinja.h"

namespace mla::text::jinja {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in.good()) << p;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string render(const std::string& src, const ojson& ctx = ojson::object()) {
  return Template::parse(src).render(ctx);
}

std::string error_of(const std::string& src, const ojson& ctx = ojson::object()) {
  try {
    render(src, ctx);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Jinja, LanguageCasesMatchJinja2) {
  const ojson data = ojson::parse(read_file(fs::path(MLA_TEST_DATA) / "text" / "jinja_cases.json"));
  int texts = 0, errors = 0;
  for (const auto& c : data["cases"]) {
    const std::string src = c["template"];
    SCOPED_TRACE(src);
    if (c.contains("error")) {
      const std::string e = error_of(src, data["context"]);
      EXPECT_NE(e, "(no error)") << "jinja2 raised " << c["error"];
      EXPECT_EQ(e.find('\n'), std::string::npos) << e;
      ++errors;
      continue;
    }
    try {
      EXPECT_EQ(render(src, data["context"]), c["text"].get<std::string>());
    } catch (const Error& e) {
      ADD_FAILURE() << "raised: " << e.what();
    }
    ++texts;
  }
  EXPECT_GE(texts, 95);
  EXPECT_GE(errors, 15);
}

TEST(Jinja, RaiseExceptionGivesItsMessage) {
  EXPECT_EQ(error_of("{{ raise_exception('Conversation roles must alternate') }}"), "Conversation roles must alternate");
  EXPECT_EQ(error_of("{% if true %}{{ raise_exception('two\nlines') }}{% endif %}"), "two\\x0alines");
  // An empty message still names what happened (an error's text is never empty).
  EXPECT_EQ(error_of("{{ raise_exception('') }}"), "the template called raise_exception() without a message");
  EXPECT_EQ(error_of("{{ raise_exception() }}"), "the template called raise_exception() without a message");
  // Control bytes are escaped (a NUL first made the text look empty); a long message is cut.
  EXPECT_EQ(error_of(std::string("{{ raise_exception('\0a') }}", 27)), "\\x00a");
  EXPECT_EQ(error_of("{{ raise_exception('" + std::string(500, 'x') + "') }}"), std::string(400, 'x') + "...");
}

TEST(Jinja, UndefinedSemantics) {
  EXPECT_EQ(render("[{{ nope }}]"), "[]");
  EXPECT_EQ(render("{{ nope is defined }} {{ nope is undefined }} {{ nope is none }} {{ not nope }}"), "False True False True");
  EXPECT_EQ(render("{% for x in nope %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{{ nope | length }} {{ nope | default('d') }} {{ nope == nope }} {{ 'a' in nope }}"), "0 d True False");
  EXPECT_NE(error_of("{{ nope.attr }}").find("'nope' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ nope + 1 }}").find("'nope' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ {'a': 1}.b.c }}").find("has no attribute 'b'"), std::string::npos);
}

// The position of a bad construct: line:column of the tag, filter, test or token at fault.
TEST(Jinja, UnsupportedConstructsAreNamedWithTheirPosition) {
  EXPECT_EQ(error_of("ab\n  {% include 'x.jinja' %}"), "2:6: the 'include' tag is not supported");
  EXPECT_EQ(error_of("{% extends 'base' %}"), "1:4: the 'extends' tag is not supported");
  EXPECT_EQ(error_of("{% call foo() %}{% endcall %}"), "1:4: the 'call' tag is not supported");
  EXPECT_EQ(error_of("{% filter upper %}x{% endfilter %}"), "1:4: the 'filter' tag is not supported");
  EXPECT_EQ(error_of("{% frobnicate %}"), "1:4: unknown tag 'frobnicate'");
  EXPECT_EQ(error_of("x\n{{ y | wordwrap(3) }}"), "2:8: unsupported filter 'wordwrap'");
  EXPECT_EQ(error_of("{{ y is escaped }}"), "1:9: unsupported test 'escaped'");
  EXPECT_EQ(error_of("{% for x in y recursive %}{% endfor %}"), "1:15: recursive for loops are not supported");
  EXPECT_EQ(error_of("{{ f(*args) }}"), "1:6: *args and **kwargs in calls are not supported");
  EXPECT_EQ(error_of("{{ x[1, 2] }}"), "1:7: tuple subscripts are not supported");
  EXPECT_EQ(error_of("{{ '%s' % 1 }}"), "1:9: printf-style string formatting ('%' on a string) is not supported");
  EXPECT_EQ(error_of("{{ 'x'.format(1) }}"), "1:7: str.format() is not supported");
  EXPECT_EQ(error_of("{{ {1: 2} }}"), "1:5: dict keys other than strings (int) are not supported");
  EXPECT_EQ(error_of("{% set x | upper %}a{% endset %}"), "1:10: filters on a set block are not supported");
}

TEST(Jinja, SyntaxErrorsAreNamedWithTheirPosition) {
  EXPECT_EQ(error_of("{% if x %}a"), "1:12: unexpected end of template: expected '{% endif %}'");
  EXPECT_EQ(error_of("{% for x in y %}a{% endif %}"), "1:21: unknown tag 'endif'");
  EXPECT_EQ(error_of("{{ 1 + }}"), "1:8: unexpected '}}'");
  EXPECT_EQ(error_of("{{ (1 }}"), "1:7: unexpected '}', expected ')'");
  EXPECT_EQ(error_of("{{ [1, 2 }}"), "1:10: unexpected '}', expected ']'");
  EXPECT_EQ(error_of("a\n{{ x"), "2:1: unclosed tag (no '}}')");
  EXPECT_EQ(error_of("{# never closed"), "1:1: unclosed comment (no '#}')");
  EXPECT_EQ(error_of("{{ 'abc }}"), "1:4: unterminated string literal");
  EXPECT_EQ(error_of("{{ a ) }}"), "1:6: unexpected ')'");
  EXPECT_EQ(error_of("{{ a $ b }}"), "1:6: unexpected character '$'");
  EXPECT_EQ(error_of("{% set %}"), "1:8: expected a name, found '%}'");
  EXPECT_EQ(error_of("{% break %}"), "1:4: 'break' outside of a loop");
  EXPECT_EQ(error_of("{{ 012 }}"), "1:4: integer literal with a leading zero '012'");
  EXPECT_EQ(error_of("{{ 99999999999999999999 }}"), "1:4: integer literal '99999999999999999999' is too large");
  EXPECT_EQ(error_of("{% raw %}never ended"), "1:1: 'raw' block without 'endraw'");
  std::string deep = "{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}";
  EXPECT_NE(error_of(deep).find("nested too deeply"), std::string::npos);
}

TEST(Jinja, RuntimeErrorsCarryTheirPosition) {
  EXPECT_EQ(error_of("\n  {{ 'a' + 1 }}"), "2:10: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(error_of("{{ x.y }}", ojson{{"x", nullptr}}), "(no error)");  // none.attr is undefined
  EXPECT_EQ(error_of("{{ 1 // 0 }}"), "1:6: integer division or modulo by zero");
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}"), "1:24: integer result outside the interpreter's 64-bit range");
  EXPECT_NE(error_of("{{ range(100000000) | length }}").find("limit"), std::string::npos);
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("nested more than"), std::string::npos);
}

TEST(Jinja, ContextKeepsObjectOrder) {
  const ojson ctx = ojson::parse(R"({"d": {"z": 1, "a": 2, "m": 3}})");
  EXPECT_EQ(render("{{ d | tojson }} {% for k, v in d.items() %}{{ k }}{% endfor %}", ctx), "{\"z\": 1, \"a\": 2, \"m\": 3} zam");
}

TEST(Jinja, StrftimeNowFormatsTheTime) {
  const std::string year = render("{{ strftime_now('%Y') }}");
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

}  // namespace
}  // namespace mla::text::jinja
