#include "distribute/collectives/worker_group.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "axis.hpp"
#include "elements.hpp"
#include "distribute/collectives/collectives.hpp"
#include "flight_recorder.hpp"
#include "troupe/errors.hpp"
#include "troupe/kernels/half_kernels.hpp"

namespace troupe::distribute::detail {

Tensor LocalWorkerGroup::reduce(ReduceOp op, const std::vector<Tensor>& per_replica, CrossDeviceOps& local) {
  return local.reduce(op, per_replica, Device{});
}

Tensor LocalWorkerGroup::concat(const Tensor& local, int axis) {
  (void)axis;
  return local;
}

void WorkerFailures::report(const std::string& why, int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  verdicts_.push_back({rank, why});
  reported_.notify_all();
  if (ring_ != nullptr) ring_->shutdown();
}

std::string WorkerFailures::reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return verdicts_.empty() ? std::string() : verdicts_.front().second;
}

std::string WorkerFailures::await_reason(std::chrono::milliseconds wait) const {
  std::unique_lock<std::mutex> lock(mutex_);
  reported_.wait_for(lock, wait, [this] { return !verdicts_.empty(); });
  return verdicts_.empty() ? std::string() : verdicts_.front().second;
}

void WorkerFailures::attach(transport::tcp_ring* ring) {
  std::lock_guard<std::mutex> lock(mutex_);
  ring_ = ring;
  if (ring_ != nullptr && !verdicts_.empty()) ring_->shutdown();  // a verdict came first
}

int WorkerFailures::rank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return verdicts_.empty() ? -1 : verdicts_.front().first;
}

std::vector<std::pair<int, std::string>> WorkerFailures::verdicts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return verdicts_;
}

void WorkerFailures::forget(const std::vector<int>& ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<int, std::string>> kept;
  for (auto& v : verdicts_) {
    if (std::find(ranks.begin(), ranks.end(), v.first) == ranks.end()) kept.push_back(std::move(v));
  }
  verdicts_ = std::move(kept);
}

void WorkerFailures::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  verdicts_.clear();
}

namespace {

using troupe::detail::flight_collective;
using troupe::detail::flight_group;
using troupe::detail::flight_op;
using troupe::detail::flight_scope;
using troupe::detail::FlightRecorder;

// A cross-worker collective as the flight recorder keeps it: numbered as the ring's frames are.
flight_collective ring_entry(const transport::tcp_ring& ring, flight_op op, std::uint64_t bytes, int workers) {
  flight_collective c;
  c.step = ring.step();
  c.collective = static_cast<std::int64_t>(ring.next_collective());
  c.op = op;
  c.group = flight_group::workers;
  c.participants = workers;
  c.bytes = bytes;
  return c;
}

// The position a heartbeat carries: this worker waits in the collective `c` while it lives.
class on_position_board {
 public:
  on_position_board(actors::position_board& board, const flight_collective& c) noexcept : board_(board) {
    const auto op = c.op == flight_op::broadcast    ? actors::position_op::broadcast
                    : c.op == flight_op::all_gather ? actors::position_op::all_gather
                                                    : actors::position_op::all_reduce;
    board_.begin_collective(c.step, c.collective, op, c.has_dtype ? static_cast<int>(c.dtype) : -1, c.bytes);
  }
  ~on_position_board() { board_.end_collective(); }
  on_position_board(const on_position_board&) = delete;
  on_position_board& operator=(const on_position_board&) = delete;

 private:
  actors::position_board& board_;
};

// A fresh host tensor holding `t`'s elements, for the ring to work on in place (tensors that are
// shared must not change): a GPU tensor's copy to the host is fresh already.
Tensor host_copy(const Tensor& t) {
  if (t.is_gpu()) return t.to(Device());
  Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device());
  if (t.nbytes() > 0) std::memcpy(out.raw_mutable_data(), t.raw_data(), t.nbytes());
  return out;
}

}  // namespace

