#include "reward_server/math/latex_parser.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "reward_server/math/latex_words.h"

namespace sluice::reward_server::math {
namespace {

bool IsLetter(char c) { return absl::ascii_isalpha(static_cast<unsigned char>(c)); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

bool OneOf(absl::string_view name, std::initializer_list<absl::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

class Parser {
 public:
  explicit Parser(absl::string_view text) : s_(text) {}

  absl::StatusOr<LatexExpr> Run() {
    if (s_.size() > kMaxLatexBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("answer is ", s_.size(), " bytes; the limit is ", kMaxLatexBytes));
    }
    // Trailing sentence punctuation is not part of the answer.
    while (true) {
      s_ = absl::StripTrailingAsciiWhitespace(s_);
      if (!absl::ConsumeSuffix(&s_, ".") && !absl::ConsumeSuffix(&s_, "$") &&
          !absl::ConsumeSuffix(&s_, "\\,") && !absl::ConsumeSuffix(&s_, "\\!")) {
        break;
      }
    }
    SkipSpace();
    first_ = pos_;
    if (pos_ >= s_.size()) return absl::InvalidArgumentError("empty answer");
    bool is_list = false;
    const int root = ParseList(&is_list);
    if (root >= 0) {
      SkipSpace();
      if (pos_ < s_.size()) Fail("unexpected input");
    }
    if (!status_.ok()) return status_;
    out_.root = root;
    return std::move(out_);
  }

 private:
  // --- Errors and nodes -----------------------------------------------------

  int Fail(absl::string_view what) {
    if (status_.ok()) {
      status_ = absl::InvalidArgumentError(absl::StrCat(what, " at byte ", pos_));
    }
    return -1;
  }
  int TooLarge(absl::string_view what) {
    if (status_.ok()) status_ = absl::ResourceExhaustedError(what);
    return -1;
  }

  int Add(NodeKind kind, std::vector<int> kids = {}, std::string text = {}) {
    if (!status_.ok()) return -1;
    for (int kid : kids) {
      if (kid < 0) return -1;
    }
    if (static_cast<int>(out_.nodes.size()) >= kMaxNodes) {
      return TooLarge(absl::StrCat("more than ", kMaxNodes, " nodes"));
    }
    Node node;
    node.kind = kind;
    node.kids = std::move(kids);
    node.text = std::move(text);
    out_.nodes.push_back(std::move(node));
    return static_cast<int>(out_.nodes.size()) - 1;
  }

  // Records a unit the parse dropped (LatexExpr::units), at most a few.
  void NoteUnit(std::string key) {
    if (out_.units.size() < 8 && !key.empty()) out_.units.push_back(std::move(key));
  }

  // Bounds recursion: every recursive entry point holds one.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser* parser) : parser_(parser) { ++parser_->depth_; }
    ~DepthGuard() { --parser_->depth_; }
    bool ok() const { return parser_->depth_ <= kMaxParseDepth; }

   private:
    Parser* parser_;
  };

  // --- Lexing ----------------------------------------------------------------

  char Peek(size_t ahead = 0) const {
    return pos_ + ahead < s_.size() ? s_[pos_ + ahead] : '\0';
  }
  bool At(absl::string_view token) const { return s_.substr(pos_, token.size()) == token; }

  // The command at pos_ ("\frac" -> "frac"; "\\le" outside matrices -> "le",
  // double backslashes come from over-escaped text), with its byte length.
  absl::string_view CommandAt(size_t at, size_t* length) const {
    *length = 0;
    if (at >= s_.size() || s_[at] != '\\') return {};
    size_t start = at + 1;
    if (start < s_.size() && s_[start] == '\\' && matrix_depth_ == 0) ++start;
    size_t end = start;
    while (end < s_.size() && IsLetter(s_[end])) ++end;
    if (end == start) return {};
    *length = end - at;
    return s_.substr(start, end - start);
  }

  // Skips spaces, "$", spacing commands (\quad, \,), \left/\right and the
  // like. The grammar calls it before every alternative it tries, often
  // several times at one position; a position known to have nothing to skip
  // returns at once (the checks of spacing commands were a fifth of parsing).
  void SkipSpace() {
    if (pos_ == settled_pos_ && matrix_depth_ == settled_matrix_depth_) return;
    if (SkipSpaceUncached()) {
      settled_pos_ = pos_;
      settled_matrix_depth_ = matrix_depth_;
    }
  }

  // True when it stopped where nothing is to skip (a pure function of the
  // text, the position and matrix_depth_); false after a malformed \hspace.
  bool SkipSpaceUncached() {
    while (pos_ < s_.size()) {
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (absl::ascii_isspace(c) || c == '$' || c == '~') {
        ++pos_;
        continue;
      }
      if (c == 0xC2 && At("\xC2\xA0")) {  // No-break space.
        pos_ += 2;
        continue;
      }
      if (c != '\\') return true;
      const char next = Peek(1);
      if (next == '$') NoteUnit("dollar");
      if (next == ',' || next == ';' || next == ':' || next == '!' || next == ' ' || next == '$' ||
          next == '(' || next == ')' || next == '[' || next == ']' || next == '\n') {
        pos_ += 2;
        continue;
      }
      if (next == '\\' && matrix_depth_ == 0 && !IsLetter(Peek(2))) {
        pos_ += 2;
        continue;
      }
      size_t length = 0;
      const absl::string_view name = CommandAt(pos_, &length);
      if (name.empty()) return true;
      if (absl::StartsWith(name, "qquad")) {
        pos_ += length - (name.size() - 5);
        continue;
      }
      if (absl::StartsWith(name, "quad")) {
        pos_ += length - (name.size() - 4);
        continue;
      }
      if (OneOf(name, {"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl",
                       "Bigr", "biggl", "biggr", "middle", "displaystyle", "textstyle",
                       "limits", "nolimits", "cdotp"})) {
        pos_ += length;
        if ((name == "left" || name == "right") && Peek() == '.') ++pos_;
        continue;
      }
      if (OneOf(name, {"hspace", "vspace", "phantom", "hphantom", "vphantom"})) {
        pos_ += length;
        std::string ignored;
        if (!ReadRawBraces(&ignored)) return false;
        continue;
      }
      return true;
    }
    return true;
  }

  // At `{`: the raw text up to the matching `}` (escaped braces skipped).
  bool ReadRawBraces(std::string* content) {
    SkipSpace();
    if (Peek() != '{') {
      Fail("expected '{'");
      return false;
    }
    size_t depth = 0;
    const size_t start = pos_ + 1;
    for (size_t i = pos_; i < s_.size(); ++i) {
      if (s_[i] == '\\') {
        ++i;
        continue;
      }
      if (s_[i] == '{') ++depth;
      if (s_[i] == '}' && --depth == 0) {
        *content = std::string(s_.substr(start, i - start));
        pos_ = i + 1;
        return true;
      }
    }
    Fail("unbalanced '{'");
    return false;
  }

  bool AtCommand(absl::string_view name) {
    SkipSpace();
    size_t length = 0;
    return CommandAt(pos_, &length) == name;
  }
  bool ConsumeCommand(absl::string_view name) {
    SkipSpace();
    size_t length = 0;
    if (CommandAt(pos_, &length) != name) return false;
    pos_ += length;
    return true;
  }
  bool Expect(char c) {
    SkipSpace();
    if (Peek() != c) {
      Fail(absl::StrCat("expected '", std::string(1, c), "'"));
      return false;
    }
    ++pos_;
    return true;
  }

  size_t LetterRun(size_t at) const {
    size_t end = at;
    while (end < s_.size() && IsLetter(s_[end])) ++end;
    return end - at;
  }

  // Where a list, group or cell ends.
  bool AtStop() {
    SkipSpace();
    if (pos_ >= s_.size()) return true;
    const char c = Peek();
    if (c == ')' || c == ']' || c == '}' || c == '&') return true;
    if (c == '|' && abs_depth_ > 0) return true;
    if (At("\\}") || AtCommand("end") || AtCommand("rfloor") || AtCommand("rceil")) return true;
    if (matrix_depth_ > 0 && At("\\\\")) return true;
    return false;
  }

  // 0: none; 1: ",", "and", "or", \text{and}; 2: ";". Consumes it.
  int ConsumeSeparator() {
    SkipSpace();
    const char c = Peek();
    if (c == ',') {
      ++pos_;
      return 1;
    }
    if (c == ';') {
      ++pos_;
      return 2;
    }
    if (IsLetter(c)) {
      const size_t run = LetterRun(pos_);
      if (IsSeparatorWord(s_.substr(pos_, run))) {
        pos_ += run;
        return 1;
      }
      return 0;
    }
    size_t length = 0;
    const absl::string_view name = CommandAt(pos_, &length);
    if (IsTextCommand(name)) {
      const size_t saved = pos_;
      pos_ += length;
      std::string content;
      if (ReadRawBraces(&content)) {
        absl::string_view word = absl::StripAsciiWhitespace(content);
        absl::ConsumeSuffix(&word, ",");
        absl::ConsumePrefix(&word, ",");
        word = absl::StripAsciiWhitespace(word);
        if (IsSeparatorWord(word) || word.empty() || word == ",") return 1;
      }
      pos_ = saved;
      status_ = absl::OkStatus();
    }
    return 0;
  }

  // --- Grammar ---------------------------------------------------------------

  // list := relation ((","|"and"|"or") relation)* (";" ...)*
  int ParseList(bool* is_list) {
    *is_list = false;
    std::vector<std::vector<int>> groups(1);
    bool semicolons = false;
    while (true) {
      if (AtStop()) {
        if (groups.back().empty() && groups.size() == 1) return Fail("empty expression");
        break;
      }
      const int item = ParseRelation();
      if (item < 0) return -1;
      groups.back().push_back(item);
      const int separator = ConsumeSeparator();
      if (separator == 0) break;
      if (separator == 2) {
        semicolons = true;
        groups.emplace_back();
      }
    }
    if (!semicolons) {
      if (groups[0].size() == 1) return groups[0][0];
      *is_list = true;
      return Add(NodeKind::kList, groups[0]);
    }
    std::vector<int> items;
    for (std::vector<int>& group : groups) {
      if (group.size() == 1) {
        items.push_back(group[0]);
      } else if (group.size() > 1) {
        items.push_back(Add(NodeKind::kTuple, std::move(group)));
      }
    }
    if (items.size() == 1) return items[0];
    *is_list = true;
    return Add(NodeKind::kList, std::move(items));
  }

  // A relation operator at pos_, consumed; empty when none.
  std::string ConsumeRelation() {
    SkipSpace();
    struct Op {
      absl::string_view token;
      absl::string_view op;
    };
    static constexpr Op kOps[] = {
        {"<=", "<="}, {">=", ">="}, {"!=", "!="}, {"==", "="},  {"=", "="},
        {"<", "<"},   {">", ">"},   {"\xE2\x89\xA4", "<="},     {"\xE2\x89\xA5", ">="},
        {"\xE2\x89\xA0", "!="},     {"\xE2\x89\x88", "~"},
    };
    for (const Op& op : kOps) {
      if (At(op.token)) {
        pos_ += op.token.size();
        return std::string(op.op);
      }
    }
    size_t length = 0;
    const absl::string_view name = CommandAt(pos_, &length);
    std::string op;
    if (OneOf(name, {"le", "leq", "leqslant", "leqq"})) op = "<=";
    if (OneOf(name, {"ge", "geq", "geqslant", "geqq"})) op = ">=";
    if (OneOf(name, {"lt"})) op = "<";
    if (OneOf(name, {"gt"})) op = ">";
    if (OneOf(name, {"ne", "neq"})) op = "!=";
    if (OneOf(name, {"approx", "simeq", "sim", "cong"})) op = "~";
    if (OneOf(name, {"equiv"})) op = "=";
    if (OneOf(name, {"in"})) op = "in";
    if (!op.empty()) pos_ += length;
    return op;
  }

  int ParseRelation() {
    std::vector<int> operands = {ParseUnion()};
    std::vector<std::string> ops;
    while (operands.back() >= 0) {
      std::string op = ConsumeRelation();
      if (op.empty()) break;
      ops.push_back(std::move(op));
      operands.push_back(ParseUnion());
    }
    if (operands.back() < 0) return -1;
    if (ops.empty()) return operands[0];
    const int node = Add(NodeKind::kRelation, std::move(operands));
    if (node >= 0) out_.nodes[node].ops = std::move(ops);
    return node;
  }

  int ParseUnion() {
    std::vector<int> parts = {ParseSum()};
    while (parts.back() >= 0 && (ConsumeCommand("cup") || ConsumeUtf8("\xE2\x88\xAA"))) {
      parts.push_back(ParseSum());
    }
    if (parts.size() == 1) return parts[0];
    return Add(NodeKind::kUnion, std::move(parts));
  }

  bool ConsumeUtf8(absl::string_view token) {
    SkipSpace();
    if (!At(token)) return false;
    pos_ += token.size();
    return true;
  }

  bool ConsumeMinus() {
    SkipSpace();
    if (Peek() == '-') {
      ++pos_;
      return true;
    }
    return ConsumeUtf8("\xE2\x88\x92");
  }
  bool ConsumePlusMinus() {
    return ConsumeCommand("pm") || ConsumeCommand("mp") || ConsumeUtf8("\xC2\xB1");
  }

  int ParseSum() {
    DepthGuard guard(this);
    if (!guard.ok()) return TooLarge("nesting too deep");
    std::vector<int> terms = {ParseTerm()};
    while (terms.back() >= 0) {
      SkipSpace();
      if (Peek() == '+') {
        ++pos_;
        terms.push_back(ParseTerm());
      } else if (ConsumeMinus()) {
        terms.push_back(Add(NodeKind::kNeg, {ParseTerm()}));
      } else if (ConsumePlusMinus()) {
        const int left = terms.size() == 1 ? terms[0] : Add(NodeKind::kAdd, terms);
        terms = {Add(NodeKind::kPlusMinus, {left, ParseTerm()})};
      } else {
        break;
      }
    }
    if (terms.back() < 0) return -1;
    return terms.size() == 1 ? terms[0] : Add(NodeKind::kAdd, std::move(terms));
  }

  // Whether the input at pos_ starts an operand (for implicit products).
  bool StartsOperand() {
    SkipSpace();
    const char c = Peek();
    if (IsDigit(c) || c == '(' || c == '{') return true;
    if (c == '.' && IsDigit(Peek(1))) return true;
    if (c == '|') return abs_depth_ == 0;
    if (IsLetter(c)) {
      const absl::string_view word = s_.substr(pos_, LetterRun(pos_));
      return !IsSeparatorWord(word) && !IsPercentWord(word);
    }
    if (At("\xCF\x80") || At("\xE2\x88\x9E") || At("\xE2\x88\x9A")) return true;
    size_t length = 0;
    const absl::string_view name = CommandAt(pos_, &length);
    if (name.empty()) return false;
    return OneOf(name, {"frac", "dfrac", "tfrac", "cfrac", "sqrt", "pi", "infty", "boxed",
                        "fbox", "begin", "sum", "lfloor", "lceil", "e"}) ||
           IsGreek(name) || IsFunctionName(name) || IsDecorationCommand(name) ||
           (IsTextCommand(name) && !IsSeparatorText());
  }

  // Whether the \text-like command at pos_ holds a separator ("and").
  bool IsSeparatorText() {
    const size_t saved = pos_;
    const bool separator = ConsumeSeparator() != 0;
    pos_ = saved;
    return separator;
  }

  // Drops a unit after an operand: "\text{ cm}^2", "\mbox{ dollars}", "cm".
  // True when one was dropped; a percent word becomes a kPercent of `*term`.
  bool DropUnit(int* term) {
    SkipSpace();
    const size_t saved = pos_;
    size_t length = 0;
    const absl::string_view name = CommandAt(pos_, &length);
    std::string word;
    if (IsTextCommand(name) && name != "operatorname" && !IsSeparatorText()) {
      pos_ += length;
      std::string content;
      if (!ReadRawBraces(&content)) return false;
      word = std::string(absl::StripAsciiWhitespace(content));
      // Only words: "\text{Evelyn}" after a number is still a unit, but
      // "\text{13}" or "\mathrm{d}x" are not.
      const bool words = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
        return IsLetter(c) || c == ' ' || c == '.' || c == '/' || c == '^' || IsDigit(c);
      }) && IsLetter(word[0]) && word.size() >= 2;
      if (!words) {
        pos_ = saved;
        return false;
      }
    } else if (IsLetter(Peek())) {
      const size_t run = LetterRun(pos_);
      const absl::string_view letters = s_.substr(pos_, run);
      if (!IsUnitWord(letters) && !IsPercentWord(letters)) return false;
      // A unit word must be a whole word: "cmx" is not "cm".
      word = std::string(letters);
      pos_ += run;
      // The unit's further words: "square cm", "cubic meters".
      while (!IsPercentWord(word)) {
        SkipSpace();
        const size_t next = LetterRun(pos_);
        if (next == 0 || !IsUnitWord(s_.substr(pos_, next))) break;
        absl::StrAppend(&word, " ", s_.substr(pos_, next));
        pos_ += next;
      }
    } else {
      return false;
    }
    if (IsPercentWord(word)) {
      *term = Add(NodeKind::kPercent, {*term});
      return true;
    }
    // "cm^2", "\text{ m}^3".
    SkipSpace();
    std::string power;
    if (Peek() == '^') {
      ++pos_;
      const int exponent = ReadArg();
      if (exponent < 0) return false;
      power = out_.SubtreeString(exponent);
    }
    NoteUnit(UnitKey(word, power));
    return true;
  }

