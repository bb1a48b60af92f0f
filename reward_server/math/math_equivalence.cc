#include "reward_server/math/math_equivalence.h"

#include <ginac/ginac.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "reward_server/math/answer_extraction.h"

namespace sluice::reward_server {
namespace {

using math::LatexExpr;
using math::Node;
using math::NodeKind;

using internal::ExtractAnswer;
using internal::ExtractedAnswer;

// Items of a set/list/tuple compared at most (matching is quadratic).
constexpr size_t kMaxItems = 48;
// Alternatives a ± expansion may produce.
constexpr size_t kMaxAlternatives = 8;
constexpr int kEvaluationPoints = 5;

// ---------------------------------------------------------------------------
// GiNaC conversion

absl::Mutex& GinacMutex() {
  static absl::Mutex* mu = new absl::Mutex();
  return *mu;
}

enum class VKind { kScalar, kTuple, kList, kSet, kInterval, kUnion, kRelation, kMatrix };

struct Scalar {
  GiNaC::ex ex;
  bool has_float = false;
};

struct Value {
  VKind kind = VKind::kScalar;
  GiNaC::ex ex;
  bool has_float = false;
  bool percent = false;
  std::vector<Value> items;
  std::vector<std::string> ops;
  bool left_closed = false;
  bool right_closed = false;
  int rows = 0;
  int cols = 0;
};

class TooLargeError {};

class Converter {
 public:
  explicit Converter(std::map<std::string, GiNaC::symbol>* symbols) : symbols_(symbols) {}

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

 public:
  // A plain name: not a number, has a symbol, not a sum ("x", "f(x)",
  // "a_3", "AB", "|AB|", "A:B"); or a tuple of names ("(p, q)").
  static bool IsName(const Value& value) {
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

 private:
  std::map<std::string, GiNaC::symbol>* symbols_;
};

// ---------------------------------------------------------------------------
// Comparison

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

class Comparer {
 public:
  Comparer(const MathCompareOptions& options, const std::map<std::string, GiNaC::symbol>& symbols)
      : options_(options) {
    for (const auto& [name, symbol] : symbols) symbols_.push_back({name, symbol});
  }

  bool Equal(const Value& g, const Value& p, int depth = 0) {
    if (depth > 64) return false;
    if (g.kind == VKind::kRelation || p.kind == VKind::kRelation) {
      return RelationEqual(g, p, depth);
    }
    const auto unordered = [](VKind k) { return k == VKind::kList || k == VKind::kSet; };
    if (unordered(g.kind) && g.items.size() == 1 && !unordered(p.kind)) {
      return Equal(g.items[0], p, depth + 1);
    }
    if (unordered(p.kind) && p.items.size() == 1 && !unordered(g.kind)) {
      return Equal(g, p.items[0], depth + 1);
    }
    if (g.kind == VKind::kScalar && p.kind == VKind::kScalar) return ScalarEqual(g, p);
    const bool g_ordered = g.kind == VKind::kTuple;
    const bool p_ordered = p.kind == VKind::kTuple;
    if ((g_ordered && (p_ordered || p.kind == VKind::kList)) ||
        (p_ordered && g.kind == VKind::kList)) {
      return Ordered(g.items, p.items, depth);
    }
    if (unordered(g.kind) && unordered(p.kind)) return Unordered(g.items, p.items, depth);
    if (g.kind == VKind::kInterval && p.kind == VKind::kInterval) {
      return g.left_closed == p.left_closed && g.right_closed == p.right_closed &&
             Ordered(g.items, p.items, depth);
    }
    // "(a, b)" is both a pair and an open interval.
    if (g.kind == VKind::kInterval && p.kind == VKind::kTuple && p.items.size() == 2) {
      return !g.left_closed && !g.right_closed && Ordered(g.items, p.items, depth);
    }
    if (p.kind == VKind::kInterval && g.kind == VKind::kTuple && g.items.size() == 2) {
      return !p.left_closed && !p.right_closed && Ordered(g.items, p.items, depth);
    }
    if (g.kind == VKind::kUnion && p.kind == VKind::kUnion) {
      return Unordered(g.items, p.items, depth);
    }
    if (g.kind == VKind::kMatrix && p.kind == VKind::kMatrix) {
      return g.rows == p.rows && g.cols == p.cols && Ordered(g.items, p.items, depth);
    }
    return false;
  }