RingWorkerGroup::RingWorkerGroup(int rank, std::vector<actors::member> members,
                                 std::unique_ptr<transport::listener> listener, std::unique_ptr<transport::tcp_ring> ring,
                                 std::shared_ptr<WorkerFailures> failures, std::unique_ptr<actors::cluster_watch> watch,
                                 std::shared_ptr<actors::cluster_health> health,
                                 std::shared_ptr<actors::log_tail> log,
                                 std::shared_ptr<actors::position_board> position)
    : rank_(rank),
      members_(std::move(members)),
      listener_(std::move(listener)),
      ring_(std::move(ring)),
      failures_(failures ? std::move(failures) : std::make_shared<WorkerFailures>()),
      health_(health ? std::move(health) : std::make_shared<actors::cluster_health>()),
      log_(log ? std::move(log) : std::make_shared<actors::log_tail>()),
      position_(position ? std::move(position) : std::make_shared<actors::position_board>()),
      watch_(std::move(watch)) {
  failures_->attach(ring_.get());
  // The heartbeat reads where the ring waits; the ring outlives the watch (destroyed first).
  transport::tcp_ring* ring_ptr = ring_.get();
  position_->set_ring_probe([ring_ptr] {
    const auto v = ring_ptr->progress();
    return actors::ring_progress{v.peer, v.last, v.sent_next, v.received_prev};
  });
}

RingWorkerGroup::~RingWorkerGroup() {
  watch_.reset();  // no more verdicts
  position_->set_ring_probe(nullptr);
  failures_->attach(nullptr);
}

void RingWorkerGroup::reform(int rank, std::vector<actors::member> members, std::uint64_t generation,
                             const transport::ring_auth& auth, std::chrono::milliseconds timeout) {
  const int workers = static_cast<int>(members.size());
  if (rank < 0 || rank >= workers) {
    throw std::invalid_argument("RingWorkerGroup::reform: rank " + std::to_string(rank) + " outside the " +
                                std::to_string(workers) + " members (expected 0.." + std::to_string(workers - 1) + ")");
  }
  if (generation <= generation_) {
    throw std::invalid_argument("RingWorkerGroup::reform: generation " + std::to_string(generation) +
                                " is not after the ring's " + std::to_string(generation_));
  }
  if (!listener_) throw std::logic_error("RingWorkerGroup::reform: the group keeps no listener to re-form on");
  // The old ring first: its sockets close, so a peer still blocked in it fails at once.
  failures_->attach(nullptr);
  position_->set_ring_probe(nullptr);
  const transport::tcp_ring_options old = ring().options();
  ring_.reset();
  failures_->clear();
  members_ = std::move(members);
  rank_ = rank;
  generation_ = generation;
  std::vector<transport::endpoint> peers;
  for (const auto& m : members_) peers.push_back({m.data_host, m.data_port});
  transport::tcp_ring_options options;
  options.segment_bytes = old.segment_bytes;
  options.spin = old.spin;
  options.yield_while_spinning = old.yield_while_spinning;
  options.timeout = timeout;
  options.auth = auth;
  try {
    ring_ = std::make_unique<transport::tcp_ring>(rank_, workers, *listener_, peers, options);
  } catch (const transport::peer_error& e) {
    throw CollectiveAborted("elastic membership: the ring of generation " + std::to_string(generation) +
                            " did not form: " + describe_collective_failure(e, members_, *failures_));
  }
  ring_->set_timeout(old.timeout);
  // The survivors may have run different numbers of steps (one may have finished the step the
  // others failed in): each generation numbers its ring's steps afresh.
  steps_ = 0;
  ring_->begin_step(steps_);
  failures_->attach(ring_.get());
  transport::tcp_ring* ring_ptr = ring_.get();
  position_->set_ring_probe([ring_ptr] {
    const auto v = ring_ptr->progress();
    return actors::ring_progress{v.peer, v.last, v.sent_next, v.received_prev};
  });
  if (auto* recorder = FlightRecorder::process()) {
    recorder->set_identity(rank_, workers, members_[static_cast<std::size_t>(rank_)].task);
  }
}