  bool IsIntegerLiteral(int index) const {
    return index >= 0 && out_.nodes[index].kind == NodeKind::kNumber && !out_.nodes[index].is_float;
  }

  // Whether `whole` (an integer literal, or its negation) and the \frac right
  // after it (`fraction`, of two integer literals) spell a mixed number:
  // "1\frac{4}{5}" is 1 + 4/5, as MATH writes it, not 4/5.
  bool IsMixedNumber(int whole, int fraction) const {
    if (whole < 0 || fraction < 0) return false;
    const Node& w = out_.nodes[whole];
    const Node& f = out_.nodes[fraction];
    const bool integer = IsIntegerLiteral(whole) ||
                         (w.kind == NodeKind::kNeg && IsIntegerLiteral(w.kids[0]));
    return integer && f.kind == NodeKind::kDiv && IsIntegerLiteral(f.kids[0]) &&
           IsIntegerLiteral(f.kids[1]);
  }

  int MixedNumber(int whole, int fraction) {
    const Node& w = out_.nodes[whole];
    if (w.kind == NodeKind::kNeg) {
      const int magnitude = w.kids[0];
      return Add(NodeKind::kNeg, {Add(NodeKind::kAdd, {magnitude, fraction})});
    }
    return Add(NodeKind::kAdd, {whole, fraction});
  }

