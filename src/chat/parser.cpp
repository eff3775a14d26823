#include "chat/parser.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include "kiln/error.h"

namespace kiln::chat {
namespace {

// Nesting deeper than this ((((...)))) is refused rather than run off the stack.
constexpr int kMaxNesting = 128;

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& name) : t_(tokens), name_(name) {}

  Body run() {
    Body body = parse_body({});
    if (peek().kind != Token::Kind::Eof) {
      const Token& tag = t_[pos_ + 1];
      error(tag.line, "unexpected {% " + tag.text + " %}");
    }
    return body;
  }

 private:
  [[noreturn]] void error(int line, const std::string& what) const {
    throw Error(detail::concat("[", name_, "] line ", line, ": ", what));
  }

  const Token& peek(size_t ahead = 0) const {
    const size_t k = pos_ + ahead;
    return k < t_.size() ? t_[k] : t_.back();
  }
  const Token& next() {
    const Token& tok = peek();
    if (pos_ < t_.size() - 1) ++pos_;
    return tok;
  }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::Op && peek(ahead).text == op;
  }
  bool is_name(const char* n, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::Name && peek(ahead).text == n;
  }
  static std::string describe(const Token& tok) {
    switch (tok.kind) {
      case Token::Kind::BlockEnd: return "end of tag %}";
      case Token::Kind::VarEnd: return "}}";
      case Token::Kind::Eof: return "end of template";
      case Token::Kind::String: return "a string";
      default: return "'" + tok.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op))
      error(peek().line, detail::concat("expected '", op, "', found ", describe(peek())));
    next();
  }
  std::string expect_name(const char* what) {
    if (peek().kind != Token::Kind::Name)
      error(peek().line, detail::concat("expected ", what, ", found ", describe(peek())));
    return next().text;
  }
  void expect_block_end(const char* tag) {
    if (peek().kind != Token::Kind::BlockEnd)
      error(peek().line, detail::concat("unexpected ", describe(peek()), " in {% ", tag, " %}"));
    next();
  }

  // Statements up to a block tag named in `ends` (left unread: the caller reads it).
  // `opened`: the line of the tag whose block this is, for the error when it never closes.
  Body parse_body(std::initializer_list<const char*> ends, int opened = 0) {
    Body body;
    while (true) {
      const Token& tok = peek();
      if (tok.kind == Token::Kind::Eof) {
        if (ends.size() == 0) return body;
        error(opened, detail::concat("missing {% ", *(ends.end() - 1),
                                     " %}: the block opened here is never closed"));
      }
      if (tok.kind == Token::Kind::Text) {
        auto s = node(Stmt::Kind::Text, tok.line);
        s->text = next().text;
        body.push_back(std::move(s));
      } else if (tok.kind == Token::Kind::VarBegin) {
        next();
        auto s = node(Stmt::Kind::Output, tok.line);
        s->expr = parse_expression();
        if (peek().kind != Token::Kind::VarEnd)
          error(peek().line, "expected }} after the expression, found " + describe(peek()));
        next();
        body.push_back(std::move(s));
      } else {  // BlockBegin
        const Token& name = peek(1);
        if (name.kind != Token::Kind::Name) error(name.line, "expected a tag name after {%");
        for (const char* end : ends)
          if (name.text == end) return body;
        next();
        next();
        body.push_back(parse_tag(name));
      }
    }
  }

  static StmtPtr node(Stmt::Kind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  // Reads `{% name %}` that closes a block.
  void close_tag(const char* end) {
    next();  // BlockBegin
    next();  // the name
    expect_block_end(end);
  }

  StmtPtr parse_tag(const Token& tag) {
    Nest nest(*this, tag.line);
    const std::string& n = tag.text;
    if (n == "if") return parse_if(tag.line);
    if (n == "for") return parse_for(tag.line);
    if (n == "set") return parse_set(tag.line);
    if (n == "macro") return parse_macro(tag.line);
    if (n == "break" || n == "continue") {
      expect_block_end(n.c_str());
      if (loop_depth_ == 0) error(tag.line, "{% " + n + " %} outside a for loop");
      return node(n == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, tag.line);
    }
    if (n == "generation") {
      expect_block_end("generation");
      auto s = node(Stmt::Kind::Generation, tag.line);
      s->body = parse_body({"endgeneration"}, tag.line);
      close_tag("endgeneration");
      return s;
    }
    if (n.rfind("end", 0) == 0 || n == "else" || n == "elif")
      error(tag.line, "unexpected {% " + n + " %}: no open block it closes");
    static const char* const known_unsupported[] = {"extends",    "block", "include", "import",
                                                    "from",       "call",  "filter",  "with",
                                                    "autoescape", "do",    "trans"};
    for (const char* u : known_unsupported)
      if (n == u) error(tag.line, "unsupported tag {% " + n + " %}");
    error(tag.line, "unknown tag {% " + n + " %}");
  }

  StmtPtr parse_if(int line) {
    auto s = node(Stmt::Kind::If, line);
    ExprPtr cond = parse_expression();
    expect_block_end("if");
    while (true) {
      Body body = parse_body({"elif", "else", "endif"}, line);
      s->branches.emplace_back(std::move(cond), std::move(body));
      const std::string which = peek(1).text;
      next();
      next();
      if (which == "elif") {
        cond = parse_expression();
        expect_block_end("elif");
      } else if (which == "else") {
        expect_block_end("else");
        s->branches.emplace_back(nullptr, parse_body({"endif"}, line));
        close_tag("endif");
        return s;
      } else {
        expect_block_end("endif");
        return s;
      }
    }
  }

  StmtPtr parse_for(int line) {
    auto s = node(Stmt::Kind::For, line);
    do {
      s->loop_vars.push_back(expect_name("a loop variable"));
      if (!is_op(",")) break;
      next();
    } while (true);
    if (!is_name("in")) error(peek().line, "expected 'in' in {% for %}, found " + describe(peek()));
    next();
    s->expr = parse_or();  // not a full expression: `if` here starts the filter
    if (is_name("if")) {
      next();
      s->filter = parse_or();
    }
    if (is_name("recursive")) error(peek().line, "unsupported: recursive for loops");
    expect_block_end("for");
    ++loop_depth_;
    s->body = parse_body({"else", "endfor"}, line);
    --loop_depth_;
    if (peek(1).text == "else") {
      close_tag("else");
      s->else_body = parse_body({"endfor"}, line);
    }
    close_tag("endfor");
    return s;
  }

  StmtPtr parse_set(int line) {
    ExprPtr target = parse_primary_name();
    if (is_op(".")) {
      next();
      auto attr = expr(Expr::Kind::Attr, line);
      attr->name = expect_name("an attribute name");
      attr->args.push_back(std::move(target));
      target = std::move(attr);
    } else if (is_op(",")) {
      auto tuple = expr(Expr::Kind::Tuple, line);
      tuple->args.push_back(std::move(target));
      while (is_op(",")) {
        next();
        tuple->args.push_back(parse_primary_name());
      }
      target = std::move(tuple);
    }
    if (peek().kind == Token::Kind::BlockEnd) {
      if (target->kind != Expr::Kind::Name) error(line, "a block {% set %} takes one name");
      next();
      auto s = node(Stmt::Kind::SetBlock, line);
      s->text = target->name;
      s->body = parse_body({"endset"}, line);
      close_tag("endset");
      return s;
    }
    expect_op("=");
    auto s = node(Stmt::Kind::Set, line);
    s->target = std::move(target);
    s->expr = parse_tuple_or_expression();
    expect_block_end("set");
    return s;
  }

  ExprPtr parse_primary_name() {
    const int line = peek().line;
    auto e = expr(Expr::Kind::Name, line);
    e->name = expect_name("a variable name");
    return e;
  }

  StmtPtr parse_macro(int line) {
    auto s = node(Stmt::Kind::Macro, line);
    s->text = expect_name("a macro name");
    expect_op("(");
    while (!is_op(")")) {
      std::string param = expect_name("a parameter name");
      ExprPtr def;
      if (is_op("=")) {
        next();
        def = parse_expression();
      }
      s->params.emplace_back(std::move(param), std::move(def));
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
    expect_block_end("macro");
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"}, line);
    loop_depth_ = saved;
    close_tag("endmacro");
    return s;
  }

  // ---- expressions, lowest precedence first (Jinja's order) ----

  static ExprPtr expr(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser, int line) : p(parser) {
      if (++p.nesting_ > kMaxNesting) p.error(line, "expression nested too deeply");
    }
    ~Nest() { --p.nesting_; }
  };

  ExprPtr parse_tuple_or_expression() {
    const int line = peek().line;
    ExprPtr first = parse_expression();
    if (!is_op(",")) return first;
    auto tuple = expr(Expr::Kind::Tuple, line);
    tuple->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      tuple->args.push_back(parse_expression());
    }
    return tuple;
  }

  ExprPtr parse_expression() {
    Nest nest(*this, peek().line);
    ExprPtr e = parse_or();
    if (is_name("if")) {
      const int line = next().line;
      auto cond = expr(Expr::Kind::Cond, line);
      cond->args.push_back(std::move(e));
      cond->args.push_back(parse_or());
      if (is_name("else")) {
        next();
        cond->args.push_back(parse_expression());
      } else {
        cond->args.push_back(nullptr);
      }
      return cond;
    }
    return e;
  }

  ExprPtr binary(Expr::Kind kind, const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto e = expr(kind, line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return deepen(std::move(e));
  }

  // Chains (a + b + ..., x|f|g..., x.a.b...) grow the tree without recursing
  // here; their depth is bounded too, since rendering (and freeing) recurses.
  ExprPtr deepen(ExprPtr e) {
    int d = 0;
    for (const auto& a : e->args)
      if (a) d = std::max(d, a->depth);
    e->depth = d + 1;
    if (e->depth > kMaxNesting * 4) error(e->line, "expression nested too deeply");
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      e = binary(Expr::Kind::Or, "or", std::move(e), parse_and(), line);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      e = binary(Expr::Kind::And, "and", std::move(e), parse_not(), line);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      const int line = next().line;
      Nest nest(*this, line);
      auto e = expr(Expr::Kind::Unary, line);
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    while (true) {
      const Token& tok = peek();
      std::string op;
      if (tok.kind == Token::Kind::Op && (tok.text == "==" || tok.text == "!=" || tok.text == "<" ||
                                          tok.text == ">" || tok.text == "<=" || tok.text == ">="))
        op = tok.text;
      else if (is_name("in")) op = "in";
      else if (is_name("not") && is_name("in", 1)) op = "not in";
      else return e;
      next();
      if (op == "not in") next();
      e = binary(Expr::Kind::Binary, op, std::move(e), parse_math1(), tok.line);
    }
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& tok = next();
      e = binary(Expr::Kind::Binary, tok.text, std::move(e), parse_concat(), tok.line);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token& tok = next();
      e = binary(Expr::Kind::Binary, "~", std::move(e), parse_math2(), tok.line);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& tok = next();
      e = binary(Expr::Kind::Binary, tok.text, std::move(e), parse_pow(), tok.line);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& tok = next();
      e = binary(Expr::Kind::Binary, "**", std::move(e), parse_unary(true), tok.line);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& tok = next();
      Nest nest(*this, tok.line);
      e = expr(Expr::Kind::Unary, tok.line);
      e->name = tok.text;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters_and_tests(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& tok = peek();
    Nest nest(*this, tok.line);
    switch (tok.kind) {
      case Token::Kind::Name: {
        next();
        auto e = expr(Expr::Kind::Literal, tok.line);
        if (tok.text == "true" || tok.text == "True") e->literal = Value::boolean(true);
        else if (tok.text == "false" || tok.text == "False") e->literal = Value::boolean(false);
        else if (tok.text == "none" || tok.text == "None") e->literal = Value::none();
        else {
          e->kind = Expr::Kind::Name;
          e->name = tok.text;
        }
        return e;
      }
      case Token::Kind::String: {
        auto e = expr(Expr::Kind::Literal, tok.line);
        std::string s;
        while (peek().kind == Token::Kind::String) s += next().text;  // adjacent literals join
        e->literal = Value::string(std::move(s));
        return e;
      }
      case Token::Kind::Int: {
        next();
        int64_t v = 0;
        auto r = std::from_chars(tok.text.data(), tok.text.data() + tok.text.size(), v);
        if (r.ec != std::errc()) error(tok.line, "integer literal " + tok.text + " is too large");
        auto e = expr(Expr::Kind::Literal, tok.line);
        e->literal = Value::integer(v);
        return e;
      }
      case Token::Kind::Float: {
        next();
        auto e = expr(Expr::Kind::Literal, tok.line);
        e->literal = Value::number(std::strtod(tok.text.c_str(), nullptr));
        return e;
      }
      case Token::Kind::Op:
        if (tok.text == "(") return parse_paren();
        if (tok.text == "[") return parse_list();
        if (tok.text == "{") return parse_dict();
        [[fallthrough]];
      default: error(tok.line, "unexpected " + describe(tok) + " in an expression");
    }
  }

  ExprPtr parse_paren() {
    const int line = next().line;
    if (is_op(")")) {
      next();
      return expr(Expr::Kind::Tuple, line);
    }
    ExprPtr first = parse_expression();
    if (is_op(")")) {
      next();
      return first;
    }
    auto tuple = expr(Expr::Kind::Tuple, line);
    tuple->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (is_op(")")) break;
      tuple->args.push_back(parse_expression());
    }
    expect_op(")");
    return tuple;
  }
  ExprPtr parse_list() {
    auto e = expr(Expr::Kind::List, next().line);
    while (!is_op("]")) {
      e->args.push_back(parse_expression());
      if (!is_op(",")) break;
      next();
    }
    expect_op("]");
    return e;
  }
  ExprPtr parse_dict() {
    auto e = expr(Expr::Kind::Dict, next().line);
    while (!is_op("}")) {
      e->args.push_back(parse_expression());
      expect_op(":");
      e->args.push_back(parse_expression());
      if (!is_op(",")) break;
      next();
    }
    expect_op("}");
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        auto a = expr(Expr::Kind::Attr, line);
        if (peek().kind == Token::Kind::Int) {  // x.0 is x[0] in Jinja
          a->kind = Expr::Kind::Index;
          a->args.push_back(std::move(e));
          auto idx = expr(Expr::Kind::Literal, line);
          idx->literal = Value::integer(std::atoll(next().text.c_str()));
          a->args.push_back(std::move(idx));
        } else {
          a->name = expect_name("an attribute name after '.'");
          a->args.push_back(std::move(e));
        }
        e = deepen(std::move(a));
      } else if (is_op("[")) {
        e = deepen(parse_subscript(std::move(e)));
      } else if (is_op("(")) {
        auto call = expr(Expr::Kind::Call, next().line);
        call->args.push_back(std::move(e));
        parse_call_args(*call);
        e = deepen(std::move(call));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target) {
    const int line = next().line;
    ExprPtr bounds[3];
    int parts = 0;
    bool is_slice = false;
    while (true) {
      if (!is_op(":") && !is_op("]")) bounds[parts] = parse_expression();
      if (is_op(":")) {
        next();
        is_slice = true;
        if (++parts > 2) error(line, "a slice has at most 3 parts");
        continue;
      }
      break;
    }
    expect_op("]");
    if (!is_slice) {
      if (!bounds[0]) error(line, "empty subscript []");
      auto e = expr(Expr::Kind::Index, line);
      e->args.push_back(std::move(target));
      e->args.push_back(std::move(bounds[0]));
      return e;
    }
    auto e = expr(Expr::Kind::Slice, line);
    e->args.push_back(std::move(target));
    for (auto& b : bounds) e->args.push_back(std::move(b));
    return e;
  }

  // "(" already read: positional and keyword arguments up to ")".
  void parse_call_args(Expr& call) {
    while (!is_op(")")) {
      if (peek().kind == Token::Kind::Name && is_op("=", 1)) {
        std::string key = next().text;
        next();
        call.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!call.kwargs.empty())
          error(peek().line, "positional argument after a keyword argument");
        call.args.push_back(parse_expression());
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
  }

  ExprPtr parse_filters_and_tests(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        const int line = next().line;
        auto f = expr(Expr::Kind::Filter, line);
        f->name = expect_name("a filter name after '|'");
        f->args.push_back(std::move(e));
        if (is_op("(")) {
          next();
          parse_call_args(*f);
        }
        e = deepen(std::move(f));
      } else if (is_name("is")) {
        const int line = next().line;
        auto t = expr(Expr::Kind::Test, line);
        if (is_name("not")) {
          next();
          t->negated = true;
        }
        // `is none` / `is true`: the literal names are test names here.
        t->name = expect_name("a test name after 'is'");
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          next();
          parse_call_args(*t);
        } else if (peek().kind == Token::Kind::String || peek().kind == Token::Kind::Int ||
                   peek().kind == Token::Kind::Float ||
                   (peek().kind == Token::Kind::Name && !is_name("and") && !is_name("or") &&
                    !is_name("if") && !is_name("else") && !is_name("is") && !is_name("in") &&
                    !is_name("not"))) {
          t->args.push_back(parse_primary());  // `is divisibleby 3`, `is sameas none`
        }
        e = deepen(std::move(t));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  const std::string& name_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens, const std::string& name) {
  return Parser(tokens, name).run();
}

}  // namespace kiln::chat
