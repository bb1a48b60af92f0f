#include "services/runtime/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/random.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/server_context.h"
#include "yaml-cpp/yaml.h"

namespace sluice::runtime {
namespace {

using grpc::experimental::InterceptionHookPoints;

constexpr Role kAllRoles[] = {Role::kOperator, Role::kViewer, Role::kWorker, Role::kTrainer,
                              Role::kController};

struct MethodRule {
  const char* method;  // Without the leading "/sluice.v1.".
  std::vector<Role> roles;
};

// Who calls what. Readers of state (Get*, List*, Watch*) admit every role;
// each call that changes state admits the one role whose service makes it.
const std::vector<MethodRule>& Rules() {
  using R = Role;
  const std::vector<Role> all(std::begin(kAllRoles), std::end(kAllRoles));
  static const auto* rules = new std::vector<MethodRule>{
      // Users: submit and cancel as operator, read as viewer too.
      {"ControllerService/SubmitRun", {R::kOperator}},
      {"ControllerService/CancelRun", {R::kOperator}},
      {"ControllerService/GetRun", {R::kOperator, R::kViewer}},
      {"ControllerService/WatchRun", {R::kOperator, R::kViewer}},
      {"ControllerService/ListRuns", {R::kOperator, R::kViewer}},
      {"ControllerService/ListWorkers", {R::kOperator, R::kViewer}},
      // `sluice up` (the operator's supervisor) reports a service it gave up
      // on.
      {"ControllerService/ReportServiceFailure", {R::kOperator}},
      {"ControllerService/LeasePrompts", {R::kWorker}},
      {"ControllerService/ReportRolloutProgress", {R::kWorker}},
      {"ControllerService/WorkerHeartbeat", {R::kWorker}},
      {"ControllerService/ReportTrainerProgress", {R::kTrainer}},

      {"ReplayBufferService/ConfigureRun", {R::kController}},
      {"ReplayBufferService/AcquireGenerationSlots", {R::kWorker}},
      // The controller hands back the slots of a worker it declared dead.
      {"ReplayBufferService/ReleaseGenerationSlots", {R::kWorker, R::kController}},
      {"ReplayBufferService/InsertGroups", {R::kWorker}},
      {"ReplayBufferService/Sample", {R::kTrainer}},
      {"ReplayBufferService/UpdatePolicyVersion", {R::kTrainer}},
      {"ReplayBufferService/UpdatePriorities", {R::kTrainer}},
      {"ReplayBufferService/CommitTrainedSteps", {R::kTrainer}},
      {"ReplayBufferService/GetStats", all},

      // Workers score rollouts, the trainer its evaluations, users `sluice
      // score`.
      {"RewardService/ScoreBatch", {R::kWorker, R::kTrainer, R::kOperator}},
      {"RewardService/ListVerifiers", all},

      {"RolloutWorkerService/StartRollouts", {R::kController, R::kOperator}},
      {"RolloutWorkerService/StopRollouts", {R::kController, R::kOperator}},
      {"RolloutWorkerService/GetWorkerStatus", all},

      {"TrainerService/StartTraining", {R::kController}},
      {"TrainerService/StopTraining", {R::kController}},
      {"TrainerService/GetTrainerStatus", all},
      // Weights go to workers (and the controller's checks); not to users.
      {"TrainerService/GetLatestVersion", {R::kWorker, R::kController, R::kTrainer}},
      {"TrainerService/WatchVersions", {R::kWorker, R::kController, R::kTrainer}},
      {"TrainerService/StreamWeights", {R::kWorker, R::kController, R::kTrainer}},
      {"TrainerService/GetWeightSource", {R::kWorker, R::kController, R::kTrainer}},
      {"WeightRelay/StreamWeights", {R::kWorker}},
  };
  return *rules;
}

const absl::flat_hash_map<std::string, std::vector<Role>>& RuleMap() {
  static const auto* map = [] {
    auto* m = new absl::flat_hash_map<std::string, std::vector<Role>>();
    for (const MethodRule& rule : Rules())
      (*m)[absl::StrCat("/sluice.v1.", rule.method)] = rule.roles;
    return m;
  }();
  return *map;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string RoleList(const std::vector<Role>& roles) {
  std::vector<std::string> names;
  for (Role role : roles) names.emplace_back(RoleName(role));
  return absl::StrJoin(names, ", ");
}

// The decision for each call in flight, keyed by its ServerContext.
class Decisions {
 public:
  static Decisions& Get() {
    static auto* decisions = new Decisions();
    return *decisions;
  }
  void Put(const void* call, absl::StatusOr<Principal> decision) {
    absl::MutexLock lock(&mu_);
    map_.insert_or_assign(call, std::move(decision));
  }
  void Erase(const void* call) {
    absl::MutexLock lock(&mu_);
    map_.erase(call);
  }
  std::optional<absl::StatusOr<Principal>> Find(const void* call) {
    absl::MutexLock lock(&mu_);
    auto it = map_.find(call);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<const void*, absl::StatusOr<Principal>> map_ ABSL_GUARDED_BY(mu_);
};

std::atomic<bool> enforced_for_process{false};

class AuthInterceptor : public grpc::experimental::Interceptor {
 public:
  AuthInterceptor(const AuthPolicy* policy, grpc::experimental::ServerRpcInfo* info)
      : policy_(policy),
        method_(info->method() != nullptr ? info->method() : ""),
        context_(info->server_context()) {}
  ~AuthInterceptor() override {
    if (decided_) Decisions::Get().Erase(context_);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA) &&
        !IsPublicMethod(method_)) {
      std::string authorization;
      if (auto* metadata = methods->GetRecvInitialMetadata(); metadata != nullptr) {
        auto it = metadata->find("authorization");
        if (it != metadata->end()) authorization.assign(it->second.data(), it->second.size());
      }
      const std::shared_ptr<const grpc::AuthContext> auth =
          context_ != nullptr ? context_->auth_context() : nullptr;
      absl::StatusOr<Principal> decision =
          AuthorizeCall(*policy_, method_, authorization, auth.get(), absl::Now());
      if (!decision.ok()) {
        log::Warning("refused a call", {{"method", method_},
                                        {"peer", context_ != nullptr ? context_->peer() : ""},
                                        {"error", std::string(decision.status().message())}});
      }
      Decisions::Get().Put(context_, std::move(decision));
      decided_ = true;
    }
    methods->Proceed();
  }

 private:
  const AuthPolicy* policy_;
  std::string method_;
  grpc::ServerContextBase* context_;
  bool decided_ = false;
};

absl::StatusOr<absl::Time> ParseTime(const std::string& text) {
  absl::Time time;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, text, &time, &error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not an RFC 3339 time (2027-01-01T00:00:00Z): ", error));
  }
  return time;
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kOperator:
      return "operator";
    case Role::kViewer:
      return "viewer";
    case Role::kWorker:
      return "worker";
    case Role::kTrainer:
      return "trainer";
    case Role::kController:
      return "controller";
  }
  return "unknown";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role role : kAllRoles) {
    if (RoleName(role) == name) return role;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown role '", name, "'; one of operator, viewer, worker, trainer, controller"));
}