  int ParseTerm() {
    int product = ParseUnary();
    std::vector<int> factors = {product};
    auto flush = [&]() {
      return factors.size() == 1 ? factors[0] : Add(NodeKind::kMul, factors);
    };
    while (factors.back() >= 0) {
      SkipSpace();
      const char c = Peek();
      if (c == '*' || ConsumeCommand("cdot") || ConsumeCommand("times") ||
          ConsumeUtf8("\xC3\x97") || ConsumeUtf8("\xC2\xB7") || ConsumeUtf8("\xE2\x8B\x85")) {
        if (c == '*') ++pos_;
        factors.push_back(ParseUnary());
      } else if ((c == '/' || (c == ':' && Peek(1) != '=')) || ConsumeCommand("div") ||
                 ConsumeUtf8("\xC3\xB7")) {
        if (c == '/' || c == ':') ++pos_;
        const int numerator = flush();
        factors = {Add(NodeKind::kDiv, {numerator, ParseUnary()})};
      } else if (DropUnit(&factors.back())) {
        continue;
      } else if (!status_.ok()) {
        return -1;
      } else if (StartsOperand()) {
        const bool frac_next = AtCommand("frac") || AtCommand("dfrac") || AtCommand("tfrac");
        const int factor = ParsePostfix();
        if (frac_next && factors.size() == 1 && IsMixedNumber(factors[0], factor)) {
          factors[0] = MixedNumber(factors[0], factor);
        } else {
          factors.push_back(factor);
        }
      } else {
        break;
      }
    }
    if (factors.back() < 0) return -1;
    return flush();
  }

