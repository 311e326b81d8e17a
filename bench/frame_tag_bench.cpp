// What one frame's integrity tag costs on this CPU (transport/src/ring_frames.hpp's frame_mac:
// AES-256-GCM over the frame as associated data, i.e. GHASH), next to what the alternatives in
// OpenSSL cost over the same bytes, and to a plain copy of them:
//   BM_FrameTag/<bytes>            frame_mac::tag over one frame of <bytes> (the nonce set, the
//                                  bytes hashed, the tag computed): 64 B shows the fixed cost per
//                                  frame, 64 MiB a buffer far larger than the caches;
//   BM_Chacha20Poly1305Aad/<bytes> the same as associated data of ChaCha20-Poly1305 (Poly1305);
//   BM_AesGcmEncrypt/<bytes>       AES-256-GCM encrypting the bytes into a scratch piece (what a
//                                  tag over the ciphertext, or TLS, would pay);
//   BM_Memcpy/<bytes>              a copy of the bytes, for scale.
// A ring rank tags every byte it sends and checks every byte it receives, so an all-reduce of B
// bytes over 2 ranks hashes 2B bytes on each rank (bench/results/collectives.md, "Frame integrity tags").
#include <benchmark/benchmark.h>
#include <openssl/evp.h>
#include <sys/uio.h>

#include <cstring>
#include <vector>

#include "ring_frames.hpp"

namespace {

using troupe::transport::frames::frame_mac;

constexpr std::size_t piece_bytes = 64 << 10;  // the AEAD loops feed the bytes in pieces of this size

void BM_FrameTag(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<unsigned char> frame(bytes, 0x5a);
  frame_mac mac(std::vector<std::uint8_t>(32, 7), 0);
  unsigned char tag[frame_mac::tag_bytes];
  const iovec iov{frame.data(), frame.size()};
  for (auto _ : state) {
    mac.tag(&iov, 1, tag);
    benchmark::DoNotOptimize(tag);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

// One AEAD over the bytes: as associated data only (out null), or encrypted into `scratch`.
void aead(benchmark::State& state, const EVP_CIPHER* cipher, bool encrypt) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<unsigned char> data(bytes, 0x5a), scratch(piece_bytes);
  unsigned char key[32] = {7}, nonce[12] = {}, tag[16];
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  if (ctx == nullptr || EVP_EncryptInit_ex(ctx, cipher, nullptr, key, nonce) != 1) {
    state.SkipWithError("OpenSSL refused the cipher");
    EVP_CIPHER_CTX_free(ctx);
    return;
  }
  for (auto _ : state) {
    ++nonce[0];
    int len = 0;
    EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce);
    for (std::size_t at = 0; at < bytes; at += piece_bytes) {
      const int n = static_cast<int>(std::min(piece_bytes, bytes - at));
      EVP_EncryptUpdate(ctx, encrypt ? scratch.data() : nullptr, &len, data.data() + at, n);
    }
    EVP_EncryptFinal_ex(ctx, tag, &len);
    benchmark::DoNotOptimize(tag);
  }
  EVP_CIPHER_CTX_free(ctx);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

void BM_Chacha20Poly1305Aad(benchmark::State& state) { aead(state, EVP_chacha20_poly1305(), false); }
void BM_AesGcmEncrypt(benchmark::State& state) { aead(state, EVP_aes_256_gcm(), true); }

void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<unsigned char> from(bytes, 0x5a), to(bytes);
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t n : {std::int64_t{64}, std::int64_t{4096}, std::int64_t{1} << 20, std::int64_t{64} << 20}) b->Arg(n);
}

BENCHMARK(BM_FrameTag)->Apply(sizes);
BENCHMARK(BM_Chacha20Poly1305Aad)->Apply(sizes);
BENCHMARK(BM_AesGcmEncrypt)->Apply(sizes);
BENCHMARK(BM_Memcpy)->Apply(sizes);

}  // namespace

BENCHMARK_MAIN();
