// The Monitor in one process: its refusals, the token, its HTTP answers, a failed run told to the
// page, the flight recorder, text summaries, the actors page and the actions asked of an actor.
#include "monitor_test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace monitor_test;

TEST_CASE("monitor: a dashboard beyond loopback without a token is refused, naming the address") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0"});
  MonitorOptions o;
  o.dashboard_port = 0;
  o.dashboard_address = "0.0.0.0";
  const std::string msg = message_of([&] { Monitor m(s, nullptr, o); });
  CHECK(contains(msg, "0.0.0.0"));
  CHECK(contains(msg, "token"));
  o.dashboard_address = "127.0.0.1";
  o.trace_file = "t.json";
  o.trace_first_step = 5;
  o.trace_last_step = 2;
  CHECK(contains(message_of([&] { Monitor m(s, nullptr, o); }), "5:2"));
}

TEST_CASE("monitor: with a token, requests without it get 401 and requests with it are served") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0"});
  MonitorOptions o;
  o.dashboard_port = 0;
  o.dashboard_token = "s3cret";
  std::ostringstream log;
  o.log = &log;
  Monitor m(s, nullptr, o);
  REQUIRE(m.dashboard_port() > 0);
  CHECK(m.dashboard_url() == "http://127.0.0.1:" + std::to_string(m.dashboard_port()) + "/?token=s3cret");
  CHECK(contains(http(m.dashboard_port(), "GET", "/api/state"), "401 Unauthorized"));
  CHECK(contains(http(m.dashboard_port(), "GET", "/api/state?token=wrong"), "401 Unauthorized"));
  CHECK(contains(http(m.dashboard_port(), "GET", "/api/state?token=s3cret"), "200 OK"));
  CHECK(contains(http(m.dashboard_port(), "GET", "/api/state", "Authorization: Bearer s3cret\r\n"), "\"paused\":false"));
  const std::string page = http(m.dashboard_port(), "GET", "/?token=s3cret");
  CHECK(contains(page, "text/html"));
  CHECK(contains(page, "<script src=\"chart.js\">"));
  CHECK(contains(page, "<script src=\"dashboard.js\">"));
  CHECK(contains(http(m.dashboard_port(), "GET", "/chart.js?token=s3cret"), "Chart.js v"));
  // The page's <script src>s and its icon come without the page's query: served without the token
  // (the same bytes for everyone, no data, no token); the page, the API and the commands are not.
  CHECK(contains(http(m.dashboard_port(), "GET", "/chart.js"), "Chart.js v"));
  CHECK(contains(http(m.dashboard_port(), "GET", "/favicon.svg"), "200 OK"));
  int scripts = 0;
  for (std::size_t at = page.find("<script src=\""); at != std::string::npos; at = page.find("<script src=\"", at + 1)) {
    const std::size_t from = at + 13;
    const std::string src = page.substr(from, page.find('"', from) - from);
    const std::string script = http(m.dashboard_port(), "GET", "/" + src);
    CHECK_MESSAGE(contains(script, "200 OK"), src);
    CHECK_MESSAGE(contains(script, "Content-Type: application/javascript"), src);
    CHECK_MESSAGE(!contains(script, "s3cret"), src);
    CHECK_MESSAGE(contains(http(m.dashboard_port(), "POST", "/" + src), "401 Unauthorized"), src);
    ++scripts;
  }
  CHECK(scripts == 4);  // chart.js, dashboard_charts.js, dashboard_cards.js, dashboard.js
  CHECK(contains(http(m.dashboard_port(), "GET", "/dashboard.js"), "withToken(\"/api/events\")"));
  CHECK(contains(http(m.dashboard_port(), "GET", "/"), "401 Unauthorized"));
  CHECK(contains(http(m.dashboard_port(), "GET", "/index.html"), "401 Unauthorized"));
  CHECK(contains(http(m.dashboard_port(), "POST", "/chart.js"), "401 Unauthorized"));
  CHECK(contains(http(m.dashboard_port(), "GET", "/api/state?x=/chart.js"), "401 Unauthorized"));
  CHECK(contains(http(m.dashboard_port(), "GET", "/api/state?x=/dashboard.js"), "401 Unauthorized"));
  for (const char* api : {"/api/state", "/api/history", "/api/events", "/api/logs?worker=0", "/api/flight_recorder",
                          "/api/ps_cluster", "/api/actors", "/api/trace"}) {
    CHECK_MESSAGE(contains(http(m.dashboard_port(), "GET", api), "401 Unauthorized"), api);
  }
  for (const char* command : {"/api/pause", "/api/resume", "/api/checkpoint", "/api/stop", "/api/learning_rate?value=0.1",
                              "/api/control?name=x&value=1", "/api/actor_command?id=1&action=stop", "/api/trace?steps=1"}) {
    CHECK_MESSAGE(contains(http(m.dashboard_port(), "POST", command), "401 Unauthorized"), command);
  }
  CHECK(body_of(http(m.dashboard_port(), "GET", "/api/state?token=s3cret"))["pending_commands"] == 0);
}

