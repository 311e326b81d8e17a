#include "distribute/cluster/cluster_net.hpp"

#include <stdexcept>

#include "troupe/base/parse_number.hpp"
#include "troupe/distribute/cluster_resolver.hpp"

namespace troupe::distribute::detail {

std::pair<std::string, std::uint16_t> split_host_port(const std::string& address, const std::string& who,
                                                      const std::string& what) {
  const auto colon = address.rfind(':');
  const auto port =
      colon == std::string::npos ? std::nullopt : base::parse_port(std::string_view(address).substr(colon + 1));
  if (!port) {
    throw std::invalid_argument(who + ": " + what + " address \"" + address.substr(0, 300) +
                                "\" needs a port in 1..65535 after its last ':' (host:port)");
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, static_cast<std::uint16_t>(*port)};
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::vector<std::string> cluster_addresses(const ClusterSpec& spec) {
  std::vector<std::string> out;
  for (const auto& job : spec.jobs()) {
    for (const auto& a : spec.task_addresses(job)) out.push_back(a);
  }
  return out;
}

void require_token(const std::vector<std::string>& addresses, const std::string& token, bool insecure,
                   const std::string& who, const std::string& insecure_field) {
  if (!token.empty() || insecure) return;
  for (const auto& a : addresses) {
    if (a == ClusterSpec::pending_address) continue;
    if (is_loopback(split_host_port(a, who).first)) continue;
    throw std::invalid_argument(who + ": the cluster spans more than loopback (" + a.substr(0, 300) +
                                ") and no cluster token is set: set the same secret in TROUPE_CLUSTER_TOKEN on every "
                                "task (troupe-launch sets one), or, on a trusted isolated network only, set "
                                "TROUPE_INSECURE=1 (" + insecure_field + ")");
  }
}

std::string task_name(const std::string& job, int index) {
  return "/job:" + job + "/replica:0/task:" + std::to_string(index);
}

}  // namespace troupe::distribute::detail
