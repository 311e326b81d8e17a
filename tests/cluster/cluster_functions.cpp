// The functions troupe's cluster tests run on their workers, as a module troupe-worker loads.
#include <chrono>
#include <stdexcept>
#include <thread>

#include "troupe/troupe.hpp"

using troupe::Tensor;
using troupe::distribute::FunctionContext;

TROUPE_MODULE(registry) {
  registry.add("empty", [](FunctionContext&) { return std::vector<Tensor>{}; });
  // arg0 + arg1, and the worker's task index (so a test sees where it ran).
  registry.add("add", [](FunctionContext& ctx) {
    const auto& t = ctx.task();
    const int index = std::stoi(t.substr(t.rfind(':') + 1));
    return std::vector<Tensor>{ctx.arg(0) + ctx.arg(1), Tensor::scalar<std::int32_t>(index)};
  });
  registry.add("fail", [](FunctionContext&) -> std::vector<Tensor> {
    throw std::runtime_error("the step diverged (loss is nan)");
  });
  // Sleeps arg0 milliseconds, then returns arg1: a closure that is in flight long enough to be
  // caught by a worker's death.
  registry.add("slow", [](FunctionContext& ctx) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ctx.arg(0).item<std::int32_t>()));
    return std::vector<Tensor>{ctx.arg(1)};
  });
  // Adds arg0 to variable "v" and returns the value it read before.
  registry.add("bump", [](FunctionContext& ctx) {
    Tensor before = ctx.read_variable("v");
    ctx.assign_add("v", ctx.arg(0));
    return std::vector<Tensor>{before};
  });
  // Adds arg0 to variable "w" (made in the strategy's scope on the chief) and returns its value.
  registry.add("bump_w", [](FunctionContext& ctx) {
    ctx.assign_add("w", ctx.arg(0));
    return std::vector<Tensor>{ctx.read_variable("w")};
  });
  // The next element of a per-worker iterator (arg0).
  registry.add("take", [](FunctionContext& ctx) { return std::vector<Tensor>{ctx.next(0)[0]}; });
  registry.add_dataset("counting", [] { return troupe::data::Dataset::range(1000); });
}