TEST_CASE("monitor: without a token, another site's page cannot steer the training") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0"});
  MonitorOptions o;
  o.dashboard_port = 0;
  std::ostringstream log;
  o.log = &log;
  Monitor m(s, nullptr, o);
  const int port = m.dashboard_port();
  const std::string host = "127.0.0.1:" + std::to_string(port);
  // A cross-site POST (a form or fetch on another site's page) carries that site's Origin.
  CHECK(contains(http(port, "POST", "/api/pause", "Origin: http://evil.example\r\n"), "403 Forbidden"));
  CHECK(contains(http(port, "POST", "/api/pause", "Origin: http://" + host + "\r\n"), "200 OK"));
  // A name rebound to 127.0.0.1 arrives with its own Host.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const std::string req = "GET /api/state HTTP/1.1\r\nHost: evil.example:" + std::to_string(port) + "\r\n\r\n";
  REQUIRE(write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()));
  char buf[512] = {};
  CHECK(read(fd, buf, sizeof buf - 1) > 0);
  CHECK(contains(buf, "403 Forbidden"));
  close(fd);
  // Its own Host first and another after: which one counts would be each reader's guess, so
  // neither does.
  CHECK(contains(http(port, "GET", "/api/state", "Host: evil.example:" + std::to_string(port) + "\r\n"),
                 "400 Bad Request"));
  const auto queued = body_of(http(port, "GET", "/api/state"))["pending_commands"].get<int>();
  const std::string twice = http(port, "POST", "/api/pause", "Host: " + host + "\r\n");
  CHECK(contains(twice, "400 Bad Request"));
  CHECK(contains(body_of(twice)["error"].get<std::string>(), "a request names one Host; this one has 2 Host headers"));
  CHECK(body_of(http(port, "GET", "/api/state"))["pending_commands"] == queued);  // the refused pause is not queued
}

TEST_CASE("monitor: a command asked for with GET is 405 with Allow: POST, a page posted to is 405 with Allow: GET") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0"});
  MonitorOptions o;
  o.dashboard_port = 0;
  std::ostringstream log;
  o.log = &log;
  Monitor m(s, nullptr, o);
  const int port = m.dashboard_port();
  for (const char* command : {"/api/pause", "/api/resume", "/api/checkpoint", "/api/stop", "/api/learning_rate"}) {
    const std::string r = http(port, "GET", command);
    CHECK_MESSAGE(contains(r, "405 Method Not Allowed"), command);
    CHECK_MESSAGE(contains(r, "Allow: POST\r\n"), command);
  }
  const std::string page = http(port, "POST", "/api/state");
  CHECK(contains(page, "405 Method Not Allowed"));
  CHECK(contains(page, "Allow: GET\r\n"));
  CHECK(contains(http(port, "PUT", "/api/trace"), "Allow: GET, POST\r\n"));
  CHECK(contains(http(port, "GET", "/api/nothing"), "404 Not Found"));
  const std::string icon = http(port, "GET", "/favicon.ico");
  CHECK(contains(icon, "200 OK"));
  CHECK(contains(icon, "image/svg+xml"));
  CHECK(contains(http(port, "GET", "/"), "rel=\"icon\""));
  // Nothing was queued by the refused requests.
  CHECK(body_of(http(port, "GET", "/api/state"))["pending_commands"] == 0);
}

