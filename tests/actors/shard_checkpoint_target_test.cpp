#include <doctest/doctest.h>

#include <string>

#include "troupe/actors/cluster_tasks.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace troupe::actors;

namespace {

bool refused(const std::string& directory, const std::string& file, const std::string& part) {
  const auto why = check_shard_checkpoint_target(directory, file);
  return why && why->find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("a ps task writes a checkpoint's shard file only inside a save in progress, under its own name") {
  CHECK(shard_file_name(1, 3) == "shard-1-of-3.ckpt");
  CHECK_FALSE(check_shard_checkpoint_target("/data/run/ckpt-12.tmp-4242-0", "shard-0-of-2.ckpt"));
  CHECK_FALSE(check_shard_checkpoint_target("/ckpt-0.tmp-1-7/", "shard-10-of-12.ckpt"));
  // Not absolute, empty, too long, control characters.
  CHECK(refused("data/ckpt-1.tmp-1-0", "shard-0-of-1.ckpt", "not an absolute path"));
  CHECK(refused("", "shard-0-of-1.ckpt", "not an absolute path"));
  CHECK(refused("/" + std::string(5000, 'a') + "/ckpt-1.tmp-1-0", "shard-0-of-1.ckpt", "not an absolute path"));
  CHECK(refused(std::string("/d/ckpt-1.tmp-1-0\n/x"), "shard-0-of-1.ckpt", "control character"));
  CHECK(refused(std::string("/d/ckpt-1.tmp-1-0") + '\0', "shard-0-of-1.ckpt", "control character"));
  // Climbing out, or a directory that is no save in progress.
  CHECK(refused("/d/../etc/ckpt-1.tmp-1-0", "shard-0-of-1.ckpt", "'..' component"));
  CHECK(refused("/d/./ckpt-1.tmp-1-0", "shard-0-of-1.ckpt", "'.' component"));
  CHECK(refused("/etc", "shard-0-of-1.ckpt", "not a save in progress"));
  CHECK(refused("/d/ckpt-1", "shard-0-of-1.ckpt", "not a save in progress"));
  CHECK(refused("/d/ckpt-x.tmp-1-0", "shard-0-of-1.ckpt", "not a save in progress"));
  CHECK(refused("/d/ckpt-1.tmp-1-", "shard-0-of-1.ckpt", "not a save in progress"));
  CHECK(refused("/d/ckpt-1.tmp-1-0/..", "shard-0-of-1.ckpt", "'..' component"));
  // Any other file name.
  CHECK(refused("/d/ckpt-1.tmp-1-0", "../passwd", "not named shard-<i>-of-<n>.ckpt"));
  CHECK(refused("/d/ckpt-1.tmp-1-0", "shard-0-of-1.ckpt/x", "not named"));
  CHECK(refused("/d/ckpt-1.tmp-1-0", "shard-a-of-1.ckpt", "not named"));
  CHECK(refused("/d/ckpt-1.tmp-1-0", "manifest.json", "not named"));
  CHECK(refused("/d/ckpt-1.tmp-1-0", "", "not named"));
}

}  // namespace TROUPE_TEST_FILE
