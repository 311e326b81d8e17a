// The functions troupe's cluster tests run on their workers, as a module troupe-worker loads.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
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
  // The first call in the whole cluster sleeps arg0 milliseconds (it creates the file that
  // TROUPE_TEST_STALL_ONCE names, shared by the workers); every later one returns at once. Both
  // return arg1: a closure that stalls on one worker and runs quickly on another.
  registry.add("stall_once", [](FunctionContext& ctx) {
    const char* flag = std::getenv("TROUPE_TEST_STALL_ONCE");
    if (flag == nullptr) throw std::runtime_error("stall_once: TROUPE_TEST_STALL_ONCE is not set");
    if (std::FILE* f = std::fopen(flag, "wx")) {  // exclusive: one caller creates it
      std::fclose(f);
      std::this_thread::sleep_for(std::chrono::milliseconds(ctx.arg(0).item<std::int32_t>()));
    }
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
  // Variables "b<arg0>" of the bulk scenario: read one whole; update one (arg1: 0 assign, 1 add,
  // 2 subtract) with arg2.
  auto bulk_name = [](FunctionContext& ctx) { return "b" + std::to_string(ctx.arg(0).item<std::int32_t>()); };
  registry.add("read_var", [=](FunctionContext& ctx) { return std::vector<Tensor>{ctx.read_variable(bulk_name(ctx))}; });
  registry.add("update_var", [=](FunctionContext& ctx) {
    const auto op = ctx.arg(1).item<std::int32_t>();
    if (op == 0) ctx.assign(bulk_name(ctx), ctx.arg(2));
    if (op == 1) ctx.assign_add(bulk_name(ctx), ctx.arg(2));
    if (op == 2) ctx.assign_sub(bulk_name(ctx), ctx.arg(2));
    return std::vector<Tensor>{};
  });
  // Assigns arg2 + k to f64 variable b<arg0> for k = 1..arg1: every element of the variable the
  // same value after each update.
  registry.add("fill", [=](FunctionContext& ctx) {
    const auto name = bulk_name(ctx);
    for (int k = 1; k <= ctx.arg(1).item<std::int32_t>(); ++k) ctx.assign(name, ctx.arg(2) + static_cast<double>(k));
    return std::vector<Tensor>{};
  });
  // Reads f64 variable b<arg0> arg1 times while "fill" runs elsewhere; arg2 holds the first row of
  // each shard and the row count. Returns the reads in which a shard held two values (torn) and
  // the distinct values seen.
  registry.add("watch", [=](FunctionContext& ctx) {
    const auto name = bulk_name(ctx);
    const auto bounds = ctx.arg(2).to_vector<std::int64_t>();
    std::int64_t torn = 0;
    std::set<double> seen;
    for (int k = 0; k < ctx.arg(1).item<std::int32_t>(); ++k) {
      const Tensor t = ctx.read_variable(name);
      const auto v = t.to_vector<double>();
      const std::size_t row = v.size() / static_cast<std::size_t>(bounds.back());
      bool torn_here = false;
      for (std::size_t s = 0; s + 1 < bounds.size(); ++s) {
        const std::size_t first = static_cast<std::size_t>(bounds[s]) * row;
        const std::size_t end = static_cast<std::size_t>(bounds[s + 1]) * row;
        seen.insert(v[first]);
        for (std::size_t i = first; i < end; ++i) torn_here = torn_here || v[i] != v[first];
      }
      torn += torn_here ? 1 : 0;
    }
    return std::vector<Tensor>{Tensor::scalar<std::int64_t>(torn),
                               Tensor::scalar<std::int64_t>(static_cast<std::int64_t>(seen.size()))};
  });
  // The next element of a per-worker iterator (arg0).
  registry.add("take", [](FunctionContext& ctx) { return std::vector<Tensor>{ctx.next(0)[0]}; });
  registry.add_dataset("counting", [] { return troupe::data::Dataset::range(1000); });
}
