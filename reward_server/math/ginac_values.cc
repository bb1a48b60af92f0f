#include "reward_server/math/ginac_values.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "reward_server/math/math_equivalence.h"

namespace sluice::reward_server::internal {
namespace {

using math::LatexExpr;
using math::Node;
using math::NodeKind;

struct Scalar {
  GiNaC::ex ex;
  bool has_float = false;
};

// ConvertToValue's walk of one tree. Each step checks its bound before GiNaC
// runs it; the only state is the comparison's symbol table.
class Converter {
 public:
  explicit Converter(SymbolTable* symbols) : symbols_(symbols) {}

  // Throws only inside the caller's try (GiNaC's own exceptions and ours).
  Value ToValue(const LatexExpr& e, int index, int depth) {
    CheckDepth(depth);
    const Node& node = e.nodes.at(index);
    Value value;
    switch (node.kind) {
      case NodeKind::kTuple:
      case NodeKind::kList:
      case NodeKind::kSet: {
        value.kind = node.kind == NodeKind::kTuple  ? VKind::kTuple
                     : node.kind == NodeKind::kList ? VKind::kList
                                                    : VKind::kSet;
        for (int kid : node.kids) {
          Value item = ToValue(e, kid, depth + 1);
          // Unordered collections flatten "a ± b" and nested bare lists.
          if (value.kind != VKind::kTuple &&
              (item.kind == VKind::kList || (item.kind == VKind::kSet && IsAlternatives(e, kid)))) {
            for (Value& inner : item.items) value.items.push_back(std::move(inner));
          } else {
            value.items.push_back(std::move(item));
          }
          if (value.items.size() > kMaxItems) throw TooLargeError();
        }
        return value;
      }
      case NodeKind::kInterval:
      case NodeKind::kUnion:
      case NodeKind::kMatrix: {
        value.kind = node.kind == NodeKind::kInterval ? VKind::kInterval
                     : node.kind == NodeKind::kUnion  ? VKind::kUnion
                                                      : VKind::kMatrix;
        value.left_closed = node.left_closed;
        value.right_closed = node.right_closed;
        value.rows = node.rows;
        value.cols = node.cols;
        for (int kid : node.kids) value.items.push_back(ToValue(e, kid, depth + 1));
        return value;
      }
      case NodeKind::kRelation:
        return RelationValue(e, node, depth);
      case NodeKind::kPercent: {
        std::vector<Scalar> inner = ToScalars(e, node.kids.at(0), depth + 1);
        if (inner.size() != 1) break;
        value.ex = inner[0].ex;
        value.has_float = inner[0].has_float;
        value.percent = true;
        return value;
      }
      default:
        break;
    }
    std::vector<Scalar> alternatives = ToScalars(e, index, depth);
    if (alternatives.size() == 1) {
      value.ex = alternatives[0].ex;
      value.has_float = alternatives[0].has_float;
      return value;
    }
    value.kind = VKind::kSet;
    for (Scalar& scalar : alternatives) {
      Value item;
      item.ex = scalar.ex;
      item.has_float = scalar.has_float;
      value.items.push_back(std::move(item));
    }
    return value;
  }

 private:
  static void CheckDepth(int depth) {
    if (depth > 4 * math::kMaxParseDepth) throw TooLargeError();
  }

  static bool IsAlternatives(const LatexExpr& e, int index) {
    return e.nodes.at(index).kind != NodeKind::kSet;
  }

  GiNaC::ex Symbol(const std::string& name) {
    auto it = symbols_->find(name);
    if (it == symbols_->end()) it = symbols_->emplace(name, GiNaC::symbol(name)).first;
    return it->second;
  }

  static void CheckSize(const GiNaC::ex& x) {
    if (!GiNaC::is_exactly_a<GiNaC::numeric>(x)) return;
    if (ExactBits(GiNaC::ex_to<GiNaC::numeric>(x)) > kMaxNumberBits) throw TooLargeError();
  }

  static int Bits(const GiNaC::numeric& n) {
    return n.numer().int_length() + n.denom().int_length();
  }

  // The bits of an exact number, both parts of a complex one ("6 - 5i");
  // -1 for a float, whose size is bounded anyway.
  static long ExactBits(const GiNaC::numeric& n) {
    const GiNaC::numeric re = GiNaC::real(n);
    const GiNaC::numeric im = GiNaC::imag(n);
    if (!re.is_rational() || !im.is_rational()) return -1;
    return static_cast<long>(Bits(re)) + (im.is_zero() ? 0 : Bits(im));
  }

