#include "troupe/actors/shard_client.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "control_gate.hpp"
#include "control_tls.hpp"
#include "protocol.hpp"
#include "shard_router.hpp"
#include "task_common.hpp"
#include "troupe/transport/bulk_channel.hpp"

namespace troupe::actors {

struct shard_client::impl {
  caf::actor_system* system = nullptr;
  std::string task;
  std::vector<task_endpoint> ps;
  std::shared_ptr<control_credentials> credentials;
  std::chrono::milliseconds timeout{0};
  std::mutex mutex;
  std::vector<bool> reached;  // by ps task: the router holds its agent (as far as we know)
  // By ps task: its losses the router counted, and how many there were when it was last reached:
  // a ps task lost since (restarted, another process) is reached again, its data connection made
  // again.
  std::shared_ptr<ps_loss_counts> losses;
  std::vector<std::uint64_t> reached_at;
  std::unique_ptr<control_gate> gate;  // every connection to the ps tasks
  caf::actor router;  // also what the ps agents watch: it lives as long as this client

  // Per ps task, its data connection (made on first use, dropped after any failure).
  struct data_link {
    std::mutex mutex;
    std::unique_ptr<transport::bulk_stream> stream;
    std::uint64_t losses = 0;  // its ps task's losses when the stream was made
  };
  std::vector<std::unique_ptr<data_link>> links;
  // Guards every change of a link's stream and `cancelled`, so that cancel() can wake a stream
  // whose link mutex a blocked function holds.
  std::mutex streams_mutex;
  std::optional<std::string> cancelled;

  // After a failure on the data connections of `used` (their mutexes held): each is made again next
  // time. The control connection stays: the router knows when its ps task is lost, and says so
  // at once when the data port is asked for again.
  void drop(const std::set<int>& used) {
    std::lock_guard<std::mutex> lock(streams_mutex);
    for (int p : used) links[static_cast<std::size_t>(p)]->stream.reset();
  }

  // Ps task p's data connection, with links[p]'s mutex held.
  transport::bulk_stream& data(int p) {
    auto& link = *links[static_cast<std::size_t>(p)];
    const std::uint64_t lost = p >= 0 && static_cast<std::size_t>(p) < ps.size() ? (*losses)[static_cast<std::size_t>(p)].load() : 0;
    if (link.stream && link.losses != lost) {  // made to a ps task lost since (and maybe restarted)
      std::lock_guard<std::mutex> lock(streams_mutex);
      link.stream.reset();
    }
    if (link.stream) return *link.stream;
    connect(p);
    const auto& t = ps[static_cast<std::size_t>(p)];
    // Through the router, which answers at once when the ps task is lost meanwhile.
    std::string answer;
    std::string failed;
    caf::scoped_actor self{*system};
    self->request(router, timeout + std::chrono::seconds(5), data_atom::value, static_cast<std::int32_t>(p))
        .receive([&](std::string& a) { answer = std::move(a); },
                 [&](caf::error& e) { failed = error_text(*system, e); });
    if (failed.empty() && answer.size() < 3) failed = "a malformed answer of " + std::to_string(answer.size()) + " bytes";
    if (!failed.empty()) {
      std::lock_guard<std::mutex> lock(mutex);
      reached[static_cast<std::size_t>(p)] = false;  // reached again next time
      throw std::runtime_error("ps task " + t.task + " gave no data port: " + failed);
    }
    const auto port = static_cast<std::uint16_t>(static_cast<unsigned char>(answer[0]) |
                                                 static_cast<unsigned char>(answer[1]) << 8);
    std::string secret = answer.substr(2);
    transport::ring_auth auth{credentials ? credentials->token() : std::string(), std::move(secret)};
    auto stream = transport::bulk_stream::connect(transport::endpoint{t.host, port}, auth, timeout, "ps task " + t.task);
    std::lock_guard<std::mutex> lock(streams_mutex);
    if (cancelled) throw std::runtime_error(*cancelled);
    link.stream = std::move(stream);
    link.losses = lost;
    return *link.stream;
  }

