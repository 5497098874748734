// text/jinja_parse.cpp — the lexer (jinja2's, with trim_blocks and lstrip_blocks on) and the
// parser of statements and expressions, with jinja2's precedence.
#include <cstring>

#include "mla/error.h"
#include "text/jinja_ast.h"

namespace mla::text::jinja {
namespace {

constexpr int kMaxDepth = 200;  // nesting of expressions and blocks

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, Int, Float, String, Op, Eof };

struct Token {
  Tok type;
  std::string text;  // Text, Name, String (decoded), Op
  int64_t i = 0;
  double f = 0;
  Pos pos;
};

const char* tok_name(Tok t) {
  switch (t) {
    case Tok::Text: return "text";
    case Tok::VarBegin: return "'{{'";
    case Tok::VarEnd: return "'}}'";
    case Tok::BlockBegin: return "'{%'";
    case Tok::BlockEnd: return "'%}'";
    case Tok::Name: return "name";
    case Tok::Int: return "integer";
    case Tok::Float: return "float";
    case Tok::String: return "string";
    case Tok::Op: return "operator";
    case Tok::Eof: return "end of template";
  }
  return "?";
}

std::string describe(const Token& t) {
  if (t.type == Tok::Name || t.type == Tok::Op) return "'" + t.text + "'";
  return tok_name(t.type);
}

// ---- lexer ------------------------------------------------------------------------------------

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // jinja2 turns every newline into "\n" and drops one trailing newline (keep_trailing_newline off).
    src_.reserve(source.size());
    for (size_t k = 0; k < source.size(); ++k) {
      if (source[k] == '\r') {
        src_ += '\n';
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
      } else {
        src_ += source[k];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    size_t p = 0;
    bool line_starting = true;
    const size_t n = src_.size();
    while (p < n) {
      size_t m = p;
      while (true) {
        m = src_.find('{', m);
        if (m == std::string::npos || m + 1 >= n) {
          m = std::string::npos;
          break;
        }
        const char k = src_[m + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++m;
      }
      if (m == std::string::npos) {
        emit_text(src_.substr(p), p);
        break;
      }
      std::string text = src_.substr(p, m - p);
      const char kind = src_[m + 1];
      const char sign = m + 2 < n && (src_[m + 2] == '-' || src_[m + 2] == '+') ? src_[m + 2] : 0;
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks: block and comment tags
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          if (text.find_first_not_of(" \t", l_pos) == std::string::npos) text.resize(l_pos);
        }
      }
      emit_text(text, p);
      size_t q = m + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        size_t e = q;
        while (true) {
          e = src_.find("#}", e);
          if (e == std::string::npos) fail("{}: unclosed comment (no '#}}')", where(m));
          break;
        }
        size_t after = e + 2;
        if (e > q && src_[e - 1] == '-') after = skip_ws(after);
        else if (!(e > q && src_[e - 1] == '+') && after < n && src_[after] == '\n') ++after;
        p = after;
      } else if (kind == '%' && is_raw_begin(q)) {
        p = lex_raw(m, q);
      } else {
        p = lex_tag(m, q, kind == '%');
      }
      line_starting = p > 0 && src_[p - 1] == '\n';
    }
    tokens_.push_back({Tok::Eof, "", 0, 0, at(n)});
    return std::move(tokens_);
  }

 private:
  std::string src_;
  std::vector<Token> tokens_;
  std::vector<size_t> line_starts_;

  Pos at(size_t off) {
    if (line_starts_.empty()) {
      line_starts_.push_back(0);
      for (size_t k = 0; k < src_.size(); ++k)
        if (src_[k] == '\n') line_starts_.push_back(k + 1);
    }
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), off) - 1;
    return {int(it - line_starts_.begin()) + 1, int(off - *it) + 1};
  }
  std::string where(size_t off) {
    const Pos p = at(off);
    return fmt::format("{}:{}", p.line, p.col);
  }

  static bool ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

  // Python's str.rstrip() / \s*: Unicode whitespace.
  static std::string rstrip_ws(const std::string& s) {
    std::u32string u = to_u32(s);
    size_t e = u.size();
    while (e > 0 && py_isspace(u[e - 1])) --e;
    if (e == u.size()) return s;
    return from_u32(std::u32string_view(u).substr(0, e));
  }
  size_t skip_ws(size_t k) {
    while (k < src_.size()) {
      const unsigned char c = static_cast<unsigned char>(src_[k]);
      if (c < 0x80) {
        if (!py_isspace(c)) break;
        ++k;
        continue;
      }
      const std::u32string one = to_u32(std::string_view(src_).substr(k, 4));
      if (one.empty() || !py_isspace(one[0])) break;
      std::string back;
      append_utf8(back, one[0]);
      k += back.size();
    }
    return k;
  }

  void emit_text(std::string text, size_t off) {
    if (!text.empty()) tokens_.push_back({Tok::Text, std::move(text), 0, 0, at(off)});
  }

  bool is_raw_begin(size_t q) {
    size_t k = q;
    while (k < src_.size() && ascii_space(src_[k])) ++k;
    if (src_.compare(k, 3, "raw") != 0) return false;
    k += 3;
    while (k < src_.size() && ascii_space(src_[k])) ++k;
    if (k < src_.size() && (src_[k] == '-' || src_[k] == '+')) ++k;
    return src_.compare(k, 2, "%}") == 0;
  }

  // {% raw %}...{% endraw %}: the text between, verbatim.
  size_t lex_raw(size_t m, size_t q) {
    size_t k = q;
    while (ascii_space(src_[k])) ++k;
    k += 3;
    while (ascii_space(src_[k])) ++k;
    const bool strip_after = src_[k] == '-';
    if (src_[k] == '-' || src_[k] == '+') ++k;
    k += 2;
    if (strip_after) k = skip_ws(k);
    size_t s = k;
    while (true) {
      const size_t b = src_.find("{%", s);
      if (b == std::string::npos) fail("{}: 'raw' block without 'endraw'", where(m));
      size_t j = b + 2;
      const char sign = j < src_.size() && (src_[j] == '-' || src_[j] == '+') ? src_[j] : 0;
      if (sign) ++j;
      while (j < src_.size() && ascii_space(src_[j])) ++j;
      if (src_.compare(j, 6, "endraw") != 0) {
        s = b + 2;
        continue;
      }
      j += 6;
      while (j < src_.size() && ascii_space(src_[j])) ++j;
      char esign = 0;
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) esign = src_[j++];
      if (src_.compare(j, 2, "%}") != 0) {
        s = b + 2;
        continue;
      }
      std::string text = src_.substr(k, b - k);
      if (sign == '-') text = rstrip_ws(text);
      emit_text(text, k);
      j += 2;
      if (esign == '-') j = skip_ws(j);
      else if (esign != '+' && j < src_.size() && src_[j] == '\n') ++j;
      return j;
    }
  }

  size_t lex_tag(size_t m, size_t q, bool block) {
    tokens_.push_back({block ? Tok::BlockBegin : Tok::VarBegin, "", 0, 0, at(m)});
    const size_t n = src_.size();
    std::string depth;  // the open brackets: no end marker is recognised inside them
    size_t k = q;
    while (true) {
      while (k < n && ascii_space(src_[k])) ++k;
      if (k >= n) fail("{}: unclosed tag (no '{}')", where(m), block ? "%}" : "}}");
      if (depth.empty()) {
        const char* close = block ? "%}" : "}}";
        if (src_[k] == '-' && src_.compare(k + 1, 2, close) == 0) {
          tokens_.push_back({block ? Tok::BlockEnd : Tok::VarEnd, "", 0, 0, at(k)});
          return skip_ws(k + 3);
        }
        if (block && src_[k] == '+' && src_.compare(k + 1, 2, close) == 0) {
          tokens_.push_back({Tok::BlockEnd, "", 0, 0, at(k)});
          return k + 3;
        }
        if (src_.compare(k, 2, close) == 0) {
          tokens_.push_back({block ? Tok::BlockEnd : Tok::VarEnd, "", 0, 0, at(k)});
          k += 2;
          if (block && k < n && src_[k] == '\n') ++k;  // trim_blocks
          return k;
        }
      }
      k = lex_one(k, depth);
    }
  }

  static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  size_t digits(size_t k) {  // \d+(_\d+)*
    while (k < src_.size() && (is_digit(src_[k]) || (src_[k] == '_' && k + 1 < src_.size() && is_digit(src_[k + 1]))))
      ++k;
    return k;
  }

  size_t lex_one(size_t k, std::string& depth) {
    const size_t n = src_.size();
    const char c = src_[k];
    const Pos pos = at(k);
    if (is_name_start(c)) {
      size_t e = k + 1;
      while (e < n && (is_name_start(src_[e]) || is_digit(src_[e]))) ++e;
      tokens_.push_back({Tok::Name, src_.substr(k, e - k), 0, 0, pos});
      return e;
    }
    if (is_digit(c)) {
      size_t e = digits(k);
      bool is_float = false;
      if (e + 1 < n && src_[e] == '.' && is_digit(src_[e + 1])) {
        e = digits(e + 1);
        is_float = true;
      }
      if (e < n && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t x = e + 1;
        if (x < n && (src_[x] == '+' || src_[x] == '-')) ++x;
        if (x < n && is_digit(src_[x])) {
          e = digits(x);
          is_float = true;
        }
      }
      std::string t;
      for (size_t j = k; j < e; ++j)
        if (src_[j] != '_') t += src_[j];
      Token tok{is_float ? Tok::Float : Tok::Int, t, 0, 0, pos};
      if (is_float) {
        tok.f = std::strtod(t.c_str(), nullptr);
      } else {
        if (t.size() > 1 && t[0] == '0' && t.find_first_not_of('0') != std::string::npos)
          fail("{}:{}: integer literal with a leading zero '{}'", pos.line, pos.col, t);
        errno = 0;
        tok.i = std::strtoll(t.c_str(), nullptr, 10);
        if (errno == ERANGE) fail("{}:{}: integer literal '{}' is too large", pos.line, pos.col, t);
      }
      tokens_.push_back(tok);
      return e;
    }
    if (c == '\'' || c == '"') return lex_string(k, pos);
    static const char* two[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : two)
      if (src_.compare(k, 2, op) == 0) {
        tokens_.push_back({Tok::Op, op, 0, 0, pos});
        return k + 2;
      }
    if (std::strchr("+-*/%~<>=()[]{},.:|", c) && c != 0) {
      if (c == '(' || c == '[' || c == '{') depth += c == '(' ? ')' : c == '[' ? ']' : '}';
      if (c == ')' || c == ']' || c == '}') {
        if (depth.empty()) fail("{}:{}: unexpected '{}'", pos.line, pos.col, c);
        if (depth.back() != c) fail("{}:{}: unexpected '{}', expected '{}'", pos.line, pos.col, c, depth.back());
        depth.pop_back();
      }
      tokens_.push_back({Tok::Op, std::string(1, c), 0, 0, pos});
      return k + 1;
    }
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7F) fail("{}:{}: unexpected character \\x{:02x}", pos.line, pos.col, unsigned(u));
    fail("{}:{}: unexpected character '{}'", pos.line, pos.col, c);
  }

  static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Python's unicode-escape decoding of the literal's body, as jinja2 does it.
  size_t lex_string(size_t k, Pos pos) {
    const char q = src_[k];
    const size_t n = src_.size();
    std::string out;
    size_t j = k + 1;
    while (true) {
      if (j >= n) fail("{}:{}: unterminated string literal", pos.line, pos.col);
      const char c = src_[j];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++j;
        continue;
      }
      if (j + 1 >= n) fail("{}:{}: unterminated string literal", pos.line, pos.col);
      const char e = src_[j + 1];
      j += 2;
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const int len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t v = 0;
          for (int d = 0; d < len; ++d) {
            const int h = j + size_t(d) < n ? hexval(src_[j + size_t(d)]) : -1;
            if (h < 0) fail("{}:{}: truncated \\{} escape in a string literal", pos.line, pos.col, e);
            v = v * 16 + uint32_t(h);
          }
          if (v > 0x10FFFF) fail("{}:{}: \\{} escape out of range in a string literal", pos.line, pos.col, e);
          if (v >= 0xD800 && v <= 0xDFFF)
            fail("{}:{}: a surrogate code point escape in a string literal is not supported", pos.line, pos.col);
          append_utf8(out, char32_t(v));
          j += size_t(len);
          break;
        }
        case 'N': fail("{}:{}: \\N{{...}} escapes in string literals are not supported", pos.line, pos.col);
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = uint32_t(e - '0');
            for (int d = 0; d < 2 && j < n && src_[j] >= '0' && src_[j] <= '7'; ++d) v = v * 8 + uint32_t(src_[j++] - '0');
            append_utf8(out, char32_t(v));
          } else {  // an unknown escape stays as written
            out += '\\';
            out += e;
          }
      }
    }
    tokens_.push_back({Tok::String, out, 0, 0, pos});
    return j + 1;
  }
};