 private:
  bool Ordered(const std::vector<Value>& a, const std::vector<Value>& b, int depth) {
    if (a.size() != b.size()) return false;
    for (size_t k = 0; k < a.size(); ++k) {
      if (!Equal(a[k], b[k], depth + 1)) return false;
    }
    return true;
  }

  // The distinct items of `items` (a set holds each element once).
  std::vector<Value> Distinct(const std::vector<Value>& items, int depth) {
    std::vector<Value> out;
    for (const Value& item : items) {
      if (std::none_of(out.begin(), out.end(),
                       [&](const Value& seen) { return Equal(seen, item, depth + 1); })) {
        out.push_back(item);
      }
    }
    return out;
  }

  bool Unordered(const std::vector<Value>& a0, const std::vector<Value>& b0, int depth) {
    if (a0.size() > kMaxItems || b0.size() > kMaxItems) return false;
    const std::vector<Value> a = Distinct(a0, depth);
    const std::vector<Value> b = Distinct(b0, depth);
    if (a.size() != b.size()) return false;
    std::vector<bool> used(b.size(), false);
    for (const Value& x : a) {
      bool found = false;
      for (size_t k = 0; k < b.size() && !found; ++k) {
        if (!used[k] && Equal(x, b[k], depth + 1)) {
          used[k] = true;
          found = true;
        }
      }
      if (!found) return false;
    }
    return true;
  }

  static bool IsInequality(const std::string& op) {
    return op == "<" || op == "<=" || op == ">" || op == ">=";
  }

  // "a < x <= b" (or reversed) as the interval (a, b]; nullopt otherwise.
  static std::optional<Value> ChainToInterval(const Value& r) {
    if (r.kind != VKind::kRelation || r.items.size() != 3) return std::nullopt;
    const std::string& a = r.ops[0];
    const std::string& b = r.ops[1];
    Value interval;
    interval.kind = VKind::kInterval;
    if ((a == "<" || a == "<=") && (b == "<" || b == "<=")) {
      interval.items = {r.items[0], r.items[2]};
      interval.left_closed = a == "<=";
      interval.right_closed = b == "<=";
      return interval;
    }
    if ((a == ">" || a == ">=") && (b == ">" || b == ">=")) {
      interval.items = {r.items[2], r.items[0]};
      interval.left_closed = b == ">=";
      interval.right_closed = a == ">=";
      return interval;
    }
    return std::nullopt;
  }

  static bool SetLike(const Value& v) {
    return v.kind == VKind::kInterval || v.kind == VKind::kUnion ||
           (v.kind == VKind::kTuple && v.items.size() == 2);
  }

  bool RelationEqual(const Value& g, const Value& p, int depth) {
    const bool g_rel = g.kind == VKind::kRelation;
    const bool p_rel = p.kind == VKind::kRelation;
    if (g_rel && p_rel) return RelationsEqual(g, p, depth);
    if (g_rel) {
      if (g.items.size() == 2 && g.ops[0] == "=" &&
          (Converter::IsName(g.items[0]) || !options_.strict)) {
        return Equal(g.items[1], p, depth + 1);
      }
      if (SetLike(p)) {
        if (std::optional<Value> interval = ChainToInterval(g)) {
          return Equal(*interval, p, depth + 1);
        }
      }
      return false;
    }
    if (p.items.size() == 2 && p.ops[0] == "=" &&
        (Converter::IsName(p.items[0]) || !options_.strict)) {
      return Equal(g, p.items[1], depth + 1);
    }
    if (options_.allow_set_relation_comp && SetLike(g)) {
      if (std::optional<Value> interval = ChainToInterval(p)) {
        return Equal(g, *interval, depth + 1);
      }
    }
    return false;
  }

