// The ring's frame reader over one incoming frame: the bytes a peer sends, read in pieces of
// arbitrary sizes, through transport's frame_reader (segment table, size limit, Cap'n Proto
// parse) and then its chunk and hello checks. Every problem must be a peer_error with a bounded
// message; anything else (a crash, a sanitizer report, another exception) is a finding.

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_util.hpp"
#include "ring_frames.hpp"

namespace tt = troupe::transport;
namespace frames = troupe::transport::frames;

namespace {

// A link whose predecessor sends the fuzzer's bytes, handed out in the sizes the fuzzer picks.
class replay_link : public tt::ring_link {
 public:
  replay_link(std::vector<std::uint8_t> bytes, std::vector<std::size_t> pieces)
      : ring_link({1, "rank 1 (127.0.0.1:2)"}, {2, "rank 2 (127.0.0.1:3)"}), bytes_(std::move(bytes)),
        pieces_(std::move(pieces)) {}

  std::size_t write_some(tt::ring_side, const iovec* iov, std::size_t count) override {
    std::size_t n = 0;
    for (std::size_t i = 0; i < count; ++i) n += iov[i].iov_len;
    return n;
  }
  std::size_t read_some(tt::ring_side side, void* into, std::size_t n) override {
    if (at_ >= bytes_.size()) throw_gone(side);
    std::size_t take = std::min(n, bytes_.size() - at_);
    if (next_piece_ < pieces_.size()) take = std::min(take, std::max<std::size_t>(1, pieces_[next_piece_++]));
    std::memcpy(into, bytes_.data() + at_, take);
    at_ += take;
    return take;
  }
  bool wait(const tt::ring_wants&, int) override { return true; }
  void shutdown() noexcept override {}

 private:
  std::vector<std::uint8_t> bytes_;
  std::vector<std::size_t> pieces_;
  std::size_t at_ = 0;
  std::size_t next_piece_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  // What the receiver expects: a hello, or a chunk of some kind, count and type.
  const bool hello = in.ConsumeBool();
  frames::chunk_frame want;
  want.header.kind = static_cast<troupe::wire::Collective>(in.ConsumeIntegralInRange<int>(0, 4));
  want.header.sequence = in.ConsumeIntegralInRange<std::uint64_t>(0, 3);
  want.header.index = in.ConsumeIntegralInRange<std::uint32_t>(0, 3);
  want.header.root = in.ConsumeIntegralInRange<std::uint32_t>(0, 3);
  want.header.total = in.ConsumeIntegralInRange<std::uint64_t>(0, 64);
  want.type = static_cast<troupe::wire::ScalarType>(in.ConsumeIntegralInRange<int>(0, 4));
  want.count = in.ConsumeIntegralInRange<std::uint64_t>(0, 16);
  want.bytes = static_cast<std::size_t>(in.ConsumeIntegralInRange<int>(0, 64));
  const std::size_t max_words = in.ConsumeIntegralInRange<std::size_t>(0, 4096);
  std::vector<std::size_t> pieces(in.ConsumeIntegralInRange<std::size_t>(0, 8));
  for (auto& p : pieces) p = in.ConsumeIntegralInRange<std::size_t>(1, 64);
  std::vector<std::uint8_t> bytes = in.ConsumeRemainingBytes<std::uint8_t>();

  replay_link link(std::move(bytes), std::move(pieces));
  frames::frame_reader reader(tt::ring_side::prev);
  try {
    reader.start(max_words);
    while (!reader.done()) reader.progress(link);
    if (hello) {
      reader.take_hello(link, 1, 3);
    } else {
      const auto* p = reader.take_chunk(link, "all_reduce", 0, want);
      // The data handed back is the expected size and readable.
      volatile std::uint8_t sink = 0;
      for (std::size_t i = 0; p != nullptr && i < want.bytes; ++i) sink = sink ^ p[i];
      (void)sink;
    }
  } catch (const tt::peer_error& e) {
    troupe::fuzz::check_message(e.what());
  }
  return 0;
}
