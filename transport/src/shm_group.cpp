#include "troupe/transport/shm_group.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <sstream>

#include "troupe/kernels/reduce_kernels.hpp"
#include "troupe/transport/spin.hpp"

namespace troupe::transport {
namespace {

void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected, std::chrono::microseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000000) * 1000);
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

base::sent_tensor sent(const std::string& who, const buffer& b) { return base::sent_tensor{who, b.type, b.shape}; }

// Element boundaries of rank r's share of a fused reduce-scatter, on 64-byte multiples.
std::int64_t share_begin(std::int64_t total, int rank, int size) {
  if (rank >= size) return total;
  std::int64_t b = total * rank / size;
  b -= b % 16;
  return rank == 0 ? 0 : b;
}

// The L3 cache this CPU shares, from sysfs (glibc's sysconf reports the whole package on some
// VMs); 32 MiB when sysfs does not say.
std::size_t last_level_cache_bytes() {
  static const std::size_t bytes = [] {
    std::size_t kib = 0;
    if (FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {
      if (std::fscanf(f, "%zuK", &kib) != 1) kib = 0;
      std::fclose(f);
    }
    return kib > 0 ? kib * 1024 : std::size_t{32} << 20;
  }();
  return bytes;
}

thread_local std::vector<const void*> tl_ins;
thread_local std::vector<void*> tl_outs;

int checked_size(int size) {
  if (size < 1) throw std::invalid_argument("shm_group: size must be at least 1, got " + std::to_string(size));
  return size;
}
}  // namespace

shm_group::shm_group(int size, std::chrono::microseconds spin, std::chrono::milliseconds timeout)
    : size_(checked_size(size)), spin_(spin), timeout_(timeout), round_(static_cast<std::size_t>(size), 0),
      arrivals_(new std::atomic<std::uint64_t>[static_cast<std::size_t>(size)]),
      slots_(2 * static_cast<std::size_t>(size)), pause_spins_(pause_spins_for(size)) {
  for (int r = 0; r < size; ++r) arrivals_[r].store(0, std::memory_order_relaxed);
}

shm_group::~shm_group() = default;

shm_group::slot& shm_group::post(int rank, collective_kind kind, const buffer* buffers, std::size_t count) {
  const std::uint64_t parity = round_[rank]++ & 1;
  slot& s = slots_[parity * size_ + rank];
  s.kind = kind;
  s.buffers.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    buffer& b = s.buffers[i];
    b.in = buffers[i].in;
    b.out = buffers[i].out;
    b.count = buffers[i].count;
    b.type = buffers[i].type;
    b.shape.assign(buffers[i].shape.begin(), buffers[i].shape.end());
    b.keepalive = buffers[i].keepalive;
  }
  return s;
}

std::string shm_group::missing_ranks(std::uint64_t arrivals) const {
  std::string out;
  for (int r = 0; r < size_; ++r) {
    if (arrivals_[r].load(std::memory_order_acquire) < arrivals) {
      if (!out.empty()) out += ", ";
      out += std::to_string(r);
    }
  }
  return out;
}

void shm_group::throw_aborted(const char* what) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    reason = abort_reason_;
  }
  if (reason.empty()) {
    const int r = finished_first_.load(std::memory_order_acquire);
    reason = "replica " + std::to_string(r) +
             " returned from its function without joining it (every replica must call the same"
             " collectives in the same order)";
  }
  throw aborted_error(std::string(what) + " abandoned: " + reason);
}

void shm_group::arrive_and_wait(int rank, const char* what) {
  if (aborted_.load(std::memory_order_acquire)) throw_aborted(what);
  const std::uint32_t gen = generation_.load(std::memory_order_acquire);
  const std::uint64_t mine = arrivals_[rank].fetch_add(1, std::memory_order_acq_rel) + 1;
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint32_t>(size_)) {
    arrived_.store(0, std::memory_order_relaxed);
    generation_.store(gen + 1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(&generation_);
    return;
  }
  auto passed = [&] { return generation_.load(std::memory_order_acquire) != gen; };
  auto stopped = [&] {
    return aborted_.load(std::memory_order_acquire) || finished_first_.load(std::memory_order_acquire) >= 0;
  };
  if (!spin_until([&] { return passed() || stopped(); }, spin_, pause_spins_)) {
    const auto start = std::chrono::steady_clock::now();
    while (!passed() && !stopped()) {
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      if (!passed()) futex_wait(&generation_, gen, std::chrono::microseconds{2000});
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      if (timeout_.count() > 0 && !passed() && std::chrono::steady_clock::now() - start > timeout_) {
        abort(rank, "timed out after " + std::to_string(timeout_.count()) +
                        " ms waiting for replicas " + missing_ranks(mine));
      }
    }
  }
  if (passed()) return;
  throw_aborted(what);
}