// ---- parser -----------------------------------------------------------------------------------

class Parser {
 public:
  explicit Parser(std::vector<Token> t) : t_(std::move(t)) {}

  Program run() {
    Program p;
    std::string end = parse_body(p.body, {});
    (void)end;
    return p;
  }

 private:
  std::vector<Token> t_;
  size_t k_ = 0;
  int depth_ = 0;

  struct DepthGuard {
    Parser& p;
    DepthGuard(Parser& pp, Pos pos) : p(pp) {
      if (++p.depth_ > kMaxDepth) fail("{}:{}: template nested too deeply (more than {} levels)", pos.line, pos.col, kMaxDepth);
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return t_[k_]; }
  const Token& peek(size_t d = 1) const { return t_[std::min(k_ + d, t_.size() - 1)]; }
  Token next() { return t_[k_ < t_.size() - 1 ? k_++ : k_]; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* nm) const { return cur().type == Tok::Name && cur().text == nm; }
  [[noreturn]] void error_at(const Token& t, const std::string& what) const {
    fail("{}:{}: {}", t.pos.line, t.pos.col, what);
  }
  void expect_op(const char* op) {
    if (!is_op(op)) error_at(cur(), fmt::format("expected '{}', found {}", op, describe(cur())));
    next();
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) error_at(cur(), fmt::format("expected a name, found {}", describe(cur())));
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) error_at(cur(), fmt::format("expected '%}}', found {}", describe(cur())));
    next();
  }

  static ExprPtr make(ExprType type, Pos pos) {
    auto e = std::make_unique<Expr>();
    e->type = type;
    e->pos = pos;
    return e;
  }
  static NodePtr make_node(NodeType type, Pos pos) {
    auto n = std::make_unique<Node>();
    n->type = type;
    n->pos = pos;
    return n;
  }

  // Parses nodes until a block tag named in `ends` (consumed up to and including its name) or the
  // end of the template (only when `ends` is empty). Returns the ending tag's name.
  std::string parse_body(Body& body, const std::vector<std::string>& ends) {
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (!ends.empty()) error_at(t, fmt::format("unexpected end of template: expected '{{% {} %}}'", ends.back()));
        return "";
      }
      if (t.type == Tok::Text) {
        auto n = make_node(NodeType::Text, t.pos);
        n->text = t.text;
        body.push_back(std::move(n));
        next();
        continue;
      }
      if (t.type == Tok::VarBegin) {
        next();
        auto n = make_node(NodeType::Output, t.pos);
        n->expr = parse_tuple(true);
        if (cur().type != Tok::VarEnd) error_at(cur(), fmt::format("expected '}}}}', found {}", describe(cur())));
        next();
        body.push_back(std::move(n));
        continue;
      }
      if (t.type != Tok::BlockBegin) error_at(t, fmt::format("unexpected {}", describe(t)));
      const Token& tag = peek();
      if (tag.type != Tok::Name) error_at(tag, fmt::format("expected a tag name, found {}", describe(tag)));
      for (const std::string& e : ends)
        if (tag.text == e) {
          next();
          next();
          return e;
        }
      next();
      DepthGuard g(*this, tag.pos);
      body.push_back(parse_statement());
    }
  }

  NodePtr parse_statement() {
    const Token tag = next();
    const std::string& nm = tag.text;
    if (nm == "if") return parse_if(tag.pos);
    if (nm == "for") return parse_for(tag.pos);
    if (nm == "set") return parse_set(tag.pos);
    if (nm == "macro") return parse_macro(tag.pos);
    if (nm == "break" || nm == "continue") {
      if (loop_depth_ == 0) error_at(tag, fmt::format("'{}' outside of a loop", nm));
      expect_block_end();
      return make_node(nm == "break" ? NodeType::Break : NodeType::Continue, tag.pos);
    }
    static const char* unsupported[] = {"extends", "include", "import", "from", "block", "call", "filter",
                                        "with", "autoescape", "do", "trans", "endwith"};
    for (const char* u : unsupported)
      if (nm == u) error_at(tag, fmt::format("the '{}' tag is not supported", nm));
    error_at(tag, fmt::format("unknown tag '{}'", nm));
  }

  int loop_depth_ = 0;

  NodePtr parse_if(Pos pos) {
    auto n = make_node(NodeType::If, pos);
    ExprPtr cond = parse_tuple(false);
    expect_block_end();
    while (true) {
      Body body;
      const std::string end = parse_body(body, {"elif", "else", "endif"});
      n->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        cond = parse_tuple(false);
        expect_block_end();
        continue;
      }
      if (end == "else") {
        expect_block_end();
        parse_body(n->else_body, {"endif"});
      }
      expect_block_end();
      return n;
    }
  }

  void parse_targets(Node& n) {
    bool paren = false;
    if (is_op("(")) {
      paren = true;
      next();
    }
    n.targets.push_back(expect_name());
    while (is_op(",")) {
      n.target_tuple = true;
      next();
      if (cur().type != Tok::Name) break;
      n.targets.push_back(expect_name());
    }
    if (paren) expect_op(")");
  }

  NodePtr parse_for(Pos pos) {
    auto n = make_node(NodeType::For, pos);
    parse_targets(*n);
    if (!is_name("in")) error_at(cur(), fmt::format("expected 'in' in the for tag, found {}", describe(cur())));
    next();
    n->expr = parse_tuple(false, /*for_iter=*/true);
    if (is_name("if")) {
      next();
      n->filter = parse_tuple(false);
    }
    if (is_name("recursive")) error_at(cur(), "recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    const std::string end = parse_body(n->body, {"else", "endfor"});
    --loop_depth_;
    if (end == "else") {
      expect_block_end();
      parse_body(n->else_body, {"endfor"});
    }
    expect_block_end();
    return n;
  }

  NodePtr parse_set(Pos pos) {
    if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == ".") {
      auto n = make_node(NodeType::SetAttr, pos);
      n->targets.push_back(next().text);
      next();
      n->targets.push_back(expect_name());
      expect_op("=");
      n->expr = parse_tuple(false);
      expect_block_end();
      return n;
    }
    auto n = make_node(NodeType::Set, pos);
    parse_targets(*n);
    if (cur().type == Tok::BlockEnd && !n->target_tuple && n->targets.size() == 1) {
      next();
      n->type = NodeType::SetBlock;
      parse_body(n->body, {"endset"});
      expect_block_end();
      return n;
    }
    if (is_op("|")) error_at(cur(), "filters on a set block are not supported");
    expect_op("=");
    n->expr = parse_tuple(false);
    expect_block_end();
    return n;
  }

  NodePtr parse_macro(Pos pos) {
    auto n = make_node(NodeType::Macro, pos);
    n->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      if (!n->params.empty()) expect_op(",");
      if (is_op(")")) break;
      n->params.push_back(expect_name());
      if (is_op("=")) {
        next();
        n->defaults.push_back(parse_expression());
      } else {
        if (!n->defaults.empty() && n->defaults.back())
          error_at(cur(), "a macro parameter without a default follows one with a default");
        n->defaults.push_back(nullptr);
      }
    }
    next();
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    parse_body(n->body, {"endmacro"});
    loop_depth_ = saved;
    expect_block_end();
    return n;
  }

  // ---- expressions ----

  // An expression, or several separated by commas (an implicit tuple).
  ExprPtr parse_tuple(bool with_condexpr, bool for_iter = false) {
    const Pos pos = cur().pos;
    ExprPtr first = with_condexpr ? parse_expression() : (for_iter ? parse_or() : parse_expression());
    if (!is_op(",")) return first;
    auto t = make(ExprType::Tuple, pos);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (cur().type == Tok::BlockEnd || cur().type == Tok::VarEnd || is_name("if") || is_op(")")) break;
      t->args.push_back(for_iter ? parse_or() : parse_expression());
    }
    return t;
  }

  ExprPtr parse_expression() {
    DepthGuard g(*this, cur().pos);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const Pos pos = cur().pos;
      next();
      auto c = make(ExprType::Cond, pos);
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (is_name("else")) {
        next();
        other = parse_expression();
      }
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, Pos pos) {
    auto e = make(ExprType::Binary, pos);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const Pos pos = next().pos;
      e = binary("or", std::move(e), parse_and(), pos);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const Pos pos = next().pos;
      e = binary("and", std::move(e), parse_not(), pos);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this, cur().pos);
      const Pos pos = next().pos;
      auto e = make(ExprType::Unary, pos);
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const Pos pos = cur().pos;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprType::Compare, pos);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token op = next();
      e = binary(op.text, std::move(e), parse_concat(), op.pos);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Pos pos = next().pos;
      e = binary("~", std::move(e), parse_math2(), pos);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token op = next();
      e = binary(op.text, std::move(e), parse_pow(), op.pos);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Pos pos = next().pos;
      e = binary("**", std::move(e), parse_unary(true), pos);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(*this, cur().pos);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token op = next();
      e = make(ExprType::Unary, op.pos);
      e->name = op.text;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token t = cur();
    switch (t.type) {
      case Tok::Name: {
        next();
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          auto e = make(ExprType::Literal, t.pos);
          e->value = Value::boolean(t.text[0] == 't' || t.text[0] == 'T');
          return e;
        }
        if (t.text == "none" || t.text == "None") {
          auto e = make(ExprType::Literal, t.pos);
          e->value = Value::none();
          return e;
        }
        auto e = make(ExprType::Name, t.pos);
        e->name = t.text;
        return e;
      }
      case Tok::String: {
        std::string s;
        while (cur().type == Tok::String) s += next().text;  // adjacent literals join
        auto e = make(ExprType::Literal, t.pos);
        e->value = Value::string(std::move(s));
        return e;
      }
      case Tok::Int: {
        next();
        auto e = make(ExprType::Literal, t.pos);
        e->value = Value::integer(t.i);
        return e;
      }
      case Tok::Float: {
        next();
        auto e = make(ExprType::Literal, t.pos);
        e->value = Value::real(t.f);
        return e;
      }
      case Tok::Op:
        if (t.text == "(") {
          next();
          if (is_op(")")) {
            next();
            return make(ExprType::Tuple, t.pos);
          }
          ExprPtr inner = parse_expression();
          if (is_op(")")) {
            next();
            return inner;
          }
          auto tup = make(ExprType::Tuple, t.pos);
          tup->args.push_back(std::move(inner));
          while (is_op(",")) {
            next();
            if (is_op(")")) break;
            tup->args.push_back(parse_expression());
          }
          expect_op(")");
          return tup;
        }
        if (t.text == "[") {
          next();
          auto e = make(ExprType::List, t.pos);
          while (!is_op("]")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("]")) break;
            e->args.push_back(parse_expression());
          }
          next();
          return e;
        }
        if (t.text == "{") {
          next();
          auto e = make(ExprType::Dict, t.pos);
          while (!is_op("}")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("}")) break;
            e->args.push_back(parse_expression());
            expect_op(":");
            e->args.push_back(parse_expression());
          }
          next();
          return e;
        }
        break;
      default: break;
    }
    error_at(t, fmt::format("unexpected {}", describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const Pos pos = next().pos;
        if (cur().type == Tok::Name) {
          auto a = make(ExprType::Attr, pos);
          a->name = next().text;
          a->args.push_back(std::move(e));
          e = std::move(a);
        } else if (cur().type == Tok::Int) {
          auto a = make(ExprType::Item, pos);
          a->args.push_back(std::move(e));
          auto lit = make(ExprType::Literal, cur().pos);
          lit->value = Value::integer(next().i);
          a->args.push_back(std::move(lit));
          e = std::move(a);
        } else {
          error_at(cur(), fmt::format("expected an attribute name after '.', found {}", describe(cur())));
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const Pos pos = next().pos;  // '['
    ExprPtr parts[3];
    bool slice = false;
    if (!is_op(":")) {
      parts[0] = parse_expression();
      if (is_op(",")) error_at(cur(), "tuple subscripts are not supported");
    }
    if (is_op(":")) {
      slice = true;
      next();
      if (!is_op("]") && !is_op(":")) parts[1] = parse_expression();
      if (is_op(":")) {
        next();
        if (!is_op("]")) parts[2] = parse_expression();
      }
    }
    expect_op("]");
    auto e = make(slice ? ExprType::Slice : ExprType::Item, pos);
    e->args.push_back(std::move(obj));
    if (slice) {
      for (auto& p : parts) e->args.push_back(std::move(p));
    } else {
      e->args.push_back(std::move(parts[0]));
    }
    return e;
  }

  void parse_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) error_at(cur(), "*args and **kwargs in calls are not supported");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        e.kwnames.push_back(next().text);
        next();
        e.kwargs.push_back(parse_expression());
      } else {
        if (!e.kwnames.empty()) error_at(cur(), "a positional argument follows a keyword argument");
        e.args.push_back(parse_expression());
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(ExprType::Call, cur().pos);
    e->args.push_back(std::move(callee));
    parse_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        next();
        auto f = make(ExprType::Filter, cur().pos);
        f->name = expect_name();
        while (is_op(".")) {
          next();
          f->name += "." + expect_name();
        }
        if (!is_known_filter(f->name)) error_at(t_[k_ - 1], fmt::format("unsupported filter '{}'", f->name));
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        next();
        auto t = make(ExprType::Test, cur().pos);
        if (is_name("not")) {
          next();
          t->negated = true;
        }
        t->name = expect_name();
        while (is_op(".")) {
          next();
          t->name += "." + expect_name();
        }
        if (!is_known_test(t->name)) error_at(t_[k_ - 1], fmt::format("unsupported test '{}'", t->name));
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*t);
        } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                    cur().type == Tok::Float || is_op("[") || is_op("{")) &&
                   !(is_name("else") || is_name("or") || is_name("and"))) {
          ExprPtr arg = parse_postfix(parse_primary());
          t->args.push_back(std::move(arg));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }
};

}  // namespace

Template Template::parse(std::string_view source) {
  try {
    std::vector<Token> tokens = Lexer(source).run();
    auto program = std::make_shared<Program>(Parser(std::move(tokens)).run());
    return Template(std::move(program));
  } catch (const Error& e) {
    throw Error(printable_line(e.what(), kMaxErrorBytes));
  }
}

}  // namespace mla::text::jinja
