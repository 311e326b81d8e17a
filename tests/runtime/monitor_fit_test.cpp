// The Monitor steering a training: pause, rate, checkpoint and stop at step boundaries, as a fit
// callback (MirroredStrategy and ParameterServerStrategy), and an application's controls.
#include "monitor_test_util.hpp"

namespace TROUPE_TEST_FILE {  // this file's own names in a unity build (tests/CMakeLists.txt)

using namespace monitor_test;

TEST_CASE("monitor: pause, learning rate, checkpoint and stop act at the step boundary") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto scope = s.scope();
  auto sgd = std::make_shared<nn::SGD>(0.5f);
  MonitorOptions o;
  o.dashboard_port = 0;
  std::ostringstream log;
  o.log = &log;
  Monitor m(s, sgd.get(), o);
  std::vector<std::int64_t> saved;
  m.set_checkpoint_function([&](std::int64_t step) { saved.push_back(step); });
  const int port = m.dashboard_port();
  one_step(s);
  CHECK(m.on_step_end(1, 0.5) == StepDecision::proceed);
  CHECK(contains(http(port, "GET", "/api/state"), "\"step\":1,\"paused\":false"));

  CHECK(contains(http(port, "POST", "/api/learning_rate?value=0.25"), "200 OK"));
  CHECK(contains(http(port, "POST", "/api/learning_rate?value=zero"), "400 Bad Request"));
  // Decimal only: 0x10 is not 16, 1e400 and inf are no rate.
  for (const char* value : {"0x10", "0X10", "1e400", "inf", "-0.1", "16abc"}) {
    const std::string r = http(port, "POST", std::string("/api/learning_rate?value=") + value);
    CHECK_MESSAGE(contains(r, "400 Bad Request"), value);
    CHECK_MESSAGE(contains(body_of(r)["error"].get<std::string>(),
                           "learning_rate: value \"" + std::string(value) + "\" is not a positive number"),
                  value);
  }
  CHECK(sgd->learning_rate() == 0.5f);  // not before the boundary
  CHECK(contains(http(port, "POST", "/api/pause"), "200 OK"));
  // The boundary pauses; the resume comes from another thread while on_step_end waits.
  std::thread resumer([&] {
    for (int i = 0; i < 100 && !contains(http(port, "GET", "/api/state"), "\"paused\":true"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    http(port, "POST", "/api/resume");
  });
  one_step(s);
  CHECK(m.on_step_end(2, 0.4) == StepDecision::proceed);
  resumer.join();
  CHECK(sgd->learning_rate() == 0.25f);
  CHECK(contains(log.str(), "paused after step 2"));
  CHECK(contains(log.str(), "learning rate 0.25 from step 3"));
  CHECK(contains(log.str(), "resumed after step 2"));

  CHECK(contains(http(port, "POST", "/api/checkpoint"), "200 OK"));
  one_step(s);
  CHECK(m.on_step_end(3, 0.3) == StepDecision::proceed);
  CHECK(contains(http(port, "POST", "/api/stop"), "200 OK"));
  one_step(s);
  CHECK(m.on_step_end(4, 0.2) == StepDecision::stop);
  CHECK(saved == std::vector<std::int64_t>{3, 4});
  CHECK(m.stopped());
  CHECK(contains(http(port, "POST", "/api/pause"), "409 Conflict"));
  CHECK(contains(http(port, "GET", "/api/nothing"), "404 Not Found"));
}

TEST_CASE("monitor: as a fit callback, the dashboard's controls reach fit through model.control()") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto scope = s.scope();
  nn::BlobOptions blobs;
  blobs.samples = 256;
  const nn::ClassificationData d = nn::make_blobs(blobs);
  nn::Model model(nn::Sequential({nn::Dense(blobs.features, 8, nn::Activation::relu, 1),
                                  nn::Dense(8, blobs.classes, nn::Activation::none, 2)}));
  auto sgd = std::make_shared<nn::SGD>(0.05f);
  model.compile(sgd, nn::Loss::sparse_categorical_crossentropy());
  MonitorOptions o;
  o.dashboard_port = 0;
  std::ostringstream log;
  o.log = &log;
  Monitor m(s, sgd.get(), o);
  const int port = m.dashboard_port();
  std::vector<std::int64_t> saved;
  std::string state_while_paused;
  std::thread resumer;
  auto probe = std::make_shared<nn::LambdaCallback>();
  probe->batch_end = [&](std::int64_t, nn::Logs&) {
    const std::int64_t step = model.control().step();
    if (step == 2) {
      CHECK(contains(http(port, "POST", "/api/learning_rate?value=0.25"), "200 OK"));
      CHECK(contains(http(port, "POST", "/api/checkpoint"), "200 OK"));
    }
    if (step == 4) {
      CHECK(contains(http(port, "POST", "/api/pause"), "200 OK"));
      resumer = std::thread([&] {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!model.control().paused() && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        state_while_paused = http(port, "GET", "/api/state");
        http(port, "POST", "/api/resume");
      });
    }
    if (step == 6) CHECK(contains(http(port, "POST", "/api/stop"), "200 OK"));
  };
  probe->checkpoint = [&](std::int64_t step, nn::Logs&) { saved.push_back(step); };
  nn::FitOptions fit;
  fit.verbose = 0;
  fit.callbacks = {m.callback(), probe};
  const nn::History h =
      model.fit(data::Dataset::from_tensor_slices({d.features, d.labels}).repeat().batch(32, true), 1, 50, fit);
  if (resumer.joinable()) resumer.join();
  // With one worker a request made after step S applies at the boundary of S.
  CHECK(saved == std::vector<std::int64_t>{2, 6});
  CHECK(h.stopped_at_step == 6);
  CHECK(h.stop_reason == Monitor::dashboard_stop_reason);
  CHECK(m.stopped());
  CHECK(sgd->learning_rate() == 0.25f);
  CHECK(contains(state_while_paused, "\"step\":4,\"paused\":true"));
  CHECK(contains(log.str(), "learning rate 0.25 from step 3"));
  CHECK(contains(log.str(), "paused after step 4"));
  CHECK(contains(log.str(), "resumed after step 4"));
  CHECK(contains(log.str(), "stopped after step 6"));
  // Both replicas' losses came from fit's logs.
  const std::string state = http(port, "GET", "/api/state");
  CHECK(contains(state, "\"step\":6,"));
  const auto losses_at = state.find("\"replica_loss\":[");
  REQUIRE(losses_at != std::string::npos);
  const std::string losses = state.substr(losses_at + 16, state.find(']', losses_at) - losses_at - 16);
  CHECK(losses.find(',') != std::string::npos);  // two replicas
  CHECK(!contains(losses, "null"));
  CHECK(std::isdigit(static_cast<unsigned char>(losses[0])));
  CHECK(contains(http(port, "POST", "/api/pause"), "409 Conflict"));
}

TEST_CASE("monitor: without checkpoints, Save checkpoint and Stop (with checkpoint) are refused with 409, a stop without one stops") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0"});
  auto scope = s.scope();
  MonitorOptions o;
  o.dashboard_port = 0;
  o.checkpoints = false;
  std::ostringstream log;
  o.log = &log;
  Monitor m(s, nullptr, o);
  std::vector<std::int64_t> saved;
  m.set_checkpoint_function([&](std::int64_t step) { saved.push_back(step); });
  const int port = m.dashboard_port();
  CHECK(body_of(http(port, "GET", "/api/state"))["can_checkpoint"] == false);
  const std::string checkpoint = http(port, "POST", "/api/checkpoint");
  CHECK(contains(checkpoint, "409 Conflict"));
  CHECK(contains(body_of(checkpoint)["error"].get<std::string>(), "saves no checkpoints"));
  const std::string stop = http(port, "POST", "/api/stop");
  CHECK(contains(stop, "409 Conflict"));
  CHECK(contains(body_of(stop)["error"].get<std::string>(), "checkpoint=0"));
  CHECK(contains(http(port, "POST", "/api/stop?checkpoint=0"), "200 OK"));
  one_step(s);
  CHECK(m.on_step_end(1, 0.5) == StepDecision::stop);
  CHECK(saved.empty());
  CHECK(m.stopped());

