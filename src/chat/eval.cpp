#include "chat/eval.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "kiln/error.h"

namespace kiln::chat {

Evaluator::Evaluator(const std::string& name, const Limits& limits,
                     std::shared_ptr<Object> variables)
    : name_(name), limits_(limits), variables_(std::move(variables)) {
  add_globals(globals_);
  scopes_.emplace_back();
}

void Evaluator::fail(const std::string& what) const {
  throw Error(detail::concat("[", name_, "] line ", line_, ": ", what));
}

void Evaluator::check_size(size_t bytes, const char* what) const {
  if (bytes > limits_.max_output)
    fail(detail::concat(what, " exceeds ", limits_.max_output, " bytes (Limits::max_output)"));
}

void Evaluator::step(int line) {
  line_ = line;
  if (++steps_ > limits_.max_steps)
    fail(detail::concat("the template ran for more than ", limits_.max_steps,
                        " steps (Limits::max_steps): an endless loop?"));
}

void Evaluator::emit(std::string_view text) {
  out_->append(text);
  check_size(out_->size(), "the output");
}

std::string Evaluator::render(const Body& body,
                              std::vector<std::pair<size_t, size_t>>* generation) {
  std::string out;
  out_ = top_out_ = &out;
  generation_ = generation;
  exec(body);
  return out;
}

Evaluator::Flow Evaluator::exec(const Body& body) {
  for (const auto& s : body) {
    const Flow f = exec(*s);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Evaluator::Flow Evaluator::exec(const Stmt& s) {
  step(s.line);
  switch (s.kind) {
    case Stmt::Kind::Text: emit(s.text); return Flow::Normal;
    case Stmt::Kind::Output: {
      const Value v = eval(*s.expr);
      if (v.is_string()) emit(v.s);
      else emit(to_str(v));
      return Flow::Normal;
    }
    case Stmt::Kind::If:
      for (const auto& [cond, body] : s.branches) {
        if (cond && !truthy(eval(*cond))) continue;
        return exec(body);
      }
      return Flow::Normal;
    case Stmt::Kind::For: return exec_for(s);
    case Stmt::Kind::Set: exec_set(s); return Flow::Normal;
    case Stmt::Kind::SetBlock: {
      std::string captured;
      std::string* saved = out_;
      out_ = &captured;
      exec(s.body);
      out_ = saved;
      assign(s.text, Value::string(std::move(captured)));
      return Flow::Normal;
    }
    case Stmt::Kind::Macro: {
      const Stmt* macro = &s;
      assign(s.text, Value::callable([macro](Evaluator& ev, Args& args) {
               return ev.call_macro(*macro, args);
             }));
      return Flow::Normal;
    }
    case Stmt::Kind::Break: return Flow::Break;
    case Stmt::Kind::Continue: return Flow::Continue;
    case Stmt::Kind::Generation: {
      if (!generation_ || out_ != top_out_) return exec(s.body);
      const size_t begin = out_->size();
      const Flow f = exec(s.body);
      if (out_->size() > begin) generation_->emplace_back(begin, out_->size());
      return f;
    }
  }
  return Flow::Normal;
}

Evaluator::Flow Evaluator::exec_for(const Stmt& s) {
  Array items = iterate(*this, eval(*s.expr));
  if (s.filter) {  // `for x in xs if cond`: loop.* counts the kept items
    Array kept;
    for (Value& item : items) {
      scopes_.emplace_back();
      scopes_.back()[s.loop_vars[0]] = item;
      if (s.loop_vars.size() > 1) {
        const Array parts = iterate(*this, item);
        for (size_t k = 0; k < s.loop_vars.size(); ++k)
          scopes_.back()[s.loop_vars[k]] = k < parts.size() ? parts[k] : Value();
      }
      const bool keep = truthy(eval(*s.filter));
      scopes_.pop_back();
      if (keep) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec(s.else_body);
  const int64_t n = int64_t(items.size());
  for (int64_t k = 0; k < n; ++k) {
    step(s.line);
    auto loop = std::make_shared<Object>();
    loop->items = {{"index", Value::integer(k + 1)},
                   {"index0", Value::integer(k)},
                   {"revindex", Value::integer(n - k)},
                   {"revindex0", Value::integer(n - k - 1)},
                   {"first", Value::boolean(k == 0)},
                   {"last", Value::boolean(k == n - 1)},
                   {"length", Value::integer(n)},
                   {"previtem", k > 0 ? items[size_t(k - 1)] : Value()},
                   {"nextitem", k + 1 < n ? items[size_t(k + 1)] : Value()}};
    loop->items.emplace_back("cycle", Value::callable([k](Evaluator& ev, Args& args) {
                               if (args.positional.empty())
                                 ev.fail("loop.cycle() needs at least one value");
                               return args.positional[size_t(k) % args.positional.size()];
                             }));
    scopes_.emplace_back();
    auto& scope = scopes_.back();
    scope["loop"] = Value::dict(loop);
    if (s.loop_vars.size() == 1) {
      scope[s.loop_vars[0]] = items[size_t(k)];
    } else {
      const Array parts = iterate(*this, items[size_t(k)]);
      if (parts.size() != s.loop_vars.size())
        fail(detail::concat("cannot unpack ", parts.size(), " values into ", s.loop_vars.size(),
                            " loop variables"));
      for (size_t j = 0; j < parts.size(); ++j) scope[s.loop_vars[j]] = parts[j];
    }
    const Flow f = exec(s.body);
    scopes_.pop_back();
    if (f == Flow::Break) break;
  }
  return Flow::Normal;
}

void Evaluator::exec_set(const Stmt& s) {
  Value v = eval(*s.expr);
  const Expr& t = *s.target;
  if (t.kind == Expr::Kind::Name) {
    assign(t.name, std::move(v));
  } else if (t.kind == Expr::Kind::Attr) {
    const Value ns = eval(*t.args[0]);
    if (!ns.is_object() || !ns.object->is_namespace)
      fail("{% set " + t.args[0]->name + "." + t.name + " %}: " + t.args[0]->name +
           " is not a namespace() (only namespaces can be changed)");
    ns.object->set(t.name, std::move(v));
  } else {  // Tuple of names
    const Array parts = iterate(*this, v);
    if (parts.size() != t.args.size())
      fail(
          detail::concat("cannot unpack ", parts.size(), " values into ", t.args.size(), " names"));
    for (size_t k = 0; k < parts.size(); ++k) assign(t.args[k]->name, parts[k]);
  }
}

Value Evaluator::lookup(const std::string& name) const {
  for (size_t k = scopes_.size(); k-- > base_;) {
    auto it = scopes_[k].find(name);
    if (it != scopes_[k].end()) return it->second;
  }
  if (base_ > 0) {
    auto it = scopes_[0].find(name);
    if (it != scopes_[0].end()) return it->second;
  }
  if (const Value* v = variables_->find(name)) return *v;
  auto it = globals_.find(name);
  if (it != globals_.end()) return it->second;
  return {};
}

void Evaluator::assign(const std::string& name, Value v) { scopes_.back()[name] = std::move(v); }

static Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_object())
    if (const Value* v = obj.object->find(name)) return *v;
  return {};
}

static int64_t normalize_index(int64_t k, int64_t n) { return k < 0 ? k + n : k; }

static Value index_value(Evaluator& ev, const Value& obj, const Value& key) {
  if (obj.is_object()) {
    if (!key.is_string()) return {};
    return get_attr(obj, key.s);
  }
  if (obj.is_array() || obj.is_string()) {
    if (key.kind != Value::Kind::Int) {
      if (key.is_undefined()) return {};
      ev.fail(detail::concat(type_name(obj), " indices must be integers, not ", type_name(key)));
    }
    if (obj.is_array()) {
      const int64_t k = normalize_index(key.i, int64_t(obj.array->size()));
      if (k < 0 || k >= int64_t(obj.array->size())) return {};
      return (*obj.array)[size_t(k)];
    }
    const auto cps = code_points(obj.s);
    const int64_t k = normalize_index(key.i, int64_t(cps.size()));
    if (k < 0 || k >= int64_t(cps.size())) return {};
    return Value::string(std::string(cps[size_t(k)]));
  }
  return {};
}

// Python's slice indices for a sequence of n items.
static std::vector<size_t> slice_indices(Evaluator& ev, const Value* b[3], int64_t n) {
  auto get = [&](const Value* v, const char* what) -> std::optional<int64_t> {
    if (!v || v->is_none() || v->is_undefined()) return std::nullopt;
    if (v->kind != Value::Kind::Int) ev.fail(detail::concat("slice ", what, " must be an integer"));
    return v->i;
  };
  const int64_t step = get(b[2], "step").value_or(1);
  if (step == 0) ev.fail("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t k = *v < 0 ? *v + n : *v;
    if (step > 0) return std::clamp<int64_t>(k, 0, n);
    return std::clamp<int64_t>(k, -1, n - 1);
  };
  const int64_t start = clamp(get(b[0], "start"), step > 0 ? 0 : n - 1);
  const int64_t stop = clamp(get(b[1], "stop"), step > 0 ? n : -1);
  std::vector<size_t> out;
  for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.push_back(size_t(k));
  return out;
}

Value Evaluator::eval(const Expr& e) {
  Value v = eval_node(e);
  const size_t size = v.is_string() ? v.s.size() / 256 : v.is_array() ? v.array->size() / 16 : 0;
  if (size > 0) {
    steps_ += size;
    step(e.line);
  }
  return v;
}

Value Evaluator::eval_node(const Expr& e) {
  step(e.line);
  switch (e.kind) {
    case Expr::Kind::Literal: return e.literal;
    case Expr::Kind::Name: return lookup(e.name);
    case Expr::Kind::Attr: return get_attr(eval(*e.args[0]), e.name);
    case Expr::Kind::Index: {
      const Value obj = eval(*e.args[0]);
      return index_value(*this, obj, eval(*e.args[1]));
    }
    case Expr::Kind::Slice: {
      const Value obj = eval(*e.args[0]);
      Value bounds[3];
      const Value* b[3] = {};
      for (int k = 0; k < 3; ++k)
        if (e.args[size_t(k) + 1]) {
          bounds[k] = eval(*e.args[size_t(k) + 1]);
          b[k] = &bounds[k];
        }
      line_ = e.line;
      if (obj.is_array()) {
        Array out;
        for (size_t k : slice_indices(*this, b, int64_t(obj.array->size())))
          out.push_back((*obj.array)[k]);
        return Value::list(std::move(out));
      }
      if (obj.is_string()) {
        const auto cps = code_points(obj.s);
        std::string out;
        for (size_t k : slice_indices(*this, b, int64_t(cps.size()))) out += cps[k];
        return Value::string(std::move(out));
      }
      if (obj.is_undefined()) return {};
      fail(detail::concat("cannot slice a ", type_name(obj)));
    }
    case Expr::Kind::Call: return eval_call(e);
    case Expr::Kind::Filter: {
      Value subject = eval(*e.args[0]);
      Args args = eval_args(e, 1);
      line_ = e.line;
      return apply_filter(*this, e.name, std::move(subject), args);
    }
    case Expr::Kind::Test: {
      const Value subject = eval(*e.args[0]);
      Args args = eval_args(e, 1);
      line_ = e.line;
      return Value::boolean(apply_test(*this, e.name, subject, args) != e.negated);
    }
    case Expr::Kind::Unary: {
      const Value v = eval(*e.args[0]);
      line_ = e.line;
      if (e.name == "not") return Value::boolean(!truthy(v));
      if (!v.is_number())
        fail(detail::concat("bad operand type for unary ", e.name, ": ", type_name(v)));
      if (e.name == "+")
        return v.kind == Value::Kind::Float
                   ? v
                   : Value::integer(v.kind == Value::Kind::Bool ? v.b : v.i);
      if (v.kind == Value::Kind::Float) return Value::number(-v.f);
      return Value::integer(-(v.kind == Value::Kind::Bool ? int64_t(v.b) : v.i));
    }
    case Expr::Kind::And: {
      Value a = eval(*e.args[0]);
      return truthy(a) ? eval(*e.args[1]) : a;
    }
    case Expr::Kind::Or: {
      Value a = eval(*e.args[0]);
      return truthy(a) ? a : eval(*e.args[1]);
    }
    case Expr::Kind::Binary: return eval_binary(e);
    case Expr::Kind::Cond:
      if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
      return e.args[2] ? eval(*e.args[2]) : Value();
    case Expr::Kind::List:
    case Expr::Kind::Tuple: {
      Array items;
      for (const auto& a : e.args) items.push_back(eval(*a));
      return Value::list(std::move(items));
    }
    case Expr::Kind::Dict: {
      auto o = std::make_shared<Object>();
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        const Value key = eval(*e.args[k]);
        line_ = e.line;
        if (!key.is_string())
          fail(detail::concat("dict keys must be strings here, not ", type_name(key)));
        o->set(key.s, eval(*e.args[k + 1]));
      }
      return Value::dict(std::move(o));
    }
  }
  return {};
}

Args Evaluator::eval_args(const Expr& e, size_t first) {
  Args args;
  for (size_t k = first; k < e.args.size(); ++k) args.positional.push_back(eval(*e.args[k]));
  for (const auto& [key, value] : e.kwargs) args.keyword.emplace_back(key, eval(*value));
  return args;
}

Value Evaluator::eval_call(const Expr& e) {
  const Expr& callee = *e.args[0];
  if (callee.kind == Expr::Kind::Attr) {  // obj.method(...)
    const Value self = eval(*callee.args[0]);
    Args args = eval_args(e, 1);
    line_ = e.line;
    const Value member = get_attr(self, callee.name);
    if (member.kind == Value::Kind::Function) return call(member, args, callee.name);
    return call_method(*this, self, callee.name, args);
  }
  const Value fn = eval(callee);
  Args args = eval_args(e, 1);
  line_ = e.line;
  return call(fn, args, callee.kind == Expr::Kind::Name ? callee.name : "expression");
}

Value Evaluator::call(const Value& fn, Args& args, const std::string& what) {
  if (fn.kind != Value::Kind::Function) {
    if (fn.is_undefined()) fail("'" + what + "' is undefined: no such function");
    fail(detail::concat("'", what, "' is a ", type_name(fn), ", not a function"));
  }
  const int saved_line = line_;
  Value r = (*fn.function)(*this, args);
  line_ = saved_line;
  return r;
}

Value Evaluator::call_macro(const Stmt& macro, Args& args) {
  if (++depth_ > limits_.max_depth)
    fail(detail::concat("macro calls nested deeper than ", limits_.max_depth,
                        " (Limits::max_depth): endless recursion?"));
  if (args.positional.size() > macro.params.size())
    fail(detail::concat("macro ", macro.text, " takes ", macro.params.size(), " arguments, got ",
                        args.positional.size()));
  std::unordered_map<std::string, Value> frame;
  for (size_t k = 0; k < macro.params.size(); ++k) {
    const auto& [param, dflt] = macro.params[k];
    if (k < args.positional.size()) {
      frame[param] = args.positional[k];
      continue;
    }
    bool found = false;
    for (auto& [key, value] : args.keyword)
      if (key == param) {
        frame[param] = value;
        found = true;
      }
    if (!found && dflt) frame[param] = eval(*dflt);
  }
  for (auto& [key, value] : args.keyword) {
    bool known = false;
    for (const auto& p : macro.params) known = known || p.first == key;
    if (!known) fail("macro " + macro.text + " has no parameter '" + key + "'");
  }
  const size_t saved_base = base_;
  std::string* saved_out = out_;
  std::string captured;
  base_ = scopes_.size();
  scopes_.push_back(std::move(frame));
  out_ = &captured;
  exec(macro.body);
  out_ = saved_out;
  scopes_.resize(base_);
  base_ = saved_base;
  --depth_;
  return Value::string(std::move(captured));
}

}  // namespace kiln::chat