  GiNaC::ex Power(const GiNaC::ex& base, const GiNaC::ex& exponent) {
    if (GiNaC::is_exactly_a<GiNaC::numeric>(exponent)) {
      const GiNaC::numeric& p = GiNaC::ex_to<GiNaC::numeric>(exponent);
      const bool trivial_base = base.is_zero() || base.is_equal(GiNaC::ex(1));
      if (!p.is_rational()) throw TooLargeError();
      // GiNaC throws for these from inside power's construction, leaking
      // the half-built object: refuse them first.
      if (base.is_zero() && !p.is_positive()) throw std::invalid_argument("0^0 or 1/0");
      if (!trivial_base) {
        const GiNaC::numeric num = GiNaC::abs(p.numer());
        const GiNaC::numeric den = p.denom();
        if (num > kMaxExponent || den > kMaxExponent) throw TooLargeError();
        if (GiNaC::is_exactly_a<GiNaC::numeric>(base)) {
          const long bits = ExactBits(GiNaC::ex_to<GiNaC::numeric>(base));
          if (bits * num.to_long() > kMaxNumberBits) throw TooLargeError();
        }
      }
    }
    GiNaC::ex result = GiNaC::pow(base, exponent);
    CheckSize(result);
    return result;
  }

  std::string Print(const GiNaC::ex& x) {
    std::ostringstream out;
    out << x;
    std::string text = out.str();
    if (text.size() > 2048) throw TooLargeError();
    return text;
  }

  // Combines the alternatives of `parts` with `op`, at most kMaxAlternatives.
  template <typename Op>
  std::vector<Scalar> Combine(const std::vector<std::vector<Scalar>>& parts, Op op) {
    std::vector<Scalar> acc = parts.at(0);
    for (size_t k = 1; k < parts.size(); ++k) {
      std::vector<Scalar> next;
      for (const Scalar& a : acc) {
        for (const Scalar& b : parts[k]) {
          GiNaC::ex x = op(a.ex, b.ex);
          CheckSize(x);
          next.push_back({x, a.has_float || b.has_float});
          if (next.size() > kMaxAlternatives) throw TooLargeError();
        }
      }
      acc = std::move(next);
    }
    return acc;
  }

  Scalar One(const LatexExpr& e, int index, int depth) {
    std::vector<Scalar> all = ToScalars(e, index, depth);
    if (all.size() != 1) throw std::invalid_argument("± here");
    return all[0];
  }

  std::vector<Scalar> ToScalars(const LatexExpr& e, int index, int depth) {
    CheckDepth(depth);
    const Node& node = e.nodes.at(index);
    const auto kids = [&]() {
      std::vector<std::vector<Scalar>> parts;
      for (int kid : node.kids) parts.push_back(ToScalars(e, kid, depth + 1));
      return parts;
    };
    switch (node.kind) {
      case NodeKind::kNumber: {
        const size_t point = node.text.find('.');
        GiNaC::numeric value(std::string(node.text.substr(0, point)).c_str());
        if (point != std::string::npos) {
          const std::string decimals = node.text.substr(point + 1);
          value += GiNaC::numeric(decimals.c_str()) /
                   GiNaC::numeric(10).power(static_cast<long>(decimals.size()));
        }
        return {{value, node.is_float}};
      }
      case NodeKind::kSymbol:
        // "6 - 5i": the imaginary unit.
        if (node.text == "i") return {{GiNaC::I, false}};
        return {{Symbol(node.text), false}};
      case NodeKind::kConstant:
        if (node.text == "pi") return {{GiNaC::Pi, false}};
        if (node.text == "e") return {{GiNaC::exp(GiNaC::ex(1)), false}};
        if (node.text == "i") return {{GiNaC::I, false}};
        return {{Symbol("\\infty"), false}};
      case NodeKind::kAdd:
        return Combine(kids(), [](const GiNaC::ex& a, const GiNaC::ex& b) { return a + b; });
      case NodeKind::kMul:
        return Combine(kids(), [](const GiNaC::ex& a, const GiNaC::ex& b) { return a * b; });
      case NodeKind::kNeg: {
        std::vector<Scalar> inner = ToScalars(e, node.kids.at(0), depth + 1);
        for (Scalar& s : inner) s.ex = -s.ex;
        return inner;
      }
      case NodeKind::kDiv:
        return Combine(kids(), [](const GiNaC::ex& a, const GiNaC::ex& b) {
          if (b.is_zero()) throw std::invalid_argument("division by zero");
          return a / b;
        });
      case NodeKind::kPow:
        return Combine(kids(), [this](const GiNaC::ex& a, const GiNaC::ex& b) { return Power(a, b); });
      case NodeKind::kPercent:
        return Combine(kids(), [](const GiNaC::ex& a, const GiNaC::ex&) { return a / 100; });
      case NodeKind::kPlusMinus: {
        std::vector<std::vector<Scalar>> parts = kids();
        std::vector<Scalar> out;
        if (parts.size() == 1) {
          for (const Scalar& b : parts[0]) {
            out.push_back({b.ex, b.has_float});
            out.push_back({-b.ex, b.has_float});
          }
        } else {
          for (const Scalar& a : parts.at(0)) {
            for (const Scalar& b : parts.at(1)) {
              out.push_back({a.ex + b.ex, a.has_float || b.has_float});
              out.push_back({a.ex - b.ex, a.has_float || b.has_float});
            }
          }
        }
        if (out.size() > kMaxAlternatives) throw TooLargeError();
        return out;
      }
      case NodeKind::kFunction:
        return {Function(e, node, depth)};
      default:
        throw std::invalid_argument("not a scalar");
    }
  }

