#ifndef SLUICE_REWARD_SERVER_MATH_LATEX_PARSER_H_
#define SLUICE_REWARD_SERVER_MATH_LATEX_PARSER_H_

// A bounded recursive-descent parser for the LaTeX (and plain-text) final
// answers of math problems: "\frac{-1 \pm \sqrt{13}}{4}", "(1,2]\cup[3,\infty)",
// "\{1,2\}", "x \geq 5", "\begin{pmatrix}1&2\\3&4\end{pmatrix}", "28\%",
// "15\text{ cm}^2", "1\frac{4}{5}" (a mixed number: an integer literal right
// before a \frac of two integer literals is their sum). It builds a small
// expression tree (no algebra happens here; math_equivalence.h turns trees
// into GiNaC expressions) and notes the units it drops. Which words are
// functions, units and so on is latex_words.h's.
//
// Why our own parser: GiNaC's parser knows no LaTeX and has no bounds, and the
// answers come from a model under RL, i.e. from an adversary. Every input is
// bounded before any work: at most kMaxLatexBytes bytes, kMaxParseDepth
// nested constructs, kMaxNodes tree nodes and kMaxNumberDigits digits per
// literal. Parsing is linear in the input, never throws, and accepts any bytes
// (invalid UTF-8 is a parse error, not undefined behaviour).
//
// latex_parser.cc is one file of about 1,000 lines on purpose: it is one
// grammar, whose productions call each other (a recursive descent), and
// splitting it would only scatter the grammar; what is not the grammar
// (which words are functions or units, equivalence, extraction) has its own
// file already.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::reward_server::math {

inline constexpr size_t kMaxLatexBytes = 4096;
inline constexpr int kMaxParseDepth = 96;
inline constexpr int kMaxNodes = 2000;
inline constexpr size_t kMaxNumberDigits = 400;

enum class NodeKind {
  kNumber,     // text: "123" or "1.50" (digits, optional point); is_float.
  kSymbol,     // text: the name ("x", "Evelyn" for \text{Evelyn}).
  kConstant,   // text: "pi", "e", "inf", "i".
  kAdd,        // kids: terms.
  kNeg,        // kids: [x].
  kMul,        // kids: factors.
  kDiv,        // kids: [numerator, denominator].
  kPow,        // kids: [base, exponent].
  kFunction,   // text: name ("sqrt", "root", "sin", "log", "abs", "factorial",
               // "sum", "_" (subscript), or an unknown name like "f"); kids: args.
  kPercent,    // kids: [x]: x percent.
  kPlusMinus,  // kids: [a, b] for a ± b, or [b] for ±b.
  kTuple,      // kids: items of "(a, b, c)" or "[a, b, c]": ordered.
  kList,       // kids: items of a bare "a, b; c" or "{a, b}" list: unordered.
  kSet,        // kids: items of "\{a, b\}": unordered.
  kInterval,   // kids: [lo, hi]; left_closed, right_closed.
  kUnion,      // kids: the operands of \cup.
  kRelation,   // kids: operands; ops: one fewer ("=", "<", "<=", ">", ">=",
               // "!=", "~" for \approx, "in").
  kMatrix,     // kids: rows*cols cells, row-major.
};

struct Node {
  NodeKind kind = NodeKind::kNumber;
  std::string text;
  std::vector<int> kids;  // Indices into LatexExpr::nodes.
  std::vector<std::string> ops;
  bool is_float = false;
  bool left_closed = false;
  bool right_closed = false;
  int rows = 0;
  int cols = 0;
};

// A parsed answer: a tree in an arena (nodes never outlive it).
struct LatexExpr {
  std::vector<Node> nodes;
  int root = -1;
  // The units the parse dropped, by key: "degree" (^\circ, \degree, "degrees"),
  // "dollar" (\$, "dollars"), else latex_words.h's UnitKey of the unit's
  // words with any power ("\text{ cm}^2", "square cm" -> "cm^2"). At most 8.
  std::vector<std::string> units;

  // A canonical-looking prefix form, for details and debugging
  // ("(+ x (neg 1))"); bounded by the node count.
  std::string DebugString() const;
  // The same for the subtree at `index`.
  std::string SubtreeString(int index) const;
};

// Parses one answer (already extracted: no surrounding prose). Accepts
// "$...$"-free LaTeX and plain text ("1/2", "x^2+1", "(7,6)"). Errors:
// INVALID_ARGUMENT when it is not a math expression we understand (with the
// byte offset), RESOURCE_EXHAUSTED when it exceeds one of the bounds above.
// Linear time; recursion depth at most kMaxParseDepth frames of each parse
// level. Thread-safe (no shared state).
absl::StatusOr<LatexExpr> ParseLatexAnswer(absl::string_view latex);

}  // namespace sluice::reward_server::math

#endif  // SLUICE_REWARD_SERVER_MATH_LATEX_PARSER_H_
