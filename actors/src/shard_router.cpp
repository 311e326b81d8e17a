#include "shard_router.hpp"

#include <set>
#include <utility>

#include "protocol.hpp"
#include "task_common.hpp"

namespace troupe::actors {
namespace {

template <class T>
struct type_tag {
  using type = T;
};

}  // namespace

caf::behavior shard_router(caf::stateful_actor<router_state>* self, std::vector<task_endpoint> ps,
                           std::chrono::milliseconds timeout, std::string self_task, caf::io::middleman_actor mm,
                           std::shared_ptr<ps_loss_counts> losses) {
  self->state.agents.resize(ps.size());
  self->state.pending.resize(ps.size());
  self->state.reaching.resize(ps.size());
  // Answers everything that waits for ps task i's reach.
  auto reached = [=](std::size_t i, caf::error e) {
    auto waiting = std::move(self->state.reaching[i]);
    self->state.reaching[i].clear();
    for (auto& rp : waiting) {
      if (e) {
        rp.deliver(e);
      } else {
        rp.deliver(true);
      }
    }
  };
  self->set_down_handler([=](caf::down_msg& d) {
    auto& st = self->state;
    for (std::size_t p = 0; p < st.agents.size(); ++p) {
      if (!st.agents[p] || st.agents[p].address() != d.source) continue;
      st.agents[p] = caf::actor{};
      if (losses) ++(*losses)[p];
      auto lost = runtime_error("ps task " + ps[p].task + " is lost (" + self->system().render(d.reason) + ")");
      for (auto& entry : st.pending[p]) entry.second.deliver(lost);
      st.pending[p].clear();
    }
  });
  // Sends `msg` to ps task p's agent and answers the promise once, with a Reply or an error.
  auto forward = [=](std::int32_t p, caf::message msg, auto reply_tag) -> caf::response_promise {
    using Reply = typename decltype(reply_tag)::type;
    auto& st = self->state;
    auto rp = self->make_response_promise();
    const auto i = static_cast<std::size_t>(p);
    if (st.cancelled) {
      rp.deliver(runtime_error(*st.cancelled));
      return rp;
    }
    if (p < 0 || i >= st.agents.size()) {
      rp.deliver(runtime_error("ps task " + std::to_string(p) + " is not in the cluster"));
      return rp;
    }
    if (!st.agents[i]) {
      rp.deliver(runtime_error("ps task " + ps[i].task + " is not connected (lost, or not reached yet)"));
      return rp;
    }
    const auto token = ++st.next;
    st.pending[i].emplace(token, rp);
    auto take = [=]() -> std::optional<caf::response_promise> {
      auto& pend = self->state.pending[i];
      auto it = pend.find(token);
      if (it == pend.end()) return std::nullopt;  // answered already (its ps task was lost)
      auto out = it->second;
      pend.erase(it);
      return out;
    };
    self->request(st.agents[i], timeout, std::move(msg))
        .then(
            [=](Reply& reply) {
              if (auto promise = take()) promise->deliver(std::move(reply));
            },
            [=](caf::error& e) {
              if (auto promise = take()) promise->deliver(std::move(e));
            });
    return rp;
  };
  return {
      [=](wup_atom, std::int32_t p, const caf::actor& agent) -> bool {
        self->state.agents.at(static_cast<std::size_t>(p)) = agent;
        self->monitor(agent);
        return true;
      },
      [=](reach_atom, std::int32_t p) -> caf::result<bool> {
        // Connects to ps task p and says hello (once, however many ask at a time), as reach()
        // does, but without blocking: a cancel answers the waiting at once.
        auto& st = self->state;
        const auto i = static_cast<std::size_t>(p);
        if (st.cancelled) return runtime_error(*st.cancelled);
        if (p < 0 || i >= st.agents.size()) return runtime_error("ps task " + std::to_string(p) + " is not in the cluster");
        if (st.agents[i]) return true;
        auto rp = self->make_response_promise();
        st.reaching[i].push_back(rp);
        if (st.reaching[i].size() > 1) return rp;
        const auto& t = ps[i];
        self->request(mm, timeout, caf::connect_atom::value, t.host, t.port)
            .then(
                [=](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
                  if (self->state.cancelled) return;
                  if (!ptr) {
                    reached(i, caf::make_error(caf::sec::no_actor_published_at_port,
                                               "no actor published at " + address_of(t.host, t.port)));
                    return;
                  }
                  auto agent = caf::actor_cast<caf::actor>(std::move(ptr));
                  self->request(agent, timeout, hello_atom::value, self_task, caf::actor_cast<caf::actor>(self))
                      .then(
                          [=](std::string& name, caf::actor& pulse) {
                            if (self->state.cancelled) return;
                            auto wrong = check_hello(t, name, pulse);
                            if (!wrong) {
                              self->state.agents[i] = agent;
                              self->monitor(agent);
                            }
                            reached(i, std::move(wrong));
                          },
                          [=](caf::error& e) {
                            if (!self->state.cancelled) reached(i, std::move(e));
                          });
                },
                [=](caf::error& e) {
                  if (!self->state.cancelled) reached(i, std::move(e));
                });
        return rp;
      },
      [=](cancel_atom, const std::string& why) {
        auto& st = self->state;
        if (st.cancelled) return;
        st.cancelled = why;
        auto e = runtime_error(why);
        for (std::size_t i = 0; i < st.agents.size(); ++i) {
          for (auto& entry : st.pending[i]) entry.second.deliver(e);
          st.pending[i].clear();
          reached(i, e);
        }
      },
      [=](gone_atom, std::int32_t p, const std::string& reason) {
        // Its connection is still open but it stopped answering: what waits on it fails now.
        auto& st = self->state;
        const auto i = static_cast<std::size_t>(p);
        if (p < 0 || i >= st.agents.size()) return;
        if (st.agents[i] && losses) ++(*losses)[i];
        st.agents[i] = caf::actor{};
        auto lost = runtime_error("ps task " + ps[i].task + " is lost (" + reason + ")");
        for (auto& entry : st.pending[i]) entry.second.deliver(lost);
        st.pending[i].clear();
      },
      [=](vread_atom, std::int32_t p, const std::string& key) -> caf::result<std::string> {
        return forward(p, caf::make_message(vread_atom::value, key), type_tag<std::string>{});
      },
      [=](vslots_atom, std::int32_t p, const std::string& key) -> caf::result<std::int32_t> {
        return forward(p, caf::make_message(vslots_atom::value, key), type_tag<std::int32_t>{});
      },
      [=](data_atom, std::int32_t p) -> caf::result<std::string> {
        return forward(p, caf::make_message(data_atom::value), type_tag<std::string>{});
      },
      [=](vnew_atom, std::int32_t p, const std::string& key, std::string& bytes) -> caf::result<bool> {
        return forward(p, caf::make_message(vnew_atom::value, key, std::move(bytes)), type_tag<bool>{});
      },
      [=](vupdate_atom, std::int32_t p, const std::string& key, std::uint8_t op,
          std::string& delta) -> caf::result<bool> {
        return forward(p, caf::make_message(vupdate_atom::value, key, op, std::move(delta)), type_tag<bool>{});
      },
  };
}

}  // namespace troupe::actors