void RingWorkerGroup::leave() {
  left_ = true;
  watch_.reset();  // its goodbye reaches the chief before the connection closes
  position_->set_ring_probe(nullptr);
  failures_->attach(nullptr);
}

transport::tcp_ring& RingWorkerGroup::ring() const {
  if (left_) {
    throw CollectiveAborted("cross-worker collective: this worker left the elastic cluster at a step boundary (it was "
                            "asked to leave), so it runs no more collectives");
  }
  if (joining_) {
    throw std::logic_error(
        "cross-worker collective: this worker joins a running elastic cluster and runs no collective before Model::fit "
        "has received the cluster's state (create the model and its optimizer, then call fit)");
  }
  if (!ring_) {
    throw CollectiveAborted("cross-worker collective: the ring of generation " + std::to_string(generation_) +
                            " did not form, so this worker cannot go on (the restart path)");
  }
  return *ring_;
}

Tensor RingWorkerGroup::reduce(ReduceOp op, const std::vector<Tensor>& per_replica, CrossDeviceOps& local) {
  Tensor total = sum(local.reduce(ReduceOp::sum, per_replica, Device{}));
  if (op == ReduceOp::sum) return total;
  return total / Scalar(static_cast<std::int64_t>(per_replica.size()) * size());
}

Tensor RingWorkerGroup::sum(const Tensor& t) {
  Tensor out = host_copy(t);
  all_reduce_in_place(out);
  return out.to(t.device());
}

Tensor RingWorkerGroup::broadcast_from_chief(const Tensor& t) {
  // A joiner's variables are created before the cluster's state reaches it (which overwrites
  // them): their initial values stay its own.
  if (joining_) return t;
  Tensor out = host_copy(t);
  flight_collective what = ring_entry(ring(), flight_op::broadcast, out.nbytes(), size());
  what.has_dtype = true;
  what.dtype = troupe::detail::to_scalar_type(t.dtype());
  flight_scope recorded(FlightRecorder::process(), what);
  const on_position_board waiting(*position_, what);
  try {
    ring().broadcast(out.raw_mutable_data(), out.nbytes(), 0);
  } catch (const transport::peer_error& e) {
    recorded.fail(e.peer());
    fail(e);
  }
  recorded.done();
  return out.to(t.device());
}

void RingWorkerGroup::all_reduce_in_place(Tensor& t, Compression compression) {
  const bool compressed = compression != Compression::none && t.dtype() == DType::f32;
  const auto wire = compression == Compression::fp16 ? base::scalar_type::f16 : base::scalar_type::bf16;
  flight_collective what = ring_entry(ring(), flight_op::all_reduce, 0, size());
  what.has_dtype = true;
  what.dtype = compressed ? wire : troupe::detail::to_scalar_type(t.dtype());
  what.bytes = static_cast<std::uint64_t>(t.num_elements()) * base::scalar_size(what.dtype);  // on the wire
  flight_scope recorded(FlightRecorder::process(), what);
  const on_position_board waiting(*position_, what);
  try {
    if (compressed) {
      const std::int64_t n = t.num_elements();
      wire_.resize(static_cast<std::size_t>(n));
      auto* values = static_cast<float*>(t.raw_mutable_data());
      kernels::compress_range(values, wire_.data(), n, wire);
      ring().all_reduce(wire_.data(), n, wire, base::reduce_kind::sum);
      kernels::decompress_range(wire_.data(), values, n, wire);
    } else if (t.dtype() == DType::f16 || t.dtype() == DType::bf16) {
      // Summed in float32 and rounded once: a 16-bit partial sum per hop would lose bits.
      Tensor wide = t.cast(DType::f32);
      ring().all_reduce(wide.raw_mutable_data(), wide.num_elements(), base::scalar_type::f32, base::reduce_kind::sum);
      kernels::compress_range(wide.data<float>(), static_cast<std::uint16_t*>(t.raw_mutable_data()), t.num_elements(),
                              troupe::detail::to_scalar_type(t.dtype()));
    } else {
      ring().all_reduce(t.raw_mutable_data(), t.num_elements(), troupe::detail::to_scalar_type(t.dtype()),
                        base::reduce_kind::sum);
    }
  } catch (const transport::peer_error& e) {
    recorded.fail(e.peer());
    fail(e);
  }
  recorded.done();
}

