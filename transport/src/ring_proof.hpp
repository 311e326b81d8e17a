#pragma once
// The cryptography of a ring connection's proof (ring_connect.hpp): fresh nonces and the HMAC that
// binds the cluster token to both nonces, both ranks, the ring, the protocol version, the side that
// proves and the cluster's incarnation. Private to transport/.

#include <cstdint>
#include <vector>

#include "troupe/transport/ring_connect.hpp"

namespace troupe::transport::proof {

/// Bytes of a nonce, and of a proof (HMAC-SHA256).
constexpr std::size_t nonce_bytes = 16;
constexpr std::size_t proof_bytes = 32;

/// Which side of a connection a proof is made by: the two sides' proofs over the same nonces
/// differ, so that neither can be reflected back as the other.
enum class side : std::uint8_t {
  accepting = 1,
  connecting = 2,
  frames = 3,  ///< not a proof: the key of the connection's frame tags (ring_frames.hpp), never sent
};

/// `nonce_bytes` fresh random bytes (std::runtime_error when the system has no randomness).
std::vector<std::uint8_t> fresh_nonce();

/// HMAC-SHA256 under `auth.token` of: a label, `version`, `by`, `auth.incarnation` (length first),
/// `size`, the connecting and the accepting rank, and both nonces.
std::vector<std::uint8_t> make(const ring_auth& auth, std::uint32_t version, side by, std::uint32_t size,
                               std::uint32_t connecting_rank, std::uint32_t accepting_rank,
                               const std::vector<std::uint8_t>& connecting_nonce,
                               const std::vector<std::uint8_t>& accepting_nonce);

/// Compares a received proof with the expected one in constant time.
bool matches(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want);

}  // namespace troupe::transport::proof
