#pragma once
// The cluster troupe-launch starts: free ports on 127.0.0.1 (or the hosts of --hosts) and each
// worker's TF_CONFIG.

#include <optional>
#include <string>
#include <vector>

#include "launch/launch_options.hpp"

namespace troupe::launch {

/// The host every local worker listens on.
inline constexpr const char* local_host = "127.0.0.1";

/// Picks `count` distinct free TCP ports on 127.0.0.1: chosen by the kernel (bind to port 0) when
/// `base` is empty, else base, base+1, ... after checking that each can be bound and listened on.
/// Throws std::runtime_error naming the port that is in use or the call that failed.
std::vector<int> pick_free_ports(int count, std::optional<int> base);

/// "host:port" for every port, in order.
std::vector<std::string> worker_addresses(const std::vector<int>& ports);

/// "host:port" for every worker of --hosts, in order: the workers of a host take the ports
/// port_base, port_base+1, ... on it.
std::vector<std::string> host_addresses(const std::vector<host_slots>& hosts, int port_base);

/// TF_CONFIG for worker `index` of a cluster with one job, "worker", at `addresses`:
/// {"cluster": {"worker": ["127.0.0.1:p0", ...]}, "task": {"type": "worker", "index": i}}.
std::string tf_config_json(const std::vector<std::string>& addresses, int index);

/// TF_CONFIG for rank `rank` of a cluster with roles, the addresses in rank order: with `chief`,
/// rank 0 is the "chief"; the last `ps` ranks are "ps" tasks; the ranks between are "worker"s:
/// {"cluster": {"chief": [...], "worker": [...], "ps": [...]}, "task": {"type": "ps", "index": 0}}.
std::string tf_config_json(const std::vector<std::string>& addresses, int rank, bool chief, int ps);

}  // namespace troupe::launch
