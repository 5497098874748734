// text/jinja_ast.h — the parsed template: expressions and statements, each with its line:column.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "text/jinja.h"
#include "text/jinja_value.h"

namespace mla::text::jinja {

struct Pos {
  int line = 1, col = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprType {
  Literal,   // value
  Name,      // name
  List,      // args
  Tuple,     // args
  Dict,      // args: key, value, key, value, ...
  Attr,      // args[0] . name
  Item,      // args[0] [ args[1] ]
  Slice,     // args[0] [ args[1] : args[2] : args[3] ] (null parts allowed)
  Call,      // args[0] ( args[1..], kwnames = kwargs )
  Filter,    // args[0] | name ( args[1..], kwnames = kwargs )
  Test,      // args[0] is [not] name ( args[1..] )
  Unary,     // op args[0]: "not", "-", "+"
  Binary,    // args[0] op args[1]: arithmetic, "~", "and", "or"
  Compare,   // args[0] ops[0] args[1] ops[1] args[2] ...: == != < > <= >= in notin
  Cond,      // args[0] if args[1] else args[2] (args[2] may be null)
};

struct Expr {
  ExprType type;
  Pos pos;
  Value value;                    // Literal
  std::string name;               // Name, Attr, Filter, Test, Unary/Binary op
  std::vector<ExprPtr> args;      // see ExprType
  std::vector<std::string> kwnames;
  std::vector<ExprPtr> kwargs;
  std::vector<std::string> ops;   // Compare
  bool negated = false;           // Test: "is not"
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

enum class NodeType { Text, Output, If, For, Set, SetAttr, SetBlock, Macro, Break, Continue };

struct Node {
  NodeType type;
  Pos pos;
  std::string text;                          // Text
  ExprPtr expr;                              // Output, Set/SetAttr value, For iterable
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: (condition, body) per if/elif
  Body body, else_body;                      // For, If (else), SetBlock, Macro
  std::vector<std::string> targets;          // For/Set names (several: unpacking); SetAttr: [obj, attr]
  bool target_tuple = false;                 // "a, b" form
  ExprPtr filter;                            // For ... if filter
  std::string name;                          // Macro name
  std::vector<std::string> params;           // Macro
  std::vector<ExprPtr> defaults;             // Macro: one per param (null: required)
};

struct Program {
  Body body;
};

// The filters and tests the evaluator knows (the parser refuses others, as jinja2 does).
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);
// The longest error message a template's text or render gives (a template may raise its own).
inline constexpr size_t kMaxErrorBytes = 400;

}  // namespace mla::text::jinja
