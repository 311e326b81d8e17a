#pragma once

// The vocabulary shared by the parts of a cluster of tasks (cluster_tasks.hpp has the walkthrough):
// the control plane's credentials, a task's address, a call's reply, a shard's layout and the
// operations that update a shard.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace caf {
class actor_system;
}

namespace troupe::actors {

class control_credentials;

/// The control plane's TLS credentials from the cluster token, installed in `system` (nullptr for
/// an empty token: plain BASP). Every object below that talks to peers keeps the pointer, so the
/// files stay as long as one of them may open a session. One set per actor system: objects of the
/// same token on one system share it; another token while it lives is std::invalid_argument
/// naming `use` (the caller: "ActorCluster", "Server", ...) and the use that installed it
/// (control_credentials::shared). Throws std::runtime_error when OpenSSL or the file system
/// fails, std::invalid_argument when the system has no OpenSSL module.
std::shared_ptr<control_credentials> make_credentials(caf::actor_system& system, const std::string& token,
                                                      const std::string& use);

/// A task's address and its name for errors and logs.
struct task_endpoint {
  std::string task;  ///< "/job:worker/replica:0/task:1"
  std::string host;
  std::uint16_t port = 0;
};

/// What a call returns: the result's bytes, or the error's message.
struct call_reply {
  bool ok = false;
  std::string payload;
};

/// Where a shard's elements lie in its bytes (the runtime's encoding), for the data connections.
struct shard_layout {
  std::size_t offset = 0;  ///< the first element's byte
  std::size_t nbytes = 0;  ///< the elements' bytes
  std::uint8_t dtype = 0;  ///< the runtime's element type
  std::size_t rows = 1;    ///< rows along the first axis (1 for a scalar): gathers and scatters index them
};

/// How a ps shard is updated: its value is set to the update, or the update is added to it, or
/// subtracted from it. The byte values travel (in CAF messages and in the data connections'
/// request headers), so they never change; a byte from the network is read with update_op_of.
enum class update_op : std::uint8_t { assign = 0, add = 1, subtract = 2 };

/// The operation a byte from the network names, or nothing for a byte that names none.
std::optional<update_op> update_op_of(std::uint8_t byte) noexcept;
/// What a task says of an update byte that names no operation: the byte and the ones it knows.
std::string unknown_update_op(std::uint8_t byte);

/// The optimizers a ps task applies to its shards itself (the worker sends gradients, the shard's
/// slots stay beside it). The byte values travel in the data connections' request headers.
enum class shard_optimizer : std::uint8_t { sgd = 0, momentum = 1, adam = 2, adamw = 3 };

/// The hyperparameters of an optimizer update as they travel before the gradient's bytes: a fixed
/// block of apply_params_bytes (the kind and nesterov in the header's op byte and here).
struct apply_params {
  shard_optimizer kind = shard_optimizer::sgd;
  bool nesterov = false;
  double learning_rate = 0.0;
  double momentum = 0.0;  ///< momentum's
  double beta_1 = 0.9;    ///< adam's and adamw's
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  double weight_decay = 0.0;  ///< adamw's (decoupled: w -= learning_rate * weight_decay * w)
};
/// The size of an encoded apply_params.
constexpr std::size_t apply_params_bytes = 56;
/// Writes `p` to `out` (apply_params_bytes bytes, the host's byte order as every field here).
void encode_apply_params(const apply_params& p, unsigned char* out) noexcept;
/// Reads apply_params_bytes from `in`, or says what is wrong with them (an unknown kind, a
/// hyperparameter that is not finite or outside its range).
std::optional<apply_params> decode_apply_params(const unsigned char* in, std::string* error);
/// How many slots (zeros of the shard's size, kept beside it) a kind keeps: 0, 1 or 2.
int slot_count(shard_optimizer kind) noexcept;
/// Keras's name of a kind: "sgd", "momentum", "adam", "adamw".
const char* shard_optimizer_name(shard_optimizer kind) noexcept;

/// A shard as a sharded checkpoint saves it (its ps task takes it under the shard's lock, so an
/// update is in it whole or not at all): its elements, its optimizer's slots and how many
/// optimizer updates it has had (Adam's step t).
struct shard_snapshot {
  std::string key;
  shard_layout layout;
  std::shared_ptr<const std::string> value;  ///< the runtime's encoding; elements at layout.offset
  std::vector<std::string> slots;            ///< slot_count(*kind) of layout.nbytes each
  std::optional<shard_optimizer> kind;       ///< none before the first optimizer update
  std::int64_t applied = 0;
};

/// The longest directory path a save or restore request may name.
constexpr std::size_t max_checkpoint_path_bytes = 4096;
/// The file ps task `ps` of `num_ps` writes its shards to: "shard-<ps>-of-<num_ps>.ckpt".
std::string shard_file_name(int ps, int num_ps);
/// Why a save request's target is refused, or nothing: the directory must be an absolute path of
/// at most max_checkpoint_path_bytes without NUL or control characters, "." or ".." components,
/// whose last component is a save in progress ("ckpt-<step>.tmp-<pid>-<n>"), and the file a name
/// shard_file_name gives. A ps task writes nothing else, wherever a request points.
std::optional<std::string> check_shard_checkpoint_target(const std::string& directory, const std::string& file);

}  // namespace troupe::actors