  int ParseUnary() {
    DepthGuard guard(this);
    if (!guard.ok()) return TooLarge("nesting too deep");
    SkipSpace();
    if (ConsumeMinus()) return Add(NodeKind::kNeg, {ParseUnary()});
    if (Peek() == '+') {
      ++pos_;
      return ParseUnary();
    }
    if (ConsumePlusMinus()) return Add(NodeKind::kPlusMinus, {ParseUnary()});
    return ParsePostfix();
  }

  int ParsePostfix() {
    int node = ParsePrimary();
    while (node >= 0) {
      SkipSpace();
      const char c = Peek();
      if (c == '^') {
        ++pos_;
        SkipSpace();
        if (ConsumeCommand("circ") || ConsumeUtf8("{\\circ}") || ConsumeUtf8("\\circ")) {
          NoteUnit("degree");
          continue;
        }
        if (At("{\\circ}")) {
          pos_ += 7;
          NoteUnit("degree");
          continue;
        }
        node = Add(NodeKind::kPow, {node, ReadArg()});
      } else if (c == '_') {
        ++pos_;
        node = Add(NodeKind::kFunction, {node, ReadArg()}, "_");
      } else if (c == '!' && Peek(1) != '=') {
        ++pos_;
        node = Add(NodeKind::kFunction, {node}, "factorial");
      } else if (c == '%' || At("\\%")) {
        pos_ += c == '%' ? 1 : 2;
        node = Add(NodeKind::kPercent, {node});
      } else if (ConsumeUtf8("\xC2\xB0") || ConsumeCommand("circ") || ConsumeCommand("degree")) {
        NoteUnit("degree");
        continue;  // Degrees: the number stands.
      } else if (c == '\'') {
        ++pos_;
        node = Add(NodeKind::kFunction, {node}, "prime");
      } else {
        break;
      }
    }
    return node;
  }

