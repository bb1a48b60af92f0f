#include "services/runtime/transport_security.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/support/client_interceptor.h"

namespace sluice::runtime {
namespace {

using grpc::experimental::FileWatcherCertificateProvider;
using grpc::experimental::InterceptionHookPoints;

const int kReloadSeconds = static_cast<int>(absl::ToInt64Seconds(kTlsReloadInterval));

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Checks a PEM certificate (the first of a chain): parses, not expired.
absl::StatusOr<std::unique_ptr<X509, X509Free>> CheckCertificate(const std::string& path,
                                                                 const std::string& flag) {
  absl::StatusOr<std::string> pem = ReadSecretFile(path, flag);
  if (!pem.ok()) return pem.status();
  auto bio = MemoryBio(*pem);
  std::unique_ptr<X509, X509Free> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", path, "' holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", path, "': the certificate has expired"));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert.get())) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", path, "': the certificate is not valid yet (clock skew?)"));
  }
  return cert;
}

absl::Status CheckKeyPair(const std::string& cert_file, const std::string& key_file,
                          const std::string& cert_flag, const std::string& key_flag) {
  std::vector<std::string> problems;
  absl::StatusOr<std::unique_ptr<X509, X509Free>> cert = CheckCertificate(cert_file, cert_flag);
  if (!cert.ok()) problems.emplace_back(cert.status().message());
  absl::StatusOr<std::string> key_pem = ReadSecretFile(key_file, key_flag);
  std::unique_ptr<EVP_PKEY, PkeyFree> key;
  if (!key_pem.ok()) {
    problems.emplace_back(key_pem.status().message());
  } else {
    auto bio = MemoryBio(*key_pem);
    key.reset(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
    if (key == nullptr) {
      problems.push_back(
          absl::StrCat(key_flag, " '", key_file, "' holds no unencrypted PEM private key"));
    }
  }
  if (cert.ok() && key != nullptr && X509_check_private_key(cert->get(), key.get()) != 1) {
    problems.push_back(absl::StrCat(key_flag, " '", key_file, "' is not the key of ", cert_flag,
                                    " '", cert_file, "'"));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

// Reads the token file again when it changes (a rotated Secret), at most
// once a second.
class TokenSource {
 public:
  explicit TokenSource(std::string path) : path_(path), watch_(std::move(path), absl::Seconds(1)) {}

  std::string Token() {
    absl::MutexLock lock(&mu_);
    if (!watch_.Changed(absl::Now())) return token_;
    absl::StatusOr<std::string> text = ReadSecretFile(path_, "token_file");
    if (text.ok()) {
      token_ = std::string(absl::StripAsciiWhitespace(*text));
    } else {
      watch_.Forget();  // Try again at the next look.
    }
    return token_;
  }

 private:
  const std::string path_;
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  FileChangeWatch watch_ ABSL_GUARDED_BY(mu_);
};

class BearerTokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(TokenSource* source) : source_(source) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      const std::string token = source_->Token();
      if (!token.empty()) {
        methods->GetSendInitialMetadata()->emplace("authorization", absl::StrCat("Bearer ", token));
      }
    }
    methods->Proceed();
  }

 private:
  TokenSource* source_;
};

class BearerTokenInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(std::shared_ptr<TokenSource> source)
      : source_(std::move(source)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(source_.get());
  }

 private:
  std::shared_ptr<TokenSource> source_;
};

struct ProcessSecurity {
  absl::Mutex mu;
  ClientSecurity security ABSL_GUARDED_BY(mu);
  std::shared_ptr<TokenSource> tokens ABSL_GUARDED_BY(mu);
  std::shared_ptr<grpc::ChannelCredentials> credentials ABSL_GUARDED_BY(mu);
};

ProcessSecurity& Process() {
  static auto* process = new ProcessSecurity();
  return *process;
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const ClientSecurity& security) {
  if (!security.tls()) return grpc::InsecureChannelCredentials();
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  if (!security.cert_file.empty()) {
    provider = std::make_shared<FileWatcherCertificateProvider>(
        security.key_file, security.cert_file, security.ca_file, kReloadSeconds);
  } else {
    provider = std::make_shared<FileWatcherCertificateProvider>(security.ca_file, kReloadSeconds);
  }
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!security.cert_file.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(options);
}

}  // namespace

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool FileChangeWatch::Changed(absl::Time now) {
  if (now < next_look_) return false;
  next_look_ = now + interval_;
  struct stat st {};
  if (stat(path_.c_str(), &st) != 0) return false;
  const int64_t mtime = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  if (mtime == mtime_ns_ && st.st_size == size_bytes_) return false;
  mtime_ns_ = mtime;
  size_bytes_ = st.st_size;
  return true;
}