  // With checkpoints (the default) but no function to save them, a custom loop refuses too.
  MonitorOptions with = o;
  with.checkpoints = true;
  Monitor bare(s, nullptr, with);
  CHECK(contains(http(bare.dashboard_port(), "POST", "/api/checkpoint"), "409 Conflict"));
  bare.set_checkpoint_function([](std::int64_t) {});
  CHECK(contains(http(bare.dashboard_port(), "POST", "/api/checkpoint"), "200 OK"));
}

TEST_CASE("monitor: as a fit callback, the state has the compiled metrics, each epoch's val_* logs, marks, the epoch and an ETA, then finished") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto scope = s.scope();
  nn::BlobOptions blobs;
  blobs.samples = 256;
  const nn::ClassificationData d = nn::make_blobs(blobs);
  nn::Model model(nn::Sequential({nn::Dense(blobs.features, 8, nn::Activation::relu, 1),
                                  nn::Dense(8, blobs.classes, nn::Activation::none, 2)}));
  auto sgd = std::make_shared<nn::SGD>(0.05f);
  model.compile(sgd, nn::Loss::sparse_categorical_crossentropy(), {"accuracy"});
  MonitorOptions o;
  o.dashboard_port = 0;
  std::ostringstream log;
  o.log = &log;
  Monitor m(s, sgd.get(), o);
  const int port = m.dashboard_port();
  nlohmann::json during;
  std::thread resumer;
  auto probe = std::make_shared<nn::LambdaCallback>();
  probe->batch_end = [&](std::int64_t, nn::Logs&) {
    const std::int64_t step = model.control().step();
    if (step == 6) {
      CHECK(contains(http(port, "POST", "/api/learning_rate?value=0.02"), "200 OK"));
      CHECK(contains(http(port, "POST", "/api/pause"), "200 OK"));
      resumer = std::thread([&] {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!model.control().paused() && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        http(port, "POST", "/api/resume");
      });
    }
    if (step == 10) during = body_of(http(port, "GET", "/api/state"));
  };
  nn::FitOptions fit;
  fit.verbose = 0;
  fit.callbacks = {m.callback(), probe};
  fit.validation_data = data::Dataset::from_tensor_slices({d.features, d.labels}).batch(64);
  model.fit(data::Dataset::from_tensor_slices({d.features, d.labels}).repeat().batch(32, true), 3, 4, fit);
  if (resumer.joinable()) resumer.join();

  // During the run: the epoch of 3, the steps in all, an ETA, the step's accuracy.
  REQUIRE(during.is_object());
  CHECK(during["status"] == "running");
  CHECK(during["progress"]["epoch"] == 3);
  CHECK(during["progress"]["epochs"] == 3);
  CHECK(during["progress"]["total_steps"] == 12);
  CHECK(during["progress"]["eta_s"].is_number());
  CHECK(during["progress"]["eta_s"].get<double>() >= 0);
  CHECK(during["metric_names"] == nlohmann::json::array({"accuracy"}));
  // The single process's row: its task and a heartbeat age.
  CHECK(during["workers"][0]["task"] == "/job:localhost/replica:0/task:0");
  CHECK(during["workers"][0]["heartbeat_age_ms"].is_number());
  CHECK(during["workers"][0]["rss_bytes"].get<double>() > 1e6);

  const nlohmann::json after = body_of(http(port, "GET", "/api/state?epochs_after=1&marks_after=0"));
  CHECK(after["status"] == "finished");
  CHECK(after["progress"]["eta_s"].is_null());
  // Epochs 2 and 3 (1 was asked to be left out), each with its val_ logs.
  REQUIRE(after["epochs"].size() == 2);
  CHECK(after["epochs"][0]["epoch"] == 2);
  CHECK(after["epochs"][0]["step"] == 8);
  CHECK(after["epochs"][1]["logs"]["val_accuracy"].is_number());
  CHECK(after["epochs"][1]["logs"]["val_loss"].is_number());
  CHECK(after["epochs"][1]["logs"]["accuracy"].is_number());
  CHECK(!after["epochs"][1]["logs"].contains("time/step_ms"));
  // The learning rate, the pause and the resume, each at step 6.
  std::vector<std::string> kinds;
  for (const auto& mark : after["marks"]) {
    kinds.push_back(mark["kind"]);
    CHECK(mark["step"] == 6);
  }
  std::sort(kinds.begin(), kinds.end());
  CHECK(kinds == std::vector<std::string>{"learning_rate", "pause", "resume"});
  CHECK(body_of(http(port, "GET", "/api/state?marks_after=3"))["marks"].empty());
  // The history's steps carry the accuracy by name.
  const nlohmann::json history = body_of(http(port, "GET", "/api/history"));
  REQUIRE(history["events"].size() == 12);
  CHECK(history["events"][11]["metrics"]["accuracy"].is_number());
  // The monitor's own lines, on demand.
  const nlohmann::json lines = body_of(http(port, "GET", "/api/logs?worker=0"));
  CHECK(contains(lines["lines"].dump(), "paused after step 6"));
  CHECK(contains(http(port, "GET", "/api/logs?worker=5"), "400 Bad Request"));
  // Commands after the end are refused.
  CHECK(contains(http(port, "POST", "/api/pause"), "409 Conflict"));
}