  // The argument of ^, _, \frac, \sqrt: a braced group, else one digit, one
  // letter or one command ("\frac12", "\sqrt3", "x^\pi").
  int ReadArg() {
    DepthGuard guard(this);
    if (!guard.ok()) return TooLarge("nesting too deep");
    SkipSpace();
    const char c = Peek();
    if (c == '{') {
      ++pos_;
      bool is_list = false;
      const int inner = ParseList(&is_list);
      if (inner < 0 || !Expect('}')) return -1;
      return inner;
    }
    if (IsDigit(c)) {
      ++pos_;
      return Add(NodeKind::kNumber, {}, std::string(1, c));
    }
    if (IsLetter(c)) {
      ++pos_;
      return Add(NodeKind::kSymbol, {}, std::string(1, c));
    }
    if (c == '-' ) {
      ++pos_;
      return Add(NodeKind::kNeg, {ReadArg()});
    }
    if (c == '\\') return ParsePrimary();
    return Fail("expected an argument");
  }

  int ParseNumber() {
    std::string digits;
    const size_t start = pos_;
    while (IsDigit(Peek())) digits.push_back(s_[pos_++]);
    // Thousands separators: "14{,}916", "12,\!000", and plain "7,425,000"
    // when unambiguous (two or more groups, or the whole answer).
    auto group_after = [&](size_t at, size_t* next) -> bool {
      size_t j = at;
      if (s_.substr(j, 3) == "{,}") {
        j += 3;
      } else if (s_.substr(j, 3) == ",\\!") {
        j += 3;
        while (j < s_.size() && s_[j] == ' ') ++j;
      } else {
        return false;
      }
      if (j + 3 > s_.size() || !IsDigit(s_[j]) || !IsDigit(s_[j + 1]) || !IsDigit(s_[j + 2])) {
        return false;
      }
      if (j + 3 < s_.size() && IsDigit(s_[j + 3])) return false;
      *next = j + 3;
      return true;
    };
    auto plain_group_after = [&](size_t at) -> bool {
      return at + 4 <= s_.size() && s_[at] == ',' && IsDigit(s_[at + 1]) &&
             IsDigit(s_[at + 2]) && IsDigit(s_[at + 3]) &&
             (at + 4 == s_.size() || !IsDigit(s_[at + 4]));
    };
    if (!digits.empty() && digits.size() <= 3) {
      size_t next = 0;
      if (group_after(pos_, &next)) {
        while (group_after(pos_, &next)) {
          absl::StrAppend(&digits, s_.substr(next - 3, 3));
          pos_ = next;
        }
      } else if (digits[0] != '0' && plain_group_after(pos_)) {
        size_t groups = 0;
        size_t at = pos_;
        while (plain_group_after(at)) {
          ++groups;
          at += 4;
        }
        const bool whole = start == first_ && at == s_.size();
        if (groups >= 2 || whole) {
          for (size_t g = 0; g < groups; ++g) {
            absl::StrAppend(&digits, s_.substr(pos_ + 1, 3));
            pos_ += 4;
          }
        }
      }
    }
    bool is_float = false;
    std::string decimals;
    if (Peek() == '.' && IsDigit(Peek(1))) {
      ++pos_;
      while (IsDigit(Peek())) decimals.push_back(s_[pos_++]);
      is_float = true;
    }
    if (digits.size() + decimals.size() > kMaxNumberDigits) {
      return TooLarge(absl::StrCat("a number has more than ", kMaxNumberDigits, " digits"));
    }
    size_t zeros = 0;
    while (zeros + 1 < digits.size() && digits[zeros] == '0') ++zeros;
    digits.erase(0, zeros);
    if (digits.empty()) digits = "0";
    if (is_float) absl::StrAppend(&digits, ".", decimals);
    const int node = Add(NodeKind::kNumber, {}, std::move(digits));
    if (node >= 0) out_.nodes[node].is_float = is_float;
    return node;
  }

