#include "task_common.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

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

std::shared_ptr<control_credentials> make_credentials(caf::actor_system& system, const std::string& token,
                                                      const std::string& use) {
  if (token.empty()) return nullptr;
  return control_credentials::shared(system, token, use);
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

void encode_apply_params(const apply_params& p, unsigned char* out) noexcept {
  std::memset(out, 0, apply_params_bytes);
  out[0] = static_cast<unsigned char>(p.kind);
  out[1] = p.nesterov ? 1 : 0;
  const double values[6] = {p.learning_rate, p.momentum, p.beta_1, p.beta_2, p.epsilon, p.weight_decay};
  std::memcpy(out + 8, values, sizeof values);
}

std::optional<apply_params> decode_apply_params(const unsigned char* in, std::string* error) {
  auto fail = [&](std::string why) -> std::optional<apply_params> {
    if (error != nullptr) *error = "optimizer update: " + why;
    return std::nullopt;
  };
  if (in[0] > static_cast<unsigned char>(shard_optimizer::adamw)) {
    return fail("optimizer " + std::to_string(in[0]) + " is unknown (expected 0 sgd, 1 momentum, 2 adam or 3 adamw)");
  }
  if (in[1] > 1) return fail("nesterov byte " + std::to_string(in[1]) + " (expected 0 or 1)");
  for (int i = 2; i < 8; ++i) {
    if (in[i] != 0) return fail("reserved byte " + std::to_string(i) + " is " + std::to_string(in[i]) + " (expected 0)");
  }
  double values[6];
  std::memcpy(values, in + 8, sizeof values);
  apply_params p;
  p.kind = static_cast<shard_optimizer>(in[0]);
  p.nesterov = in[1] == 1;
  p.learning_rate = values[0];
  p.momentum = values[1];
  p.beta_1 = values[2];
  p.beta_2 = values[3];
  p.epsilon = values[4];
  p.weight_decay = values[5];
  const char* names[6] = {"learning_rate", "momentum", "beta_1", "beta_2", "epsilon", "weight_decay"};
  for (int i = 0; i < 6; ++i) {
    if (!std::isfinite(values[i]) || values[i] < 0) {
      return fail(std::string(names[i]) + " is " + std::to_string(values[i]) + " (expected a finite number >= 0)");
    }
  }
  if (p.momentum >= 1) return fail("momentum is " + std::to_string(p.momentum) + " (expected [0, 1))");
  if (p.beta_1 >= 1 || p.beta_2 >= 1) {
    return fail("beta_1 " + std::to_string(p.beta_1) + " and beta_2 " + std::to_string(p.beta_2) +
                " (expected each in [0, 1))");
  }
  return p;
}

int slot_count(shard_optimizer kind) noexcept {
  switch (kind) {
    case shard_optimizer::sgd: return 0;
    case shard_optimizer::momentum: return 1;
    case shard_optimizer::adam:
    case shard_optimizer::adamw: return 2;
  }
  return 0;
}

const char* shard_optimizer_name(shard_optimizer kind) noexcept {
  switch (kind) {
    case shard_optimizer::sgd: return "sgd";
    case shard_optimizer::momentum: return "momentum";
    case shard_optimizer::adam: return "adam";
    case shard_optimizer::adamw: return "adamw";
  }
  return "?";
}

namespace {

bool digits(const std::string& s, std::size_t from, std::size_t to) {
  if (from >= to || to > s.size() || to - from > 19) return false;
  for (std::size_t i = from; i < to; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return true;
}

// "<prefix><digits><mid><digits><suffix>" exactly, each number 1..19 digits.
bool two_numbers(const std::string& s, const std::string& prefix, const std::string& mid, const std::string& suffix) {
  if (s.size() < prefix.size() + mid.size() + suffix.size() + 2 || s.compare(0, prefix.size(), prefix) != 0 ||
      s.compare(s.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  const std::size_t end = s.size() - suffix.size();
  const std::size_t at = s.find(mid, prefix.size());
  return at != std::string::npos && at + mid.size() <= end && digits(s, prefix.size(), at) &&
         digits(s, at + mid.size(), end);
}

}  // namespace

std::string shard_file_name(int ps, int num_ps) {
  return "shard-" + std::to_string(ps) + "-of-" + std::to_string(num_ps) + ".ckpt";
}

std::optional<std::string> check_shard_checkpoint_target(const std::string& directory, const std::string& file) {
  const std::string shown = directory.substr(0, 200);
  if (directory.empty() || directory.size() > max_checkpoint_path_bytes || directory[0] != '/') {
    return "the checkpoint directory '" + shown + "' is not an absolute path of 1.." +
           std::to_string(max_checkpoint_path_bytes) + " bytes";
  }
  for (char c : directory) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return "the checkpoint directory '" + shown + "' holds a NUL or control character";
    }
  }
  std::string last;
  for (std::size_t at = 1; at <= directory.size();) {
    const std::size_t slash = std::min(directory.find('/', at), directory.size());
    const std::string part = directory.substr(at, slash - at);
    if (part == "." || part == "..") return "the checkpoint directory '" + shown + "' has a '" + part + "' component";
    if (!part.empty()) last = part;
    at = slash + 1;
  }
  const std::size_t tmp = last.find(".tmp-");
  if (tmp == std::string::npos || last.compare(0, 5, "ckpt-") != 0 || !digits(last, 5, tmp) ||
      !two_numbers(last.substr(tmp), ".tmp-", "-", "")) {
    return "the checkpoint directory '" + shown + "' is not a save in progress (its last component must be " +
           "ckpt-<step>.tmp-<pid>-<n>)";
  }
  if (file.size() > 64 || !two_numbers(file, "shard-", "-of-", ".ckpt")) {
    return "the shard file '" + file.substr(0, 64) + "' is not named shard-<i>-of-<n>.ckpt";
  }
  return std::nullopt;
}

}  // namespace troupe::actors
