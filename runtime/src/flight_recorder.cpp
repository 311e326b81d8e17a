#include "flight_recorder.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>

#include "troupe/flight_recorder.hpp"
#include "troupe/log.hpp"

namespace troupe::detail {

namespace {

thread_local const char* tl_call_site = nullptr;

// The words of a slot.
enum : std::size_t { w_step, w_collective, w_meta, w_bytes, w_enqueue, w_start, w_end, w_peer, w_spare, w_label };
constexpr std::size_t label_words = 4;
constexpr std::uint64_t no_dtype = 0xff;

std::uint64_t pack_meta(const flight_collective& c, flight_state state) noexcept {
  const std::uint64_t dtype = c.has_dtype ? static_cast<std::uint64_t>(c.dtype) : no_dtype;
  const auto participants = static_cast<std::uint64_t>(static_cast<std::uint16_t>(c.participants));
  const auto replica = static_cast<std::uint64_t>(static_cast<std::uint16_t>(c.replica + 1));
  return static_cast<std::uint64_t>(c.op) | static_cast<std::uint64_t>(state) << 8 |
         static_cast<std::uint64_t>(c.group) << 16 | dtype << 24 | participants << 32 | replica << 48;
}

constexpr std::uint64_t state_mask = std::uint64_t{0xff} << 8;

// The pipe SIGUSR1's handler wakes the dump thread through (-1: none).
std::atomic<int> signal_pipe{-1};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_sigusr1(int) {
  const int saved = errno;
  const int fd = signal_pipe.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const char wake = 'u';
    (void)!::write(fd, &wake, 1);
  }
  errno = saved;
}

std::mutex process_mutex;
std::weak_ptr<FlightRecorder> process_owner;

std::string file_name(int rank, int world) {
  if (world > 1) return "flight_recorder.rank" + std::to_string(rank) + ".json";
  return "flight_recorder.pid" + std::to_string(::getpid()) + ".json";
}

}  // namespace

std::atomic<FlightRecorder*> FlightRecorder::process_{nullptr};

const char* flight_op_name(flight_op op) noexcept {
  switch (op) {
    case flight_op::step: return "step";
    case flight_op::all_reduce: return "all_reduce";
    case flight_op::all_gather: return "all_gather";
    case flight_op::merge_call: return "merge_call";
    case flight_op::broadcast: return "broadcast";
    case flight_op::bucket_all_reduce: return "bucket_all_reduce";
    case flight_op::membership: return "membership";
  }
  return "?";
}

const char* flight_state_name(flight_state s) noexcept {
  switch (s) {
    case flight_state::queued: return "queued";
    case flight_state::running: return "running";
    case flight_state::done: return "done";
    case flight_state::failed: return "failed";
  }
  return "?";
}

const char* flight_group_name(flight_group g) noexcept {
  switch (g) {
    case flight_group::replicas: return "replicas";
    case flight_group::workers: return "workers";
    case flight_group::nccl: return "nccl";
  }
  return "?";
}

std::int64_t flight_now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* current_call_site() noexcept { return tl_call_site; }
void set_call_site(const char* label) noexcept { tl_call_site = label; }

struct FlightRecorder::signal_dump {
  int pipe[2] = {-1, -1};
  struct sigaction previous {};
  std::thread thread;
};

FlightRecorder::FlightRecorder(std::size_t capacity, std::string dir)
    : capacity_(capacity), dir_(std::move(dir)), slots_(new slot[capacity]) {
  if (capacity < min_entries || capacity > max_entries) {
    throw std::invalid_argument("flight recorder: " + std::to_string(capacity) + " entries is outside " +
                                std::to_string(min_entries) + ".." + std::to_string(max_entries));
  }
  for (std::size_t i = 0; i < capacity_; ++i) {
    for (auto& w : slots_[i].word) w.store(0, std::memory_order_relaxed);
  }
}

FlightRecorder::~FlightRecorder() {
  FlightRecorder* self = this;
  process_.compare_exchange_strong(self, nullptr);
  if (signal_) {
    signal_pipe.store(-1);
    // The handler before ours comes back, unless the application installed another since.
    struct sigaction current {};
    if (::sigaction(SIGUSR1, nullptr, &current) == 0 && current.sa_handler == on_sigusr1) {
      ::sigaction(SIGUSR1, &signal_->previous, nullptr);
    }
    const char quit = 'q';
    (void)!::write(signal_->pipe[1], &quit, 1);
    if (signal_->thread.joinable()) signal_->thread.join();
    ::close(signal_->pipe[0]);
    ::close(signal_->pipe[1]);
  }
}

