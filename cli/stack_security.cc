#include "cli/stack_security.h"

#include <filesystem>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/runtime/auth.h"
#include "services/runtime/local_pki.h"

namespace sluice::cli {

namespace fs = std::filesystem;

absl::StatusOr<StackSecurity> WriteStackSecurity(const std::string& dir,
                                                 const std::vector<ServiceEndpoint>& services) {
  StackSecurity security;
  security.dir = dir;
  std::vector<runtime::PkiEntity> entities;
  for (const ServiceEndpoint& service : services) {
    runtime::PkiEntity entity;
    entity.file_stem = service.name;
    // Least privilege: the reward server and the replay buffer call no one,
    // so their certificates name a role that may only read.
    if (service.kind == "rollout_worker") {
      entity.common_name = absl::StrCat("worker:", service.worker_id);
    } else if (service.kind == "trainer" || service.kind == "controller") {
      entity.common_name = absl::StrCat(service.kind, ":", service.kind);
    } else {
      entity.common_name = absl::StrCat("viewer:", service.name);
    }
    entities.push_back(std::move(entity));
  }
  ASSIGN_OR_RETURN(runtime::PkiFiles pki, runtime::WriteLocalPki(security.dir, entities));
  security.ca_cert = pki.ca_cert;
  security.tokens_file = (fs::path(security.dir) / "tokens.yaml").string();
  security.operator_token_file = (fs::path(security.dir) / "operator.token").string();
  security.viewer_token_file = (fs::path(security.dir) / "viewer.token").string();
  std::string yaml =
      "# Bearer tokens of `sluice up --tls` (SHA-256 only; the tokens are in\n"
      "# operator.token and viewer.token). New ones on every start.\ntokens:\n";
  const std::tuple<runtime::Role, const char*, std::string> users[] = {
      {runtime::Role::kOperator, "operator", security.operator_token_file},
      {runtime::Role::kViewer, "viewer", security.viewer_token_file}};
  for (const auto& [role, identity, file] : users) {
    const std::string token = runtime::NewToken();
    absl::StrAppend(
        &yaml, runtime::TokenEntryYaml({runtime::TokenHash(token), role, identity, std::nullopt}));
    RETURN_IF_ERROR(runtime::WriteSecretFile(file, token + "\n"));
  }
  RETURN_IF_ERROR(runtime::WriteSecretFile(security.tokens_file, yaml));
  return security;
}

}  // namespace sluice::cli