TEST_CASE("monitor: as a fit callback under ParameterServerStrategy, the dashboard steers fit at closure boundaries") {
  const auto a = troupe::testing::loopback_addresses(3);
  ClusterSpec spec(ClusterSpec::JobMap{{"chief", {a[0]}}, {"worker", {a[1]}}, {"ps", {a[2]}}});
  FunctionRegistry functions;
  nn::BlobOptions blobs;
  blobs.samples = 256;
  functions.add_dataset("blobs", [blobs] {
    const nn::ClassificationData d = nn::make_blobs(blobs);
    return data::Dataset::from_tensor_slices({d.features, d.labels}).repeat().batch(32, true);
  });
  Runtime worker_rt, ps_rt, chief_rt;
  Server worker(worker_rt, spec, "worker", 0, functions, ServerOptions{});
  Server ps(ps_rt, spec, "ps", 0, FunctionRegistry{}, ServerOptions{});
  ParameterServerStrategy strategy(chief_rt, std::make_shared<SimpleClusterResolver>(spec, "chief", 0), nullptr,
                                   ServerOptions{});
  auto sgd = std::make_shared<nn::SGD>(0.05f);
  std::optional<nn::Model> model;
  {
    auto scope = strategy.scope();
    model.emplace(nn::Sequential({nn::Dense(blobs.features, 8, nn::Activation::relu, 1),
                                  nn::Dense(8, blobs.classes, nn::Activation::none, 2)}));
    model->compile(sgd, nn::Loss::sparse_categorical_crossentropy());
  }
  MonitorOptions o;
  o.dashboard_port = 0;
  std::ostringstream log;
  o.log = &log;
  Monitor m(strategy, sgd.get(), o);
  const int dashboard = m.dashboard_port();
  std::vector<std::int64_t> saved;
  auto probe = std::make_shared<nn::LambdaCallback>();
  probe->batch_end = [&](std::int64_t, nn::Logs&) {
    const std::int64_t step = model->control().step();
    if (step == 4) CHECK(contains(http(dashboard, "POST", "/api/learning_rate?value=0.25"), "200 OK"));
    if (step == 8) CHECK(contains(http(dashboard, "POST", "/api/stop"), "200 OK"));
  };
  probe->checkpoint = [&](std::int64_t step, nn::Logs&) { saved.push_back(step); };
  nn::FitOptions fit;
  fit.verbose = 0;
  fit.steps_per_execution = 2;
  fit.callbacks = {m.callback(), probe};
  const nn::History h = model->fit(nn::DatasetCreator("blobs"), 1, 50, fit);
  // The stop waits for the closure in flight (2 per worker): one more closure of 2 steps.
  CHECK(h.stopped_at_step == 10);
  CHECK(saved == std::vector<std::int64_t>{10});  // the dashboard's stop saves a checkpoint first
  CHECK(h.stop_reason == Monitor::dashboard_stop_reason);
  CHECK(m.stopped());
  CHECK(sgd->learning_rate() == 0.25f);
  CHECK(contains(log.str(), "learning rate 0.25 from step"));
  CHECK(contains(log.str(), "stopped after step 10"));
  CHECK(contains(http(dashboard, "GET", "/api/state"), "\"step\":10,"));
}