TEST_CASE("monitor: destroyed by an exception, it tells an open page the run failed before its server closes") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0"});
  MonitorOptions o;
  o.dashboard_port = 0;
  std::ostringstream log;
  o.log = &log;
  std::string received;
  std::thread reader;
  try {
    Monitor m(s, nullptr, o);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(m.dashboard_port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    const std::string req =
        "GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(m.dashboard_port()) + "\r\n\r\n";
    REQUIRE(write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()));
    // The stream's header arrives once the server holds the stream.
    char buf[4096];
    while (!contains(received, ": troupe metrics")) {
      const ssize_t n = read(fd, buf, sizeof buf);
      REQUIRE(n > 0);
      received.append(buf, static_cast<std::size_t>(n));
    }
    reader = std::thread([fd, &received] {
      char more[4096];
      ssize_t n;
      while ((n = read(fd, more, sizeof more)) > 0) received.append(more, static_cast<std::size_t>(n));
      close(fd);
    });
    throw std::runtime_error("a step failed");
  } catch (const std::runtime_error&) {
  }
  reader.join();
  CHECK(contains(received, "\"end\":{"));
  CHECK(contains(received, "\"status\":\"failed\""));
  CHECK(contains(received, "the trainer ended with an error"));
}

TEST_CASE("monitor: /api/flight_recorder answers with this process's last collectives") {
  Runtime rt;
  MirroredStrategy s(rt, troupe::testing::cpus(2));
  MonitorOptions o;
  o.dashboard_port = 0;
  Monitor m(s, nullptr, o);
  REQUIRE(m.dashboard_port() > 0);
  one_step(s);
  one_step(s);
  const std::string response = http(m.dashboard_port(), "GET", "/api/flight_recorder");
  CHECK(contains(response, "200 OK"));
  const nlohmann::json dump = body_of(response);
  CHECK(dump["format"] == "troupe-flight-recorder");
  CHECK(dump["reason"] == "/api/flight_recorder");
  int reduces = 0;
  for (const auto& e : dump["entries"]) reduces += e["op"] == "all_reduce" ? 1 : 0;
  CHECK(reduces == 4);
  CHECK(contains(http(m.dashboard_port(), "POST", "/api/flight_recorder"), "405"));
}