FlightRecorder::ticket FlightRecorder::record(const flight_collective& what, flight_state state) noexcept {
  const std::uint64_t id = next_.fetch_add(1, std::memory_order_relaxed);
  slot& s = slots_[id % capacity_];
  // Claim the slot. It is busy only when the ring is smaller than the entries in flight at once
  // (an update of the entry capacity() places back): then this waits for that update to end.
  for (;;) {
    std::uint64_t v = s.version.load(std::memory_order_relaxed);
    if (v >= 2 * id + 2) return id;  // a later entry already holds it (the ring lapped this one)
    if ((v & 1) == 0 && s.version.compare_exchange_weak(v, 2 * id + 1, std::memory_order_acq_rel)) break;
    std::this_thread::yield();
  }
  std::atomic_thread_fence(std::memory_order_release);
  const std::int64_t now = flight_now_ns();
  s.word[w_step].store(what.step, std::memory_order_relaxed);
  s.word[w_collective].store(static_cast<std::uint64_t>(what.collective), std::memory_order_relaxed);
  s.word[w_meta].store(pack_meta(what, state), std::memory_order_relaxed);
  s.word[w_bytes].store(what.bytes, std::memory_order_relaxed);
  s.word[w_enqueue].store(static_cast<std::uint64_t>(now), std::memory_order_relaxed);
  s.word[w_start].store(state == flight_state::queued ? 0 : static_cast<std::uint64_t>(now), std::memory_order_relaxed);
  s.word[w_end].store(0, std::memory_order_relaxed);
  s.word[w_peer].store(static_cast<std::uint64_t>(std::int64_t{-1}), std::memory_order_relaxed);
  std::uint64_t label[label_words] = {};
  if (const char* site = tl_call_site) {
    char* bytes = reinterpret_cast<char*>(label);
    std::size_t n = 0;
    while (n < sizeof label - 1 && site[n] != '\0') ++n;
    std::memcpy(bytes, site, n);
  }
  for (std::size_t i = 0; i < label_words; ++i) s.word[w_label + i].store(label[i], std::memory_order_relaxed);
  s.version.store(2 * id + 2, std::memory_order_release);
  return id;
}

bool FlightRecorder::claim_for_update(slot& s, ticket t) noexcept {
  std::uint64_t expected = 2 * t + 2;
  if (!s.version.compare_exchange_strong(expected, 2 * t + 1, std::memory_order_acq_rel)) return false;
  std::atomic_thread_fence(std::memory_order_release);
  return true;
}

void FlightRecorder::start(ticket t) noexcept {
  slot& s = slots_[t % capacity_];
  if (!claim_for_update(s, t)) return;  // the ring has moved past it
  s.word[w_start].store(static_cast<std::uint64_t>(flight_now_ns()), std::memory_order_relaxed);
  const std::uint64_t meta = s.word[w_meta].load(std::memory_order_relaxed);
  s.word[w_meta].store((meta & ~state_mask) | static_cast<std::uint64_t>(flight_state::running) << 8,
                       std::memory_order_relaxed);
  s.version.store(2 * t + 2, std::memory_order_release);
}

void FlightRecorder::end(ticket t, bool ok, int peer) noexcept {
  if (!ok) failures_.fetch_add(1, std::memory_order_relaxed);
  slot& s = slots_[t % capacity_];
  if (!claim_for_update(s, t)) return;
  const auto now = static_cast<std::uint64_t>(flight_now_ns());
  if (s.word[w_start].load(std::memory_order_relaxed) == 0) s.word[w_start].store(now, std::memory_order_relaxed);
  s.word[w_end].store(now, std::memory_order_relaxed);
  const std::uint64_t meta = s.word[w_meta].load(std::memory_order_relaxed);
  const auto state = ok ? flight_state::done : flight_state::failed;
  s.word[w_meta].store((meta & ~state_mask) | static_cast<std::uint64_t>(state) << 8, std::memory_order_relaxed);
  s.word[w_peer].store(static_cast<std::uint64_t>(static_cast<std::int64_t>(peer)), std::memory_order_relaxed);
  s.version.store(2 * t + 2, std::memory_order_release);
}

