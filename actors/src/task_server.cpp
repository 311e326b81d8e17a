#include "troupe/actors/task_server.hpp"

#include <iostream>
#include <stdexcept>

#include "caf/all.hpp"
#include "caf/io/all.hpp"
#include "control_gate.hpp"
#include "control_tls.hpp"
#include "listen_error.hpp"
#include "ps_shards.hpp"
#include "task_agent.hpp"
#include "task_common.hpp"
#include "troupe/transport/random.hpp"

namespace troupe::actors {

struct task_server::impl {
  std::unique_ptr<transport::bulk_listener> data;  // ps tasks: the shards' data connections
  std::shared_ptr<std::atomic<std::uint16_t>> data_port;  // what the agent hands out; 0 once closing
  std::shared_ptr<app_data_host> app_data;  // tasks that host actors: their data port (from the first spawn)
  caf::actor_system* system = nullptr;
  std::shared_ptr<control_credentials> credentials;
  std::unique_ptr<control_gate> gate;  // the task's listener
  caf::actor agent;
  caf::actor pulse;
  std::shared_ptr<const task_handlers> handlers;
  std::shared_ptr<function_runner> runner;  // worker tasks
  std::uint16_t port = 0;
  bool tls = false;

  // Ends the function thread: a function still running is told to give up its waits (the
  // handlers' cancel) and is waited for, saying so every 30 s.
  void stop_functions() {
    if (!runner) return;
    {
      std::lock_guard<std::mutex> lock(runner->mutex);
      runner->stopping = true;
    }
    runner->wake.notify_all();
    if (handlers->cancel) handlers->cancel();
    std::unique_lock<std::mutex> lock(runner->mutex);
    while (!runner->wake.wait_for(lock, std::chrono::seconds(30), [&] { return runner->finished; })) {
      std::cerr << "troupe: the task's function " + runner->running + " still runs; waiting for it to return\n"
                << std::flush;
    }
    lock.unlock();
    runner->thread.join();
  }
};

task_server::task_server(caf::actor_system& system, std::string task, std::string host, std::uint16_t port,
                         std::shared_ptr<control_credentials> credentials, task_handlers handlers,
                         task_server_options options)
    : impl_(std::make_unique<impl>()) {
  auto& s = *impl_;
  s.system = &system;
  s.credentials = std::move(credentials);
  s.tls = s.credentials != nullptr;
  // Functions run on a thread of their own, heartbeats are answered by an actor of their own: a
  // function running long is no silence, and the agent answers its peers meanwhile.
  auto shared = std::make_shared<const task_handlers>(std::move(handlers));
  auto store = std::make_shared<shard_store>();
  auto data_port = std::make_shared<std::atomic<std::uint16_t>>(0);
  std::string secret;
  const bool holds_variables = shared->layout && shared->combine;
  if (holds_variables) {
    // The data port's secret: handed out over the control plane only, so that without a token
    // too only peers that reached the agent can prove themselves there.
    const auto bytes = transport::random_bytes(32, "Server: " + task + ": the data port's secret");
    secret.assign(bytes.begin(), bytes.end());
  }
  s.handlers = shared;
  if (shared->call) s.runner = std::make_shared<function_runner>();
  auto pulse = system.spawn(pulse_actor, shared);
  s.pulse = pulse;
  s.data_port = data_port;
  if (shared->spawn_actor) {
    s.app_data = std::make_shared<app_data_host>(task, host, s.credentials ? s.credentials->token() : std::string(),
                                                 options.data_timeout, shared->event);
  }
  s.agent = system.spawn(task_agent, task, shared, pulse, store, data_port, secret, s.runner, s.app_data);
  if (s.runner) {
    s.runner->agent = s.agent.address();
    s.runner->thread = std::thread([runner = s.runner, shared] { runner->run(*shared); });
  }
  s.gate = std::make_unique<control_gate>(system, s.tls, gate_limits::for_tasks());
  auto published = s.gate->publish(s.agent, port, host);
  if (!published) {
    caf::anon_send_exit(s.agent, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(pulse, caf::exit_reason::user_shutdown);
    s.stop_functions();
    throw_cannot_listen("Server: " + task + " cannot listen on " + address_of(host, port) + ": " +
                            system.render(published.error()),
                        host, port);
  }
  s.port = *published;
  if (holds_variables) {
    // Listened on after the agent's own port, so that a free port the system picks here cannot be
    // the one the cluster spec gave this task. Until then the agent says it has no data port.
    try {
      transport::ring_auth auth{s.credentials ? s.credentials->token() : std::string(), secret};
      s.data = std::make_unique<transport::bulk_listener>(
          host, options.data_port, std::move(auth), options.data_timeout, task + "'s data port",
          [store, shared, task](transport::bulk_stream& stream) { serve_shards(stream, *store, *shared, task); });
    } catch (const std::exception& e) {
      caf::anon_send_exit(s.agent, caf::exit_reason::user_shutdown);
      caf::anon_send_exit(pulse, caf::exit_reason::user_shutdown);
      s.stop_functions();
      throw std::runtime_error("Server: " + task + " cannot listen for variables' data on " +
                               (options.data_port == 0 ? host : address_of(host, options.data_port)) + ": " + e.what() +
                               (options.data_port == 0 ? "" : " (the data port: TROUPE_PS_DATA_PORT or --data-port)"));
    }
    *data_port = s.data->port();
    if (shared->event) shared->event("variables' data port " + address_of(host, s.data->port()));
  }
}

task_server::~task_server() {
  auto& s = *impl_;
  // Workers asking for the data port from now on hear that there is none, at once.
  if (s.data_port) *s.data_port = 0;
  s.data.reset();
  s.gate->unpublish(s.agent, s.port);
  // The agent and the pulse end at once (neither runs functions); the function thread ends once
  // its function returns. Both wait here: the handlers reach into the owner of this object, which
  // is destroyed next.
  // The actors' data connections end (their spawners hear it) before the actors stop.
  if (s.app_data) s.app_data->stop();
  caf::scoped_actor self{*s.system};
  self->monitor(s.pulse);
  self->send_exit(s.pulse, caf::exit_reason::user_shutdown);
  self->monitor(s.agent);
  self->send_exit(s.agent, caf::exit_reason::user_shutdown);
  bool gone = false;
  bool pulse_gone = false;
  self->receive_while([&] { return !gone || !pulse_gone; })(
      [&](caf::down_msg& d) {
        gone = gone || d.source == s.agent.address();
        pulse_gone = pulse_gone || d.source == s.pulse.address();
      },
      caf::after(std::chrono::seconds(30)) >> [&] {
        std::cerr << "troupe: the task agent did not stop within 30 s" << std::endl;
        gone = true;
        pulse_gone = true;
      });
  s.stop_functions();
}

std::uint16_t task_server::port() const noexcept { return impl_->port; }

}  // namespace troupe::actors