  // Reaches ps task p on first use (and again after it was lost), through the router.
  void connect(int p) {
    const auto i = static_cast<std::size_t>(p);
    if (p < 0 || i >= ps.size()) {
      throw std::out_of_range("variable shard on ps task " + std::to_string(p) + ", but the cluster has " +
                              std::to_string(ps.size()) + " ps task(s)");
    }
    const std::uint64_t lost = (*losses)[i].load();
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (reached[i] && reached_at[i] == lost) return;
    }
    std::string failed;
    caf::scoped_actor self{*system};
    // The router bounds the connect and the hello by the timeout each.
    self->request(router, 2 * timeout + std::chrono::seconds(5), reach_atom::value, static_cast<std::int32_t>(p))
        .receive([](bool) {}, [&](caf::error& e) { failed = error_text(*system, e); });
    if (!failed.empty()) {
      throw std::runtime_error(task + " cannot reach ps task " + ps[i].task + " at " +
                               address_of(ps[i].host, ps[i].port) + ": " + failed);
    }
    std::lock_guard<std::mutex> lock(mutex);
    reached[i] = true;
    reached_at[i] = lost;
  }

  [[noreturn]] void fail(int p, const std::string& what, const caf::error& e) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      reached[static_cast<std::size_t>(p)] = false;  // asks the router again next time
    }
    throw std::runtime_error(what + " on ps task " + ps[static_cast<std::size_t>(p)].task + " failed: " +
                             error_text(*system, e));
  }
};

shard_client::shard_client(caf::actor_system& system, std::string task, std::vector<task_endpoint> ps,
                           std::shared_ptr<control_credentials> credentials, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<impl>()) {
  auto& s = *impl_;
  s.system = &system;
  s.task = std::move(task);
  s.ps = std::move(ps);
  s.timeout = timeout;
  s.reached.assign(s.ps.size(), false);
  s.reached_at.assign(s.ps.size(), 0);
  s.losses = std::make_shared<ps_loss_counts>(s.ps.size());
  for (std::size_t p = 0; p < s.ps.size(); ++p) s.links.push_back(std::make_unique<impl::data_link>());
  s.credentials = std::move(credentials);
  s.gate = std::make_unique<control_gate>(system, s.credentials != nullptr, gate_limits::for_tasks());
  s.router = system.spawn(shard_router, s.ps, timeout, s.task, s.gate->actor(), s.losses);
}

shard_client::~shard_client() { caf::anon_send_exit(impl_->router, caf::exit_reason::user_shutdown); }

void shard_client::cancel(const std::string& why) {
  auto& c = *impl_;
  caf::anon_send(c.router, cancel_atom::value, why);
  std::lock_guard<std::mutex> lock(c.streams_mutex);
  if (c.cancelled) return;
  c.cancelled = why;
  for (auto& link : c.links) {
    if (link->stream) link->stream->shutdown();
  }
}

std::string shard_client::read(int ps, const std::string& key) { return std::move(read_many({{ps, key}}).at(0)); }

void shard_client::update(int ps, const std::string& key, update_op op, std::string delta) {
  std::vector<shard_update> one;
  one.push_back(shard_update{ps, key, op, std::move(delta)});
  update_many(std::move(one));
}

std::vector<std::string> shard_client::read_many(const std::vector<std::pair<int, std::string>>& shards) {
  for (const auto& s : shards) impl_->connect(s.first);
  caf::scoped_actor self{*impl_->system};
  // Every request leaves at once; the answers are taken in order (a blocking receive keeps the
  // others in the mailbox). The router answers within its own timeout; the margin covers the hop.
  const auto wait = impl_->timeout + std::chrono::seconds(5);
  using handle = decltype(self->request(impl_->router, wait, vread_atom::value, std::int32_t{0}, std::string{}));
  std::vector<handle> pending;
  pending.reserve(shards.size());
  for (const auto& s : shards) {
    pending.push_back(self->request(impl_->router, wait, vread_atom::value, static_cast<std::int32_t>(s.first), s.second));
  }
  std::vector<std::string> out(shards.size());
  std::size_t bad = shards.size();
  caf::error failed;
  for (std::size_t i = 0; i < pending.size(); ++i) {
    pending[i].receive([&](std::string& bytes) { out[i] = std::move(bytes); },
                       [&](caf::error& e) {
                         if (bad == shards.size()) {
                           bad = i;
                           failed = std::move(e);
                         }
                       });
  }
  if (bad != shards.size()) impl_->fail(shards[bad].first, "reading variable shard '" + shards[bad].second + "'", failed);
  return out;
}

