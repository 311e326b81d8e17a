#pragma once

// The control plane's credentials: every worker of a cluster derives one Ed25519 key and one
// self-signed certificate from the cluster token, and uses that certificate both as its own and
// as the only authority it trusts. The control gate (control_gate.hpp) then runs mutual TLS with
// CAF's OpenSSL sessions on every rendezvous and heartbeat connection: a peer without the token
// fails the handshake before one byte of BASP is parsed. Internal to actors/.

#include <memory>
#include <string>

#include "caf/fwd.hpp"

namespace troupe::actors {

/// The PEM texts CAF's OpenSSL module reads, in two sealed memory files (memfd_create) that it
/// opens as /proc/self/fd/N: nothing is ever written to a file system, and both vanish with the
/// object (or the process). The key is as secret as the token it comes from.
class control_credentials {
 public:
  /// Derives the key and the certificate from `token` (not empty) into their memory files.
  /// Throws std::runtime_error when OpenSSL or memfd_create fails.
  explicit control_credentials(const std::string& token);
  ~control_credentials();
  control_credentials(const control_credentials&) = delete;
  control_credentials& operator=(const control_credentials&) = delete;

  const std::string& certificate() const noexcept { return certificate_; }
  const std::string& key() const noexcept { return key_; }
  /// The cluster token itself (the data connections prove it too).
  const std::string& token() const noexcept { return token_; }

  /// Points `system`'s OpenSSL module at these files: every TLS session it opens from now on
  /// presents this certificate and requires the peer's to be signed by it. Throws
  /// std::invalid_argument when the system was built without the module.
  void install(caf::actor_system& system) const;

  /// The credentials of `token` installed in `system`, one set for every object of the process on
  /// that system. CAF's OpenSSL module reads one certificate, key and authority per actor system,
  /// at every session it opens: two sets in one system would make the last one installed win for
  /// every connection (a different token's peers fail the handshake; a set that ends first leaves
  /// the module reading closed descriptors). So the first call makes and installs the set, later
  /// calls with the same token share it (it lives while one of them keeps it), and a call with
  /// another token while it lives throws std::invalid_argument naming `use` and the use that
  /// installed it, leaving the system's configuration as it was. `use` names the caller for that
  /// error ("ActorCluster", "Server", ...). Throws as the constructor and install() do otherwise.
  static std::shared_ptr<control_credentials> shared(caf::actor_system& system, const std::string& token,
                                                     const std::string& use);

 private:
  int key_fd_ = -1;
  int certificate_fd_ = -1;
  std::string certificate_;
  std::string key_;
  std::string token_;
};

}  // namespace troupe::actors