void FlightRecorder::set_identity(int rank, int world, const std::string& task) {
  std::lock_guard<std::mutex> lock(identity_mutex_);
  rank_ = rank;
  world_ = world;
  task_ = task;
}

std::vector<flight_entry> FlightRecorder::entries() const {
  const std::uint64_t end = next_.load(std::memory_order_acquire);
  const std::uint64_t begin = end > capacity_ ? end - capacity_ : 0;
  std::vector<flight_entry> out;
  out.reserve(static_cast<std::size_t>(end - begin));
  for (std::uint64_t id = begin; id < end; ++id) {
    const slot& s = slots_[id % capacity_];
    std::uint64_t copy[words];
    const std::uint64_t v1 = s.version.load(std::memory_order_acquire);
    if (v1 != 2 * id + 2) continue;  // being written, or already replaced by a later entry
    for (std::size_t i = 0; i < words; ++i) copy[i] = s.word[i].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.version.load(std::memory_order_relaxed) != v1) continue;
    flight_entry e;
    e.id = id;
    e.step = copy[w_step];
    e.collective = static_cast<std::int64_t>(copy[w_collective]);
    const std::uint64_t meta = copy[w_meta];
    e.op = static_cast<flight_op>(meta & 0xff);
    e.state = static_cast<flight_state>((meta >> 8) & 0xff);
    e.group = static_cast<flight_group>((meta >> 16) & 0xff);
    const std::uint64_t dtype = (meta >> 24) & 0xff;
    e.has_dtype = dtype != no_dtype;
    if (e.has_dtype) e.dtype = static_cast<base::scalar_type>(dtype);
    e.participants = static_cast<int>((meta >> 32) & 0xffff);
    e.replica = static_cast<int>((meta >> 48) & 0xffff) - 1;
    e.bytes = copy[w_bytes];
    e.enqueue_ns = static_cast<std::int64_t>(copy[w_enqueue]);
    e.start_ns = static_cast<std::int64_t>(copy[w_start]);
    e.end_ns = static_cast<std::int64_t>(copy[w_end]);
    e.peer = static_cast<int>(static_cast<std::int64_t>(copy[w_peer]));
    std::memcpy(e.label, copy + w_label, sizeof e.label);
    e.label[sizeof e.label - 1] = '\0';
    out.push_back(e);
  }
  return out;
}