  int ParseBracket() {
    const char open = s_[pos_++];
    bool is_list = false;
    const int inner = ParseList(&is_list);
    if (inner < 0) return -1;
    SkipSpace();
    const char close = Peek();
    if (close != ')' && close != ']') return Fail("unclosed bracket");
    ++pos_;
    std::vector<int> items = is_list ? out_.nodes[inner].kids : std::vector<int>{inner};
    if (items.size() == 1 && ((open == '(' && close == ')') || (open == '[' && close == ']'))) {
      return inner;
    }
    if (items.size() == 2 && !(open == '(' && close == ')')) {
      const int node = Add(NodeKind::kInterval, std::move(items));
      if (node >= 0) {
        out_.nodes[node].left_closed = open == '[';
        out_.nodes[node].right_closed = close == ']';
      }
      return node;
    }
    if (open == '(' && close == ')') return Add(NodeKind::kTuple, std::move(items));
    if (open == '[' && close == ']') return Add(NodeKind::kTuple, std::move(items));
    return Fail("mismatched brackets");
  }

  int ParsePrimary() {
    DepthGuard guard(this);
    if (!guard.ok()) return TooLarge("nesting too deep");
    SkipSpace();
    const char c = Peek();
    if (IsDigit(c) || (c == '.' && IsDigit(Peek(1)))) return ParseNumber();
    if (IsLetter(c)) {
      const bool function_letter =
          absl::string_view("fghFGHPQW").find(c) != absl::string_view::npos &&
          Peek(1) == '(';
      ++pos_;
      if (function_letter) {
        ++pos_;
        bool is_list = false;
        const int args = ParseList(&is_list);
        if (args < 0 || !Expect(')')) return -1;
        return Add(NodeKind::kFunction,
                   is_list ? out_.nodes[args].kids : std::vector<int>{args}, std::string(1, c));
      }
      if (c == 'e' && Peek() == '^') return Add(NodeKind::kConstant, {}, "e");
      return Add(NodeKind::kSymbol, {}, std::string(1, c));
    }
    if (c == '(' || c == '[') return ParseBracket();
    if (c == '{') {
      ++pos_;
      bool is_list = false;
      const int inner = ParseList(&is_list);
      if (inner < 0 || !Expect('}')) return -1;
      return inner;
    }
    if (c == '|') {
      ++pos_;
      ++abs_depth_;
      const int inner = ParseSum();
      --abs_depth_;
      if (inner < 0 || !Expect('|')) return -1;
      return Add(NodeKind::kFunction, {inner}, "abs");
    }
    if (At("\\{")) {
      pos_ += 2;
      SkipSpace();
      if (At("\\}")) {
        pos_ += 2;
        return Add(NodeKind::kSet);
      }
      bool is_list = false;
      const int inner = ParseList(&is_list);
      if (inner < 0) return -1;
      SkipSpace();
      if (!At("\\}")) return Fail("unclosed \\{");
      pos_ += 2;
      return Add(NodeKind::kSet, is_list ? out_.nodes[inner].kids : std::vector<int>{inner});
    }
    if (ConsumeUtf8("\xCF\x80")) return Add(NodeKind::kConstant, {}, "pi");
    if (ConsumeUtf8("\xE2\x88\x9E")) return Add(NodeKind::kConstant, {}, "inf");
    if (ConsumeUtf8("\xE2\x88\x9A")) return Add(NodeKind::kFunction, {ReadArg()}, "sqrt");
    if (c == '\\') return ParseCommand();
    if (c == '\0') return Fail("unexpected end");
    return Fail(absl::StrCat("unexpected byte ", static_cast<int>(static_cast<unsigned char>(c))));
  }

