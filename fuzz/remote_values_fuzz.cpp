// The bytes a cluster's tasks exchange (runtime/src/distribute/cluster/remote_wire.cpp) over arbitrary
// input: function arguments, results, variable shards and tables, and a ps shard's update.
// Refusals must be std::invalid_argument with a bounded message; what is accepted must encode
// back to the same bytes.

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "distribute/cluster/remote_wire.hpp"
#include "fuzz_util.hpp"

namespace wire = troupe::distribute::detail;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    if (wire::encode_tensors(wire::decode_tensors(bytes)) != bytes) std::abort();
  } catch (const std::invalid_argument& e) {
    troupe::fuzz::check_message(e.what());
  }
  try {
    if (wire::encode_arguments(wire::decode_arguments(bytes)) != bytes) std::abort();
  } catch (const std::invalid_argument& e) {
    troupe::fuzz::check_message(e.what());
  }
  try {
    (void)wire::encode_table(wire::decode_table(bytes));
  } catch (const std::invalid_argument& e) {
    troupe::fuzz::check_message(e.what());
  }
  try {
    std::string shard = wire::encode_tensor(wire::decode_tensor(bytes));
    if (shard != bytes) std::abort();
    if (auto refused = wire::update_in_place(shard, troupe::actors::update_op::add, bytes)) std::abort();  // a tensor always fits itself
  } catch (const std::invalid_argument& e) {
    troupe::fuzz::check_message(e.what());
  }
  return 0;
}
