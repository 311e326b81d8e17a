#include <doctest/doctest.h>

#include <stdexcept>

#include "troupe/device.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using troupe::Device;

TEST_CASE("device short forms parse and print") {
  CHECK(Device::parse("CPU:0").to_string() == "CPU:0");
  CHECK(Device::parse("GPU:1").to_string() == "GPU:1");
  CHECK(Device::parse("gpu:3").index() == 3);
  CHECK(Device::parse("/cpu:2").to_string() == "CPU:2");
  CHECK(Device::parse("/device:GPU:0").is_gpu());
}

TEST_CASE("device long form keeps job, replica and task") {
  Device d = Device::parse("/job:worker/replica:0/task:1/device:CPU:0");
  REQUIRE(d.job());
  CHECK(*d.job() == "worker");
  CHECK(d.replica() == 0);
  CHECK(d.task() == 1);
  CHECK(d.to_string() == "/job:worker/replica:0/task:1/device:CPU:0");
  CHECK(Device::parse("/job:localhost/device:GPU:2").to_string() == "/job:localhost/device:GPU:2");
  CHECK(Device(Device::Type::gpu, 1).with_job("localhost", 0, 0).to_string() ==
        "/job:localhost/replica:0/task:0/device:GPU:1");
}

TEST_CASE("bad device specs are clear errors") {
  for (const char* bad : {"", "CPU", "TPU:0", "CPU:-1", "CPU:x", "/job:w/task:1", "/job:w/bogus:1/device:CPU:0",
                          "CPU:1x"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(Device::parse(bad), std::invalid_argument);
  }
  try {
    Device::parse("TPU:0");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("TPU") != std::string::npos);
    CHECK(std::string(e.what()).find("expected") != std::string::npos);
  }
}

TEST_CASE("devices compare by every field") {
  CHECK(Device::parse("CPU:0") == Device{});
  CHECK(Device::parse("CPU:0") != Device::parse("CPU:1"));
  CHECK(Device::parse("CPU:0") != Device::parse("/job:w/device:CPU:0"));
}

}  // namespace TROUPE_TEST_FILE
