// The chief's rendezvous rules (rendezvous_state) and a worker's check of the peer table
// (check_peer_table) driven by what peers send: a sequence of joins, heartbeats, goodbyes, closed
// connections and clock ticks, then a peer table, every value taken from the input. Nothing may
// throw; every refusal must be a rendezvous_error with a bounded message, and a table once
// accepted must hold no NUL in a host.
//
// rendezvous_state is linked alone, without the CAF agent in rendezvous.cpp: the token proof
// (hmac_sha256_hex there) is stood in for by a keyed function defined here, which the harness
// uses to make proofs that pass or fail as the input says.

#include <fuzzer/FuzzedDataProvider.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "troupe/actors/rendezvous_state.hpp"

namespace troupe::actors {
std::string hmac_sha256_hex(const std::string& key, const std::string& message) {
  std::uint64_t h = 1469598103934665603ULL;
  for (char c : key + '\x1f' + message) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return std::to_string(h);
}
}  // namespace troupe::actors

namespace {

using namespace troupe::actors;
using troupe::fuzz::check_message;

std::string task(int r) { return "/job:worker/replica:0/task:" + std::to_string(r); }

// Host-like text: mostly short, sometimes long, NULs and all.
std::string host_of(FuzzedDataProvider& in) { return in.ConsumeRandomLengthString(400); }

void check(const std::optional<rendezvous_error>& e) {
  if (e) check_message(e->message);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const int n = in.ConsumeIntegralInRange<int>(1, 6);
  const int self = in.ConsumeIntegralInRange<int>(0, n - 1);
  rendezvous_options o;
  o.rank = self;
  for (int r = 0; r < n; ++r) o.tasks.push_back(task(r));
  o.chief_host = "10.0.0.1";
  o.chief_port = 2222;
  o.devices = in.ConsumeIntegralInRange<int>(1, 4);
  o.data_host = "10.0.0." + std::to_string(self + 1);
  o.data_port = static_cast<std::uint16_t>(40000 + self);
  o.token = "token";
  o.timeout = std::chrono::milliseconds(1000);
  o.missed_heartbeats = in.ConsumeIntegralInRange<int>(1, 8);

  // The chief's side: what joining workers and, later, watched ones send.
  rendezvous_state chief(o);
  const auto t0 = rendezvous_state::clock::time_point{} + std::chrono::hours(1);
  auto now = t0;
  bool watching = false;
  const int steps = in.ConsumeIntegralInRange<int>(0, 32);
  for (int step = 0; step < steps && in.remaining_bytes() > 0; ++step) {
    switch (in.ConsumeIntegralInRange<int>(0, 6)) {
      case 0: {  // a join
        join_request j;
        j.version = in.ConsumeBool() ? o.version : in.ConsumeIntegral<std::uint32_t>();
        j.rank = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::int32_t>(0, n) : in.ConsumeIntegral<std::int32_t>();
        j.nonce = in.ConsumeRandomLengthString(64);
        if (in.ConsumeBool()) chief.add_nonce(j.nonce);
        j.proof = in.ConsumeBool() ? hmac_sha256_hex(o.token, j.nonce) : in.ConsumeRandomLengthString(64);
        j.devices = in.ConsumeBool() ? o.devices : in.ConsumeIntegral<std::int32_t>();
        j.data_host = host_of(in);
        j.data_port = in.ConsumeIntegral<std::uint16_t>();
        check(chief.join(j));
        break;
      }
      case 1:
        if (chief.complete() && !watching) {
          chief.start_watch(std::chrono::milliseconds(in.ConsumeIntegralInRange<int>(1, 1000)), now);
          watching = true;
        }
        break;
      case 2:
        if (watching) chief.on_beat(in.ConsumeIntegral<int>() % (n + 2), now);
        break;
      case 3:
        if (watching) chief.on_bye(in.ConsumeIntegral<int>() % (n + 2));
        break;
      case 4:
        if (watching) {
          if (auto v = chief.on_connection_closed(in.ConsumeIntegral<int>() % (n + 2))) check_message(v->reason);
        }
        break;
      case 5:
        now += std::chrono::milliseconds(in.ConsumeIntegralInRange<int>(0, 100'000));
        if (watching) {
          for (const auto& v : chief.check(now)) check_message(v.reason);
        }
        break;
      case 6:
        if (chief.expire() && chief.failure()) check_message(chief.failure()->message);
        break;
    }
  }

  // A worker's side: the peer table the chief sends.
  std::vector<member> table;
  const int entries = in.ConsumeIntegralInRange<int>(0, 8);
  for (int r = 0; r < entries; ++r) {
    member m;
    const bool honest = in.ConsumeBool();
    m.rank = honest ? r : in.ConsumeIntegral<int>();
    m.task = honest ? task(r) : in.ConsumeRandomLengthString(300);
    m.data_host = honest && r == self ? o.data_host : host_of(in);
    m.data_port = honest && r == self ? o.data_port : in.ConsumeIntegral<std::uint16_t>();
    m.devices = honest ? o.devices : in.ConsumeIntegral<int>();
    m.collective_id = in.ConsumeBool() ? std::string() : in.ConsumeRandomLengthString(2000);
    table.push_back(std::move(m));
  }
  const auto e = check_peer_table(o, table);
  if (e) {
    check_message(e->message);
  } else {
    for (const auto& m : table) {
      if (m.data_host.find('\0') != std::string::npos) std::abort();  // accepted a NUL in a host
    }
  }
  return 0;
}
