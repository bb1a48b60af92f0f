#ifndef SLUICE_SERVICES_RUNTIME_LOCAL_PKI_H_
#define SLUICE_SERVICES_RUNTIME_LOCAL_PKI_H_

// A private certificate authority for one machine or one test: what
// `sluice up --tls` writes into its state directory so that every service
// and the CLI speak mutual TLS without the user running openssl.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::runtime {

struct PkiEntity {
  std::string file_stem;    // "replay_buffer": <dir>/replay_buffer.{pem,key}
  std::string common_name;  // "controller:controller" (<role>:<identity>, see auth.h)
  // DNS names and IP addresses the certificate is valid for as a server.
  std::vector<std::string> dns_names = {"localhost"};
  std::vector<std::string> ip_addresses = {"127.0.0.1", "::1"};
};

struct PkiFiles {
  std::string ca_cert;  // <dir>/ca.pem
  std::string ca_key;   // <dir>/ca.key (0600)
};

// Makes (or, when `dir` already holds ca.pem and ca.key, reuses) a CA, then
// writes a fresh ECDSA P-256 key (0600) and a certificate signed by the CA for
// each entity, valid from an hour ago for `validity`. `ca_common_name` names
// the CA ("Sluice local CA").
absl::StatusOr<PkiFiles> WriteLocalPki(const std::string& dir,
                                       const std::vector<PkiEntity>& entities,
                                       absl::Duration validity = absl::Hours(24 * 365),
                                       const std::string& ca_common_name = "Sluice local CA");

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_LOCAL_PKI_H_
