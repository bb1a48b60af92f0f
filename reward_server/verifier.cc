#include "reward_server/verifier.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sluice::reward_server {

absl::string_view VerifierErrorKindName(VerifierErrorKind kind) {
  switch (kind) {
    case VerifierErrorKind::kNone:
      return "none";
    case VerifierErrorKind::kTimeout:
      return "timeout";
    case VerifierErrorKind::kCrash:
      return "crash";
    case VerifierErrorKind::kParse:
      return "parse";
    case VerifierErrorKind::kSandbox:
      return "sandbox";
    case VerifierErrorKind::kUnknownVerifier:
      return "unknown_verifier";
    case VerifierErrorKind::kInvalidInput:
      return "invalid_input";
    case VerifierErrorKind::kResourceExhausted:
      return "resource_exhausted";
    case VerifierErrorKind::kUnavailable:
      return "unavailable";
    case VerifierErrorKind::kInternal:
      return "internal";
  }
  return "internal";
}

bool IsRetryable(VerifierErrorKind kind) {
  return kind == VerifierErrorKind::kUnavailable || kind == VerifierErrorKind::kSandbox ||
         kind == VerifierErrorKind::kInternal;
}

absl::string_view RequestField(const VerifyRequest& request, absl::string_view field) {
  if (field == "response") return request.response;
  if (field == "reference_answer") return request.reference_answer;
  if (field == "prompt") return request.prompt;
  if (field == "test") return request.test;
  if (field == "entry_point") return request.entry_point;
  auto it = request.metadata.find(std::string(field));
  return it == request.metadata.end() ? absl::string_view() : absl::string_view(it->second);
}

VerifyOutcome VerifyOutcome::Error(VerifierErrorKind kind, std::string detail) {
  VerifyOutcome outcome;
  outcome.error_kind = kind;
  outcome.detail = std::move(detail);
  outcome.retryable = IsRetryable(kind);
  return outcome;
}

void TruncateUtf8(std::string* text, size_t max_bytes) {
  if (text->size() <= max_bytes) return;
  constexpr absl::string_view kEllipsis = "...";
  if (max_bytes < kEllipsis.size()) {
    text->clear();
    return;
  }
  size_t cut = max_bytes - kEllipsis.size();
  // Back off continuation bytes (10xxxxxx) so that no character is split.
  while (cut > 0 && (static_cast<unsigned char>((*text)[cut]) & 0xC0) == 0x80) --cut;
  text->resize(cut);
  text->append(kEllipsis.data(), kEllipsis.size());
}

absl::Status VerifierRegistry::Register(std::shared_ptr<const Verifier> verifier) {
  if (verifier == nullptr) return absl::InvalidArgumentError("verifier must not be null");
  if (verifier->name().empty())
    return absl::InvalidArgumentError("verifier name must not be empty");
  const std::string name = verifier->name();
  if (!verifiers_.emplace(name, std::move(verifier)).second) {
    return absl::AlreadyExistsError(absl::StrCat("verifier \"", name, "\" is already registered"));
  }
  return absl::OkStatus();
}

std::shared_ptr<const Verifier> VerifierRegistry::Find(absl::string_view name) const {
  auto it = verifiers_.find(name);
  return it == verifiers_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const Verifier>> VerifierRegistry::List() const {
  std::vector<std::shared_ptr<const Verifier>> all;
  all.reserve(verifiers_.size());
  for (const auto& [name, verifier] : verifiers_) all.push_back(verifier);
  return all;
}

VerifyOutcome VerifierRegistry::Verify(absl::string_view name, const VerifyRequest& request) const {
  std::shared_ptr<const Verifier> verifier = Find(name);
  if (verifier == nullptr) return UnknownVerifierOutcome(name);
  if (std::optional<VerifyOutcome> invalid = CheckRequiredFields(*verifier, request)) {
    return *std::move(invalid);
  }
  VerifyOutcome outcome = verifier->Verify(request);
  outcome.verifier_name = verifier->name();
  return outcome;
}

VerifyOutcome UnknownVerifierOutcome(absl::string_view name) {
  std::string shown(name);
  TruncateUtf8(&shown, 128);
  VerifyOutcome outcome = VerifyOutcome::Error(
      VerifierErrorKind::kUnknownVerifier,
      absl::StrCat("no verifier named \"", shown, "\" on this server (see ListVerifiers)"));
  outcome.verifier_name = std::move(shown);
  return outcome;
}

std::optional<VerifyOutcome> CheckRequiredFields(const Verifier& verifier,
                                                 const VerifyRequest& request) {
  std::vector<absl::string_view> missing;
  for (const std::string& field : verifier.required_fields()) {
    if (RequestField(request, field).empty()) missing.push_back(field);
  }
  if (missing.empty()) return std::nullopt;
  VerifyOutcome outcome =
      VerifyOutcome::Error(VerifierErrorKind::kInvalidInput,
                           absl::StrCat(verifier.name(), " needs ", absl::StrJoin(missing, ", ")));
  outcome.verifier_name = verifier.name();
  return outcome;
}

absl::Status ValidateVerifierTimeouts(absl::Duration default_timeout,
                                      absl::Duration max_timeout) {
  if (default_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("default_timeout must be > 0, got ", absl::FormatDuration(default_timeout)));
  }
  if (max_timeout < default_timeout) {
    return absl::InvalidArgumentError(absl::StrCat("max_timeout must be >= default_timeout (",
                                                   absl::FormatDuration(default_timeout), "), got ",
                                                   absl::FormatDuration(max_timeout)));
  }
  return absl::OkStatus();
}

}  // namespace sluice::reward_server
