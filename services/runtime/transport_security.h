#ifndef SLUICE_SERVICES_RUNTIME_TRANSPORT_SECURITY_H_
#define SLUICE_SERVICES_RUNTIME_TRANSPORT_SECURITY_H_

// TLS for servers and channels, and the credentials a process presents when
// it calls another service. One set of names everywhere (flags of every
// binary and of the CLI, YAML keys with underscores):
//
//   --tls-cert FILE    this process's certificate (PEM): served to clients,
//                      and presented as its client certificate (mutual TLS)
//   --tls-key FILE     its private key (PEM)
//   --tls-ca FILE      CA bundle (PEM) that verifies the servers this process
//                      dials and, on a server, the client certificates
//   --tls-require-client-cert   a server refuses connections without a
//                      client certificate signed by --tls-ca (mutual TLS)
//   --token-file FILE  bearer token this process sends (`authorization:
//                      Bearer ...` on every call); SLUICE_TOKEN_FILE too
//   --tls-server-name NAME  the name to verify in servers' certificates when
//                      it is not the host dialed (an IP behind a proxy)
//
// Every file is watched: certificates, keys and CA bundles are read again
// within kTlsReloadInterval of a change (gRPC's FileWatcherCertificateProvider)
// and the token file on the next call after a change, so rotated Kubernetes
// Secrets take effect without a restart.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace sluice::runtime {

inline constexpr absl::Duration kTlsReloadInterval = absl::Seconds(5);

// How a server accepts connections.
struct ServerTls {
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
  bool require_client_cert = false;

  bool enabled() const { return !cert_file.empty(); }
  // Files readable, PEM that parses, the key matches the certificate, mutual
  // TLS has a CA; each problem names the flag.
  absl::Status Validate() const;
};

// Plaintext when `tls` is not enabled.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerTls& tls);

// How this process dials other services.
struct ClientSecurity {
  std::string ca_file;    // Non-empty = TLS.
  std::string cert_file;  // Client certificate for mutual TLS (optional).
  std::string key_file;
  std::string token_file;   // Bearer token sent on every call (optional).
  std::string server_name;  // Overrides the name verified in server certificates.

  bool tls() const { return !ca_file.empty(); }
  absl::Status Validate() const;
  // "TLS (CA ca.pem, client certificate), bearer token from t" or
  // "plaintext, no credentials": for logs and error hints.
  std::string Describe() const;
};

// Set once at start (ServiceMain, the CLI) from flags; every channel the
// process makes with CreateChannel() uses it.
void SetProcessClientSecurity(ClientSecurity security);
ClientSecurity ProcessClientSecurity();

// A channel to `target` with the process's client security (TLS or not, the
// bearer token interceptor or not) and `args`.
std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target,
                                             const grpc::ChannelArguments& args = {});

// `message` of a failed call, with what to do when the failure looks like a
// TLS or credentials mismatch: a plaintext client against a TLS server, a
// server certificate the CA does not sign, a missing or refused token.
std::string ExplainCallError(int grpc_code, const std::string& message);

// Reads a whole file ("" and an error naming `what` if it cannot).
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what);

// Whether a watched file (a tokens file, a token file: Secrets rotated in
// place) changed since it was last looked at: its mtime or size differs.
// Looks at most once per `interval`; not thread-safe (its owner locks).
class FileChangeWatch {
 public:
  FileChangeWatch(std::string path, absl::Duration interval)
      : path_(std::move(path)), interval_(interval) {}
  // True when it is time to look and the file's stamp is new (the first
  // look at an existing file included); a missing file (mid-rotation) is no
  // change.
  bool Changed(absl::Time now);
  // Makes the next look (once due) report a change, e.g. after a failed read.
  void Forget() { mtime_ns_ = -1; }

 private:
  const std::string path_;
  const absl::Duration interval_;
  absl::Time next_look_ = absl::InfinitePast();
  int64_t mtime_ns_ = -1;
  int64_t size_bytes_ = -1;
};

// Writes `contents` to `path` with permissions `mode` (0600: keys, tokens),
// whole then renamed, so that a reader (a service watching the file) never
// sees half of it.
absl::Status WriteSecretFile(const std::string& path, const std::string& contents,
                             unsigned mode = 0600);

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_TRANSPORT_SECURITY_H_
