#pragma once

// The collectives' vocabulary, shared by every transport (shm_group, tcp_ring, memory_ring, the
// NCCL group) and by the runtime that drives them.

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "troupe/base/elements.hpp"

namespace troupe::transport {

// The element vocabulary (troupe/base/elements.hpp), by its short names in transport's code.
using base::reduce_kind;
using base::scalar_name;
using base::scalar_size;
using base::scalar_type;

/// Which collective a rank takes part in.
enum class collective_kind : std::uint8_t { all_reduce, all_gather, merge };
/// "all_reduce", "all_gather", "merge_call".
const char* collective_name(collective_kind k) noexcept;

/// One tensor taking part in a collective, as one rank sees it.
struct buffer {
  const void* in = nullptr;           ///< this rank's input; read by every rank
  void* out = nullptr;                ///< this rank's output (all_reduce: same element count)
  std::int64_t count = 0;             ///< elements
  scalar_type type = scalar_type::f32;
  std::vector<std::int64_t> shape;    ///< for checks and error messages
  std::shared_ptr<const void> keepalive;  ///< keeps `in` readable after its owner moves on
};

/// A collective that cannot complete: another rank failed, left, or a wait timed out.
class aborted_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace troupe::transport
