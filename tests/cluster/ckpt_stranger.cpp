// A stranger to a cluster of tasks, for run_cluster.sh: over plain CAF/BASP it reaches a ps task's
// agent and sends the checkpoint messages only the chief may send, each of which must be refused.
// Usage: ckpt_stranger HOST PORT CHECKPOINT_DIR
//   without a hello: a save of a shard file into CHECKPOINT_DIR, and a restore;
//   then, having said hello as a worker (/job:worker/replica:0/task:7): the same save, one into a
//   directory named as a save in progress is (CHECKPOINT_DIR/ckpt-999.tmp-1-0), saves that climb
//   out of CHECKPOINT_DIR with ".." (its parent, and "/tmp"), a directory and a file name of
//   16 MiB, and restores with a key of 16 MiB, 16 MiB of elements, and a key with "..".
// Prints "stranger: connected", then "stranger: refused: <error>" or "stranger: ACCEPTED: <what>"
// for each message, and "stranger: refused N of M" at the end. Exit status: 0 when every message
// was refused, 1 when one was accepted, 2 when the task could not be reached (what a cluster with
// a token does to a peer without it: "stranger: unreachable: <error>").
#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>
#include <thread>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "troupe/base/parse_number.hpp"

namespace {

using hello_atom = caf::atom_constant<caf::atom("hello")>;
using ckptsave_atom = caf::atom_constant<caf::atom("ckptsave")>;
using ckptload_atom = caf::atom_constant<caf::atom("ckptload")>;

constexpr std::size_t huge = 16u << 20;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: ckpt_stranger HOST PORT CHECKPOINT_DIR\n";
    return 2;
  }
  const std::string host = argv[1], dir = argv[3];
  const auto port = troupe::base::parse_port(argv[2]);
  if (!port) {
    std::cerr << "ckpt_stranger: PORT '" << argv[2] << "' is not a port (expected 1..65535)\n";
    return 2;
  }
  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  // The task listens before this starts; a few tries cover a slow start. A task with a token
  // refuses this plain connection every time.
  caf::expected<caf::actor> agent = caf::sec::cannot_connect_to_node;
  for (int i = 0; i < 20 && !agent; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    agent = sys.middleman().remote_actor(host, *port);
  }
  if (!agent) {
    std::cout << "stranger: unreachable: " << sys.render(agent.error()) << std::endl;
    return 2;
  }
  std::cout << "stranger: connected" << std::endl;
  caf::scoped_actor self{sys};
  int sent = 0, refused = 0;
  const auto outcome = [&](const std::string& what) {
    return std::make_pair([&, what](const caf::message&) { std::cout << "stranger: ACCEPTED: " << what << std::endl; },
                          [&](caf::error& e) {
                            ++refused;
                            std::cout << "stranger: refused: " << sys.render(e).substr(0, 300) << std::endl;
                          });
  };
  const auto save = [&](const std::string& directory, const std::string& file, const std::string& what) {
    ++sent;
    auto [ok, no] = outcome(what);
    self->request(*agent, std::chrono::seconds(20), ckptsave_atom::value, directory, file, std::int64_t{7})
        .receive(ok, no);
  };
  const auto load = [&](const std::string& key, const std::string& elements, const std::string& what) {
    ++sent;
    auto [ok, no] = outcome(what);
    self->request(*agent, std::chrono::seconds(20), ckptload_atom::value, key, elements, std::string(),
                  std::int64_t{0}, std::uint8_t{255})
        .receive(ok, no);
  };

  save(dir, "shard-0-of-1.ckpt", "a save without a hello");
  load("dense/kernel", std::string(16, '\0'), "a restore without a hello");

  bool greeted = false;
  self->request(*agent, std::chrono::seconds(20), hello_atom::value, std::string("/job:worker/replica:0/task:7"),
                caf::actor_cast<caf::actor>(self))
      .receive([&](const std::string&, const caf::actor&) { greeted = true; },
               [&](caf::error& e) { std::cout << "stranger: hello failed: " << sys.render(e) << std::endl; });
  if (!greeted) return 1;
  std::cout << "stranger: said hello as /job:worker/replica:0/task:7" << std::endl;

  save(dir, "shard-0-of-1.ckpt", "a save from a worker");
  save(dir + "/ckpt-999.tmp-1-0", "shard-0-of-1.ckpt", "a save into what a save in progress is named");
  save(dir + "/..", "escaped.ckpt", "a save into the checkpoint directory's parent");
  save(dir + "/../..", "../escaped-too.ckpt", "a save two levels up");
  save("/tmp", "../tmp/escaped-tmp.ckpt", "a save into /tmp");
  std::string climbing;
  while (climbing.size() < huge) climbing += "../";
  save(climbing, "escaped-huge.ckpt", "a save into a directory of 16 MiB of ../");
  save(dir, std::string(huge, 'f'), "a save of a file name of 16 MiB");
  load(std::string(huge, 'k'), std::string(16, '\0'), "a restore of a key of 16 MiB");
  load("dense/kernel", std::string(huge, '\x7f'), "a restore of 16 MiB of elements");
  load("../../dense/kernel", std::string(16, '\0'), "a restore of a key with ..");

  std::cout << "stranger: refused " << refused << " of " << sent << std::endl;
  return refused == sent ? 0 : 1;
}