std::optional<std::vector<Role>> MethodRoles(absl::string_view method) {
  auto it = RuleMap().find(method);
  if (it == RuleMap().end()) return std::nullopt;
  return it->second;
}

bool IsPublicMethod(absl::string_view method) {
  return absl::StartsWith(method, "/grpc.health.v1.Health/") ||
         absl::StartsWith(method, "/grpc.reflection.v1alpha.ServerReflection/") ||
         absl::StartsWith(method, "/grpc.reflection.v1.ServerReflection/");
}

std::vector<std::string> PolicyMethods() {
  std::vector<std::string> methods;
  for (const MethodRule& rule : Rules())
    methods.push_back(absl::StrCat("/sluice.v1.", rule.method));
  return methods;
}

std::string TokenHash(absl::string_view token) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(token.data(), token.size(), digest, &length, EVP_sha256(), nullptr);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), length));
}

std::string NewToken() {
  char bytes[32];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n > 0) filled += static_cast<size_t>(n);
  }
  std::string encoded;
  absl::WebSafeBase64Escape(absl::string_view(bytes, sizeof(bytes)), &encoded);
  return absl::StrCat("slc_", encoded);
}

absl::StatusOr<std::vector<TokenEntry>> ParseTokensYaml(absl::string_view yaml,
                                                        absl::string_view source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not YAML: ", e.what()));
  }
  if (!root.IsMap() || !root["tokens"] || !root["tokens"].IsSequence()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     ": expected a map with a 'tokens' list (identity, "
                     "role, sha256[, expires])"));
  }
  std::vector<TokenEntry> entries;
  std::vector<std::string> problems;
  int index = 0;
  for (const YAML::Node& node : root["tokens"]) {
    const std::string where = absl::StrCat(source, ": tokens[", index++, "]");
    if (!node.IsMap()) {
      problems.push_back(absl::StrCat(where, " must be a map"));
      continue;
    }
    for (const auto& field : node) {
      const std::string key = field.first.as<std::string>("");
      if (key != "identity" && key != "role" && key != "sha256" && key != "expires") {
        problems.push_back(
            absl::StrCat(where, ": unknown field '", key, "' (identity, role, sha256, expires)"));
      }
    }
    TokenEntry entry;
    try {
      entry.identity = node["identity"] ? node["identity"].as<std::string>() : "";
      const std::string role = node["role"] ? node["role"].as<std::string>() : "";
      entry.sha256 = absl::AsciiStrToLower(node["sha256"] ? node["sha256"].as<std::string>() : "");
      if (entry.identity.empty() || entry.identity.find(':') != std::string::npos) {
        problems.push_back(absl::StrCat(where, ": identity must be non-empty without ':'"));
      }
      if (absl::StatusOr<Role> parsed = ParseRole(role); parsed.ok()) {
        entry.role = *parsed;
      } else {
        problems.push_back(absl::StrCat(where, ": ", parsed.status().message()));
      }
      if (entry.sha256.size() != 64 ||
          entry.sha256.find_first_not_of("0123456789abcdef") != std::string::npos) {
        problems.push_back(absl::StrCat(where,
                                        ": sha256 must be 64 hex digits (the "
                                        "token's SHA-256, never the token; "
                                        "`sluice token create` writes it)"));
      }
      if (node["expires"]) {
        absl::StatusOr<absl::Time> expires = ParseTime(node["expires"].as<std::string>());
        if (expires.ok()) {
          entry.expires = *expires;
        } else {
          problems.push_back(absl::StrCat(where, ": expires: ", expires.status().message()));
        }
      }
    } catch (const YAML::Exception& e) {
      problems.push_back(absl::StrCat(where, ": fields must be strings: ", e.what()));
      continue;
    }
    for (const TokenEntry& earlier : entries) {
      if (earlier.sha256 == entry.sha256) {
        problems.push_back(
            absl::StrCat(where, ": the same token as identity '", earlier.identity, "'"));
      }
    }
    entries.push_back(std::move(entry));
  }
  if (!problems.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
  return entries;
}