TEST_CASE("monitor: text summaries reach /api/state printable and bounded, the newest of each tag, after the sequence asked for") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0"});
  MonitorOptions o;
  o.dashboard_port = 0;
  std::ostringstream log;
  o.log = &log;
  Monitor m(s, nullptr, o);
  const int port = m.dashboard_port();
  CHECK(body_of(http(port, "GET", "/api/state"))["texts"].empty());
  // Lines stay lines; a control byte, a byte that is not UTF-8 and a tab do not reach the page.
  m.publish_text("sample", 10, "line one\nline\x01two\xff\r\n<b>three</b>\tend");
  nlohmann::json state = body_of(http(port, "GET", "/api/state"));
  REQUIRE(state["texts"].size() == 1);
  CHECK(state["texts"][0]["tag"] == "sample");
  CHECK(state["texts"][0]["step"] == 10);
  CHECK(state["texts"][0]["sequence"] == 1);
  CHECK(state["texts"][0]["text"] == "line one\nline\xEF\xBF\xBDtwo\xEF\xBF\xBD\n<b>three</b> end");
  CHECK(body_of(http(port, "GET", "/api/state?texts_after=1"))["texts"].empty());

  // A long text is cut, "..." at its end.
  std::string long_text;
  for (int i = 0; i < 5000; ++i) long_text += "line " + std::to_string(i) + "\n";
  m.publish_text("long", 11, long_text);
  state = body_of(http(port, "GET", "/api/state?texts_after=1"));
  REQUIRE(state["texts"].size() == 1);
  const std::string shown = state["texts"][0]["text"];
  CHECK(shown.size() <= Monitor::max_text_bytes);
  CHECK(shown.size() > Monitor::max_text_bytes - 16);
  CHECK(shown.substr(0, 14) == "line 0\nline 1\n");
  CHECK(shown.substr(shown.size() - 3) == "...");
  std::string one_line(100000, 'x');
  m.publish_text("long", 12, one_line);
  state = body_of(http(port, "GET", "/api/state?texts_after=2"));
  CHECK(state["texts"][0]["text"].get<std::string>().size() == Monitor::max_text_bytes);

  // The newest few of a tag are kept.
  for (int step = 20; step < 30; ++step) m.publish_text("sample", step, "at " + std::to_string(step));
  state = body_of(http(port, "GET", "/api/state"));
  std::vector<std::int64_t> kept;
  for (const auto& t : state["texts"]) {
    if (t["tag"] == "sample") kept.push_back(t["step"]);
  }
  CHECK(kept == std::vector<std::int64_t>{26, 27, 28, 29});

  CHECK(contains(message_of([&] { m.publish_text("has space", 1, "x"); }), "tag 'has space' is not 1 to 64"));
  CHECK(contains(message_of([&] { m.publish_text("", 1, "x"); }), "is not 1 to 64"));
  for (std::size_t i = 2; i < Monitor::max_text_tags; ++i) m.publish_text("tag_" + std::to_string(i), 1, "x");
  CHECK(contains(message_of([&] { m.publish_text("one_too_many", 1, "x"); }), "at most 16"));
  m.publish_text("sample", 31, "an existing tag still takes texts");
}

namespace {

// Answers "get" with how many messages it handled.
class Counter : public Actor {
 public:
  std::vector<Tensor> receive(const std::string& name, const std::vector<Tensor>&) override {
    ++handled_;
    if (name != "get") throw std::invalid_argument("no message " + name);
    return {Tensor::scalar<std::int64_t>(handled_)};
  }

 private:
  std::int64_t handled_ = 0;
};

}  // namespace

