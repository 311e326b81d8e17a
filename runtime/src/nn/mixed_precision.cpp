#include "troupe/nn/mixed_precision.hpp"

#include <atomic>
#include <stdexcept>

#include "troupe/base/quote.hpp"

namespace troupe::nn::mixed_precision {

namespace {

struct Known {
  const char* name;
  DType compute;
};
constexpr Known known[] = {{"float32", DType::f32}, {"mixed_float16", DType::f16}, {"mixed_bfloat16", DType::bf16}};

// Keras keeps its global policy per process; so does troupe. An index into `known`, atomic so
// that a read from a replica thread never races with a set.
std::atomic<int> global_index{0};

int index_of(std::string_view name) {
  std::string names;
  for (int i = 0; i < static_cast<int>(std::size(known)); ++i) {
    if (name == known[i].name) return i;
    names += (names.empty() ? "\"" : ", \"") + std::string(known[i].name) + "\"";
  }
  throw std::invalid_argument("mixed_precision::Policy: unknown policy " + base::quoted(name) + " (expected one of " +
                              names + ")");
}

}  // namespace

Policy::Policy(std::string_view name) {
  const Known& k = known[index_of(name)];
  name_ = k.name;
  compute_ = k.compute;
}

void set_global_policy(const Policy& policy) { global_index.store(index_of(policy.name()), std::memory_order_relaxed); }

void set_global_policy(std::string_view name) { global_index.store(index_of(name), std::memory_order_relaxed); }

Policy global_policy() { return Policy(known[global_index.load(std::memory_order_relaxed)].name); }

}  // namespace troupe::nn::mixed_precision