  // "52_8", "4210_{5}": digits in a base from 2 to 10, by value (42, 555);
  // nullopt for anything else ("x_1", "19_8", "12_{10.5}").
  static std::optional<GiNaC::numeric> BaseNumber(const LatexExpr& e, const Node& node) {
    if (node.kids.size() != 2) return std::nullopt;
    const Node& digits = e.nodes.at(node.kids[0]);
    const Node& base = e.nodes.at(node.kids[1]);
    if (digits.kind != NodeKind::kNumber || digits.is_float || base.kind != NodeKind::kNumber ||
        base.is_float || base.text.size() > 2) {
      return std::nullopt;
    }
    const int radix = std::stoi(base.text);
    if (radix < 2 || radix > 10) return std::nullopt;
    GiNaC::numeric value = 0;
    for (const char digit : digits.text) {
      if (digit - '0' >= radix) return std::nullopt;
      value = value * radix + (digit - '0');
    }
    return value;
  }

  Scalar Function(const LatexExpr& e, const Node& node, int depth) {
    const std::string& name = node.text;
    if (name == "_") {
      if (std::optional<GiNaC::numeric> value = BaseNumber(e, node)) return {*value, false};
    }
    if (name == "_" || name == "prime") {
      // x_1, a_{n-1}, 204_5: one opaque name.
      std::string base = e.SubtreeString(node.kids.at(0));
      std::string sub;
      if (node.kids.size() > 1) {
        try {
          sub = Print(One(e, node.kids[1], depth + 1).ex);
        } catch (const TooLargeError&) {
          throw;
        } catch (...) {
          sub = e.SubtreeString(node.kids[1]);
        }
      }
      return {Symbol(name == "_" ? absl::StrCat(base, "_", sub) : absl::StrCat(base, "'")), false};
    }
    if (name == "sum" || name == "prod") {
      const std::string text =
          absl::StrCat(name, "[", e.SubtreeString(node.kids.at(0)), ";",
                       Print(One(e, node.kids.at(1), depth + 1).ex), "](",
                       Print(One(e, node.kids.at(2), depth + 1).ex), ")");
      return {Symbol(text), false};
    }
    std::vector<Scalar> args;
    bool has_float = false;
    for (int kid : node.kids) {
      args.push_back(One(e, kid, depth + 1));
      has_float = has_float || args.back().has_float;
    }
    const GiNaC::ex& x = args.at(0).ex;
    GiNaC::ex result;
    if (name == "sqrt") {
      result = Power(x, GiNaC::numeric(1, 2));
    } else if (name == "root") {
      const GiNaC::ex& n = args.at(1).ex;
      if (n.is_zero()) throw std::invalid_argument("zeroth root");
      result = Power(x, GiNaC::ex(1) / n);
    } else if (name == "sin") {
      result = GiNaC::sin(x);
    } else if (name == "cos") {
      result = GiNaC::cos(x);
    } else if (name == "tan") {
      result = GiNaC::tan(x);
    } else if (name == "sec") {
      result = 1 / GiNaC::cos(x);
    } else if (name == "csc") {
      result = 1 / GiNaC::sin(x);
    } else if (name == "cot") {
      result = GiNaC::cos(x) / GiNaC::sin(x);
    } else if (name == "arcsin") {
      result = GiNaC::asin(x);
    } else if (name == "arccos") {
      result = GiNaC::acos(x);
    } else if (name == "arctan") {
      result = GiNaC::atan(x);
    } else if (name == "sinh") {
      result = GiNaC::sinh(x);
    } else if (name == "cosh") {
      result = GiNaC::cosh(x);
    } else if (name == "tanh") {
      result = GiNaC::tanh(x);
    } else if (name == "exp") {
      result = GiNaC::exp(x);
    } else if (name == "ln" || name == "log") {
      if (x.is_zero()) throw std::invalid_argument("log(0)");
      result = GiNaC::log(x);
      if (args.size() > 1) {
        const GiNaC::ex base_log = GiNaC::log(args[1].ex);
        if (base_log.is_zero()) throw std::invalid_argument("log base 1");
        result = result / base_log;
      }
    } else if (name == "abs") {
      result = GiNaC::abs(x);
    } else if (name == "factorial") {
      if (GiNaC::is_exactly_a<GiNaC::numeric>(x)) {
        const GiNaC::numeric& n = GiNaC::ex_to<GiNaC::numeric>(x);
        if (!n.is_nonneg_integer()) throw std::invalid_argument("factorial of a non-integer");
        if (n > kMaxFactorial) throw TooLargeError();
      }
      result = GiNaC::factorial(x);
    } else {
      // f(x), floor(x), \operatorname{lcm}(..): an opaque name.
      std::vector<std::string> printed;
      for (const Scalar& arg : args) printed.push_back(Print(arg.ex));
      result = Symbol(absl::StrCat(name, "(", absl::StrJoin(printed, ","), ")"));
    }
    CheckSize(result);
    return {result, has_float};
  }

