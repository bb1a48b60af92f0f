#ifndef SLUICE_REWARD_SERVER_MATH_GINAC_VALUES_H_
#define SLUICE_REWARD_SERVER_MATH_GINAC_VALUES_H_

// Step 2 of math_equivalence.h: what a parsed answer (latex_parser.h's tree)
// denotes, as GiNaC expressions: a scalar, or a tuple, bare list, set,
// interval, union, relation chain or matrix of values. Internal to the math
// verifier.
//
// Two rules make GiNaC safe to run on a model's output, and every use of
// this header must keep both:
//
//  - Bounds before GiNaC. GiNaC has no limits: 2^{2^{30}} or 100000! would
//    run for ever or exhaust memory. So the conversion checks each size
//    *before* the GiNaC operation that would produce it: rational exponents
//    with numerator and denominator at most kMaxExponent, and base bits
//    times exponent at most kMaxNumberBits; every exact result (both parts
//    of a complex one) at most kMaxNumberBits bits; factorials of at most
//    kMaxFactorial; at most kMaxItems items per collection and
//    kMaxAlternatives values from "±"; nesting at most 4 *
//    math::kMaxParseDepth. It never calls expand() or normal(). A bound
//    exceeded throws TooLargeError.
//
//  - One GiNaC at a time. GiNaC and CLN are not thread-safe (non-atomic
//    reference counts on shared constants such as the numbers 0 and 1), so
//    every GiNaC object of the process is created, copied, used and destroyed
//    while holding GinacMutex(): the conversion, the comparison
//    (math_equivalence.cc) and the destruction of the Values and the
//    SymbolTable that hold GiNaC expressions. Work without GiNaC (extraction,
//    parsing) stays outside it.

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "reward_server/math/latex_parser.h"

// Last: CLN (under GiNaC) defines a macro `Mutable` that breaks Abseil's
// Cord headers (reached through absl/status) when they come after it.
#include <ginac/ginac.h>

namespace sluice::reward_server::internal {

// Items of a set/list/tuple at most (matching them is quadratic).
inline constexpr size_t kMaxItems = 48;
// Alternatives a ± expansion may produce.
inline constexpr size_t kMaxAlternatives = 8;

// The process-wide mutex around every use of GiNaC (see above). Never
// destroyed. Hold it for one comparison at a time: each is bounded and short.
absl::Mutex& GinacMutex();

// Thrown by the conversion when an answer exceeds a bound (see above); the
// caller reports it as MathCompareError::kTooLarge.
class TooLargeError {};

enum class VKind { kScalar, kTuple, kList, kSet, kInterval, kUnion, kRelation, kMatrix };

// A parsed answer's value. A tree: `items` holds the parts of every kind but
// kScalar. Copying it copies GiNaC expressions: hold GinacMutex().
struct Value {
  VKind kind = VKind::kScalar;
  GiNaC::ex ex;             // kScalar: the expression.
  bool has_float = false;   // kScalar: it holds a decimal literal ("0.5").
  bool percent = false;     // kScalar: it is a percentage ("28\%").
  std::vector<Value> items;
  std::vector<std::string> ops;  // kRelation: one fewer than items ("=", "<=", "!=").
  bool left_closed = false;      // kInterval.
  bool right_closed = false;
  int rows = 0;  // kMatrix; items are the cells, row-major.
  int cols = 0;
};

// The symbols of the expressions of one comparison, by name, so that "x" is
// the same symbol on both sides.
using SymbolTable = std::map<std::string, GiNaC::symbol>;

// The value of `expr` (from math::ParseLatexAnswer), creating its symbols in
// `*symbols`. "a ± b" is the set {a+b, a-b}; "i" is the imaginary unit;
// "52_8" is 42; "x ≈ 11" is 11; "x = 5+5+1 = 11" is 11; "x \in S" is S;
// unknown functions ("f(x)", "\lfloor x \rfloor") and subscripts ("a_{n-1}")
// are opaque symbols. Throws TooLargeError when over a bound (see above),
// std::exception (or GiNaC's exceptions) when the answer has no value
// ("1/0", "log(0)", "±" where one value is needed); the caller catches
// everything. Bounded time: linear in the tree, each GiNaC operation on
// bounded sizes.
Value ConvertToValue(const math::LatexExpr& expr, SymbolTable* symbols)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(GinacMutex());

// Whether `value` is a plain name: not a number, has a symbol, not a sum
// ("x", "f(x)", "a_3", "AB", "|AB|", "A:B"); or a tuple of names ("(p, q)").
// So "x = 5" can answer "5". Linear in the expression; hold GinacMutex().
bool IsName(const Value& value);

}  // namespace sluice::reward_server::internal

#endif  // SLUICE_REWARD_SERVER_MATH_GINAC_VALUES_H_