TEST_CASE("monitor: an ActorCluster reporting into actor_events shows its actors in /api/actors, with the application's labels, numbers and restarts") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0"});
  MonitorOptions o;
  o.dashboard_port = 0;
  std::ostringstream log;
  o.log = &log;
  Monitor m(s, nullptr, o);
  const int port = m.dashboard_port();
  CHECK(body_of(http(port, "GET", "/api/state"))["actors"].is_null());
  CHECK(contains(http(port, "GET", "/api/actors"), "404 Not Found"));

  FunctionRegistry registry;
  registry.add_actor("counter", [](const std::vector<Tensor>&) -> std::unique_ptr<Actor> { return std::make_unique<Counter>(); });
  ActorClusterOptions ao;
  ao.log = [](const std::string&) {};
  std::vector<ActorEvent::Kind> heard;
  std::mutex heard_mutex;
  const auto hook = m.actor_events();
  ao.on_event = [&](const ActorEvent& e) {
    {
      std::lock_guard<std::mutex> lock(heard_mutex);
      heard.push_back(e.kind);
    }
    hook(e);
  };
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {"127.0.0.1:" + std::to_string(troupe::testing::free_port())}}});
  ActorCluster actors(rt, spec, "chief:0", registry, ao);
  ActorHandle a = actors.spawn("counter", "local");
  ActorHandle b = actors.spawn("counter", "local");
  CHECK(a.request("get")[0].item<std::int64_t>() == 1);
  CHECK(contains(message_of([&] { b.request("nope"); }), "no message nope"));  // an error is a reply too
  m.describe_actor(a.id(), "trial 0", 1, {{"accuracy", 0.5}, {"lr", 0.1}});
  m.describe_actor(b.id(), "trial 1", 1, {{"accuracy", 0.25}, {"lr", 0.2}});
  b.stop();

  // The down notice comes from the spawner's supervisor, on its own thread.
  nlohmann::json v;
  for (int i = 0; i < 100; ++i) {
    v = body_of(http(port, "GET", "/api/actors"));
    if (v["stopped"] == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(v["actors"].size() == 2);
  CHECK(v["spawned"] == 2);
  CHECK(v["running"] == 1);
  CHECK(v["down"] == 0);  // stopped by its spawner: not lost
  CHECK(v["stopped"] == 1);
  CHECK(v["restarts"] == 0);
  CHECK(v["actors"][0]["label"] == "trial 0");
  CHECK(v["actors"][0]["type"] == "counter");
  CHECK(v["actors"][0]["task"] == "local");
  CHECK(v["actors"][0]["state"] == "running");
  CHECK(v["actors"][0]["cause"].is_null());
  CHECK(v["actors"][0]["last_reply_age_ms"].get<double>() >= 0);
  CHECK(v["actors"][0]["step"] == 1);
  CHECK(v["actors"][0]["values"]["accuracy"] == 0.5);
  CHECK(v["actors"][0]["values"]["lr"] == 0.1);
  CHECK(v["actors"][1]["state"] == "stopped");
  CHECK(contains(v["actors"][1]["cause"].get<std::string>(), "stopped by its spawner"));
  CHECK(v["actors"][1]["last_reply_age_ms"].get<double>() >= 0);

  // A new actor in the stopped one's role takes its row and counts as its restart.
  ActorHandle c = actors.spawn("counter", "local");
  m.describe_actor(c.id(), "trial 1", 2, {{"accuracy", 0.75}, {"lr", 0.2}});
  v = body_of(http(port, "GET", "/api/state"))["actors"];
  REQUIRE(v["actors"].size() == 2);
  CHECK(v["actors"][1]["id"] == c.id());
  CHECK(v["actors"][1]["label"] == "trial 1");
  CHECK(v["actors"][1]["state"] == "running");
  CHECK(v["actors"][1]["restarts"] == 1);
  CHECK(v["actors"][1]["last_reply_age_ms"].is_null());
  CHECK(v["restarts"] == 1);
  REQUIRE(v["history"].size() == 2);
  CHECK(v["history"][1]["label"] == "trial 1");
  REQUIRE(v["history"][1]["points"].size() == 2);
  CHECK(v["history"][1]["points"][0]["values"]["accuracy"] == 0.25);
  CHECK(v["history"][1]["points"][1]["step"] == 2);
  CHECK(v["history"][1]["points"][1]["values"]["accuracy"] == 0.75);
  {
    std::lock_guard<std::mutex> lock(heard_mutex);
    CHECK(std::count(heard.begin(), heard.end(), ActorEvent::Kind::spawned) == 3);
    CHECK(std::count(heard.begin(), heard.end(), ActorEvent::Kind::replied) == 2);
    CHECK(std::count(heard.begin(), heard.end(), ActorEvent::Kind::down) == 1);
  }

  CHECK(contains(message_of([&] { m.describe_actor(1, "", 1, {}); }), "label '' is not 1 to 64 bytes"));
  CHECK(contains(message_of([&] { m.describe_actor(1, "a\x01", 1, {}); }), "is not 1 to 64 bytes of printable text"));
  CHECK(contains(message_of([&] { m.describe_actor(1, "t", 1, {{"has space", 1}}); }), "the name 'has space' is not 1 to 32"));
  std::vector<std::pair<std::string, double>> many(Monitor::max_actor_values + 1, {"v", 1.0});
  CHECK(contains(message_of([&] { m.describe_actor(1, "t", 1, many); }), "17 numbers for t (at most 16)"));
}

TEST_CASE("monitor: an actor command from the page waits for the application: a declared action on a running actor's row, else 400 naming the id or action, under every command's guards") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0"});
  MonitorOptions o;
  o.dashboard_port = 0;
  std::ostringstream log;
  o.log = &log;
  Monitor m(s, nullptr, o);
  const int port = m.dashboard_port();
  const std::string host = "127.0.0.1:" + std::to_string(port);
  FunctionRegistry registry;
  registry.add_actor("counter", [](const std::vector<Tensor>&) -> std::unique_ptr<Actor> { return std::make_unique<Counter>(); });
  ActorClusterOptions ao;
  ao.log = [](const std::string&) {};
  ao.on_event = m.actor_events();
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {"127.0.0.1:" + std::to_string(troupe::testing::free_port())}}});
  ActorCluster actors(rt, spec, "chief:0", registry, ao);
  ActorHandle a = actors.spawn("counter", "local");
  ActorHandle b = actors.spawn("counter", "local");
  m.describe_actor(a.id(), "trial 0", 1, {{"accuracy", 0.5}});
  m.describe_actor(b.id(), "trial 1", 1, {{"accuracy", 0.25}});
  const std::string a_id = std::to_string(a.id()), b_id = std::to_string(b.id());
  const auto error_of = [](const std::string& r) { return body_of(r)["error"].get<std::string>(); };

  // Nothing offered yet: refused, naming the action.
  std::string r = http(port, "POST", "/api/actor_command?id=" + a_id + "&action=stop");
  CHECK(contains(r, "400 Bad Request"));
  CHECK(contains(error_of(r), "no action named \"stop\" (this trainer offers: none)"));
  CHECK(contains(message_of([&] { m.add_actor_action("Stop"); }), "name 'Stop' is not 1 to 32 of a-z 0-9 _"));
  m.add_actor_action("stop", "stop this trial");
  m.add_actor_action("clone", "clone\tit\n");
  CHECK(contains(message_of([&] { m.add_actor_action("stop"); }), "an action named stop was already added"));
  nlohmann::json v = body_of(http(port, "GET", "/api/actors"));
  REQUIRE(v["actions"].size() == 2);
  CHECK(v["actions"][0] == nlohmann::json({{"name", "stop"}, {"help", "stop this trial"}}));
  CHECK(v["actions"][1]["help"] == "clone it\xEF\xBF\xBD");  // printable: one line
  CHECK(v["pending"].empty());
  CHECK(v["answers"].empty());

  // Hostile ids and actions: each refused with 400 naming it (printable), nothing waiting.
  for (const char* id : {"abc", "", "-1", "1e3", "0x1"}) {
    r = http(port, "POST", std::string("/api/actor_command?action=stop&id=") + id);
    CHECK_MESSAGE(contains(r, "400 Bad Request"), id);
    CHECK_MESSAGE(contains(error_of(r), "actor_command: id \"" + std::string(id) + "\" is not an actor's id"), error_of(r));
  }
  r = http(port, "POST", "/api/actor_command?id=99999&action=stop");
  CHECK(contains(r, "400 Bad Request"));
  CHECK(contains(error_of(r), "no actor with id 99999 on the Actors card"));
  r = http(port, "POST", "/api/actor_command?id=" + a_id + "&action=%3Cb%3E%01");
  CHECK(contains(r, "400 Bad Request"));
  CHECK(contains(error_of(r), "no action named \"<b>\xEF\xBF\xBD\" (this trainer offers: stop, clone)"));
  // The guards of every command.
  const std::string get = http(port, "GET", "/api/actor_command?id=" + a_id + "&action=stop");
  CHECK(contains(get, "405 Method Not Allowed"));
  CHECK(contains(get, "Allow: POST\r\n"));
  CHECK(contains(http(port, "POST", "/api/actor_command?id=" + a_id + "&action=stop", "Origin: http://evil.example\r\n"),
                 "403 Forbidden"));
  CHECK(body_of(http(port, "GET", "/api/actors"))["pending"].empty());
  CHECK(m.take_actor_commands().empty());

  // Asked from the page's origin: waiting, until the application takes them, in order.
  r = http(port, "POST", "/api/actor_command?id=" + a_id + "&action=stop", "Origin: http://" + host + "\r\n");
  CHECK(contains(r, "200 OK"));
  CHECK(body_of(r)["id"] == a.id());
  CHECK(body_of(r)["label"] == "trial 0");
  CHECK(body_of(r)["action"] == "stop");
  CHECK(contains(http(port, "POST", "/api/actor_command?id=" + b_id + "&action=clone"), "200 OK"));
  v = body_of(http(port, "GET", "/api/state"))["actors"];
  REQUIRE(v["pending"].size() == 2);
  CHECK(v["pending"][0] == nlohmann::json({{"id", a.id()}, {"label", "trial 0"}, {"action", "stop"}}));
  CHECK(v["pending"][1]["action"] == "clone");
  const std::vector<ActorCommand> taken = m.take_actor_commands();
  REQUIRE(taken.size() == 2);
  CHECK(taken[0].id == a.id());
  CHECK(taken[0].label == "trial 0");
  CHECK(taken[0].action == "stop");
  CHECK(taken[1].id == b.id());
  CHECK(taken[1].label == "trial 1");
  CHECK(taken[1].action == "clone");
  CHECK(m.take_actor_commands().empty());
  CHECK(body_of(http(port, "GET", "/api/actors"))["pending"].empty());

  // The application's answers: said, and listed newest first, a refusal marked.
  a.stop();
  m.answer_actor_command(taken[0], "trial 0 stopped after step 1");
  m.answer_actor_command(taken[1], "trial 1 not cloned: no room", true);
  CHECK(contains(log.str(), "trial 0 stopped after step 1\n"));
  CHECK(contains(log.str(), "trial 1 not cloned: no room\n"));
  for (int i = 0; i < 100; ++i) {
    v = body_of(http(port, "GET", "/api/actors"));
    if (v["actors"][0]["state"] == "stopped") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(v["answers"].size() == 2);
  CHECK(v["answers"][0]["text"] == "trial 1 not cloned: no room");
  CHECK(v["answers"][0]["refused"] == true);
  CHECK(v["answers"][0]["action"] == "clone");
  CHECK(v["answers"][0]["label"] == "trial 1");
  CHECK(v["answers"][0]["sequence"] == 2);
  CHECK(v["answers"][1]["text"] == "trial 0 stopped after step 1");
  CHECK(v["answers"][1]["refused"] == false);
  CHECK(v["answers"][1]["id"] == a.id());
  // A stopped actor takes no action.
  CHECK(v["actors"][0]["state"] == "stopped");
  r = http(port, "POST", "/api/actor_command?id=" + a_id + "&action=clone");
  CHECK(contains(r, "409 Conflict"));
  CHECK(contains(error_of(r), "trial 0 (#" + a_id + ") is stopped: actions are for running actors"));

  // At most max_actor_actions.
  for (std::size_t i = 2; i < Monitor::max_actor_actions; ++i) m.add_actor_action("action_" + std::to_string(i));
  CHECK(contains(message_of([&] { m.add_actor_action("one_too_many"); }), "(at most 8)"));

  {
    // With a token, a command without it is refused like every other request.
    MonitorOptions with_token = o;
    with_token.dashboard_token = "s3cret";
    Monitor guarded(s, nullptr, with_token);
    guarded.add_actor_action("stop");
    CHECK(contains(http(guarded.dashboard_port(), "POST", "/api/actor_command?id=" + a_id + "&action=stop"),
                   "401 Unauthorized"));
    CHECK(contains(http(guarded.dashboard_port(), "POST", "/api/actor_command?id=" + a_id + "&action=stop&token=s3cret"),
                   "400 Bad Request"));  // past the token: it watches no actors
  }

  // After the end, 409 as for every command.
  CHECK(contains(http(port, "POST", "/api/stop?checkpoint=0"), "200 OK"));
  one_step(s);
  CHECK(m.on_step_end(1, 0.5) == StepDecision::stop);
  r = http(port, "POST", "/api/actor_command?id=" + b_id + "&action=stop");
  CHECK(contains(r, "409 Conflict"));
  CHECK(contains(error_of(r), "the training has stopped"));
}

}  // namespace TROUPE_TEST_FILE
