#include "troupe/transport/random.hpp"

#include <openssl/rand.h>

#include <stdexcept>

namespace troupe::transport {

std::vector<std::uint8_t> random_bytes(std::size_t n, const std::string& what) {
  std::vector<std::uint8_t> out(n);
  if (n > 0 && RAND_bytes(out.data(), static_cast<int>(n)) != 1) {
    throw std::runtime_error(what + ": the system has no randomness");
  }
  return out;
}

std::string random_hex(std::size_t n, const std::string& what) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (std::uint8_t b : random_bytes(n, what)) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

}  // namespace troupe::transport