namespace {

// Builds the message only when there is a mismatch: a stream costs more than the check itself.
template <class... Parts>
[[noreturn]] void mismatch(const Parts&... parts) {
  std::ostringstream err;
  (err << ... << parts);
  throw std::invalid_argument(err.str());
}

}  // namespace

void shm_group::check_slots(int rank, const char* what) const {
  const std::uint64_t parity = (round_[rank] - 1) & 1;  // every rank is in the same round here
  const slot& first = slots_[parity * size_];
  for (int r = 1; r < size_; ++r) {
    const slot& s = slots_[parity * size_ + r];
    if (s.kind != first.kind) {
      mismatch("collective mismatch: replica 0 called ", collective_name(first.kind), ", replica ", r, " called ",
               collective_name(s.kind));
    }
    if (s.kind == collective_kind::all_reduce) {
      if (s.op != first.op) {
        mismatch(what, ": replica 0 asked for ", base::reduce_name(first.op), ", replica ", r, " for ",
                 base::reduce_name(s.op));
      }
      if (s.buffers.size() != first.buffers.size()) {
        mismatch(what, ": replica 0 sent ", first.buffers.size(), " tensors, replica ", r, " sent ", s.buffers.size());
      }
      const std::string other = "replica " + std::to_string(r);
      for (std::size_t i = 0; i < s.buffers.size(); ++i) {
        base::check_agree(what, sent("replica 0", first.buffers[i]), sent(other, s.buffers[i]), -1,
                          first.buffers.size() > 1
                              ? " (tensor " + std::to_string(i) + " of " + std::to_string(first.buffers.size()) + ")"
                              : std::string());
      }
    } else if (s.kind == collective_kind::all_gather) {
      if (s.axis != first.axis) {
        mismatch(what, ": replica 0 gathers along axis ", first.axis, ", replica ", r, " along axis ", s.axis);
      }
      base::check_agree(what, sent("replica 0", first.buffers.at(0)), sent("replica " + std::to_string(r), s.buffers.at(0)),
                        first.axis, "; only the size along the gather axis may differ");
    }
  }
}

void shm_group::all_reduce(int rank, const buffer* buffers, std::size_t count, reduce_kind op, bool shared_output) {
  const char* what = "all_reduce";
  post(rank, collective_kind::all_reduce, buffers, count).op = op;
  arrive_and_wait(rank, what);
  check_slots(rank, what);

  const std::uint64_t parity = (round_[rank] - 1) & 1;
  const slot* row = &slots_[parity * size_];
  const std::size_t nbuf = row[0].buffers.size();
  std::int64_t total = 0;
  std::size_t total_bytes = 0;
  for (const buffer& b : row[0].buffers) {
    total += b.count;
    total_bytes += static_cast<std::size_t>(b.count) * scalar_size(b.type);
  }
  const bool small = !fused(total_bytes, size_);
  const int num_outs = shared_output ? 1 : size_;  // the fused path's outputs
  // Inputs and outputs that overflow the last-level cache go to memory anyway: write the outputs
  // around the cache then. Ones that fit stay cached for whoever reads them next.
  const bool streaming =
      !small && (static_cast<std::size_t>(size_) + static_cast<std::size_t>(num_outs)) * total_bytes > last_level_cache_bytes();
  const std::int64_t lo = small ? 0 : share_begin(total, rank, size_);
  const std::int64_t hi = small ? total : share_begin(total, rank + 1, size_);

  tl_ins.resize(static_cast<std::size_t>(size_));
  tl_outs.resize(static_cast<std::size_t>(size_));
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < nbuf && offset < hi; ++i) {
    const buffer& b0 = row[0].buffers[i];
    const std::int64_t seg_lo = std::max(lo, offset) - offset;
    const std::int64_t seg_hi = std::min(hi, offset + b0.count) - offset;
    if (seg_lo < seg_hi) {
      for (int r = 0; r < size_; ++r) {
        tl_ins[r] = row[r].buffers[i].in;
        tl_outs[r] = row[r].buffers[i].out;
      }
      if (small) {
        void* out = row[rank].buffers[i].out;
        kernels::reduce_range(tl_ins.data(), size_, &out, 1, seg_lo, seg_hi, b0.type, op);
      } else {
        kernels::reduce_range(tl_ins.data(), size_, tl_outs.data(), num_outs, seg_lo, seg_hi, b0.type, op, streaming);
      }
    }
    offset += b0.count;
  }
  if (!small) arrive_and_wait(rank, what);
}

