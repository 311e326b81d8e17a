#pragma once

// The bytes of remote function arguments and results, and of the variables' layout a chief sends
// its workers. Peers are untrusted until they proved the token, and a bug or a version skew can
// still send anything: every length, count, dtype and shape is checked against what remains of
// the buffer before it is used, and a bad value is std::invalid_argument naming it. Tensors
// travel as one contiguous block of their bytes (host order: troupe's hosts are little-endian).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/cluster_tasks.hpp"
#include "troupe/distribute/parameter_server_strategy.hpp"
#include "troupe/distribute/remote_function.hpp"

namespace troupe::distribute::detail {

/// Arguments of a call: tensors and per-worker iterators.
std::string encode_arguments(const std::vector<FunctionContext::Argument>& args);
std::vector<FunctionContext::Argument> decode_arguments(const std::string& bytes);

/// A function's results (an actor's message and reply too); `what` names them in an error.
std::string encode_tensors(const std::vector<Tensor>& tensors);
std::vector<Tensor> decode_tensors(const std::string& bytes, const char* what = "function results");

/// One tensor's bytes alone (a shard's value), with its dtype and shape checked on receipt.
std::string encode_tensor(const Tensor& t);
Tensor decode_tensor(const std::string& bytes);

/// A ps shard's update, applied to its encoded bytes in place: an error message when the update
/// does not fit the shard; malformed bytes throw std::invalid_argument.
std::optional<std::string> update_in_place(std::string& value, actors::update_op op, const std::string& delta);

/// The data connections' view of a shard (raw elements, no encoding): where the elements of an
/// encoded tensor lie (malformed bytes throw std::invalid_argument), a dtype's number on the
/// wire, and an update of raw elements applied in place (an error message for an unknown dtype).
std::optional<actors::shard_layout> shard_layout_of(const std::string& value);
std::uint8_t wire_dtype(DType t);
std::optional<std::string> combine_raw(char* value, const char* delta, std::size_t nbytes, std::uint8_t dtype,
                                       actors::update_op op);

/// An optimizer update of raw elements in place, on a ps task (task_handlers::apply): float32
/// and float64 shards (another dtype is an error message), nn::SGD's and nn::Adam's arithmetic
/// element by element (shard_optimizer.cpp).
std::optional<std::string> apply_raw(char* value, char* const* slots, const char* grad, std::size_t nbytes,
                                     std::uint8_t dtype, const actors::apply_params& p, std::int64_t step);

/// What a worker needs to reach the variables: the ps tasks and every variable's shards.
struct VariableTable {
  struct Ps {
    std::string task;
    std::string host;
    std::uint16_t port = 0;
  };
  std::vector<Ps> ps;
  std::vector<ShardedVariable> variables;
};
std::string encode_table(const VariableTable& table);
VariableTable decode_table(const std::string& bytes);

/// The rows [row, row + rows) of t along axis 0, and t's pieces joined along axis 0.
Tensor rows_of(const Tensor& t, std::int64_t row, std::int64_t rows);
Tensor join_rows(const std::vector<Tensor>& pieces, const Shape& shape, DType dtype);

}  // namespace troupe::distribute::detail