  Value RelationValue(const LatexExpr& e, const Node& node, int depth) {
    std::vector<int> operands = node.kids;
    std::vector<std::string> ops = node.ops;
    // "a ≈ b": keep what precedes the first ≈, unless that is a bare name
    // ("x ≈ 11" -> 11).
    for (size_t k = 0; k < ops.size(); ++k) {
      if (ops[k] != "~") continue;
      if (k == 0) {
        Value left = ToValue(e, operands[0], depth + 1);
        if (IsName(left)) return ToValue(e, operands[1], depth + 1);
        return left;
      }
      operands.resize(k + 1);
      ops.resize(k);
      break;
    }
    if (ops.size() == 1 && ops[0] == "in") return ToValue(e, operands[1], depth + 1);
    for (const std::string& op : ops) {
      if (op == "in") throw std::invalid_argument("'in' in a chain");
    }
    // "x = 5+5+1 = 11": the last part.
    if (ops.size() >= 2 && std::all_of(ops.begin(), ops.end(),
                                       [](const std::string& op) { return op == "="; })) {
      return ToValue(e, operands.back(), depth + 1);
    }
    Value value;
    value.kind = VKind::kRelation;
    value.ops = ops;
    for (int operand : operands) value.items.push_back(ToValue(e, operand, depth + 1));
    return value;
  }

 private:
  SymbolTable* symbols_;
};

}  // namespace

absl::Mutex& GinacMutex() {
  static absl::Mutex* mu = new absl::Mutex();
  return *mu;
}

Value ConvertToValue(const LatexExpr& expr, SymbolTable* symbols) {
  return Converter(symbols).ToValue(expr, expr.root, 0);
}

bool IsName(const Value& value) {
  if (value.kind == VKind::kTuple) {
    return !value.items.empty() && std::all_of(value.items.begin(), value.items.end(),
                                               [](const Value& v) { return IsName(v); });
  }
  if (value.kind != VKind::kScalar || value.percent) return false;
  if (GiNaC::is_a<GiNaC::numeric>(value.ex) || GiNaC::is_a<GiNaC::add>(value.ex)) return false;
  for (auto it = value.ex.preorder_begin(); it != value.ex.preorder_end(); ++it) {
    if (GiNaC::is_a<GiNaC::symbol>(*it)) return true;
  }
  return false;
}

}  // namespace sluice::reward_server::internal