void RingWorkerGroup::all_gather(const void* mine, std::size_t my_bytes, void* out,
                                 const std::vector<std::size_t>& bytes) {
  std::uint64_t total = 0;
  for (std::size_t b : bytes) total += b;
  const flight_collective what = ring_entry(ring(), flight_op::all_gather, total, size());
  flight_scope recorded(FlightRecorder::process(), what);
  const on_position_board waiting(*position_, what);
  try {
    ring().all_gather(mine, my_bytes, out, bytes);
  } catch (const transport::peer_error& e) {
    recorded.fail(e.peer());
    fail(e);
  }
  recorded.done();
}

namespace {
// How long a fault report waits for the chief to pass it on, and a worker whose ring broke for
// the verdict that explains it. Failure paths only.
constexpr std::chrono::milliseconds fault_report_wait{1000};
constexpr std::chrono::milliseconds verdict_wait{500};
}  // namespace

void RingWorkerGroup::fail(const transport::peer_error& e) {
  if (!e.for_everyone().empty() && watch_) {
    watch_->report_fault(describe_fault_report(e, members_, rank_), fault_report_wait);
  } else if (watch_) {
    failures_->await_reason(verdict_wait);
  }
  std::string message = describe_collective_failure(e, members_, *failures_);
  // The last collectives and steps of this worker, for the cluster's post-mortem (docs/diagnosis.md).
  if (FlightRecorder* recorder = FlightRecorder::process()) {
    const std::string path = recorder->dump_on_failure(message);
    if (!path.empty()) message += " (flight recorder: " + path + ")";
  }
  health_->collective_error(message, actors::cluster_health::clock::now());
  throw CollectiveAborted(std::move(message));
}

std::string describe_fault_report(const transport::peer_error& e, const std::vector<actors::member>& members, int rank) {
  auto name = [&](int r) {
    if (r < 0 || static_cast<std::size_t>(r) >= members.size()) return "rank " + std::to_string(r);
    return members[static_cast<std::size_t>(r)].task + " (rank " + std::to_string(r) + ")";
  };
  if (e.kind() == transport::peer_error::fault::altered) {
    return name(rank) + " found the ring link from " + name(e.peer()) + " tampered with: " + e.for_everyone();
  }
  return name(rank) + " found the workers out of step: " + e.for_everyone();
}

std::string describe_collective_failure(const transport::peer_error& e, const std::vector<actors::member>& members,
                                        const WorkerFailures& failures) {
  std::string who = "worker " + std::to_string(e.peer());
  if (e.peer() >= 0 && static_cast<std::size_t>(e.peer()) < members.size()) {
    const auto& m = members[static_cast<std::size_t>(e.peer())];
    who = m.task + " (" + m.data_host + ":" + std::to_string(m.data_port) + ")";
  }
  std::string out = std::string("cross-worker collective failed: ") + e.what() + " [peer " + who + "]";
  // Often the cause of the broken ring (a worker that stopped or vanished), sometimes only a
  // consequence (the chief left).
  const std::string known = failures.reason();
  if (!known.empty()) out += "; cluster watch: " + known;
  return out;
}

