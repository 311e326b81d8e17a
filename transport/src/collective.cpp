#include "troupe/transport/collective.hpp"

namespace troupe::transport {

const char* collective_name(collective_kind k) noexcept {
  switch (k) {
    case collective_kind::all_reduce: return "all_reduce";
    case collective_kind::all_gather: return "all_gather";
    case collective_kind::merge: return "merge_call";
  }
  return "?";
}

}  // namespace troupe::transport