std::string FlightRecorder::json(const std::string& reason) const {
  using nlohmann::ordered_json;
  ordered_json out;
  out["format"] = "troupe-flight-recorder";
  out["version"] = 1;
  {
    std::lock_guard<std::mutex> lock(identity_mutex_);
    out["rank"] = rank_;
    out["world"] = world_;
    out["task"] = task_;
  }
  out["pid"] = static_cast<std::int64_t>(::getpid());
  out["reason"] = reason;
  out["dumped_at_ns"] = flight_now_ns();
  out["capacity"] = capacity_;
  const std::uint64_t recorded_now = recorded();
  out["recorded"] = recorded_now;
  ordered_json list = ordered_json::array();
  for (const flight_entry& e : entries()) {
    ordered_json j;
    j["id"] = e.id;
    j["step"] = e.step;
    j["collective"] = e.collective >= 0 ? ordered_json(e.collective) : ordered_json(nullptr);
    j["op"] = flight_op_name(e.op);
    j["dtype"] = e.has_dtype ? ordered_json(base::scalar_name(e.dtype)) : ordered_json(nullptr);
    j["bytes"] = e.bytes;
    j["group"] = flight_group_name(e.group);
    j["participants"] = e.participants;
    j["replica"] = e.replica >= 0 ? ordered_json(e.replica) : ordered_json(nullptr);
    j["state"] = flight_state_name(e.state);
    j["enqueue_ns"] = e.enqueue_ns;
    j["start_ns"] = e.start_ns > 0 ? ordered_json(e.start_ns) : ordered_json(nullptr);
    j["end_ns"] = e.end_ns > 0 ? ordered_json(e.end_ns) : ordered_json(nullptr);
    j["peer"] = e.peer >= 0 ? ordered_json(e.peer) : ordered_json(nullptr);
    j["label"] = e.label;
    list.push_back(std::move(j));
  }
  out["entries"] = std::move(list);
  return out.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

std::string FlightRecorder::write(const std::string& reason, const std::string& dir_in) const {
  namespace fs = std::filesystem;
  fs::path dir = dir_in.empty() ? fs::path(dir_) : fs::path(dir_in);
  if (dir.empty()) dir = fs::temp_directory_path();
  int rank = 0, world = 1;
  {
    std::lock_guard<std::mutex> lock(identity_mutex_);
    rank = rank_;
    world = world_;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path path = dir / file_name(rank, world);
  const fs::path partial = dir / (file_name(rank, world) + ".partial");
  const std::string text = json(reason);
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out << text << '\n';
    out.flush();
    if (!out) {
      throw std::runtime_error("flight recorder: cannot write " + partial.string() + ": " + std::strerror(errno) +
                               " (is TROUPE_FLIGHT_RECORDER_DIR a writable directory?)");
    }
  }
  fs::rename(partial, path, ec);
  if (ec) {
    throw std::runtime_error("flight recorder: cannot rename " + partial.string() + " to " + path.string() + ": " +
                             ec.message());
  }
  return path.string();
}

std::string FlightRecorder::dump_on_failure(const std::string& reason) noexcept {
  if (dir_.empty()) return {};
  try {
    std::lock_guard<std::mutex> lock(dump_mutex_);
    // Once per failure: the step that ends failed after its collective rewrites the same file.
    const std::uint64_t now = failures();
    if (now == failure_dumped_at_) return failure_path_;
    failure_path_ = write("collective failed: " + reason);
    failure_dumped_at_ = now;
    troupe::log(LogLevel::warning, "flight recorder written to " + failure_path_);
    return failure_path_;
  } catch (const std::exception& e) {
    try {
      troupe::log(LogLevel::warning, std::string("flight recorder: ") + e.what());
    } catch (...) {
    }
    return {};
  }
}

std::shared_ptr<FlightRecorder> FlightRecorder::acquire(std::size_t capacity, const std::string& dir) {
  std::lock_guard<std::mutex> lock(process_mutex);
  if (auto existing = process_owner.lock()) return existing;
  auto recorder = std::make_shared<FlightRecorder>(capacity, dir);
  recorder->install_signal_dump();
  process_owner = recorder;
  process_.store(recorder.get(), std::memory_order_release);
  return recorder;
}

void FlightRecorder::install_signal_dump() {
  auto sd = std::make_unique<signal_dump>();
  if (::pipe2(sd->pipe, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "flight recorder: pipe for SIGUSR1");
  }
  ::fcntl(sd->pipe[1], F_SETFL, ::fcntl(sd->pipe[1], F_GETFL) | O_NONBLOCK);  // the handler never blocks
  signal_ = std::move(sd);
  signal_->thread = std::thread([this] { signal_thread_main(); });
  signal_pipe.store(signal_->pipe[1]);
  struct sigaction action {};
  action.sa_handler = on_sigusr1;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &action, &signal_->previous);
}

void FlightRecorder::signal_thread_main() {
  for (;;) {
    char c = 0;
    const ssize_t n = ::read(signal_->pipe[0], &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == 'q') return;
    try {
      const std::string path = write("SIGUSR1");
      troupe::log(LogLevel::warning, "flight recorder written to " + path + " (SIGUSR1)");
    } catch (const std::exception& e) {
      troupe::log(LogLevel::warning, std::string("flight recorder: SIGUSR1: ") + e.what());
    }
  }
}

}  // namespace troupe::detail

namespace troupe {

CallSiteLabel::CallSiteLabel(const char* label) noexcept : previous_(detail::current_call_site()) {
  detail::set_call_site(label);
}

CallSiteLabel::~CallSiteLabel() { detail::set_call_site(previous_); }

namespace {
detail::FlightRecorder& the_recorder() {
  detail::FlightRecorder* r = detail::FlightRecorder::process();
  if (r == nullptr) {
    throw std::logic_error(
        "flight recorder: none in this process (create a Runtime first; RuntimeOptions::flight_recorder_entries "
        "or TROUPE_FLIGHT_RECORDER_ENTRIES is 0 turns it off)");
  }
  return *r;
}
}  // namespace

std::string flight_recorder_json(const std::string& reason) { return the_recorder().json(reason); }

std::string write_flight_recorder(const std::string& reason) { return the_recorder().write(reason); }

}  // namespace troupe