  // Puts ">"/">=" relations the other way round.
  static Value Oriented(const Value& r) {
    Value out = r;
    if (std::all_of(r.ops.begin(), r.ops.end(),
                    [](const std::string& op) { return op == ">" || op == ">="; })) {
      std::reverse(out.items.begin(), out.items.end());
      std::reverse(out.ops.begin(), out.ops.end());
      for (std::string& op : out.ops) op = op == ">" ? "<" : "<=";
    }
    return out;
  }

  bool RelationsEqual(const Value& g0, const Value& p0, int depth) {
    const Value g = Oriented(g0);
    const Value p = Oriented(p0);
    if (g.ops != p.ops || g.items.size() != p.items.size()) return false;
    const bool scalars =
        std::all_of(g.items.begin(), g.items.end(), [](const Value& v) { return v.kind == VKind::kScalar && !v.percent; }) &&
        std::all_of(p.items.begin(), p.items.end(), [](const Value& v) { return v.kind == VKind::kScalar && !v.percent; });
    if (scalars && g.items.size() == 2) {
      const std::string& op = g.ops[0];
      const GiNaC::ex dg = g.items[1].ex - g.items[0].ex;
      const GiNaC::ex dp = p.items[1].ex - p.items[0].ex;
      if (HasSymbols(dg) || HasSymbols(dp)) {
        return Proportional(dg, dp, /*positive=*/IsInequality(op));
      }
    }
    return Ordered(g.items, p.items, depth);
  }

  bool HasSymbols(const GiNaC::ex& x) {
    for (auto it = x.preorder_begin(); it != x.preorder_end(); ++it) {
      if (GiNaC::is_a<GiNaC::symbol>(*it)) return true;
    }
    return false;
  }

  // `x` at evaluation point `k` (every symbol a pseudo-random value in
  // [0.3, 2.3], fixed by its name and k); nullopt when not a finite number.
  std::optional<std::complex<double>> Evaluate(const GiNaC::ex& x, int k) {
    try {
      GiNaC::exmap values;
      for (const auto& [name, symbol] : symbols_) {
        uint64_t h = Mix(std::hash<std::string>()(name) ^ Mix(static_cast<uint64_t>(k) + 17));
        const double v = 0.3 + 2.0 * static_cast<double>(h >> 11) / 9007199254740992.0;
        values[symbol] = GiNaC::numeric(v);
      }
      const GiNaC::ex value = x.subs(values).evalf();
      if (!GiNaC::is_a<GiNaC::numeric>(value)) return std::nullopt;
      const GiNaC::numeric& n = GiNaC::ex_to<GiNaC::numeric>(value);
      const double re = GiNaC::real(n).to_double();
      const double im = GiNaC::imag(n).to_double();
      if (!std::isfinite(re) || !std::isfinite(im)) return std::nullopt;
      return std::complex<double>(re, im);
    } catch (...) {
      return std::nullopt;
    }
  }

  static bool Close(std::complex<double> a, std::complex<double> b, double tolerance) {
    const double scale = std::max({1.0, std::abs(a), std::abs(b)});
    return std::abs(a - b) <= tolerance * scale;
  }

