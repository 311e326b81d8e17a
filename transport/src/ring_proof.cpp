#include "ring_proof.hpp"

#include "troupe/transport/random.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <stdexcept>
#include <string>

namespace troupe::transport::proof {
namespace {

void put_u32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

}  // namespace

std::vector<std::uint8_t> fresh_nonce() { return random_bytes(nonce_bytes, "tcp_ring: a nonce"); }

std::vector<std::uint8_t> make(const ring_auth& auth, std::uint32_t version, side by, std::uint32_t size,
                               std::uint32_t connecting_rank, std::uint32_t accepting_rank,
                               const std::vector<std::uint8_t>& connecting_nonce,
                               const std::vector<std::uint8_t>& accepting_nonce) {
  // Every field has a fixed size or its length first: no two inputs frame to the same bytes.
  static const std::string label = "troupe ring proof";
  std::vector<std::uint8_t> message(label.begin(), label.end());
  put_u32(message, version);
  message.push_back(static_cast<std::uint8_t>(by));
  put_u32(message, static_cast<std::uint32_t>(auth.incarnation.size()));
  message.insert(message.end(), auth.incarnation.begin(), auth.incarnation.end());
  put_u32(message, size);
  put_u32(message, connecting_rank);
  put_u32(message, accepting_rank);
  put_u32(message, static_cast<std::uint32_t>(connecting_nonce.size()));
  message.insert(message.end(), connecting_nonce.begin(), connecting_nonce.end());
  put_u32(message, static_cast<std::uint32_t>(accepting_nonce.size()));
  message.insert(message.end(), accepting_nonce.begin(), accepting_nonce.end());
  std::vector<std::uint8_t> out(EVP_MAX_MD_SIZE);
  size_t len = 0;
  if (EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, auth.token.data(), auth.token.size(), message.data(),
                message.size(), out.data(), out.size(), &len) == nullptr ||
      len != proof_bytes) {
    throw std::runtime_error("tcp_ring: HMAC-SHA256 failed");
  }
  out.resize(len);
  return out;
}

bool matches(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want) {
  return got.size() == want.size() && CRYPTO_memcmp(got.data(), want.data(), want.size()) == 0;
}

}  // namespace troupe::transport::proof