std::string TokenEntryYaml(const TokenEntry& entry) {
  std::string yaml =
      absl::StrCat("  - identity: ", entry.identity, "\n    role: ", RoleName(entry.role),
                   "\n    sha256: ", entry.sha256, "\n");
  if (entry.expires.has_value()) {
    absl::StrAppend(&yaml, "    expires: ",
                    absl::FormatTime(absl::RFC3339_sec, *entry.expires, absl::UTCTimeZone()), "\n");
  }
  return yaml;
}

absl::StatusOr<std::unique_ptr<TokenStore>> TokenStore::Load(std::string path) {
  std::unique_ptr<TokenStore> store(new TokenStore(std::move(path)));
  absl::MutexLock lock(&store->mu_);
  store->watch_.Changed(absl::Now());  // The stamp of what is read now.
  absl::StatusOr<std::string> text = ReadSecretFile(store->path_, "auth_tokens");
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<TokenEntry>> entries = ParseTokensYaml(*text, store->path_);
  if (!entries.ok()) return entries.status();
  store->entries_ = std::move(*entries);
  return store;
}

void TokenStore::MaybeReload(absl::Time now) {
  // A file missing mid-rotation is no change: the last set is kept.
  if (!watch_.Changed(now)) return;
  absl::StatusOr<std::string> text = ReadSecretFile(path_, "auth_tokens");
  absl::StatusOr<std::vector<TokenEntry>> entries =
      text.ok() ? ParseTokensYaml(*text, path_) : text.status();
  if (!entries.ok()) {
    log::Error("tokens file changed but does not parse; keeping the previous tokens",
               {{"path", path_}, {"error", std::string(entries.status().message())}});
    return;
  }
  log::Info("tokens reloaded", {{"path", path_}, {"tokens", entries->size()}});
  entries_ = std::move(*entries);
}

absl::StatusOr<Principal> TokenStore::Authenticate(absl::string_view bearer_token, absl::Time now) {
  const std::string hash = TokenHash(bearer_token);
  absl::MutexLock lock(&mu_);
  MaybeReload(now);
  for (const TokenEntry& entry : entries_) {
    if (!ConstantTimeEquals(entry.sha256, hash)) continue;
    if (entry.expires.has_value() && now >= *entry.expires) {
      return absl::UnauthenticatedError(
          absl::StrCat("the bearer token of '", entry.identity, "' expired at ",
                       absl::FormatTime(absl::RFC3339_sec, *entry.expires, absl::UTCTimeZone()),
                       "; ask for a new one"));
    }
    return Principal{entry.role, entry.identity, "token"};
  }
  return absl::UnauthenticatedError(
      "unknown bearer token: it is not in this service's tokens file (revoked, "
      "or meant for "
      "another cluster)");
}

