#ifndef SLUICE_SERVICES_RUNTIME_AUTH_H_
#define SLUICE_SERVICES_RUNTIME_AUTH_H_

// Who may call which RPC: bearer tokens (hashed at rest) and mutual-TLS
// identities mapped to roles, and one table naming the roles each RPC of
// every Sluice service admits.
//
// A caller is a Principal: a role and an identity ("worker" and
// "rollout_worker-0"). It is established once per call, before the handler
// runs, by the interceptor ServiceMain installs (AuthInterceptorFactory), from
//   - a client certificate verified by the server's CA, whose common name is
//     "<role>:<identity>" (mutual TLS), or else
//   - `authorization: Bearer <token>` metadata whose SHA-256 is in the
//     service's tokens file (--auth-tokens).
// Every handler's first line is `SLUICE_RETURN_IF_DENIED(context)`: the call
// goes on only if the caller's role is one its method admits (MethodRoles).
// Health checks and reflection need no credentials (Kubernetes probes).
//
// Without --auth-tokens and without required client certificates nothing is
// enforced (the single-machine default), and every call is anonymous.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/support/server_interceptor.h"
#include "grpcpp/support/status.h"
#include "services/runtime/transport_security.h"

namespace grpc {
class ServerContextBase;
class AuthContext;
}  // namespace grpc

namespace sluice::runtime {

// What a caller is allowed to be. Users are operators (submit, cancel and
// read) or viewers (read only); services call each other as worker, trainer
// or controller.
enum class Role { kOperator, kViewer, kWorker, kTrainer, kController };

absl::string_view RoleName(Role role);
absl::StatusOr<Role> ParseRole(absl::string_view name);

struct Principal {
  Role role = Role::kViewer;
  std::string identity;  // "alice", "rollout_worker-0"; never empty.
  std::string via;       // "token" or "certificate".
};

// The roles admitted by `method` ("/sluice.v1.ControllerService/SubmitRun"),
// or nullopt for a method no policy names (refused: fail closed). Health and
// reflection are public and answered separately (IsPublicMethod).
std::optional<std::vector<Role>> MethodRoles(absl::string_view method);
bool IsPublicMethod(absl::string_view method);
// Every method the policy names, for documentation and tests.
std::vector<std::string> PolicyMethods();

// Lowercase hex SHA-256 of `token`: what a tokens file stores.
std::string TokenHash(absl::string_view token);
// A fresh random token (32 bytes from the kernel, base64url): "slc_..." .
std::string NewToken();

// One entry of a tokens file.
struct TokenEntry {
  std::string sha256;  // 64 lowercase hex digits.
  Role role = Role::kViewer;
  std::string identity;
  std::optional<absl::Time> expires;
};

// Parses a tokens file (YAML):
//
//   tokens:
//     - identity: alice
//       role: operator
//       sha256:
//       9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//       expires: 2027-01-01T00:00:00Z     # optional, RFC 3339
//
// Errors name the entry and field. Duplicate hashes are an error.
absl::StatusOr<std::vector<TokenEntry>> ParseTokensYaml(absl::string_view yaml,
                                                        absl::string_view source);
// One entry as the YAML above writes it (for `sluice token create` and
// `sluice up --tls`).
std::string TokenEntryYaml(const TokenEntry& entry);

// The accepted tokens of one service, read from a file and read again when
// it changes (checked at most once a second), so that tokens can be added or
// revoked (a Kubernetes Secret updated in place) without a restart. A file
// that stops parsing keeps the last good set and logs why.
class TokenStore {
 public:
  static absl::StatusOr<std::unique_ptr<TokenStore>> Load(std::string path);

  // The principal `bearer_token` stands for at `now`: UNAUTHENTICATED saying
  // "unknown token" or "token for <identity> expired at <time>".
  absl::StatusOr<Principal> Authenticate(absl::string_view bearer_token, absl::Time now);

  size_t size();

 private:
  explicit TokenStore(std::string path) : path_(path), watch_(std::move(path), absl::Seconds(1)) {}
  void MaybeReload(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  std::vector<TokenEntry> entries_ ABSL_GUARDED_BY(mu_);
  FileChangeWatch watch_ ABSL_GUARDED_BY(mu_);
};

// "worker:rollout_worker-0" (a client certificate's common name) as a
// principal; INVALID_ARGUMENT when it is not "<role>:<identity>".
absl::StatusOr<Principal> PrincipalFromCommonName(absl::string_view common_name);

// How a service admits callers.
struct AuthPolicy {
  // Accepted bearer tokens; null = tokens are not accepted.
  std::shared_ptr<TokenStore> tokens;
  // Callers presenting a client certificate verified by the CA are
  // identified by it (its common name, "<role>:<identity>").
  bool certificates = false;
  // Every connection carries a verified client certificate (mutual TLS).
  bool certificates_required = false;
  // Whether calls must be authenticated at all: a tokens file, or mutual TLS
  // required. TLS alone (server certificate only) authenticates no caller.
  bool enforced() const { return tokens != nullptr || certificates_required; }
};

// The caller of `method`, or why not: UNAUTHENTICATED (no credentials, an
// unknown or expired token, a certificate that names no role) or
// PERMISSION_DENIED (authenticated, but its role may not call the method).
// `authorization` is the call's "authorization" metadata (empty if absent);
// `auth_context` may be null.
absl::StatusOr<Principal> AuthorizeCall(const AuthPolicy& policy, absl::string_view method,
                                        absl::string_view authorization,
                                        const grpc::AuthContext* auth_context, absl::Time now);

// Installed by ServiceMain when the policy is enforced: decides each call at
// its initial metadata and leaves the decision for the handler.
class AuthInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit AuthInterceptorFactory(AuthPolicy policy);
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  AuthPolicy policy_;
};

// For handlers: OK when the call may go on (or nothing is enforced in this
// process), else the UNAUTHENTICATED / PERMISSION_DENIED status to return.
grpc::Status CheckCaller(const grpc::ServerContextBase* context);
// The authenticated caller of this call; nullopt when nothing is enforced.
std::optional<Principal> Caller(const grpc::ServerContextBase* context);
// A worker speaks only for itself: OK unless the caller is an authenticated
// worker whose identity is not `claimed` (the worker id a request or a group
// names), then PERMISSION_DENIED naming both. What a worker inserts or leases
// is attributed to the identity its credentials prove, never to a name it
// chose. Services and users may name any worker (the controller releasing a
// dead worker's slots).
grpc::Status CheckWorkerIdentity(const grpc::ServerContextBase* context, absl::string_view claimed,
                                 absl::string_view what);
// Who a call can be attributed to, for a record of who did what (the buffer
// stamps it on the groups a call inserts, and rollout verification
// quarantines by it): "<role>:<identity>" for an authenticated caller
// ("worker:worker-0"), else "peer:<the connection's address>"
// ("peer:ipv4:127.0.0.1:53118"). Without authentication a name in a request
// is a claim anyone can make; the connection is all a service knows for
// sure, and it lasts as long as the client's channel.
std::string CallerAttribution(const grpc::ServerContextBase* context);

// Whether this process enforces authentication (set once by ServiceMain).
bool AuthEnforced();
void SetAuthEnforcedForProcess(bool enforced);

#define SLUICE_RETURN_IF_DENIED(context)                                                   \
  do {                                                                                     \
    if (::grpc::Status denied_ = ::sluice::runtime::CheckCaller(context); !denied_.ok()) { \
      return denied_;                                                                      \
    }                                                                                      \
  } while (false)

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_AUTH_H_