  int ParseFunctionCall(std::string name) {
    SkipSpace();
    int power = -1;
    int base = -1;
    for (int i = 0; i < 2; ++i) {
      SkipSpace();
      if (Peek() == '^' && power < 0) {
        ++pos_;
        power = ReadArg();
        if (power < 0) return -1;
      } else if (Peek() == '_' && base < 0) {
        ++pos_;
        base = ReadArg();
        if (base < 0) return -1;
      }
    }
    SkipSpace();
    int arg = -1;
    if (Peek() == '(') {
      ++pos_;
      bool is_list = false;
      arg = ParseList(&is_list);
      if (arg < 0 || !Expect(')')) return -1;
      if (is_list) return Fail("a function of several arguments");
    } else {
      arg = ParsePostfix();
    }
    if (name == "lg") {
      name = "log";
      if (base < 0) base = Add(NodeKind::kNumber, {}, "10");
    }
    std::vector<int> args = {arg};
    if (base >= 0) args.push_back(base);
    int call = Add(NodeKind::kFunction, std::move(args), std::move(name));
    if (power >= 0) call = Add(NodeKind::kPow, {call, power});
    return call;
  }

  int ParseMatrix(const std::string& environment) {
    DepthGuard guard(this);
    if (!guard.ok()) return TooLarge("nesting too deep");
    if (environment == "array") {
      std::string columns;
      if (!ReadRawBraces(&columns)) return -1;
    }
    ++matrix_depth_;
    std::vector<std::vector<int>> rows(1);
    while (true) {
      SkipSpace();
      if (AtCommand("end")) break;
      const int cell = ParseRelation();
      if (cell < 0) {
        --matrix_depth_;
        return -1;
      }
      rows.back().push_back(cell);
      SkipSpace();
      if (Peek() == '&') {
        ++pos_;
      } else if (At("\\\\")) {
        pos_ += 2;
        rows.emplace_back();
      } else if (!AtCommand("end")) {
        --matrix_depth_;
        return Fail("bad matrix cell");
      }
    }
    --matrix_depth_;
    ConsumeCommand("end");
    std::string closing;
    if (!ReadRawBraces(&closing)) return -1;
    if (closing != environment) return Fail("mismatched \\end");
    if (rows.back().empty()) rows.pop_back();
    if (rows.empty()) return Fail("empty matrix");
    std::vector<int> cells;
    const size_t cols = rows[0].size();
    for (const std::vector<int>& row : rows) {
      if (row.size() != cols) return Fail("ragged matrix");
      cells.insert(cells.end(), row.begin(), row.end());
    }
    const int node = Add(NodeKind::kMatrix, std::move(cells));
    if (node >= 0) {
      out_.nodes[node].rows = static_cast<int>(rows.size());
      out_.nodes[node].cols = static_cast<int>(cols);
    }
    return node;
  }