void shard_client::update_many(std::vector<shard_update> updates) {
  for (const auto& u : updates) impl_->connect(u.ps);
  caf::scoped_actor self{*impl_->system};
  const auto wait = impl_->timeout + std::chrono::seconds(5);
  using handle = decltype(self->request(impl_->router, wait, vupdate_atom::value, std::int32_t{0}, std::string{},
                                        std::uint8_t{0}, std::string{}));
  std::vector<handle> pending;
  pending.reserve(updates.size());
  for (auto& u : updates) {
    pending.push_back(self->request(impl_->router, wait, vupdate_atom::value, static_cast<std::int32_t>(u.ps), u.key,
                                    static_cast<std::uint8_t>(u.op), std::move(u.bytes)));
  }
  std::size_t bad = updates.size();
  caf::error failed;
  for (std::size_t i = 0; i < pending.size(); ++i) {
    pending[i].receive([](bool) {},
                       [&](caf::error& e) {
                         if (bad == updates.size()) {
                           bad = i;
                           failed = std::move(e);
                         }
                       });
  }
  if (bad != updates.size()) impl_->fail(updates[bad].ps, "updating variable shard '" + updates[bad].key + "'", failed);
}

namespace {

// The data links of the ps tasks `used` (ascending), locked in that order for one batch.
std::vector<std::unique_lock<std::mutex>> lock_links(shard_client::impl& c, const std::set<int>& used) {
  std::vector<std::unique_lock<std::mutex>> locks;
  for (int p : used) {
    if (p < 0 || static_cast<std::size_t>(p) >= c.ps.size()) {
      throw std::out_of_range("variable shard on ps task " + std::to_string(p) + ", but the cluster has " +
                              std::to_string(c.ps.size()) + " ps task(s)");
    }
    locks.emplace_back(c.links[static_cast<std::size_t>(p)]->mutex);
  }
  return locks;
}

}  // namespace

namespace {

// One request of a batch on the data connections: what to send, and what its answer carries.
struct data_request {
  int ps = 0;
  transport::bulk_request header;
  const void* data = nullptr;  // all but reads: header.bytes - more_n bytes from here...
  const void* more = nullptr;  // ...then more_n from here
  std::size_t more_n = 0;
  void* into = nullptr;        // reads and gathers: the answer's bytes go here
  std::size_t reply_bytes = 0;
};

// Reads and gathers carry no operation: their op byte is assign's (0), as ever.
data_request request_of(int ps, std::uint8_t kind, update_op op, std::uint8_t dtype, const std::string& key,
                        std::uint64_t bytes) {
  data_request r;
  r.ps = ps;
  r.header.kind = kind;
  r.header.op = static_cast<std::uint8_t>(op);
  r.header.dtype = dtype;
  r.header.key = key;
  r.header.bytes = bytes;
  return r;
}

// Sends every request of a batch at once (they are small, or sent from where the data lies), then
// takes the answers in order. Reads and gathers: the first failure ends the batch. Updates and
// scatters: every answer is taken, then the first failure is thrown. Either way the connections
// used are made again next time, and the error names the shard, its ps task and `what` it was.
void data_batch(shard_client::impl& c, const std::vector<data_request>& batch, const char* what) {
  if (batch.empty()) return;
  std::set<int> used;
  for (const auto& r : batch) used.insert(r.ps);
  auto locks = lock_links(c, used);
  const bool fetch = batch.front().header.kind == transport::bulk_request::read ||
                     batch.front().header.kind == transport::bulk_request::gather;
  std::size_t at = 0;
  bool sent = false;
  std::string failed;
  std::size_t failed_at = batch.size();
  try {
    for (; at < batch.size(); ++at) {
      const auto& r = batch[at];
      c.data(r.ps).send_request(r.header, r.data, r.more, r.more_n);
    }
    sent = true;
    for (at = 0; at < batch.size(); ++at) {
      const auto& r = batch[at];
      auto& stream = *c.links[static_cast<std::size_t>(r.ps)]->stream;
      if (fetch) {
        stream.receive_reply(r.reply_bytes);
        stream.receive(r.into, r.reply_bytes);
        continue;
      }
      try {
        stream.receive_reply(0);
      } catch (const std::exception& e) {
        // An error the ps task sent keeps the connection in step: the other answers are taken.
        if (failed_at == batch.size()) {
          failed_at = at;
          failed = e.what();
        }
      }
    }
  } catch (const std::exception& e) {
    failed_at = std::min(at, batch.size() - 1);
    failed = e.what();
  }
  if (failed_at == batch.size()) return;
  c.drop(used);
  const auto& r = batch[failed_at];
  throw std::runtime_error(std::string(fetch && !sent ? "asking for" : what) + " variable shard '" + r.header.key +
                           "' on ps task " + c.ps[static_cast<std::size_t>(r.ps)].task + " failed: " + failed);
}

}  // namespace