  bool Proportional(const GiNaC::ex& a, const GiNaC::ex& b, bool positive) {
    std::optional<std::complex<double>> ratio;
    int valid = 0;
    for (int k = 0; k < kEvaluationPoints; ++k) {
      std::optional<std::complex<double>> x = Evaluate(a, k);
      std::optional<std::complex<double>> y = Evaluate(b, k);
      if (!x || !y) continue;
      if (std::abs(*y) < 1e-12) {
        if (std::abs(*x) < 1e-12) continue;
        return false;
      }
      const std::complex<double> r = *x / *y;
      if (!ratio) {
        if (std::abs(r) < 1e-12) return false;
        if (positive && !(r.real() > 0 && std::abs(r.imag()) < 1e-9)) return false;
        ratio = r;
      } else if (!Close(r, *ratio, 1e-9)) {
        return false;
      }
      ++valid;
    }
    return valid >= 3;
  }

  bool ScalarEqual(const Value& g, const Value& p) {
    if (g.percent != p.percent) {
      const Value& pct = g.percent ? g : p;
      const Value& other = g.percent ? p : g;
      return Numbers(pct.ex / 100, pct.has_float, other.ex, other.has_float) ||
             Numbers(pct.ex, pct.has_float, other.ex, other.has_float);
    }
    return Numbers(g.ex, g.has_float, p.ex, p.has_float);
  }

  bool RoundedEqual(double a, double b) {
    const double scale = std::pow(10.0, options_.precision);
    if (std::abs(a) * scale < 1e15 && std::abs(b) * scale < 1e15) {
      return std::llround(a * scale) == std::llround(b * scale);
    }
    return std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b));
  }

  bool Numbers(const GiNaC::ex& a, bool a_float, const GiNaC::ex& b, bool b_float) {
    const GiNaC::ex difference = a - b;
    if (difference.is_zero()) return true;
    const bool floats = a_float || b_float;
    const bool symbolic = HasSymbols(a) || HasSymbols(b);
    if (!floats && !symbolic && GiNaC::is_exactly_a<GiNaC::numeric>(a) &&
        GiNaC::is_exactly_a<GiNaC::numeric>(b)) {
      return false;  // Distinct exact rationals.
    }
    if (!symbolic) {
      std::optional<std::complex<double>> x = Evaluate(a, 0);
      std::optional<std::complex<double>> y = Evaluate(b, 0);
      if (!x || !y) return false;
      if (floats) {
        return RoundedEqual(x->real(), y->real()) && RoundedEqual(x->imag(), y->imag());
      }
      return Close(*x, *y, 1e-12);
    }
    const double tolerance = floats ? std::pow(10.0, -options_.precision) : 1e-9;
    int valid = 0;
    for (int k = 0; k < kEvaluationPoints; ++k) {
      std::optional<std::complex<double>> x = Evaluate(a, k);
      std::optional<std::complex<double>> y = Evaluate(b, k);
      if (!x || !y) continue;
      if (!Close(*x, *y, tolerance)) return false;
      ++valid;
    }
    return valid >= 3;
  }

  const MathCompareOptions& options_;
  std::vector<std::pair<std::string, GiNaC::symbol>> symbols_;
};

// Whether both answers carry units (LatexExpr::units) and not the same ones.
// An answer without a unit matches one with any: "30" is "30^\circ".
bool UnitsDiffer(const LatexExpr& a, const LatexExpr& b) {
  if (a.units.empty() || b.units.empty()) return false;
  std::set<std::string> x(a.units.begin(), a.units.end());
  std::set<std::string> y(b.units.begin(), b.units.end());
  return x != y;
}

}  // namespace

absl::Status MathCompareOptions::Validate() const {
  if (precision < 0 || precision > 15) {
    return absl::InvalidArgumentError(
        absl::StrCat("precision must be in [0, 15], got ", precision));
  }
  if (!match_latex && !match_expr) {
    return absl::InvalidArgumentError("match_latex and match_expr cannot both be false");
  }
  return absl::OkStatus();
}

absl::string_view MathCompareErrorName(MathCompareError error) {
  switch (error) {
    case MathCompareError::kNone:
      return "none";
    case MathCompareError::kParse:
      return "parse";
    case MathCompareError::kTooLarge:
      return "too_large";
  }
  return "unknown";
}

