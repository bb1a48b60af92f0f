#include "reward_server/math/math_equivalence.h"

#include <ginac/ginac.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <complex>
#include <cstdint>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "reward_server/math/answer_extraction.h"
#include "reward_server/math/ginac_values.h"

namespace sluice::reward_server {
namespace {

using internal::ExtractParsedAnswer;
using internal::GinacMutex;
using internal::kMaxItems;
using internal::SymbolTable;
using internal::TooLargeError;
using internal::Value;
using internal::VKind;
using math::LatexExpr;

// Points at which two expressions with symbols are evaluated.
constexpr int kEvaluationPoints = 5;

// Largest |log2 |v|| of any value met while evaluating at a point: far past
// what a double holds, and small enough that GiNaC's arbitrary-precision
// floats stay cheap. (Without it "2^{2^{2^{2^{30}x}}}" asked CLN for 6 GB.)
constexpr double kMaxEvaluationLog2 = 1e5;

struct EvaluationTooLarge {};
struct ZeroToNonPositivePower {};

double Log2Magnitude(const GiNaC::numeric& n) {
  const double m = GiNaC::abs(n).to_double();
  if (m == 0) return 0;
  if (!std::isfinite(m)) return INFINITY;
  return std::abs(std::log2(m));
}

// Substitutes `values` and evaluates numerically bottom-up, refusing
// (EvaluationTooLarge) any value, or power about to be computed, whose
// magnitude passes kMaxEvaluationLog2.
class BoundedEvaluation : public GiNaC::map_function {
 public:
  explicit BoundedEvaluation(const GiNaC::exmap& values) : values_(values) {}

  GiNaC::ex operator()(const GiNaC::ex& e) override {
    if (GiNaC::is_a<GiNaC::symbol>(e)) {
      auto it = values_.find(e);
      return it != values_.end() ? it->second : e;
    }
    GiNaC::ex result;
    if (GiNaC::is_exactly_a<GiNaC::power>(e)) {
      const GiNaC::ex base = (*this)(e.op(0));
      // A rational exponent stays exact (x^{-1} of every quotient, x^2,
      // \sqrt{x}): CLN then multiplies or takes a square root, where a float
      // exponent made it exp(y log x) at every power, which was a fifth of
      // all comparison time. The value differs in the last bits of CLN's
      // precision only. A zero base keeps the float exponent, as before.
      const bool exact_exponent =
          GiNaC::is_exactly_a<GiNaC::numeric>(e.op(1)) &&
          GiNaC::ex_to<GiNaC::numeric>(e.op(1)).is_rational() &&
          !(GiNaC::is_exactly_a<GiNaC::numeric>(base) && base.is_zero());
      const GiNaC::ex exponent = exact_exponent ? e.op(1) : (*this)(e.op(1));
      if (GiNaC::is_exactly_a<GiNaC::numeric>(base) &&
          GiNaC::is_exactly_a<GiNaC::numeric>(exponent)) {
        // 0 to a power whose real part is not positive has no value. GiNaC
        // would throw from inside pow() and leak the power it had just
        // allocated (a few dozen bytes per such answer, for as long as the
        // server runs): refuse it before, as the caller refuses any
        // evaluation that throws.
        if (base.is_zero() && !GiNaC::real(GiNaC::ex_to<GiNaC::numeric>(exponent)).is_positive()) {
          throw ZeroToNonPositivePower();
        }
        const double p = GiNaC::abs(GiNaC::ex_to<GiNaC::numeric>(exponent)).to_double();
        const double b = Log2Magnitude(GiNaC::ex_to<GiNaC::numeric>(base));
        if (!(p * std::max(b, 1.0) <= kMaxEvaluationLog2)) throw EvaluationTooLarge();
      }
      result = GiNaC::pow(base, exponent).evalf();
    } else {
      result = e.map(*this).evalf();
    }
    if (GiNaC::is_exactly_a<GiNaC::numeric>(result) &&
        !(Log2Magnitude(GiNaC::ex_to<GiNaC::numeric>(result)) <= kMaxEvaluationLog2)) {
      throw EvaluationTooLarge();
    }
    return result;
  }

 private:
  const GiNaC::exmap& values_;
};

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Step 3 of math_equivalence.h: whether two Values (ginac_values.h) of one
// comparison are the same answer. Exact where GiNaC cancels the difference,
// else numeric identity testing: every symbol of the comparison takes
// kEvaluationPoints deterministic pseudo-random values. Bounded: recursion at
// most 64 deep, unordered matching only up to kMaxItems items; never calls
// expand() or normal(). Uses GiNaC throughout: construct, use and destroy it
// under GinacMutex().
class Comparer {
 public:
  Comparer(const MathCompareOptions& options, const SymbolTable& symbols)
      : options_(options), symbols_(symbols) {}

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
          (internal::IsName(g.items[0]) || !options_.strict)) {
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
        (internal::IsName(p.items[0]) || !options_.strict)) {
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
  // Memoised per expression: matching sets and lists (Distinct, Unordered)
  // evaluates each item against every other, and each evaluation is a walk
  // with CLN arithmetic at every node.
  std::optional<std::complex<double>> Evaluate(const GiNaC::ex& x, int k) {
    std::array<std::optional<std::optional<std::complex<double>>>, kEvaluationPoints>& memo =
        evaluations_[x];
    if (!memo[k]) memo[k] = EvaluateUncached(x, k);
    return *memo[k];
  }

  std::optional<std::complex<double>> EvaluateUncached(const GiNaC::ex& x, int k) {
    try {
      GiNaC::exmap& values = points_[k];
      if (values.empty()) {
        for (const auto& [name, symbol] : symbols_) {
          uint64_t h = Mix(std::hash<std::string>()(name) ^ Mix(static_cast<uint64_t>(k) + 17));
          const double v = 0.3 + 2.0 * static_cast<double>(h >> 11) / 9007199254740992.0;
          values[symbol] = GiNaC::numeric(v);
        }
      }
      BoundedEvaluation evaluate(values);
      const GiNaC::ex value = evaluate(x);
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
  const SymbolTable& symbols_;
  // Every symbol's value at each evaluation point, made on first use.
  std::array<GiNaC::exmap, kEvaluationPoints> points_;
  std::unordered_map<
      GiNaC::ex,
      std::array<std::optional<std::optional<std::complex<double>>>, kEvaluationPoints>,
      std::hash<GiNaC::ex>, GiNaC::ex_is_equal>
      evaluations_;
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
  ExtractedAnswer g = ExtractParsedAnswer(gold, checked, /*whole_first=*/checked.gold_is_answer);
  ExtractedAnswer p = ExtractParsedAnswer(prediction, checked);
  result.gold_answer = g.text;
  result.prediction_answer = p.text;
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
    SymbolTable symbols;
    Value gv = internal::ConvertToValue(*g.parsed, &symbols);
    Value pv = internal::ConvertToValue(*p.parsed, &symbols);
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
  ExtractedAnswer side = ExtractParsedAnswer(text, options);
  if (!side.parsed) {
    if (side.too_large) return absl::ResourceExhaustedError(side.error);
    return absl::NotFoundError(side.error);
  }
  absl::MutexLock lock(&GinacMutex());
  try {
    SymbolTable symbols;
    Value value = internal::ConvertToValue(*side.parsed, &symbols);
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
