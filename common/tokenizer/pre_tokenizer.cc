#include "common/tokenizer/pre_tokenizer.h"

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "unicode/regex.h"
#include "unicode/uchar.h"
#include "unicode/unistr.h"
#include "unicode/utf8.h"

namespace sluice::tokenizer {
namespace {

constexpr UChar32 kReplacementChar = 0xFFFD;

// Character classes the known patterns test.
enum : uint8_t {
  kLetter = 1,  // \p{L}
  kNumber = 2,  // \p{N}
  kSpace = 4,   // \s (Unicode White_Space)
};

uint8_t ClassOf(UChar32 c) {
  if (c < 0x80) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return kLetter;
    if (c >= '0' && c <= '9') return kNumber;
    if (c == ' ' || (c >= '\t' && c <= '\r')) return kSpace;
    return 0;
  }
  const uint32_t mask = U_GET_GC_MASK(c);
  uint8_t result = 0;
  if (mask & U_GC_L_MASK) result |= kLetter;
  if (mask & U_GC_N_MASK) result |= kNumber;
  if (u_isUWhiteSpace(c)) result |= kSpace;
  return result;
}

// `text` as code points. An invalid UTF-8 byte is one U+FFFD character, so
// that every byte of `text` belongs to exactly one character.
struct Chars {
  std::vector<UChar32> code_points;
  std::vector<uint32_t> offsets;  // Byte offset of each character, then text.size().
};

Chars DecodeUtf8(absl::string_view text) {
  Chars chars;
  chars.code_points.reserve(text.size());
  chars.offsets.reserve(text.size() + 1);
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  const int32_t length = static_cast<int32_t>(text.size());
  int32_t i = 0;
  while (i < length) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(bytes, i, length, c);
    if (c < 0) {
      c = kReplacementChar;
      i = start + 1;
    }
    chars.code_points.push_back(c);
    chars.offsets.push_back(static_cast<uint32_t>(start));
  }
  chars.offsets.push_back(static_cast<uint32_t>(text.size()));
  return chars;
}

bool IsNewline(UChar32 c) { return c == '\r' || c == '\n'; }

// A hand-written matcher for kQwen2Pattern (max_digits 1) and kLlama3Pattern
// (max_digits 3), alternative by alternative, with the regex's leftmost-
// first semantics (the fast path llama.cpp also takes). Every character is
// covered by some alternative, so there are no gaps.
class KnownPatternSplitter : public Splitter {
 public:
  explicit KnownPatternSplitter(int max_digits) : max_digits_(max_digits) {}

  void Split(absl::string_view text, std::vector<absl::string_view>* out) const override {
    if (text.empty()) return;
    const Chars chars = DecodeUtf8(text);
    const std::vector<UChar32>& cp = chars.code_points;
    const size_t n = cp.size();
    std::vector<uint8_t> cls(n);
    for (size_t i = 0; i < n; ++i) cls[i] = ClassOf(cp[i]);

    size_t pos = 0;
    auto emit = [&](size_t end) {
      out->push_back(text.substr(chars.offsets[pos], chars.offsets[end] - chars.offsets[pos]));
      pos = end;
    };
    while (pos < n) {
      const UChar32 c = cp[pos];
      const uint8_t f = cls[pos];
      // (?i:'s|'t|'re|'ve|'m|'ll|'d)
      if (c == '\'' && pos + 1 < n) {
        const UChar32 c1 = u_foldCase(cp[pos + 1], U_FOLD_CASE_DEFAULT);
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
          emit(pos + 2);
          continue;
        }
        if (pos + 2 < n) {
          const UChar32 c2 = u_foldCase(cp[pos + 2], U_FOLD_CASE_DEFAULT);
          if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
            emit(pos + 3);
            continue;
          }
        }
      }
      // [^\r\n\p{L}\p{N}]?\p{L}+
      {
        size_t letters = n;  // Where the \p{L}+ part starts, if it can.
        if (f & kLetter) {
          letters = pos;
        } else if (!IsNewline(c) && !(f & kNumber) && pos + 1 < n && (cls[pos + 1] & kLetter)) {
          letters = pos + 1;
        }
        if (letters < n) {
          size_t end = letters + 1;
          while (end < n && (cls[end] & kLetter)) ++end;
          emit(end);
          continue;
        }
      }
      // \p{N} or \p{N}{1,3}
      if (f & kNumber) {
        size_t end = pos + 1;
        while (end < n && end - pos < static_cast<size_t>(max_digits_) && (cls[end] & kNumber))
          ++end;
        emit(end);
        continue;
      }
      // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
      {
        const size_t start = pos + (c == ' ' ? 1 : 0);
        constexpr uint8_t kAny = kLetter | kNumber | kSpace;
        if (start < n && !(cls[start] & kAny)) {
          size_t end = start + 1;
          while (end < n && !(cls[end] & kAny)) ++end;
          while (end < n && IsNewline(cp[end])) ++end;
          emit(end);
          continue;
        }
      }
      // \s*[\r\n]+ | \s+(?!\S) | \s+
      size_t end = pos;
      size_t after_last_newline = 0;
      while (end < n && (cls[end] & kSpace)) {
        if (IsNewline(cp[end])) after_last_newline = end + 1;
        ++end;
      }
      if (after_last_newline > 0) {
        emit(after_last_newline);
      } else if (end - pos > 1 && end < n) {
        emit(end - 1);  // Leave the last space to the next token.
      } else if (end > pos) {
        emit(end);
      } else {
        emit(pos + 1);  // Unreachable: every character is matched above.
      }
    }
  }

 private:
  const int max_digits_;
};

