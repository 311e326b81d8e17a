// The frame tags (transport/src/ring_frames.hpp's frame_mac), hashed by the caller or on a
// tag_thread beside it: the same tag either way, and a tag that fails for altered, replayed or
// reordered bytes.
#include <doctest/doctest.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "ring_frames.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using troupe::transport::frames::frame_mac;
using troupe::transport::frames::tag_thread;

namespace {

using tag = std::vector<unsigned char>;

std::vector<unsigned char> bytes_of(std::size_t n, unsigned seed) {
  std::vector<unsigned char> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>((i * 131 + seed * 7) >> 3);
  return b;
}

// The tag of `frame` fed in pieces of `piece` bytes; `defer` hands them to the tag_thread.
tag tag_of(frame_mac& mac, const std::vector<unsigned char>& frame, std::size_t piece, bool defer) {
  mac.begin();
  for (std::size_t at = 0; at < frame.size(); at += piece) mac.add(frame.data() + at, std::min(piece, frame.size() - at), defer);
  tag t(frame_mac::tag_bytes);
  mac.end(t.data());
  return t;
}

}  // namespace

TEST_CASE("frame tags hashed on a tag thread are the ones hashed by the caller, frame after frame") {
  const std::vector<std::uint8_t> key(32, 0x3c);
  auto helper = std::make_shared<tag_thread>();
  frame_mac inline_mac(key, 0), helped(key, 0, helper), checker(key, 0, helper);
  const std::vector<std::size_t> sizes = {100, std::size_t{1} << 20, 70000, 8, std::size_t{3} << 20, 64 * 1024};
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    CAPTURE(sizes[k]);
    const auto frame = bytes_of(sizes[k], static_cast<unsigned>(k));
    const tag want = tag_of(inline_mac, frame, 4096, false);
    // Deferred in large pieces, with a small piece done inline between them.
    const tag got = tag_of(helped, frame, 256 * 1024 + 8, sizes[k] >= tag_thread::min_frame_bytes);
    CHECK(got == want);
    // The receiving side, hashing on the same thread as it reads.
    checker.begin();
    for (std::size_t at = 0; at < frame.size(); at += 100000) {
      checker.add(frame.data() + at, std::min<std::size_t>(100000, frame.size() - at), true);
    }
    CHECK(checker.matches(want.data()));
  }
}

TEST_CASE("a frame tag hashed on a tag thread fails for a flipped byte, a replayed frame and a reordered frame") {
  const std::vector<std::uint8_t> key(32, 0x5a);
  auto helper = std::make_shared<tag_thread>();
  frame_mac sender(key, 1), receiver(key, 1, helper);
  const auto a = bytes_of(std::size_t{1} << 20, 1), b = bytes_of(std::size_t{1} << 20, 2);
  const tag ta = tag_of(sender, a, a.size(), false), tb = tag_of(sender, b, b.size(), false);
  const tag tc = tag_of(sender, a, a.size(), false);  // the same bytes as the first frame, later on
  auto check = [&](const std::vector<unsigned char>& frame, const tag& t) {
    receiver.begin();
    for (std::size_t at = 0; at < frame.size(); at += 256 * 1024) receiver.add(frame.data() + at, 256 * 1024, true);
    return receiver.matches(t.data());
  };
  SUBCASE("a flipped byte") {
    auto altered = a;
    altered[500000] ^= 0x04;
    CHECK(!check(altered, ta));
  }
  SUBCASE("a replayed frame") {
    CHECK(check(a, ta));
    CHECK(!check(a, ta));  // frame 0 again where frame 1 is due
  }
  SUBCASE("a reordered frame") {
    CHECK(!check(b, tb));  // frame 1 where frame 0 is due
  }
  SUBCASE("the stream in order") {
    CHECK(check(a, ta));
    CHECK(check(b, tb));
    CHECK(check(a, tc));
  }
  SUBCASE("the other direction's tag") {
    frame_mac other(key, 0);
    CHECK(!check(a, tag_of(other, a, a.size(), false)));
  }
}

}  // namespace TROUPE_TEST_FILE
