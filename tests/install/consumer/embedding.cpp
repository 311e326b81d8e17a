// An application with its own CAF actor system that embeds troupe (Runtime(caf::actor_system&)):
// troupe's replicas live in the application's system, a MultiWorkerMirroredStrategy rendezvouses
// through the application's middleman, and the application's own actor still answers afterwards.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <troupe/troupe.hpp>

using namespace troupe::distribute;

namespace {

// A port that was free a moment ago, for the one worker's rendezvous.
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw std::runtime_error("no free port on 127.0.0.1");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

caf::behavior doubler() {
  return {[](int x) { return 2 * x; }};
}

}  // namespace

int main() {
  try {
    caf::actor_system_config config;
    troupe::Runtime::configure(config);  // the middleman and troupe's message types
    caf::actor_system system{config};
    auto app_actor = system.spawn(doubler);
    {
      troupe::Runtime rt(system);
      MirroredStrategy mirrored(rt, {"CPU:0", "CPU:1"});
      auto sums = mirrored.run([] {
        return get_replica_context()->all_reduce(ReduceOp::sum, troupe::Tensor::scalar<int>(5));
      });
      std::cout << "mirrored in the application's system: " << mirrored.experimental_local_results(sums)[0].item<int>()
                << "\n";

      // One worker: the rendezvous still publishes its agent through the application's middleman.
      auto resolver = std::make_shared<SimpleClusterResolver>(
          ClusterSpec(ClusterSpec::JobMap{{"worker", {"127.0.0.1:" + std::to_string(free_port())}}}), "worker", 0);
      MultiWorkerMirroredStrategy multi(rt, {}, resolver);
      auto total = multi.run([] {
        return get_replica_context()->all_reduce(ReduceOp::sum, troupe::Tensor::scalar<int>(7));
      });
      std::cout << "multi-worker over " << multi.num_replicas_in_sync()
                << " replica(s): " << multi.experimental_local_results(total)[0].item<int>() << "\n";
    }
    caf::scoped_actor self{system};
    int answer = 0;
    bool failed = false;
    self->request(app_actor, std::chrono::seconds(10), 21)
        .receive([&](int y) { answer = y; },
                 [&](caf::error& e) {
                   std::cerr << "embedding: the application's actor did not answer: " << system.render(e) << "\n";
                   failed = true;
                 });
    if (failed) return 1;
    std::cout << "the application's actor answered " << answer << " after troupe ran\n";
    self->send_exit(app_actor, caf::exit_reason::user_shutdown);
    return answer == 42 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "embedding: " << e.what() << "\n";
    return 1;
  }
}
