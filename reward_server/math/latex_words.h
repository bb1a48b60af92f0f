#ifndef SLUICE_REWARD_SERVER_MATH_LATEX_WORDS_H_
#define SLUICE_REWARD_SERVER_MATH_LATEX_WORDS_H_

// The vocabulary of math answers, apart from their grammar: which command
// names are functions, Greek letters, \text-like wrappers or decorations;
// which plain words are units, percent signs or list separators; the key by
// which a dropped unit compares ("square cm" and "\text{ cm}^2" are both
// "cm^2"); and, built on these, whether a text reads as prose.
//
// The parser (latex_parser.h) reads answers with these words, and answer
// extraction (answer_extraction.h) asks LooksLikeProse whether a reference
// is one answer; one list serves both so that they agree. Every function is
// pure, thread-safe and linear in its input (the lists are fixed).

#include <string>

#include "absl/strings/string_view.h"

namespace sluice::reward_server::math {

// Command names, without the backslash ("alpha", not "\alpha").
bool IsGreek(absl::string_view name);         // "alpha", "Omega".
bool IsFunctionName(absl::string_view name);  // "sin", "arctan", "ln", "lg".
bool IsTextCommand(absl::string_view name);   // "text", "mathrm", "operatorname".
bool IsDecorationCommand(absl::string_view name);  // "overline", "vec", "mathbb".

// Plain words, in any case.
// Unit words dropped after a number ("cm", "dollars", "square"); single
// letters never are (they are variables).
bool IsUnitWord(absl::string_view word);
bool IsPercentWord(absl::string_view word);    // "percent", "percentage", "pct".
bool IsSeparatorWord(absl::string_view word);  // "and", "or".

// The key of a dropped unit, by which CompareMathAnswers compares units: its
// words (the letter runs of `words`) lower case, singular and abbreviated
// ("Inches" -> "inch", "centimeters" -> "cm"), "square" and "cubic" turned
// into a power, then the power ("\text{ cm}^2" and "square cm" -> "cm^2").
// `power` is the printed exponent, empty for none.
std::string UnitKey(absl::string_view words, absl::string_view power);

// Whether `text` reads as prose rather than as one answer: it holds a word
// (two or more ASCII letters after the start or a space, outside commands
// and their \text{}-like arguments) that is not a unit ("cm", "dollars"), a
// function or constant name ("sin", "pi") or "and"/"or", and the text is not
// that word alone. "The answer is 5" and "5 pears" are prose; "Evelyn",
// "5 cm", "\sin x", "x^2 + 1" and "\text{Navin}" are not. The parser would
// read prose as a product of letters, so a caller that has a choice should
// extract an answer from it instead. Linear; thread-safe.
bool LooksLikeProse(absl::string_view text);

}  // namespace sluice::reward_server::math

#endif  // SLUICE_REWARD_SERVER_MATH_LATEX_WORDS_H_