// The workers first learn each other's dtype and shape (an all-gather of one row each) and check
// that only `axis` differs, then all-gather their elements and join the parts.
Tensor RingWorkerGroup::concat(const Tensor& t_in, int axis) {
  const Tensor t = t_in.to(Device());  // the ring works on host memory
  const int workers = size();
  constexpr int max_rank = 8;
  constexpr int cols = 2 + max_rank;
  if (t.rank() < 1 || t.rank() > max_rank) {
    throw std::invalid_argument("gather across workers: tensors of rank 1.." + std::to_string(max_rank) +
                                ", got rank " + std::to_string(t.rank()));
  }
  std::int64_t row[cols] = {};
  row[0] = static_cast<std::int64_t>(t.dtype()) + 1;
  row[1] = t.rank();
  for (int d = 0; d < t.rank(); ++d) row[2 + d] = t.shape()[static_cast<std::size_t>(d)];
  Tensor table = Tensor::empty({workers, cols}, DType::i64);
  all_gather(row, sizeof row, table.raw_mutable_data(), std::vector<std::size_t>(static_cast<std::size_t>(workers), sizeof row));
  const auto* all = table.data<std::int64_t>();
  std::vector<Shape> shapes(static_cast<std::size_t>(workers));
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(workers) + 1, 0);
  const std::string& me = members_[static_cast<std::size_t>(rank_)].task;
  for (int w = 0; w < workers; ++w) {
    // Every row but this worker's came from the network: its dtype code, rank and sizes are checked
    // before they mean anything.
    const auto* r = all + w * cols;
    const std::string& who = members_[static_cast<std::size_t>(w)].task;
    if (r[0] < 1 || r[0] > 4 || r[1] < 1 || r[1] > max_rank) {
      throw std::runtime_error("gather across workers: " + who + " sent a malformed description of its tensor (dtype code " +
                               std::to_string(r[0]) + ", rank " + std::to_string(r[1]) + ")");
    }
    Shape& shape = shapes[static_cast<std::size_t>(w)];
    shape.assign(r + 2, r + 2 + r[1]);
    for (std::int64_t d : shape) {
      if (d < 0) {
        throw std::runtime_error("gather across workers: " + who + " sent a negative size in shape " +
                                 shape_to_string(shape));
      }
    }
    base::check_agree("gather across workers", troupe::detail::sent(me, t),
                      base::sent_tensor{who, static_cast<base::scalar_type>(r[0] - 1), shape}, axis,
                      "; only the size of axis " + std::to_string(axis) + " may differ");
    // The sizes came from a peer: their product, and the running total, are checked for overflow.
    std::int64_t n = 0;
    try {
      n = shape_num_elements(shape);
    } catch (const std::invalid_argument&) {
      throw std::runtime_error("gather across workers: " + who + " sent shape " + shape_to_string(shape) +
                               ", whose element count overflows 64 bits");
    }
    if (__builtin_add_overflow(offsets[static_cast<std::size_t>(w)], n, &offsets[static_cast<std::size_t>(w) + 1])) {
      throw std::runtime_error("gather across workers: with " + who + "'s shape " + shape_to_string(shape) +
                               " the workers' tensors have more elements together than 64 bits count");
    }
  }
  std::vector<std::size_t> bytes(static_cast<std::size_t>(workers));
  for (std::size_t w = 0; w < bytes.size(); ++w) {
    bytes[w] = static_cast<std::size_t>(offsets[w + 1] - offsets[w]) * dtype_size(t.dtype());
  }
  Tensor flat = Tensor::empty({offsets.back()}, t.dtype());
  all_gather(t.raw_data(), t.nbytes(), flat.raw_mutable_data(), bytes);
  std::vector<Tensor> parts;
  parts.reserve(shapes.size());
  for (std::size_t w = 0; w < shapes.size(); ++w) {
    parts.push_back(flat.slice(offsets[w], offsets[w + 1]).reshape(shapes[w]));
  }
  return troupe::concat(parts, axis).to(t_in.device());
}

}  // namespace troupe::distribute::detail
