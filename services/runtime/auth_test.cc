#include "services/runtime/auth.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "services/runtime/health_client.h"
#include "services/runtime/local_pki.h"
#include "services/runtime/transport_security.h"
#include "sluice/v1/controller.grpc.pb.h"
#include "sluice/v1/replay_buffer.pb.h"
#include "sluice/v1/reward_server.pb.h"
#include "sluice/v1/rollout_worker.pb.h"
#include "sluice/v1/trainer.pb.h"

namespace sluice::runtime {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/auth-", getpid(), "-", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string TokensYaml(const std::string& token, const std::string& role,
                       const std::string& identity, const std::string& extra = "") {
  return absl::StrCat("tokens:\n  - identity: ", identity, "\n    role: ", role,
                      "\n    sha256: ", TokenHash(token), "\n", extra);
}

TEST(TokenHashTest, IsTheSha256OfTheToken) {
  EXPECT_EQ(TokenHash("test"), "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
  const std::string a = NewToken();
  EXPECT_THAT(a, ::testing::StartsWith("slc_"));
  EXPECT_GE(a.size(), 40u);
  EXPECT_NE(a, NewToken());
}

TEST(TokensYamlTest, ParsesEntriesAndNamesEveryProblem) {
  absl::StatusOr<std::vector<TokenEntry>> good = ParseTokensYaml(
      TokensYaml("t1", "operator", "alice", "    expires: 2030-01-01T00:00:00Z\n"), "f");
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_EQ(good->size(), 1u);
  EXPECT_EQ((*good)[0].identity, "alice");
  EXPECT_EQ((*good)[0].role, Role::kOperator);
  ASSERT_TRUE((*good)[0].expires.has_value());

  absl::StatusOr<std::vector<TokenEntry>> bad = ParseTokensYaml(
      "tokens:\n  - {identity: a, role: admin, sha256: abc}\n"
      "  - {identity: 'w:1', role: worker, sha256: " +
          TokenHash("x") +
          ", color: red}\n"
          "  - {identity: b, role: viewer, sha256: " +
          TokenHash("x") + ", expires: soon}\n",
      "tokens.yaml");
  ASSERT_FALSE(bad.ok());
  const std::string message(bad.status().message());
  EXPECT_THAT(message, HasSubstr("tokens.yaml: tokens[0]: unknown role 'admin'"));
  EXPECT_THAT(message, HasSubstr("tokens[0]: sha256 must be 64 hex digits"));
  EXPECT_THAT(message, HasSubstr("tokens[1]: unknown field 'color'"));
  EXPECT_THAT(message, HasSubstr("tokens[1]: identity must be non-empty without ':'"));
  EXPECT_THAT(message, HasSubstr("tokens[2]: expires: 'soon' is not an RFC 3339 time"));
  EXPECT_THAT(message, HasSubstr("tokens[2]: the same token as identity 'w:1'"));
  EXPECT_FALSE(ParseTokensYaml("[1, 2]", "f").ok());
  EXPECT_FALSE(ParseTokensYaml("tokens: {", "f").ok());
}

TEST(TokenEntryYamlTest, RoundTrips) {
  TokenEntry entry{TokenHash("t"), Role::kWorker, "worker-3", absl::FromUnixSeconds(2000000000)};
  absl::StatusOr<std::vector<TokenEntry>> parsed =
      ParseTokensYaml(absl::StrCat("tokens:\n", TokenEntryYaml(entry)), "f");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ((*parsed)[0].sha256, entry.sha256);
  EXPECT_EQ((*parsed)[0].role, Role::kWorker);
  EXPECT_EQ((*parsed)[0].identity, "worker-3");
  EXPECT_EQ((*parsed)[0].expires, entry.expires);
}

TEST(TokenStoreTest, AuthenticatesExpiresAndReloadsWhenTheFileChanges) {
  const std::string path = TempDir("store") + "/tokens.yaml";
  std::ofstream(path) << TokensYaml(
      "alpha", "operator", "alice",
      "  - identity: bob\n    role: viewer\n    sha256: " + TokenHash("beta") +
          "\n    expires: 2020-01-01T00:00:00Z\n");
  absl::StatusOr<std::unique_ptr<TokenStore>> store = TokenStore::Load(path);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<Principal> alice = (*store)->Authenticate("alpha", absl::Now());
  ASSERT_TRUE(alice.ok());
  EXPECT_EQ(alice->identity, "alice");
  EXPECT_EQ(alice->role, Role::kOperator);
  absl::StatusOr<Principal> bob = (*store)->Authenticate("beta", absl::Now());
  EXPECT_EQ(bob.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(bob.status().message(), HasSubstr("'bob' expired at 2020-01-01T00:00:00"));
  absl::StatusOr<Principal> nobody = (*store)->Authenticate("gamma", absl::Now());
  EXPECT_EQ(nobody.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(nobody.status().message(), HasSubstr("unknown bearer token"));

  // Rotated in place: alpha revoked, gamma added; picked up within a second.
  std::ofstream(path, std::ios::trunc) << TokensYaml("gamma", "viewer", "carol");
  const absl::Time later = absl::Now() + absl::Seconds(2);
  EXPECT_FALSE((*store)->Authenticate("alpha", later).ok());
  ASSERT_TRUE((*store)->Authenticate("gamma", later).ok());
  // A file that stops parsing keeps the last good set.
  std::ofstream(path, std::ios::trunc) << "tokens: [ {";
  EXPECT_TRUE((*store)->Authenticate("gamma", later + absl::Seconds(2)).ok());

  EXPECT_FALSE(TokenStore::Load(path + ".missing").ok());
}

TEST(AuthorizeCallTest, NamesWhatIsMissingOrWhichRoleIsNeeded) {
  const std::string path = TempDir("authorize") + "/tokens.yaml";
  std::ofstream(path) << TokensYaml("op", "operator", "alice") +
                             "  - identity: worker-0\n    role: worker\n    sha256: " +
                             TokenHash("w0") + "\n";
  AuthPolicy policy;
  policy.tokens = std::move(*TokenStore::Load(path));
  const std::string submit = "/sluice.v1.ControllerService/SubmitRun";
  const absl::Time now = absl::Now();

  absl::StatusOr<Principal> none = AuthorizeCall(policy, submit, "", nullptr, now);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(none.status().message(), HasSubstr("missing credentials"));
  EXPECT_EQ(AuthorizeCall(policy, submit, "Basic abc", nullptr, now).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(AuthorizeCall(policy, submit, "Bearer ", nullptr, now).status().code(),
            absl::StatusCode::kUnauthenticated);

  absl::StatusOr<Principal> op = AuthorizeCall(policy, submit, "Bearer op", nullptr, now);
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->identity, "alice");

  absl::StatusOr<Principal> worker = AuthorizeCall(policy, submit, "Bearer w0", nullptr, now);
  EXPECT_EQ(worker.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(worker.status().message(),
              HasSubstr("'worker-0' (role worker) may not call "
                        "/sluice.v1.ControllerService/SubmitRun; it needs role operator"));
  EXPECT_TRUE(AuthorizeCall(policy, "/sluice.v1.ReplayBufferService/InsertGroups", "Bearer w0",
                            nullptr, now)
                  .ok());
  // A method no policy names is refused even to an operator (fail closed).
  EXPECT_EQ(
      AuthorizeCall(policy, "/sluice.v1.ControllerService/DropTables", "Bearer op", nullptr, now)
          .status()
          .code(),
      absl::StatusCode::kPermissionDenied);
}

TEST(PrincipalFromCommonNameTest, IsRoleColonIdentity) {
  absl::StatusOr<Principal> worker = PrincipalFromCommonName("worker:rollout_worker-0");
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(worker->role, Role::kWorker);
  EXPECT_EQ(worker->identity, "rollout_worker-0");
  EXPECT_EQ(worker->via, "certificate");
  EXPECT_FALSE(PrincipalFromCommonName("rollout_worker-0").ok());
  EXPECT_FALSE(PrincipalFromCommonName("worker:").ok());
  EXPECT_THAT(PrincipalFromCommonName("root:x").status().message(), HasSubstr("unknown role"));
}

// Every RPC of every Sluice service has a rule, and every rule an RPC: a new
// RPC cannot ship open, and a renamed one cannot leave a stale rule behind.
TEST(AuthPolicyTest, NamesExactlyTheRpcsOfEveryService) {
  (void)v1::SubmitRunRequest::descriptor();
  (void)v1::GetStatsRequest::descriptor();
  (void)v1::ScoreBatchRequest::descriptor();
  (void)v1::StartRolloutsRequest::descriptor();
  (void)v1::StartTrainingRequest::descriptor();
  std::set<std::string> rpcs;
  for (const char* file : {"sluice/v1/controller.proto", "sluice/v1/replay_buffer.proto",
                           "sluice/v1/reward_server.proto", "sluice/v1/rollout_worker.proto",
                           "sluice/v1/trainer.proto"}) {
    const google::protobuf::FileDescriptor* descriptor =
        google::protobuf::DescriptorPool::generated_pool()->FindFileByName(file);
    ASSERT_NE(descriptor, nullptr) << file;
    for (int s = 0; s < descriptor->service_count(); ++s) {
      const google::protobuf::ServiceDescriptor* service = descriptor->service(s);
      for (int m = 0; m < service->method_count(); ++m) {
        rpcs.insert(absl::StrCat("/", service->full_name(), "/", service->method(m)->name()));
      }
    }
  }
  const std::vector<std::string> policy = PolicyMethods();
  EXPECT_EQ(std::set<std::string>(policy.begin(), policy.end()), rpcs);
  EXPECT_EQ(rpcs.size(), 33u);
  EXPECT_TRUE(IsPublicMethod("/grpc.health.v1.Health/Check"));
  EXPECT_TRUE(IsPublicMethod("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"));
  EXPECT_FALSE(IsPublicMethod("/sluice.v1.ControllerService/ListRuns"));
}

TEST(TransportSecurityTest, ValidatesCertificatesKeysAndCas) {
  const std::string dir = TempDir("pki");
  absl::StatusOr<PkiFiles> pki =
      WriteLocalPki(dir, {{"a", "controller:controller"}, {"b", "worker:w"}});
  ASSERT_TRUE(pki.ok()) << pki.status();
  EXPECT_EQ(std::filesystem::status(dir + "/a.key").permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);

  ServerTls good{dir + "/a.pem", dir + "/a.key", pki->ca_cert, true};
  EXPECT_TRUE(good.Validate().ok()) << good.Validate();
  ServerTls mismatched{dir + "/a.pem", dir + "/b.key", pki->ca_cert, false};
  EXPECT_THAT(mismatched.Validate().message(), HasSubstr("is not the key of tls_cert"));
  ServerTls missing{dir + "/nope.pem", dir + "/a.key", "", false};
  EXPECT_THAT(missing.Validate().message(), HasSubstr("tls_cert: cannot read"));
  ServerTls half{dir + "/a.pem", "", "", false};
  EXPECT_THAT(half.Validate().message(), HasSubstr("give both or neither"));
  ServerTls mtls_without_ca{dir + "/a.pem", dir + "/a.key", "", true};
  EXPECT_THAT(mtls_without_ca.Validate().message(), HasSubstr("needs tls_ca"));
  ServerTls key_as_ca{dir + "/a.pem", dir + "/a.key", dir + "/a.key", false};
  EXPECT_THAT(key_as_ca.Validate().message(), HasSubstr("holds no PEM certificate"));

  ClientSecurity client;
  client.cert_file = dir + "/b.pem";
  client.key_file = dir + "/b.key";
  EXPECT_THAT(client.Validate().message(), HasSubstr("needs tls_ca"));
  client.ca_file = pki->ca_cert;
  EXPECT_TRUE(client.Validate().ok());
  client.token_file = dir + "/empty.token";
  std::ofstream(client.token_file) << "\n";
  EXPECT_THAT(client.Validate().message(), HasSubstr("is empty"));

  // A second call keeps the CA (so certificates already issued stay valid).
  const std::string ca_before = *ReadSecretFile(pki->ca_cert, "ca");
  ASSERT_TRUE(WriteLocalPki(dir, {{"c", "trainer:trainer"}}).ok());
  EXPECT_EQ(*ReadSecretFile(pki->ca_cert, "ca"), ca_before);
}

// Kubernetes rotates a mounted Secret in place: a server started with one
// CA's certificate serves the next CA's within the reload interval, without
// a restart, and clients trusting only the old CA are refused from then on.
TEST(TransportSecurityTest, AServerPicksUpRotatedCertificatesWithoutARestart) {
  const std::string first = TempDir("rotate-first");
  const std::string second = TempDir("rotate-second");
  const std::string live = TempDir("rotate-live");
  ASSERT_TRUE(WriteLocalPki(first, {{"server", "viewer:server"}}, absl::Hours(1), "First CA").ok());
  ASSERT_TRUE(
      WriteLocalPki(second, {{"server", "viewer:server"}}, absl::Hours(1), "Second CA").ok());
  const auto install = [&](const std::string& from) {
    for (const char* name : {"server.key", "server.pem", "ca.pem"}) {
      std::filesystem::copy_file(from + "/" + name, live + "/" + name + ".new",
                                 std::filesystem::copy_options::overwrite_existing);
      std::filesystem::rename(live + "/" + name + ".new", live + "/" + name);
    }
  };
  install(first);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  v1::ControllerService::Service unimplemented;  // A sync service, so the server starts.
  builder.RegisterService(&unimplemented);
  int port = 0;
  builder.AddListeningPort(
      "127.0.0.1:0",
      MakeServerCredentials({live + "/server.pem", live + "/server.key", live + "/ca.pem", false}),
      &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string target = absl::StrCat("127.0.0.1:", port);
  const auto healthy_trusting = [&](const std::string& ca) {
    ClientSecurity client;
    client.ca_file = ca;
    SetProcessClientSecurity(client);
    return CheckHealth(target, "", absl::Seconds(3)).ok();
  };
  EXPECT_TRUE(healthy_trusting(first + "/ca.pem"));
  EXPECT_FALSE(healthy_trusting(second + "/ca.pem"));

  install(second);
  const absl::Time deadline = absl::Now() + kTlsReloadInterval + absl::Seconds(10);
  bool rotated = false;
  while (!rotated && absl::Now() < deadline) {
    rotated = healthy_trusting(second + "/ca.pem");
    if (!rotated) absl::SleepFor(absl::Milliseconds(500));
  }
  EXPECT_TRUE(rotated) << "the server still serves the first CA's certificate";
  EXPECT_FALSE(healthy_trusting(first + "/ca.pem"));
  SetProcessClientSecurity(ClientSecurity());
  server->Shutdown();
}

}  // namespace
}  // namespace sluice::runtime
