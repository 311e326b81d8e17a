#pragma once
// The one source of secrets and identities for both cluster stacks: the ring's and the data
// connections' nonces, a cluster's incarnation, a ps task's data-port secret. Every one comes from
// OpenSSL's RAND_bytes; a system without randomness is an error naming what needed it, never a
// weaker value.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::transport {

/// `n` random bytes. Throws std::runtime_error "<what>: the system has no randomness" when the
/// system has none to give.
std::vector<std::uint8_t> random_bytes(std::size_t n, const std::string& what);

/// `n` random bytes as 2n lowercase hex digits (an incarnation, a rendezvous nonce); throws as
/// random_bytes does.
std::string random_hex(std::size_t n, const std::string& what);

}  // namespace troupe::transport
