#pragma once

// The rules every cluster stack of troupe shares (MultiWorkerMirroredStrategy's rendezvous and
// ring, and the tasks of ParameterServerStrategy: Server and ClusterCoordinator), so that the two
// read a cluster's addresses and decide when a token is needed the same way.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace troupe::distribute {
class ClusterSpec;
}

namespace troupe::distribute::detail {

/// A cluster address "host:port" or "[v6]:port" split into its host (brackets removed) and port.
/// The resolvers checked the addresses already; this still refuses a port that is not a decimal
/// number in 1..65535 with std::invalid_argument: "<who>: <what> address "<address>" needs a port
/// in 1..65535 after its last ':' (host:port)".
std::pair<std::string, std::uint16_t> split_host_port(const std::string& address, const std::string& who,
                                                      const std::string& what = "a task's");

/// Whether `host` (a name or a literal, without brackets) is this machine's loopback: "localhost",
/// 127.0.0.0/8 or ::1. Only such a cluster (or dashboard) may go without a token.
bool is_loopback(const std::string& host);

/// Every address of `spec`, job by job in its order (pending addresses included).
std::vector<std::string> cluster_addresses(const ClusterSpec& spec);

/// A cluster that spans more than loopback needs a token unless told insecure: without one its
/// control plane is plain CAF/BASP, and anyone who reaches a task's port could speak as a peer,
/// run its functions or rewrite its variables. Throws std::invalid_argument naming `who`, the first
/// address beyond loopback and both ways out (`insecure_field`: "ServerOptions::insecure", say).
/// Pending addresses are skipped.
void require_token(const std::vector<std::string>& addresses, const std::string& token, bool insecure,
                   const std::string& who, const std::string& insecure_field);

/// A task's full name: "/job:<job>/replica:0/task:<index>".
std::string task_name(const std::string& job, int index);

}  // namespace troupe::distribute::detail
