#include "control_tls.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
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

// A memory file holding `pem`, sealed; its descriptor. Nothing of it is in a file system: the
// OpenSSL module reads it through /proc/self/fd/N, and it is gone when the descriptor closes.
int memory_file(const char* name, const std::function<int(BIO*)>& write) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  if (!bio || write(bio.get()) != 1) fail(std::string("cannot encode the ") + name);
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio.get(), &data);
  const int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) fail(std::string("memfd_create failed for the ") + name);
  long done = 0;
  while (done < len) {
    const ssize_t n = ::write(fd, data + done, static_cast<std::size_t>(len - done));
    if (n <= 0) {
      ::close(fd);
      fail(std::string("cannot write the ") + name + " to its memory file");
    }
    done += n;
  }
  // Nobody changes it from now on (a descriptor handed to a child by mistake cannot either).
  ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  return fd;
}

// The credentials installed in each actor system by control_credentials::shared, and who did.
struct tls_installation {
  const caf::actor_system* system = nullptr;
  std::weak_ptr<control_credentials> credentials;
  std::string use;
};

std::mutex tls_installations_mutex;
std::vector<tls_installation> tls_installations;  // guarded by tls_installations_mutex

}  // namespace

std::shared_ptr<control_credentials> control_credentials::shared(caf::actor_system& system, const std::string& token,
                                                                 const std::string& use) {
  std::lock_guard<std::mutex> lock(tls_installations_mutex);
  auto& all = tls_installations;
  all.erase(std::remove_if(all.begin(), all.end(), [](const tls_installation& i) { return i.credentials.expired(); }),
            all.end());
  auto it = std::find_if(all.begin(), all.end(), [&](const tls_installation& i) { return i.system == &system; });
  if (it != all.end()) {
    auto existing = it->credentials.lock();
    // Still the system's own set (not one of a system that ended, whose address this one reuses,
    // nor replaced by a direct install()): share it, or refuse another token.
    if (existing && system.config().openssl_key == existing->key()) {
      if (existing->token() == token) {
        if (it->use.find(use) == std::string::npos) it->use += " and " + use;
        return existing;
      }
      throw std::invalid_argument(
          use + ": this process's actor system already holds the control plane's TLS credentials of another "
          "cluster token, installed for " + it->use + ". One actor system presents one certificate on every "
          "connection, so the two would break each other's connections: give " + use + " the same cluster token as " +
          it->use + " (one cluster), or construct it on a troupe::Runtime of its own (another actor system)");
    }
    all.erase(it);
  }
  auto made = std::make_shared<control_credentials>(token);
  made->install(system);
  all.push_back(tls_installation{&system, made, use});
  return made;
}

control_credentials::control_credentials(const std::string& token) : token_(token) {
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

  key_fd_ = memory_file("troupe-control-key", [&](BIO* b) {
    return PEM_write_bio_PrivateKey(b, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  });
  try {
    certificate_fd_ = memory_file("troupe-control-cert", [&](BIO* b) { return PEM_write_bio_X509(b, cert.get()); });
  } catch (...) {
    ::close(key_fd_);
    throw;
  }
  key_ = "/proc/self/fd/" + std::to_string(key_fd_);
  certificate_ = "/proc/self/fd/" + std::to_string(certificate_fd_);
}

control_credentials::~control_credentials() {
  if (key_fd_ >= 0) ::close(key_fd_);
  if (certificate_fd_ >= 0) ::close(certificate_fd_);
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
