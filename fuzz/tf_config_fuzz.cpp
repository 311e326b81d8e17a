// The TF_CONFIG parser (TFConfigClusterResolver) over arbitrary text, and, for what it accepts,
// the cluster spec's accessors. Refusals must be std::invalid_argument or std::out_of_range with a
// bounded message; an accepted config must name a task of its own cluster.
//
// The parser is linked alone (runtime/src/distribute/cluster/cluster_resolver.cpp), without the runtime's
// actor system: Runtime::gpu_count, which only num_accelerators() asks, is defined here.

#include <cstdint>
#include <stdexcept>
#include <string>

#include "fuzz_util.hpp"
#include "troupe/distribute/cluster_resolver.hpp"
#include "troupe/runtime.hpp"

int troupe::Runtime::gpu_count() { return 0; }

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace troupe::distribute;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    TFConfigClusterResolver r(text);
    const ClusterSpec spec = r.cluster_spec();
    const std::string type = r.task_type();
    if (type != "evaluator" || spec.has_job("evaluator")) {
      const std::string& address = spec.task_address(type, r.task_id());
      if (address.find('\0') != std::string::npos) std::abort();  // a NUL in an accepted host
    }
    for (const auto& job : spec.jobs()) {
      for (const auto& a : spec.task_addresses(job)) {
        if (a.find('\0') != std::string::npos) std::abort();
      }
    }
    (void)spec.as_json();
    if (spec.has_job("chief") || spec.has_job("worker")) (void)r.coordinator_address();
    (void)r.master();
  } catch (const std::invalid_argument& e) {
    troupe::fuzz::check_message(e.what());
  } catch (const std::out_of_range& e) {
    troupe::fuzz::check_message(e.what());
  }
  return 0;
}
