// The actor types troupe's actor tests spawn, as a module troupe-worker loads (and the test's
// spawner loads too, for its local actors).
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <thread>

#include "troupe/troupe.hpp"

using troupe::Tensor;
namespace td = troupe::distribute;

namespace {

// A running sum of float32 tensors of one shape, started from its constructor argument.
//   add(t) -> [sum]; get() -> [sum, task index or -1]; echo(ts...) -> ts; fail() -> error;
//   sleep(ms) -> [] after ms milliseconds (saying so first on stdout).
class Accumulator : public td::Actor {
 public:
  Accumulator(Tensor initial, int index) : sum_(std::move(initial)), index_(index) {}
  std::vector<Tensor> receive(const std::string& name, const std::vector<Tensor>& tensors) override {
    if (name == "add") {
      if (tensors.size() != 1) throw std::invalid_argument("add takes 1 tensor, got " + std::to_string(tensors.size()));
      sum_ = sum_ + tensors[0];
      return {sum_};
    }
    if (name == "get") return {sum_, Tensor::scalar<std::int32_t>(index_)};
    if (name == "echo") return tensors;
    if (name == "fail") throw std::runtime_error("the trial diverged (loss is nan)");
    if (name == "sleep") {
      // Said first, so that a script can act while the request is in flight.
      std::cout << "accumulator " << index_ << ": sleeping " << tensors.at(0).item<std::int32_t>() << " ms" << std::endl;
      std::this_thread::sleep_for(std::chrono::milliseconds(tensors.at(0).item<std::int32_t>()));
      return {};
    }
    throw std::invalid_argument("accumulator: no message " + name);
  }

 private:
  Tensor sum_;
  int index_;
};

}  // namespace

TROUPE_MODULE(registry) {
  // TROUPE_TEST_TASK_INDEX (the test sets it per daemon) lets a reply say where it ran.
  registry.add_actor("accumulator", [](const std::vector<Tensor>& args) -> std::unique_ptr<td::Actor> {
    // A second argument, an int32 of milliseconds, makes the construction that slow (a restart
    // that takes a while, for the tests that act during one).
    if (args.size() != 1 && args.size() != 2) {
      throw std::invalid_argument("accumulator takes its initial sum, 1 tensor (and a construction delay in ms)");
    }
    if (args.size() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(args[1].item<std::int32_t>()));
    const char* index = std::getenv("TROUPE_TEST_TASK_INDEX");
    int where = -1;
    if (index != nullptr) where = *index == '1' ? 1 : 0;
    return std::make_unique<Accumulator>(args[0], where);
  });
}