// Any pattern, on ICU's regex engine. Matches run over UTF-16, mapped back
// to byte offsets.
class IcuRegexSplitter : public Splitter {
  // The most steps of ICU's match engine (each ~10,000 operations) one find
  // may take: a pattern from a tokenizer.json that backtracks exponentially
  // ("(a|aa)*c" over a run of a's) stops there (U_REGEX_TIME_OUT) instead
  // of hanging Encode. Real patterns take well under one step per match.
  static constexpr int32_t kMatchTimeLimitSteps = 1000;

 public:
  explicit IcuRegexSplitter(std::unique_ptr<icu::RegexPattern> pattern)
      : pattern_(std::move(pattern)) {}

  void Split(absl::string_view text, std::vector<absl::string_view>* out) const override {
    if (text.empty()) return;
    const Chars chars = DecodeUtf8(text);
    icu::UnicodeString utf16;
    std::vector<uint32_t> utf16_to_byte;
    utf16_to_byte.reserve(chars.code_points.size() + 1);
    for (size_t i = 0; i < chars.code_points.size(); ++i) {
      const UChar32 c = chars.code_points[i];
      utf16.append(c);
      utf16_to_byte.push_back(chars.offsets[i]);
      if (c > 0xFFFF) utf16_to_byte.push_back(chars.offsets[i]);
    }
    utf16_to_byte.push_back(static_cast<uint32_t>(text.size()));

    size_t done = 0;  // Bytes already emitted.
    auto emit_to = [&](size_t end) {
      if (end > done) out->push_back(text.substr(done, end - done));
      done = end;
    };
    UErrorCode status = U_ZERO_ERROR;
    std::unique_ptr<icu::RegexMatcher> matcher(pattern_->matcher(utf16, status));
    if (U_SUCCESS(status)) matcher->setTimeLimit(kMatchTimeLimitSteps, status);
    if (U_SUCCESS(status)) {
      while (matcher->find(status) && U_SUCCESS(status)) {
        const int32_t start = matcher->start(status);
        const int32_t end = matcher->end(status);
        if (U_FAILURE(status) || start < 0 || end < start) break;
        if (end == start) continue;     // Empty matches split nothing.
        emit_to(utf16_to_byte[start]);  // The gap before the match.
        emit_to(utf16_to_byte[end]);
      }
    }
    // The gap after the last match (or, should ICU fail, the rest).
    emit_to(text.size());
  }

 private:
  std::unique_ptr<icu::RegexPattern> pattern_;
};

// Oniguruma's \s is Unicode White_Space; ICU's is [\t\n\f\r\p{Z}], which
// leaves out \v and U+0085.
std::string ToIcuSyntax(absl::string_view pattern) {
  std::string result;
  result.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[i + 1];
      if (next == 's') {
        result += "\\p{White_Space}";
      } else if (next == 'S') {
        result += "\\P{White_Space}";
      } else {
        result += pattern[i];
        result += next;
      }
      ++i;
    } else {
      result += pattern[i];
    }
  }
  return result;
}

}  // namespace

std::string QuoteRegex(absl::string_view literal) {
  std::string result;
  for (char c : literal) {
    const auto byte = static_cast<unsigned char>(c);
    const bool alnum = (byte >= '0' && byte <= '9') || (byte >= 'a' && byte <= 'z') ||
                       (byte >= 'A' && byte <= 'Z');
    if (byte < 0x80 && !alnum) result += '\\';
    result += c;
  }
  return result;
}

absl::StatusOr<std::unique_ptr<Splitter>> MakeRegexSplitter(absl::string_view pattern,
                                                            bool allow_fast_path) {
  if (allow_fast_path && pattern == kQwen2Pattern) {
    return std::unique_ptr<Splitter>(new KnownPatternSplitter(1));
  }
  if (allow_fast_path && pattern == kLlama3Pattern) {
    return std::unique_ptr<Splitter>(new KnownPatternSplitter(3));
  }
  const std::string icu_pattern = ToIcuSyntax(pattern);
  UParseError parse_error;
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexPattern> compiled(icu::RegexPattern::compile(
      icu::UnicodeString::fromUTF8(icu_pattern), 0, parse_error, status));
  if (U_FAILURE(status) || compiled == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot compile regex /", pattern,
                                                   "/: ", u_errorName(status), " at offset ",
                                                   parse_error.offset));
  }
  return std::unique_ptr<Splitter>(new IcuRegexSplitter(std::move(compiled)));
}

}  // namespace sluice::tokenizer
