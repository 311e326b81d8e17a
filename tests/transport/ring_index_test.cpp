#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "troupe/transport/ring_index.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::transport::ring_index;

TEST_CASE("ring index: neighbours wrap around, and what a rank receives in step k is what its predecessor sends") {
  for (int n : {1, 2, 3, 4, 5, 8}) {
    CAPTURE(n);
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(next_rank(prev_rank(r, n), n) == r);
      CHECK(prev_rank(r, n) == (r + n - 1) % n);
      std::set<int> sent, received;
      for (int k = 0; k < n - 1; ++k) {
        CHECK(ring_recv_index(r, k, n) == ring_send_index(prev_rank(r, n), k, n));
        // The chunk received in step k is the one sent on in step k + 1.
        CHECK(ring_recv_index(r, k, n) == ring_send_index(r, k + 1, n));
        sent.insert(ring_send_index(r, k, n));
        received.insert(ring_recv_index(r, k, n));
      }
      // n - 1 distinct chunks each way; the last one received is the one this rank owns.
      CHECK(sent.size() == static_cast<std::size_t>(n - 1));
      CHECK(received.size() == static_cast<std::size_t>(n - 1));
      if (n > 1) CHECK(ring_recv_index(r, n - 2, n) == owned_chunk(r, n));
    }
  }
}

TEST_CASE("ring index: chunks cover the buffer in order on 16-element bounds, for any count") {
  for (int n : {1, 2, 3, 4, 7}) {
    for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{15}, std::int64_t{16}, std::int64_t{1001},
                               std::int64_t{100003}}) {
      CAPTURE(n);
      CAPTURE(count);
      std::int64_t at = 0;
      for (int c = 0; c < n; ++c) {
        const auto [b, e] = chunk_bounds(count, n, c);
        CHECK(b == at);
        CHECK(e >= b);
        if (c + 1 < n) CHECK(e % 16 == 0);
        at = e;
      }
      CHECK(at == count);
    }
  }
}

TEST_CASE("ring index: segments cover a buffer exactly, an empty one in one empty segment") {
  for (std::size_t segment : {std::size_t{64}, std::size_t{1} << 20}) {
    for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{65},
                              std::size_t{3} << 20}) {
      CAPTURE(segment);
      CAPTURE(bytes);
      const std::size_t n = segments_of(bytes, segment);
      CHECK(n == (bytes == 0 ? 1 : (bytes + segment - 1) / segment));
      std::size_t at = 0;
      for (std::size_t j = 0; j < n; ++j) {
        CHECK(segment_begin(j, segment) == at);
        CHECK(segment_size(j, bytes, segment) <= segment);
        at += segment_size(j, bytes, segment);
      }
      CHECK(at == bytes);
    }
  }
}

TEST_CASE("ring index: the small all-reduce brings every other rank's block exactly once, and the broadcast chain starts at the root") {
  for (int n : {2, 3, 4, 5, 6, 8}) {
    CAPTURE(n);
    CHECK(small_steps_from_prev(n) + small_steps_from_next(n) == n - 1);
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      std::multiset<int> got;
      for (int k = 1; k <= small_steps_from_prev(n); ++k) {
        got.insert(small_from_prev_owner(r, k, n));
        // What arrives from the predecessor in step k is what it forwards in step k.
        CHECK(small_from_prev_owner(r, k, n) == small_forward_owner(prev_rank(r, n), k, n));
        if (k <= small_steps_from_next(n)) {
          got.insert(small_from_next_owner(r, k, n));
          CHECK(small_from_next_owner(r, k, n) == small_backward_owner(next_rank(r, n), k, n));
        }
      }
      CHECK(got.size() == static_cast<std::size_t>(n - 1));
      CHECK(got.count(r) == 0);
      for (int q = 0; q < n; ++q) {
        if (q != r) CHECK(got.count(q) == 1);
      }
      CHECK(chain_position(r, r, n) == 0);
      CHECK(chain_position(prev_rank(r, n), r, n) == n - 1);
    }
  }
}

}  // namespace TROUPE_TEST_FILE