size_t TokenStore::size() {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

absl::StatusOr<Principal> PrincipalFromCommonName(absl::string_view common_name) {
  const size_t colon = common_name.find(':');
  if (colon == absl::string_view::npos || colon + 1 == common_name.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the client certificate's common name '", common_name,
                     "' is not <role>:<identity> (e.g. worker:rollout_worker-0)"));
  }
  absl::StatusOr<Role> role = ParseRole(common_name.substr(0, colon));
  if (!role.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the client certificate's common name '",
                                                   common_name, "': ", role.status().message()));
  }
  return Principal{*role, std::string(common_name.substr(colon + 1)), "certificate"};
}

absl::StatusOr<Principal> AuthorizeCall(const AuthPolicy& policy, absl::string_view method,
                                        absl::string_view authorization,
                                        const grpc::AuthContext* auth_context, absl::Time now) {
  std::optional<absl::StatusOr<Principal>> authenticated;
  if (policy.certificates && auth_context != nullptr && auth_context->IsPeerAuthenticated()) {
    const std::vector<grpc::string_ref> names =
        auth_context->FindPropertyValues("x509_common_name");
    if (!names.empty()) {
      authenticated = PrincipalFromCommonName(absl::string_view(names[0].data(), names[0].size()));
      if (!authenticated->ok()) {
        authenticated = absl::UnauthenticatedError(authenticated->status().message());
      }
    }
  }
  if (!authenticated.has_value() && !authorization.empty()) {
    constexpr absl::string_view kBearer = "Bearer ";
    if (!absl::StartsWith(authorization, kBearer) || authorization.size() == kBearer.size()) {
      authenticated =
          absl::UnauthenticatedError("the authorization metadata must be 'Bearer <token>'");
    } else if (policy.tokens == nullptr) {
      authenticated = absl::UnauthenticatedError(
          "this service accepts client certificates, not bearer tokens (it has "
          "no "
          "--auth-tokens)");
    } else {
      authenticated = policy.tokens->Authenticate(authorization.substr(kBearer.size()), now);
    }
  }
  if (!authenticated.has_value()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "missing credentials: ", method, " needs ",
        policy.tokens != nullptr ? "a bearer token (--token-file, or SLUICE_TOKEN_FILE)"
                                 : "a client certificate (--tls-cert/--tls-key)",
        policy.tokens != nullptr && policy.certificates ? " or a client certificate" : ""));
  }
  if (!authenticated->ok()) return authenticated->status();
  const std::optional<std::vector<Role>> roles = MethodRoles(method);
  if (!roles.has_value()) {
    return absl::PermissionDeniedError(
        absl::StrCat(method, " is not in the authorization policy; refused"));
  }
  const Principal& caller = **authenticated;
  if (std::find(roles->begin(), roles->end(), caller.role) == roles->end()) {
    return absl::PermissionDeniedError(absl::StrCat("'", caller.identity, "' (role ",
                                                    RoleName(caller.role), ") may not call ",
                                                    method, "; it needs role ", RoleList(*roles)));
  }
  return caller;
}

AuthInterceptorFactory::AuthInterceptorFactory(AuthPolicy policy) : policy_(std::move(policy)) {}

grpc::experimental::Interceptor* AuthInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new AuthInterceptor(&policy_, info);
}

grpc::Status CheckCaller(const grpc::ServerContextBase* context) {
  if (!AuthEnforced()) return grpc::Status::OK;
  std::optional<absl::StatusOr<Principal>> decision = Decisions::Get().Find(context);
  if (!decision.has_value()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "no authorization decision for this call; refused");
  }
  if (decision->ok()) return grpc::Status::OK;
  const absl::Status& status = decision->status();
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

std::optional<Principal> Caller(const grpc::ServerContextBase* context) {
  if (!AuthEnforced()) return std::nullopt;
  std::optional<absl::StatusOr<Principal>> decision = Decisions::Get().Find(context);
  if (!decision.has_value() || !decision->ok()) return std::nullopt;
  return **decision;
}

grpc::Status CheckWorkerIdentity(const grpc::ServerContextBase* context, absl::string_view claimed,
                                 absl::string_view what) {
  const std::optional<Principal> caller = Caller(context);
  if (!caller.has_value() || caller->role != Role::kWorker || caller->identity == claimed) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      absl::StrCat(what, " names worker '", claimed, "' but the caller is worker '",
                                   caller->identity,
                                   "': a worker's --worker-id must be the identity of its "
                                   "credentials"));
}

std::string CallerAttribution(const grpc::ServerContextBase* context) {
  if (const std::optional<Principal> caller = Caller(context); caller.has_value()) {
    return absl::StrCat(RoleName(caller->role), ":", caller->identity);
  }
  return absl::StrCat("peer:", context->peer());
}

bool AuthEnforced() { return enforced_for_process.load(std::memory_order_relaxed); }
void SetAuthEnforcedForProcess(bool enforced) { enforced_for_process.store(enforced); }

}  // namespace sluice::runtime
