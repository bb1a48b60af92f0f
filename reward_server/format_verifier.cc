#include "reward_server/format_verifier.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "re2/re2.h"
#include "reward_server/math/answer_extraction.h"
#include "reward_server/math/math_equivalence.h"
#include "common/run/verifier_params.h"

namespace sluice::reward_server {
namespace {

VerifyOutcome Judged(bool ok, std::string extracted, std::string detail) {
  VerifyOutcome outcome;
  outcome.reward = ok ? 1.0 : 0.0;
  outcome.extracted_answer = std::move(extracted);
  TruncateUtf8(&outcome.extracted_answer, 1024);
  outcome.detail = std::move(detail);
  return outcome;
}

VerifyOutcome CheckPreset(absl::string_view preset, absl::string_view response) {
  if (preset.empty() || preset == "answer_marker") {
    std::optional<ExtractedAnswer> answer = ExtractAnswer(response);
    if (!answer.has_value()) return Judged(false, "", "no answer found");
    const bool marked = answer->source != AnswerSource::kLastNumber;
    return Judged(marked, answer->text,
                  marked ? absl::StrCat("answer given with marker \"",
                                        AnswerSourceName(answer->source), "\"")
                         : "the answer is not marked (no \\boxed{}, ####, \"the answer is\" "
                           "or \"Answer:\")");
  }
  if (preset == "boxed") {
    // The math verifier's own scan, so both agree on what a box is. Blank
    // boxes are not answers: "\\boxed{ }" counts as none.
    const std::vector<absl::string_view> bodies = FindBoxedContents(response);
    if (bodies.size() != 1) {
      return Judged(false, "",
                    absl::StrCat("want exactly one non-empty \\boxed{...}, found ", bodies.size()));
    }
    return Judged(true, std::string(bodies[0]), "one \\boxed{}");
  }
  if (preset == "think_answer") {
    const absl::string_view text = absl::StripLeadingAsciiWhitespace(response);
    constexpr absl::string_view kOpen = "<think>", kClose = "</think>";
    if (!absl::StartsWith(text, kOpen)) return Judged(false, "", "does not start with <think>");
    const size_t close = text.find(kClose);
    if (close == absl::string_view::npos) return Judged(false, "", "no </think>");
    if (text.find(kOpen, kOpen.size()) != absl::string_view::npos ||
        text.find(kClose, close + kClose.size()) != absl::string_view::npos) {
      return Judged(false, "", "more than one <think> block");
    }
    const absl::string_view answer = absl::StripAsciiWhitespace(text.substr(close + kClose.size()));
    if (answer.empty()) return Judged(false, "", "nothing after </think>");
    return Judged(true, std::string(answer), "<think>...</think> then an answer");
  }
  return VerifyOutcome::Error(
      VerifierErrorKind::kInvalidInput,
      absl::StrCat("format: unknown preset \"", preset,
                   "\" (want answer_marker, boxed or think_answer, or set format_regex)"));
}

}  // namespace

FormatVerifier::FormatVerifier()
    : Verifier({
          .name = "format",
          .description = "Reward 1 when the response has the required shape: metadata "
                         "format_regex (RE2) or preset format = answer_marker | boxed | "
                         "think_answer.",
          .default_timeout = absl::Milliseconds(1000),
          .max_timeout = absl::Seconds(60),
          .required_fields = {},
      }) {}

FormatVerifier::~FormatVerifier() = default;

absl::StatusOr<std::shared_ptr<const re2::RE2>> FormatVerifier::Compile(
    const std::string& pattern) const {
  {
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(pattern);
    if (it != cache_.end()) return it->second;
  }
  RE2::Options options;
  options.set_log_errors(false);
  options.set_dot_nl(false);
  auto compiled = std::make_shared<const RE2>(pattern, options);
  if (!compiled->ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("format_regex: not a valid RE2 pattern: ", compiled->error()));
  }
  absl::MutexLock lock(&mu_);
  // Run configs hold a handful of patterns; items that each bring their own
  // would grow the cache for ever, so it is simply emptied when full.
  if (cache_.size() >= kMaxCachedPatterns) cache_.clear();
  cache_.emplace(pattern, compiled);
  return compiled;
}

VerifyOutcome FormatVerifier::Verify(const VerifyRequest& request) const {
  const auto regex = request.metadata.find("format_regex");
  if (regex == request.metadata.end() || regex->second.empty()) {
    const auto preset = request.metadata.find("format");
    return CheckPreset(preset == request.metadata.end() ? "" : preset->second, request.response);
  }
  if (regex->second.size() > kMaxPatternBytes) {
    return VerifyOutcome::Error(VerifierErrorKind::kInvalidInput,
                                absl::StrCat("format_regex: longer than ", kMaxPatternBytes,
                                             " bytes (", regex->second.size(), ")"));
  }
  absl::StatusOr<std::shared_ptr<const RE2>> compiled = Compile(regex->second);
  if (!compiled.ok()) {
    return VerifyOutcome::Error(VerifierErrorKind::kInvalidInput,
                                std::string(compiled.status().message()));
  }
  const RE2& re = **compiled;
  const auto full = request.metadata.find("format_full_match");
  bool parsed = false;  // A malformed value was refused at submission (verifier_params).
  const bool whole = full != request.metadata.end() && run::ParseBoolParam(full->second, &parsed);
  const re2::StringPiece text(request.response.data(), request.response.size());
  re2::StringPiece match;
  const bool matched =
      re.Match(text, 0, text.size(), whole ? RE2::ANCHOR_BOTH : RE2::UNANCHORED, &match, 1);
  return Judged(matched, matched ? std::string(match.data(), match.size()) : "",
                matched ? (whole ? "the whole response matches format_regex"
                                 : "format_regex matches")
                        : (whole ? "the response does not match format_regex as a whole"
                                 : "format_regex does not match"));
}

}  // namespace sluice::reward_server