void shard_client::read_into(const std::vector<shard_read>& shards) {
  // Each shard's elements are read straight into their place.
  std::vector<data_request> batch;
  for (const auto& s : shards) {
    batch.push_back(request_of(s.ps, transport::bulk_request::read, update_op::assign, s.dtype, s.key, s.nbytes));
    batch.back().into = s.into;
    batch.back().reply_bytes = s.nbytes;
  }
  data_batch(*impl_, batch, "reading");
}

void shard_client::update_from(const std::vector<shard_write>& updates) {
  std::vector<data_request> batch;
  for (const auto& u : updates) {
    batch.push_back(request_of(u.ps, transport::bulk_request::update, u.op, u.dtype, u.key, u.nbytes));
    batch.back().data = u.from;
  }
  data_batch(*impl_, batch, "updating");
}

void shard_client::gather_into(const std::vector<shard_gather>& gathers) {
  std::vector<data_request> batch;
  for (const auto& g : gathers) {
    batch.push_back(request_of(g.ps, transport::bulk_request::gather, update_op::assign, g.dtype, g.key,
                               g.count * sizeof(std::uint64_t)));
    batch.back().data = g.rows;
    batch.back().into = g.into;
    batch.back().reply_bytes = g.count * g.row_bytes;
  }
  data_batch(*impl_, batch, "gathering rows of");
}

void shard_client::scatter_from(const std::vector<shard_scatter>& scatters) {
  std::vector<data_request> batch;
  for (const auto& u : scatters) {
    batch.push_back(request_of(u.ps, transport::bulk_request::scatter, u.op, u.dtype, u.key,
                               u.count * (sizeof(std::uint64_t) + u.row_bytes)));
    batch.back().data = u.rows;  // the indices, then the rows from where they lie
    batch.back().more = u.from;
    batch.back().more_n = u.count * u.row_bytes;
  }
  data_batch(*impl_, batch, "scattering rows into");
}

void shard_client::apply_from(const std::vector<shard_apply>& applies) {
  // The parameters and row indices go first as one small block, the gradients from where they lie.
  std::vector<std::vector<char>> heads(applies.size());
  std::vector<data_request> batch;
  for (std::size_t i = 0; i < applies.size(); ++i) {
    const auto& a = applies[i];
    auto& head = heads[i];
    head.resize(apply_params_bytes + a.count * sizeof(std::uint64_t));
    std::memcpy(head.data(), a.params, apply_params_bytes);
    if (a.count > 0) std::memcpy(head.data() + apply_params_bytes, a.rows, a.count * sizeof(std::uint64_t));
    const auto kind = a.count > 0 ? transport::bulk_request::apply_rows : transport::bulk_request::apply;
    batch.push_back(request_of(a.ps, kind, update_op::assign, a.dtype, a.key, head.size() + a.nbytes));
    batch.back().header.op = static_cast<std::uint8_t>(a.kind);
    batch.back().data = head.data();
    batch.back().more = a.from;
    batch.back().more_n = a.nbytes;
  }
  data_batch(*impl_, batch, "applying an optimizer update to");
}

}  // namespace troupe::actors