TEST_CASE("monitor: an application's control is set from the page within its range at the next step boundary, else refused naming the value and the range") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto scope = s.scope();
  MonitorOptions o;
  o.dashboard_port = 0;
  std::ostringstream log;
  o.log = &log;
  Monitor m(s, nullptr, o);
  MonitorControl t;
  t.name = "temperature";
  t.value = 1;
  t.min = 0.1;
  t.max = 5;
  t.help = "sampling\ttemperature\n";
  m.add_control(t);
  CHECK(m.control("temperature") == 1);
  CHECK(contains(message_of([&] { m.add_control(t); }), "already added"));
  MonitorControl bad = t;
  bad.name = "tem perature";
  CHECK(contains(message_of([&] { m.add_control(bad); }), "'tem perature' is not 1 to 32 of"));
  bad.name = "ok";
  bad.value = 9;
  CHECK(contains(message_of([&] { m.add_control(bad); }), "value 9 and range 0.1..5"));
  bad.value = 1;
  bad.max = NAN;
  CHECK(contains(message_of([&] { m.add_control(bad); }), "finite"));
  CHECK_THROWS_AS(m.control("nope"), std::out_of_range);
  CHECK(contains(message_of([&] { m.control("nope"); }), "added: temperature"));

  const int port = m.dashboard_port();
  const std::string host = "127.0.0.1:" + std::to_string(port);
  nlohmann::json state = body_of(http(port, "GET", "/api/state"));
  REQUIRE(state["controls"].size() == 1);
  CHECK(state["controls"][0]["name"] == "temperature");
  CHECK(state["controls"][0]["value"] == 1.0);
  CHECK(state["controls"][0]["min"] == 0.1);
  CHECK(state["controls"][0]["max"] == 5.0);
  CHECK(state["controls"][0]["help"] == "sampling temperature\xEF\xBF\xBD");  // printable: one line
  CHECK(state["controls"][0]["pending"].is_null());

  // Hostile values: each refused with 400 naming it and the range, nothing pending.
  for (const char* value : {"abc", "nan", "inf", "-inf", "1e400", "6", "0.05", "", "0x1", "1;2"}) {
    const std::string r = http(port, "POST", std::string("/api/control?name=temperature&value=") + value);
    CHECK_MESSAGE(contains(r, "400 Bad Request"), value);
    const std::string error = body_of(r)["error"].get<std::string>();
    CHECK_MESSAGE(contains(error, "control temperature: value \"" + std::string(value) + "\" is not a number in 0.1..5"),
                  error);
  }
  // A name from the page is shown decoded and printable (a control byte as U+FFFD).
  const std::string unknown = http(port, "POST", "/api/control?name=%3Cb%3E%01&value=1");
  CHECK(contains(unknown, "400 Bad Request"));
  CHECK(contains(body_of(unknown)["error"].get<std::string>(),
                 "no control named \"<b>\xEF\xBF\xBD\" (this trainer has: temperature)"));
  CHECK(contains(http(port, "POST", "/api/control?value=1"), "400 Bad Request"));
  CHECK(body_of(http(port, "GET", "/api/state"))["controls"][0]["pending"].is_null());
  // The dashboard's guards hold for it as for every command.
  const std::string get = http(port, "GET", "/api/control?name=temperature&value=2");
  CHECK(contains(get, "405 Method Not Allowed"));
  CHECK(contains(get, "Allow: POST\r\n"));
  CHECK(contains(http(port, "POST", "/api/control?name=temperature&value=2", "Origin: http://evil.example\r\n"),
                 "403 Forbidden"));
  CHECK(body_of(http(port, "GET", "/api/state"))["controls"][0]["pending"].is_null());

  // Set from the page's origin: pending until the boundary, then in use from the next step.
  const std::string ok =
      http(port, "POST", "/api/control?name=temperature&value=0.5", "Origin: http://" + host + "\r\n");
  CHECK(contains(ok, "200 OK"));
  CHECK(body_of(ok)["value"] == 0.5);
  CHECK(body_of(http(port, "GET", "/api/state"))["controls"][0]["pending"] == 0.5);
  CHECK(m.control("temperature") == 1);
  one_step(s);
  CHECK(m.on_step_end(1, 0.5) == StepDecision::proceed);
  CHECK(m.control("temperature") == 0.5);
  CHECK(contains(log.str(), "temperature 0.5 from step 2"));
  state = body_of(http(port, "GET", "/api/state"));
  CHECK(state["controls"][0]["value"] == 0.5);
  CHECK(state["controls"][0]["pending"].is_null());
  bool marked = false;
  for (const auto& mark : state["marks"]) marked |= mark["kind"] == "control" && mark["step"] == 1;
  CHECK(marked);
  // The last of several sets before a boundary wins; the bounds themselves are accepted.
  CHECK(contains(http(port, "POST", "/api/control?name=temperature&value=5"), "200 OK"));
  CHECK(contains(http(port, "POST", "/api/control?name=temperature&value=0.1"), "200 OK"));
  one_step(s);
  CHECK(m.on_step_end(2, 0.5) == StepDecision::proceed);
  CHECK(m.control("temperature") == 0.1);

  CHECK(contains(http(port, "POST", "/api/stop?checkpoint=0"), "200 OK"));
  one_step(s);
  CHECK(m.on_step_end(3, 0.5) == StepDecision::stop);
  CHECK(contains(http(port, "POST", "/api/control?name=temperature&value=2"), "409 Conflict"));

  // With a token, a set without it is refused like every other request.
  MonitorOptions with_token = o;
  with_token.dashboard_token = "s3cret";
  Monitor guarded(s, nullptr, with_token);
  guarded.add_control(t);
  CHECK(contains(http(guarded.dashboard_port(), "POST", "/api/control?name=temperature&value=2"), "401 Unauthorized"));
  CHECK(contains(http(guarded.dashboard_port(), "POST", "/api/control?name=temperature&value=2&token=s3cret"), "200 OK"));
}

