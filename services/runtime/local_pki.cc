#include "services/runtime/local_pki.h"

#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/runtime/transport_security.h"

namespace sluice::runtime {
namespace {

namespace fs = std::filesystem;

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Free>;
using Cert = std::unique_ptr<X509, Free>;

absl::Status OpenSslError(const std::string& what) {
  char buffer[256] = "unknown error";
  if (unsigned long code = ERR_get_error(); code != 0)
    ERR_error_string_n(code, buffer, sizeof(buffer));
  ERR_clear_error();
  return absl::InternalError(absl::StrCat(what, ": ", buffer));
}

absl::StatusOr<std::string> ToPem(EVP_PKEY* key, X509* cert) {
  std::unique_ptr<BIO, Free> bio(BIO_new(BIO_s_mem()));
  const bool ok = key != nullptr ? PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0,
                                                            nullptr, nullptr) == 1
                                 : PEM_write_bio_X509(bio.get(), cert) == 1;
  if (!ok) return OpenSslError("cannot encode PEM");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

absl::StatusOr<Key> NewKey() {
  Key key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("cannot make an EC key");
  return key;
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return OpenSslError(absl::StrCat("bad extension ", value));
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return absl::OkStatus();
}

struct Issuer {
  EVP_PKEY* key;
  X509* cert;  // null: self-signed.
};

absl::StatusOr<Cert> NewCertificate(EVP_PKEY* key, const std::string& common_name,
                                    const Issuer& issuer, absl::Duration validity,
                                    const std::vector<std::pair<int, std::string>>& extensions) {
  Cert cert(X509_new());
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof(serial));
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), absl::ToInt64Seconds(validity));
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>("Sluice"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                             0);
  X509* issuer_cert = issuer.cert != nullptr ? issuer.cert : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(issuer_cert));
  X509_set_pubkey(cert.get(), key);
  for (const auto& [nid, value] : extensions) {
    if (absl::Status added = AddExtension(cert.get(), issuer_cert, nid, value); !added.ok()) {
      return added;
    }
  }
  if (X509_sign(cert.get(), issuer.key, EVP_sha256()) == 0) {
    return OpenSslError("cannot sign a certificate");
  }
  return cert;
}

absl::StatusOr<std::pair<Key, Cert>> LoadCa(const std::string& cert_path,
                                            const std::string& key_path) {
  std::unique_ptr<BIO, Free> cert_bio(BIO_new_file(cert_path.c_str(), "r"));
  std::unique_ptr<BIO, Free> key_bio(BIO_new_file(key_path.c_str(), "r"));
  if (cert_bio == nullptr || key_bio == nullptr) return OpenSslError("cannot open the CA");
  Cert cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  Key key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr || key == nullptr || X509_check_private_key(cert.get(), key.get()) != 1 ||
      X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return OpenSslError(absl::StrCat("the CA in ", cert_path, " is unusable"));
  }
  return std::make_pair(std::move(key), std::move(cert));
}

}  // namespace

absl::StatusOr<PkiFiles> WriteLocalPki(const std::string& dir,
                                       const std::vector<PkiEntity>& entities,
                                       absl::Duration validity, const std::string& ca_common_name) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  chmod(dir.c_str(), 0700);
  PkiFiles files{(fs::path(dir) / "ca.pem").string(), (fs::path(dir) / "ca.key").string()};

  Key ca_key;
  Cert ca_cert;
  if (fs::exists(files.ca_cert) && fs::exists(files.ca_key)) {
    absl::StatusOr<std::pair<Key, Cert>> loaded = LoadCa(files.ca_cert, files.ca_key);
    if (loaded.ok()) {
      ca_key = std::move(loaded->first);
      ca_cert = std::move(loaded->second);
    }
  }
  if (ca_cert == nullptr) {
    absl::StatusOr<Key> key = NewKey();
    if (!key.ok()) return key.status();
    absl::StatusOr<Cert> cert = NewCertificate(
        key->get(), ca_common_name, Issuer{key->get(), nullptr}, validity + absl::Hours(24),
        {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
         {NID_key_usage, "critical,keyCertSign,cRLSign"},
         {NID_subject_key_identifier, "hash"}});
    if (!cert.ok()) return cert.status();
    ca_key = std::move(*key);
    ca_cert = std::move(*cert);
    absl::StatusOr<std::string> key_pem = ToPem(ca_key.get(), nullptr);
    absl::StatusOr<std::string> cert_pem = ToPem(nullptr, ca_cert.get());
    if (!key_pem.ok()) return key_pem.status();
    if (!cert_pem.ok()) return cert_pem.status();
    if (absl::Status s = WriteSecretFile(files.ca_key, *key_pem, 0600); !s.ok()) return s;
    if (absl::Status s = WriteSecretFile(files.ca_cert, *cert_pem, 0644); !s.ok()) return s;
  }

  for (const PkiEntity& entity : entities) {
    absl::StatusOr<Key> key = NewKey();
    if (!key.ok()) return key.status();
    std::vector<std::string> names;
    for (const std::string& dns : entity.dns_names) names.push_back(absl::StrCat("DNS:", dns));
    for (const std::string& ip : entity.ip_addresses) names.push_back(absl::StrCat("IP:", ip));
    std::vector<std::pair<int, std::string>> extensions = {
        {NID_basic_constraints, "critical,CA:FALSE"},
        {NID_key_usage, "critical,digitalSignature,keyEncipherment"},
        {NID_ext_key_usage, "serverAuth,clientAuth"},
        {NID_authority_key_identifier, "keyid"}};
    if (!names.empty()) extensions.emplace_back(NID_subject_alt_name, absl::StrJoin(names, ","));
    absl::StatusOr<Cert> cert = NewCertificate(
        key->get(), entity.common_name, Issuer{ca_key.get(), ca_cert.get()}, validity, extensions);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key_pem = ToPem(key->get(), nullptr);
    absl::StatusOr<std::string> cert_pem = ToPem(nullptr, cert->get());
    if (!key_pem.ok()) return key_pem.status();
    if (!cert_pem.ok()) return cert_pem.status();
    const fs::path stem = fs::path(dir) / entity.file_stem;
    if (absl::Status s = WriteSecretFile(stem.string() + ".key", *key_pem, 0600); !s.ok()) return s;
    if (absl::Status s = WriteSecretFile(stem.string() + ".pem", *cert_pem, 0644); !s.ok()) return s;
  }
  return files;
}

}  // namespace sluice::runtime
