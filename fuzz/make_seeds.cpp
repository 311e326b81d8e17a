// Writes the seed files of fuzz/corpus/: real frames from transport's frame writer and real
// checkpoint files from format's writer, each with the trailing bytes the fuzz target reads its
// expectations from (FuzzedDataProvider takes integers from the end of the input), so that the
// seeds start the fuzzer on the accepting paths. Usage: make_fuzz_seeds <fuzz/corpus directory>.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "ring_frames.hpp"
#include "troupe/format/checkpoint_file.hpp"

namespace tt = troupe::transport;
namespace frames = troupe::transport::frames;
namespace fmt = troupe::format;
using bytes = std::vector<std::uint8_t>;

namespace {

// The link a frame_writer writes into: it keeps every byte.
class capture_link : public tt::ring_link {
 public:
  capture_link() : ring_link({1, "next"}, {2, "prev"}) {}
  std::size_t write_some(tt::ring_side, const iovec* iov, std::size_t count) override {
    std::size_t n = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const auto* p = static_cast<const std::uint8_t*>(iov[i].iov_base);
      out.insert(out.end(), p, p + iov[i].iov_len);
      n += iov[i].iov_len;
    }
    return n;
  }
  std::size_t read_some(tt::ring_side, void*, std::size_t) override { return 0; }
  bool wait(const tt::ring_wants&, int) override { return true; }
  void shutdown() noexcept override {}
  bytes out;
};

// The trailing bytes FuzzedDataProvider turns into `values`, each a one- or two-byte integer in
// the order the target consumes them (it reads from the end, most significant byte first).
bytes tail(const std::vector<std::pair<unsigned, int>>& values) {
  bytes consumed;
  for (const auto& [v, width] : values) {
    if (width == 2) consumed.push_back(static_cast<std::uint8_t>(v >> 8));
    consumed.push_back(static_cast<std::uint8_t>(v & 0xff));
  }
  return bytes(consumed.rbegin(), consumed.rend());
}

void write(const std::string& path, const bytes& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) {
    std::cerr << "make_fuzz_seeds: cannot write " << path << "\n";
    std::exit(1);
  }
}

// A frame seed: the frame, then what ring_frame_fuzz expects (see its LLVMFuzzerTestOneInput).
bytes frame_seed(bool hello, const frames::chunk_frame& f, const void* data, std::size_t max_words,
                 const std::vector<unsigned>& pieces) {
  capture_link link;
  frames::frame_writer w(tt::ring_side::next);
  if (hello) {
    w.start_hello(1, 2, 3);
  } else {
    w.start_chunk(f, data);
  }
  w.progress(link);
  bytes out = link.out;
  std::vector<std::pair<unsigned, int>> v{{hello ? 1u : 0u, 1},
                                          {static_cast<unsigned>(f.header.kind), 1},
                                          {static_cast<unsigned>(f.header.sequence), 1},
                                          {f.header.index, 1},
                                          {f.header.root, 1},
                                          {static_cast<unsigned>(f.header.total), 1},
                                          {static_cast<unsigned>(f.type), 1},
                                          {static_cast<unsigned>(f.count), 1},
                                          {static_cast<unsigned>(f.bytes), 1},
                                          {static_cast<unsigned>(max_words), 2},
                                          {static_cast<unsigned>(pieces.size()), 1}};
  for (unsigned p : pieces) v.push_back({p - 1, 1});
  const bytes t = tail(v);
  out.insert(out.end(), t.begin(), t.end());
  return out;
}

bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_fuzz_seeds <fuzz/corpus directory>\n";
    return 2;
  }
  const std::string dir = argv[1];

  // Frames: a hello, an all-reduce chunk of 4 float32, a broadcast segment of 13 bytes (copied:
  // not whole words), an all-gather block in pieces, and a broadcast close.
  const float four[4] = {1.5f, -2.0f, 3.25f, 4.0f};
  const std::uint8_t thirteen[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  using C = troupe::wire::Collective;
  using S = troupe::wire::ScalarType;
  write(dir + "/ring_frame/hello", frame_seed(true, {}, nullptr, 64, {}));
  write(dir + "/ring_frame/all_reduce_f32",
        frame_seed(false, {{C::ALL_REDUCE, 1, 0, 0, 0}, S::FLOAT32, 0, 4, 16}, four, 64, {}));
  write(dir + "/ring_frame/broadcast_13_bytes",
        frame_seed(false, {{C::BROADCAST, 2, 0, 1, 13}, S::UINT8, 0, 13, 13}, thirteen, 64, {}));
  write(dir + "/ring_frame/all_gather_in_pieces",
        frame_seed(false, {{C::ALL_GATHER, 3, 2, 0, 16}, S::UINT8, 0, 16, 16}, four, 64, {3, 5, 8, 1, 64}));
  write(dir + "/ring_frame/broadcast_close",
        frame_seed(false, {{C::BROADCAST_CLOSE, 0, 0, 2, 40}, S::UINT8, 0, 0, 0}, nullptr, 64, {}));

  // Checkpoints: a file of three tensors (a tail chunk, a scalar) and one with an empty tensor, each
  // as a whole file (mode 0) and as a message to seal (mode 1; mode 3 skips tensor checksums).
  const std::string tmp = "/tmp/troupe-make-seeds-" + std::to_string(::getpid()) + ".ckpt";
  const std::vector<float> w{1.5f, -2.0f, 3.25f, 4.0f, 5.0f, 6.0f};
  const std::vector<std::int32_t> b{7, 8, 9};
  const std::vector<double> s{0.125};
  const std::vector<std::pair<std::string, std::vector<fmt::checkpoint_tensor>>> files{
      {"three_tensors",
       {{"dense/kernel", fmt::scalar_type::f32, {2, 3}, w.data(), 24},
        {"dense/bias", fmt::scalar_type::i32, {3}, b.data(), 12},
        {"scale", fmt::scalar_type::f64, {}, s.data(), 8}}},
      {"empty_tensor", {{"empty", fmt::scalar_type::i64, {0, 4}, nullptr, 0}}}};
  for (const auto& [name, tensors] : files) {
    fmt::write_checkpoint_file(tmp, 7, tensors);
    const bytes file = read_file(tmp);
    bytes raw{0};
    raw.insert(raw.end(), file.begin(), file.end());
    write(dir + "/checkpoint/" + name + "_file", raw);
    for (std::uint8_t mode : {1, 3}) {
      bytes sealed{mode};
      sealed.insert(sealed.end(), file.begin() + fmt::checkpoint_preamble_bytes, file.end());
      write(dir + "/checkpoint/" + name + "_message_" + std::to_string(mode), sealed);
    }
  }
  std::remove(tmp.c_str());
  return 0;
}