TEST_CASE("monitor: as a fit callback, a control set after step 2 is read by the application from step 3") {
  Runtime rt;
  MirroredStrategy s(rt, {"CPU:0", "CPU:1"});
  auto scope = s.scope();
  nn::BlobOptions blobs;
  blobs.samples = 256;
  const nn::ClassificationData d = nn::make_blobs(blobs);
  nn::Model model(nn::Sequential({nn::Dense(blobs.features, 8, nn::Activation::relu, 1),
                                  nn::Dense(8, blobs.classes, nn::Activation::none, 2)}));
  model.compile(std::make_shared<nn::SGD>(0.05f), nn::Loss::sparse_categorical_crossentropy());
  MonitorOptions o;
  o.dashboard_port = 0;
  std::ostringstream log;
  o.log = &log;
  Monitor m(s, model.optimizer().get(), o);
  m.add_control({"noise", 0.25, 0, 1, ""});
  const int port = m.dashboard_port();
  std::vector<double> seen;  // the value the application read at each step's boundary
  auto app = std::make_shared<nn::LambdaCallback>();
  app->batch_end = [&](std::int64_t, nn::Logs&) {
    seen.push_back(m.control("noise"));
    if (model.control().step() == 2) CHECK(contains(http(port, "POST", "/api/control?name=noise&value=0.75"), "200 OK"));
  };
  nn::FitOptions fit;
  fit.verbose = 0;
  fit.callbacks = {app, m.callback()};
  model.fit(data::Dataset::from_tensor_slices({d.features, d.labels}).repeat().batch(32, true), 1, 4, fit);
  CHECK(seen == std::vector<double>{0.25, 0.25, 0.75, 0.75});
  CHECK(contains(log.str(), "noise 0.75 from step 3"));
}

}  // namespace TROUPE_TEST_FILE