std::vector<MathAnswerCandidate> ExtractMathAnswerCandidates(absl::string_view text,
                                                             const MathCompareOptions& options) {
  std::vector<MathAnswerCandidate> out;
  for (internal::RankedCandidate& ranked :
       internal::RankedCandidates(internal::CutInput(text), options)) {
    out.push_back(std::move(ranked.candidate));
  }
  return out;
}

MathComparison CompareMathAnswers(absl::string_view gold, absl::string_view prediction,
                                  const MathCompareOptions& options) {
  MathComparison result;
  MathCompareOptions checked = options;
  if (!checked.Validate().ok()) checked = MathCompareOptions();
  ExtractedAnswer g = ExtractAnswer(gold, checked, /*whole_first=*/checked.gold_is_answer);
  ExtractedAnswer p = ExtractAnswer(prediction, checked);
  result.gold_answer = g.answer;
  result.prediction_answer = p.answer;
  result.gold_normalized = g.normalized;
  result.prediction_normalized = p.normalized;
  if (g.too_large || p.too_large) {
    result.error = MathCompareError::kTooLarge;
    result.error_detail = g.too_large ? "gold: " + g.error : "prediction: " + p.error;
    return result;  // Never equal: an answer over the bounds cannot be checked.
  }
  if (!g.parsed || !p.parsed) {
    result.error = MathCompareError::kParse;
    result.error_detail = !g.parsed ? "gold: " + g.error : "prediction: " + p.error;
  }
  if (!g.fallback.empty() && g.fallback == p.fallback) {
    result.equal = true;
    return result;
  }
  if (!g.parsed || !p.parsed) return result;
  // "36^\circ" is not "\$36": units count when both sides give one.
  if (UnitsDiffer(*g.parsed, *p.parsed)) return result;
  absl::MutexLock lock(&GinacMutex());
  try {
    std::map<std::string, GiNaC::symbol> symbols;
    Converter converter(&symbols);
    Value gv = converter.ToValue(*g.parsed, g.parsed->root, 0);
    Value pv = converter.ToValue(*p.parsed, p.parsed->root, 0);
    if (g.percent && gv.kind == VKind::kScalar) gv.percent = true;
    if (p.percent && pv.kind == VKind::kScalar) pv.percent = true;
    Comparer comparer(checked, symbols);
    result.equal = comparer.Equal(gv, pv);
  } catch (const TooLargeError&) {
    result.error = MathCompareError::kTooLarge;
    result.error_detail = "an exponent, factorial or number is too large";
    result.equal = false;
  } catch (const std::exception& e) {
    result.error = MathCompareError::kParse;
    result.error_detail = e.what();
    result.equal = false;
  } catch (...) {
    result.error = MathCompareError::kParse;
    result.error_detail = "unknown error in symbolic comparison";
    result.equal = false;
  }
  return result;
}

absl::StatusOr<std::string> ParseMathAnswerForFuzzing(absl::string_view text) {
  MathCompareOptions options;
  ExtractedAnswer side = ExtractAnswer(text, options);
  if (!side.parsed) {
    if (side.too_large) return absl::ResourceExhaustedError(side.error);
    return absl::NotFoundError(side.error);
  }
  absl::MutexLock lock(&GinacMutex());
  try {
    std::map<std::string, GiNaC::symbol> symbols;
    Converter converter(&symbols);
    Value value = converter.ToValue(*side.parsed, side.parsed->root, 0);
    (void)value;
  } catch (const TooLargeError&) {
    return absl::ResourceExhaustedError("too large");
  } catch (...) {
    return absl::InvalidArgumentError("not convertible");
  }
  return side.normalized;
}

std::vector<absl::string_view> FindBoxedContents(absl::string_view text) {
  std::vector<absl::string_view> contents;
  for (const internal::Span& box : internal::FindBoxes(text)) contents.push_back(box.content);
  return contents;
}

}  // namespace sluice::reward_server
