// The Monitor in one process: its refusals, the token, its HTTP answers, a failed run told to the
// page, the flight recorder, text summaries and the actors page.
#include "monitor_test_util.hpp"

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
  CHECK(contains(http(m.dashboard_port(), "GET", "/chart.js?token=s3cret"), "Chart.js v"));
  // The page's <script src="chart.js"> and its icon come without the page's query: served without
  // the token (the same bytes for everyone); the page, the API and the commands are not.
  CHECK(contains(http(m.dashboard_port(), "GET", "/chart.js"), "Chart.js v"));
  CHECK(contains(http(m.dashboard_port(), "GET", "/favicon.svg"), "200 OK"));
  CHECK(contains(http(m.dashboard_port(), "GET", "/"), "401 Unauthorized"));
  CHECK(contains(http(m.dashboard_port(), "POST", "/chart.js"), "401 Unauthorized"));
  CHECK(contains(http(m.dashboard_port(), "GET", "/api/state?x=/chart.js"), "401 Unauthorized"));
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
    if (v["down"] == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(v["actors"].size() == 2);
  CHECK(v["spawned"] == 2);
  CHECK(v["running"] == 1);
  CHECK(v["down"] == 1);
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
  CHECK(v["actors"][1]["state"] == "down");
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