  int ParseCommand() {
    size_t length = 0;
    const std::string name(CommandAt(pos_, &length));
    if (name.empty()) return Fail("unexpected '\\'");
    pos_ += length;
    if (OneOf(name, {"frac", "dfrac", "tfrac", "cfrac"})) {
      const int numerator = ReadArg();
      if (numerator < 0) return -1;
      return Add(NodeKind::kDiv, {numerator, ReadArg()});
    }
    if (name == "sqrt") {
      SkipSpace();
      if (Peek() == '[') {
        ++pos_;
        const int degree = ParseSum();
        if (degree < 0 || !Expect(']')) return -1;
        const int radicand = ReadArg();
        return Add(NodeKind::kFunction, {radicand, degree}, "root");
      }
      return Add(NodeKind::kFunction, {ReadArg()}, "sqrt");
    }
    if (name == "pi") return Add(NodeKind::kConstant, {}, "pi");
    if (name == "infty" || name == "infin" || name == "infinity") {
      return Add(NodeKind::kConstant, {}, "inf");
    }
    if (IsGreek(name)) return Add(NodeKind::kSymbol, {}, name);
    if (IsFunctionName(name)) return ParseFunctionCall(name);
    if (name == "boxed" || name == "fbox") return ReadArg();
    if (IsTextCommand(name)) {
      std::string content;
      if (!ReadRawBraces(&content)) return -1;
      absl::string_view word = absl::StripAsciiWhitespace(content);
      if (word.size() == 3 && word[0] == '(' && word[2] == ')') word = word.substr(1, 1);
      if (word.empty()) return Fail("empty text");
      if (name == "operatorname" || name == "mathrm") {
        SkipSpace();
        if (Peek() == '(' && word.size() > 1) return ParseFunctionCall(std::string(word));
      }
      std::string symbol;
      for (char ch : word) {
        if (!absl::ascii_isspace(static_cast<unsigned char>(ch))) symbol.push_back(ch);
      }
      return Add(NodeKind::kSymbol, {}, std::move(symbol));
    }
    if (IsDecorationCommand(name)) {
      std::string content;
      SkipSpace();
      if (Peek() == '{') {
        if (!ReadRawBraces(&content)) return -1;
      } else if (IsLetter(Peek())) {
        content = std::string(1, s_[pos_++]);
      } else {
        return Fail("bad decoration");
      }
      content.erase(std::remove(content.begin(), content.end(), ' '), content.end());
      return Add(NodeKind::kSymbol, {}, absl::StrCat(name, "{", content, "}"));
    }
    if (name == "begin") {
      std::string environment;
      if (!ReadRawBraces(&environment)) return -1;
      if (OneOf(environment, {"pmatrix", "bmatrix", "Bmatrix", "vmatrix", "Vmatrix", "matrix",
                              "smallmatrix", "array"})) {
        return ParseMatrix(environment);
      }
      return Fail("unsupported environment");
    }
    if (name == "sum" || name == "prod") {
      int lower = -1, upper = -1;
      for (int i = 0; i < 2; ++i) {
        SkipSpace();
        if (Peek() == '_' && lower < 0) {
          ++pos_;
          lower = ReadArg();
        } else if (Peek() == '^' && upper < 0) {
          ++pos_;
          upper = ReadArg();
        }
      }
      if (lower < 0 || upper < 0) return Fail("a sum needs both bounds");
      const int body = ParseTerm();
      return Add(NodeKind::kFunction, {lower, upper, body}, name);
    }
    if (name == "lfloor" || name == "lceil") {
      const int inner = ParseSum();
      if (inner < 0) return -1;
      if (!ConsumeCommand(name == "lfloor" ? "rfloor" : "rceil")) return Fail("unclosed floor");
      return Add(NodeKind::kFunction, {inner}, name == "lfloor" ? "floor" : "ceil");
    }
    if (name == "e") return Add(NodeKind::kConstant, {}, "e");
    if (OneOf(name, {"end", "cup", "cap", "int", "lim", "dots", "ldots", "cdots", "over",
                     "choose", "binom"})) {
      return Fail(absl::StrCat("unsupported command \\", name));
    }
    // Any other command names something ("\\zzz", "\\ell"): a symbol.
    return Add(NodeKind::kSymbol, {}, absl::StrCat("\\", name));
  }

  absl::string_view s_;
  size_t pos_ = 0;
  size_t first_ = 0;
  int depth_ = 0;
  int abs_depth_ = 0;
  int matrix_depth_ = 0;
  // Where SkipSpace last found nothing to skip, at which matrix depth.
  size_t settled_pos_ = absl::string_view::npos;
  int settled_matrix_depth_ = -1;
  absl::Status status_;
  LatexExpr out_;
};

void AppendDebug(const LatexExpr& expr, int index, int depth, std::string* out) {
  if (index < 0 || index >= static_cast<int>(expr.nodes.size()) || depth > 400) {
    out->append("?");
    return;
  }
  const Node& node = expr.nodes[index];
  static constexpr absl::string_view kNames[] = {
      "num", "sym", "const", "+", "neg", "*", "/", "^", "fn", "%", "pm",
      "tuple", "list", "set", "interval", "union", "rel", "matrix"};
  if (node.kind == NodeKind::kNumber || node.kind == NodeKind::kSymbol ||
      node.kind == NodeKind::kConstant) {
    out->append(node.text);
    return;
  }
  absl::StrAppend(out, "(", kNames[static_cast<int>(node.kind)]);
  if (!node.text.empty()) absl::StrAppend(out, ":", node.text);
  if (node.kind == NodeKind::kInterval) {
    absl::StrAppend(out, node.left_closed ? "[" : "(", node.right_closed ? "]" : ")");
  }
  for (size_t i = 0; i < node.kids.size(); ++i) {
    out->push_back(' ');
    if (node.kind == NodeKind::kRelation && i > 0 && i - 1 < node.ops.size()) {
      absl::StrAppend(out, node.ops[i - 1], " ");
    }
    AppendDebug(expr, node.kids[i], depth + 1, out);
  }
  out->push_back(')');
}

}  // namespace

std::string LatexExpr::DebugString() const { return SubtreeString(root); }

std::string LatexExpr::SubtreeString(int index) const {
  std::string out;
  AppendDebug(*this, index, 0, &out);
  return out;
}

absl::StatusOr<LatexExpr> ParseLatexAnswer(absl::string_view latex) {
  return Parser(latex).Run();
}

}  // namespace sluice::reward_server::math
