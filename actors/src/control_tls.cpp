#include "control_tls.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

#include "caf/actor_system.hpp"
#include "caf/actor_system_config.hpp"

namespace troupe::actors {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error("rendezvous: cannot make the control plane's TLS credentials: " + what);
}

struct pkey_free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct x509_free {
  void operator()(X509* x) const { X509_free(x); }
};

// The key's seed: HMAC-SHA256(token, label). Everyone with the token gets the same key, nobody
// without it can.
std::vector<unsigned char> seed_from(const std::string& token) {
  static const char label[] = "troupe control plane ed25519 key v1";
  std::vector<unsigned char> seed(EVP_MAX_MD_SIZE);
  unsigned len = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), reinterpret_cast<const unsigned char*>(label),
           sizeof label - 1, seed.data(), &len) == nullptr || len != 32) {
    fail("HMAC-SHA256 failed");
  }
  seed.resize(32);
  return seed;
}

void write_file(const std::string& path, const std::function<int(FILE*)>& write) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) fail("cannot write " + path);
  const int ok = write(f);
  if (std::fclose(f) != 0 || ok != 1) fail("cannot write " + path);
}

}  // namespace

control_credentials::control_credentials(const std::string& token) {
  if (token.empty()) throw std::invalid_argument("rendezvous: TLS credentials need a cluster token");
  auto seed = seed_from(token);
  std::unique_ptr<EVP_PKEY, pkey_free> key(
      EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed.data(), seed.size()));
  if (!key) fail("no Ed25519 key");
  std::unique_ptr<X509, x509_free> cert(X509_new());
  if (!cert) fail("no certificate");
  // Fixed fields and a deterministic signature (Ed25519): every worker makes the same certificate.
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  ASN1_TIME_set_string(X509_getm_notBefore(cert.get()), "20000101000000Z");
  ASN1_TIME_set_string(X509_getm_notAfter(cert.get()), "99991231235959Z");
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("troupe cluster"), -1,
                             -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509_set_pubkey(cert.get(), key.get());
  if (X509_sign(cert.get(), key.get(), nullptr) <= 0) fail("cannot sign the certificate");

  const char* base = std::getenv("TMPDIR");
  std::string pattern = (base != nullptr && *base != '\0' ? std::string(base) : std::string("/tmp")) +
                        "/troupe-control-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) fail("cannot make a private directory from " + pattern);  // mode 0700
  dir_ = buf.data();
  certificate_ = dir_ + "/cert.pem";
  key_ = dir_ + "/key.pem";
  const mode_t old = umask(077);
  try {
    write_file(key_, [&](FILE* f) { return PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr); });
    write_file(certificate_, [&](FILE* f) { return PEM_write_X509(f, cert.get()); });
  } catch (...) {
    umask(old);
    throw;
  }
  umask(old);
}

control_credentials::~control_credentials() {
  if (dir_.empty()) return;
  ::unlink(key_.c_str());
  ::unlink(certificate_.c_str());
  ::rmdir(dir_.c_str());
}

void control_credentials::install(caf::actor_system& system) const {
  if (!system.has_openssl_manager()) {
    throw std::invalid_argument(
        "rendezvous: a cluster token needs CAF's OpenSSL module in this actor system: call "
        "troupe::Runtime::configure(config) on its config before constructing it");
  }
  // The OpenSSL module reads these when it opens a session, so setting them before the first
  // publish or connect is enough. The config is the system's own object, never a const one.
  auto& config = const_cast<caf::actor_system_config&>(system.config());
  config.openssl_certificate = certificate_;
  config.openssl_key = key_;
  config.openssl_cafile = certificate_;
}

}  // namespace troupe::actors