void shm_group::all_gather(int rank, const buffer& value, int axis,
                           const std::function<void*(const std::vector<std::int64_t>&)>& allocate) {
  const char* what = "all_gather";
  post(rank, collective_kind::all_gather, &value, 1).axis = axis;
  arrive_and_wait(rank, what);
  check_slots(rank, what);

  const std::uint64_t parity = (round_[rank] - 1) & 1;
  const slot* row = &slots_[parity * size_];
  std::vector<std::int64_t> shape = row[0].buffers[0].shape;
  std::int64_t gathered = 0;
  for (int r = 0; r < size_; ++r) gathered += row[r].buffers[0].shape[static_cast<std::size_t>(axis)];
  shape[static_cast<std::size_t>(axis)] = gathered;
  auto* out = static_cast<char*>(allocate(shape));

  std::int64_t outer = 1;
  for (int d = 0; d < axis; ++d) outer *= shape[static_cast<std::size_t>(d)];
  std::size_t inner_bytes = scalar_size(value.type);
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < shape.size(); ++d) {
    inner_bytes *= static_cast<std::size_t>(shape[d]);
  }
  for (std::int64_t o = 0; o < outer; ++o) {
    for (int r = 0; r < size_; ++r) {
      const buffer& b = row[r].buffers[0];
      const std::size_t bytes = static_cast<std::size_t>(b.shape[static_cast<std::size_t>(axis)]) * inner_bytes;
      if (bytes == 0) continue;
      std::memcpy(out, static_cast<const char*>(b.in) + static_cast<std::size_t>(o) * bytes, bytes);
      out += bytes;
    }
  }
}

void shm_group::merge(int rank, const void* mine,
                      const std::function<void(const std::vector<const void*>&)>& on_first) {
  const char* what = "merge_call";
  buffer b;
  b.in = mine;
  post(rank, collective_kind::merge, &b, 1);
  arrive_and_wait(rank, what);
  check_slots(rank, what);
  std::exception_ptr failure;
  if (rank == 0) {
    const std::uint64_t parity = (round_[rank] - 1) & 1;
    std::vector<const void*> all(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) all[static_cast<std::size_t>(r)] = slots_[parity * size_ + r].buffers[0].in;
    try {
      on_first(all);
    } catch (const std::exception& e) {
      failure = std::current_exception();
      abort(0, std::string("the merge_call function failed on replica 0: ") + e.what());
    } catch (...) {
      failure = std::current_exception();
      abort(0, "the merge_call function failed on replica 0");
    }
  }
  if (failure) std::rethrow_exception(failure);
  arrive_and_wait(rank, what);
}

void shm_group::abort(int rank, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    if (abort_reason_.empty()) {
      abort_reason_ = reason.empty() ? "replica " + std::to_string(rank) + " aborted" : reason;
    }
  }
  aborted_.store(true, std::memory_order_seq_cst);
  futex_wake_all(&generation_);
}

void shm_group::finish(int rank) {
  int none = -1;
  finished_first_.compare_exchange_strong(none, rank, std::memory_order_acq_rel);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(&generation_);
}

void shm_group::reset() {
  // Release the inputs the slots kept alive, but keep the slots' storage for the next step.
  for (auto& s : slots_) {
    for (auto& b : s.buffers) b.keepalive.reset();
  }
  std::fill(round_.begin(), round_.end(), 0);
  for (int r = 0; r < size_; ++r) arrivals_[r].store(0, std::memory_order_relaxed);
  arrived_.store(0, std::memory_order_relaxed);
  aborted_.store(false, std::memory_order_relaxed);
  finished_first_.store(-1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(reason_mutex_);
  abort_reason_.clear();
}

}  // namespace troupe::transport
