#include "task_common.hpp"

#include "control_tls.hpp"

namespace troupe::actors {

std::string error_text(caf::actor_system& system, const caf::error& e) {
  if (e.context().match_elements<std::string>()) return e.context().get_as<std::string>(0);
  return system.render(e);
}

caf::error runtime_error(std::string text) { return caf::make_error(caf::sec::runtime_error, std::move(text)); }

std::string address_of(const std::string& host, std::uint16_t port) { return host + ":" + std::to_string(port); }

caf::error check_hello(const task_endpoint& t, const std::string& name, const caf::actor& pulse) {
  if (name != t.task) return runtime_error(address_of(t.host, t.port) + " is " + name.substr(0, 64) + ", not " + t.task);
  if (!pulse) return runtime_error(address_of(t.host, t.port) + " (" + t.task + ") answers no heartbeats");
  return {};
}

// Every connection of the cluster tasks, made or accepted, goes through a control gate
// (control_gate.hpp): with a token no byte is parsed before the peer proved it in the TLS
// handshake, the OpenSSL error queue is cleared before every session call (a stranger's failed
// handshake would otherwise make a healthy session's next read look fatal), unproven connections
// are bounded and refusals logged with the peer's address.
caf::expected<caf::actor> connect_to_task(caf::actor_system& system, const control_gate& gate, const std::string& host,
                                          std::uint16_t port, std::chrono::milliseconds wait) {
  return connect_bounded(system, gate.actor(), host, port, wait);
}

std::shared_ptr<control_credentials> make_credentials(caf::actor_system& system, const std::string& token) {
  if (token.empty()) return nullptr;
  auto c = std::make_shared<control_credentials>(token);
  c->install(system);
  return c;
}

std::optional<update_op> update_op_of(std::uint8_t byte) noexcept {
  switch (byte) {
    case static_cast<std::uint8_t>(update_op::assign): return update_op::assign;
    case static_cast<std::uint8_t>(update_op::add): return update_op::add;
    case static_cast<std::uint8_t>(update_op::subtract): return update_op::subtract;
    default: return std::nullopt;
  }
}

std::string unknown_update_op(std::uint8_t byte) {
  return "update operation " + std::to_string(byte) + " is unknown (expected 0 assign, 1 add or 2 subtract)";
}

}  // namespace troupe::actors