absl::Status WriteSecretFile(const std::string& path, const std::string& contents,
                             unsigned mode) {
  const std::string temporary = path + ".tmp";
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", temporary));
  fchmod(fd, mode);
  const bool written =
      write(fd, contents.data(), contents.size()) == static_cast<ssize_t>(contents.size());
  close(fd);
  if (!written || rename(temporary.c_str(), path.c_str()) != 0) {
    unlink(temporary.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

absl::Status ServerTls::Validate() const {
  std::vector<std::string> problems;
  if (cert_file.empty() != key_file.empty()) {
    problems.emplace_back("tls_cert and tls_key go together: give both or neither");
  }
  if (!enabled()) {
    if (!ca_file.empty() || require_client_cert) {
      problems.emplace_back(
          "tls_ca / tls_require_client_cert on a server need "
          "tls_cert and tls_key");
    }
  } else if (!key_file.empty()) {
    if (absl::Status pair = CheckKeyPair(cert_file, key_file, "tls_cert", "tls_key"); !pair.ok()) {
      problems.emplace_back(pair.message());
    }
  }
  if (require_client_cert && ca_file.empty()) {
    problems.emplace_back("tls_require_client_cert needs tls_ca (the CA that signs clients)");
  }
  if (!ca_file.empty()) {
    if (auto ca = CheckCertificate(ca_file, "tls_ca"); !ca.ok()) {
      problems.emplace_back(ca.status().message());
    }
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerTls& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  if (!tls.ca_file.empty()) {
    provider = std::make_shared<FileWatcherCertificateProvider>(tls.key_file, tls.cert_file,
                                                                tls.ca_file, kReloadSeconds);
  } else {
    provider = std::make_shared<FileWatcherCertificateProvider>(tls.key_file, tls.cert_file,
                                                                kReloadSeconds);
  }
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!tls.ca_file.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(tls.require_client_cert
                                      ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                      : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

absl::Status ClientSecurity::Validate() const {
  std::vector<std::string> problems;
  if (cert_file.empty() != key_file.empty()) {
    problems.emplace_back("tls_cert and tls_key go together: give both or neither");
  }
  if (!cert_file.empty() && ca_file.empty()) {
    problems.emplace_back(
        "a client certificate (tls_cert) needs tls_ca: the "
        "CA that verifies the servers dialed");
  }
  if (!ca_file.empty()) {
    if (auto ca = CheckCertificate(ca_file, "tls_ca"); !ca.ok()) {
      problems.emplace_back(ca.status().message());
    }
  }
  if (!cert_file.empty() && !key_file.empty()) {
    if (absl::Status pair = CheckKeyPair(cert_file, key_file, "tls_cert", "tls_key"); !pair.ok()) {
      problems.emplace_back(pair.message());
    }
  }
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = ReadSecretFile(token_file, "token_file");
    if (!token.ok()) {
      problems.emplace_back(token.status().message());
    } else if (absl::StripAsciiWhitespace(*token).empty()) {
      problems.push_back(absl::StrCat("token_file '", token_file, "' is empty"));
    }
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

std::string ClientSecurity::Describe() const {
  std::string text = tls() ? absl::StrCat("TLS (CA ", ca_file,
                                          cert_file.empty() ? "" : ", client certificate", ")")
                           : "plaintext";
  absl::StrAppend(&text, token_file.empty() ? ", no bearer token"
                                            : absl::StrCat(", bearer token from ", token_file));
  return text;
}

void SetProcessClientSecurity(ClientSecurity security) {
  ProcessSecurity& process = Process();
  absl::MutexLock lock(&process.mu);
  process.tokens =
      security.token_file.empty() ? nullptr : std::make_shared<TokenSource>(security.token_file);
  process.credentials = MakeChannelCredentials(security);
  process.security = std::move(security);
}

ClientSecurity ProcessClientSecurity() {
  ProcessSecurity& process = Process();
  absl::MutexLock lock(&process.mu);
  return process.security;
}

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target,
                                             const grpc::ChannelArguments& args) {
  ProcessSecurity& process = Process();
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::shared_ptr<TokenSource> tokens;
  std::string server_name;
  {
    absl::MutexLock lock(&process.mu);
    if (process.credentials == nullptr) process.credentials = grpc::InsecureChannelCredentials();
    credentials = process.credentials;
    tokens = process.tokens;
    server_name = process.security.server_name;
  }
  grpc::ChannelArguments arguments = args;
  if (!server_name.empty()) arguments.SetSslTargetNameOverride(server_name);
  if (tokens == nullptr) return grpc::CreateCustomChannel(target, credentials, arguments);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<BearerTokenInterceptorFactory>(std::move(tokens)));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, arguments,
                                                                 std::move(creators));
}

std::string ExplainCallError(int grpc_code, const std::string& message) {
  const ClientSecurity security = ProcessClientSecurity();
  const auto code = static_cast<grpc::StatusCode>(grpc_code);
  std::string hint;
  if (code == grpc::StatusCode::UNAUTHENTICATED) {
    hint = security.token_file.empty() && security.cert_file.empty()
               ? "this client sends no credentials: pass --token-file (or "
                 "SLUICE_TOKEN_FILE), or "
                 "a client certificate with --tls-cert/--tls-key"
               : "the server did not accept this client's credentials";
  } else if (code == grpc::StatusCode::PERMISSION_DENIED) {
    hint = "the credentials are valid but their role may not make this call";
  } else if (code == grpc::StatusCode::UNAVAILABLE) {
    if (absl::StrContains(message, "CERTIFICATE_VERIFY_FAILED") ||
        absl::StrContains(message, "certificate verify failed")) {
      hint = absl::StrCat("the server's certificate is not signed by --tls-ca '", security.ca_file,
                          "' (wrong CA?)");
    } else if (absl::StrContains(message, "Peer name") ||
               absl::StrContains(message, "does not match")) {
      hint =
          "the server's certificate does not name the host dialed: pass "
          "--tls-server-name";
    } else if (security.tls() && (absl::StrContains(message, "WRONG_VERSION_NUMBER") ||
                                  absl::StrContains(message, "andshake"))) {
      hint =
          "the TLS handshake failed: is the server plaintext, or does it "
          "require a client "
          "certificate (--tls-cert/--tls-key)?";
    } else if (!security.tls()) {
      hint =
          "this client dials in plaintext; if the server uses TLS pass "
          "--tls-ca (and "
          "--token-file)";
    }
  }
  if (hint.empty()) return message;
  return absl::StrCat(message, " (", hint, ")");
}

}  // namespace sluice::runtime
