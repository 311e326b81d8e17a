// Population-based training (PBT, Jaderberg et al. 2017) over an actor cluster: every trial is an
// actor on one of the workers (ActorCluster, docs/actors.md), training its own copy of a small MLP
// on the digits with its own hyperparameters (learning rate and momentum of SGD). One binary for
// every role, chosen by TF_CONFIG: the "worker" tasks host the trials until the chief leaves; the
// "chief" runs the search.
//
//   troupe-launch -n 2 --chief -- pbt_search --trials 8 --generations 10 --dashboard-port 8080
//
// Every generation the chief has each trial train --steps steps, asks each for its validation
// accuracy, and keeps a copy of each trial's weights (its "last copy"). Then the worst
// --exploit-fraction of the trials take the weights of one of the best (exploit: the weights
// travel as byte blocks, one tensor each) with that trial's hyperparameters perturbed by a factor
// of 0.8 or 1.25 (explore).
//
// A worker that dies (its process killed, its host gone) takes only its trials with it: the
// chief hears each as down (ActorClusterOptions::on_down), and respawns it on a worker still up
// from its last copy, under its old label, so the search goes on. A search with every worker gone
// fails, saying so.
//
// Data: scikit-learn's bundled 8x8 digits (tools/install-deps.sh puts them at
// /opt/troupe-data/digits.csv; every worker reads its own copy at --digits), a fixed --val-fraction
// held out for the validation accuracy; where that file is missing, a generated set of 10 classes
// in 64 features (nn::make_blobs) takes its place, and the chief says so.
//
// With --dashboard-port the chief serves the dashboard: the best trial's validation loss per
// generation as the loss chart, and the Actors card with every trial (its task, state, restarts,
// last reply, accuracy and hyperparameters) and the trials' accuracies over the generations. Each
// row has a Stop and a Clone button (Monitor::add_actor_action): the chief applies them after the
// generation they were asked in, before its exploit. Stop ends that trial (its actor stopped; it
// trains no more, and takes no part in the exploit), never the last one running; Clone spawns a
// new trial on the worker holding the fewest running trials, from the trial's last copy with its
// hyperparameters perturbed as explore does. With --tensorboard-dir DIR each trial's accuracy,
// loss and hyperparameters per generation go to DIR/trial_<i>/train (epoch_accuracy, epoch_loss,
// epoch_learning_rate, epoch_momentum).
//
// The last line is for scripts:
//   result: trials=N generations=G best_initial=A0 best_final=A respawned=R workers_lost=W
//           stopped_by_hand=S cloned_by_hand=C
// (best_initial: the best validation accuracy after the first generation's training, before any
// exploit; best_final: the best of the trials running after the last; respawned: trials started
// again from their last copy after their worker was lost; workers_lost: workers whose trials went
// down; stopped_by_hand and cloned_by_hand: the dashboard's Stop and Clone applied).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <troupe/troupe.hpp>

#include "example_cli.hpp"

using troupe::examples::in_range;

using namespace troupe;
using namespace troupe::distribute;

namespace {

struct Flags {
  int trials = 8;
  int generations = 10;
  std::int64_t steps = 25;
  std::int64_t batch = 32;
  int hidden = 32;
  double exploit_fraction = 0.25;
  double lr_min = 0.01;
  double lr_max = 1.0;
  std::uint64_t seed = 1;
  std::string digits = "/opt/troupe-data/digits.csv";
  double val_fraction = 0.2;
  int step_delay_ms = 0;
  int request_timeout_s = 120;
  std::string tensorboard_dir;
  bool quiet = false;
  troupe::examples::MonitorFlags monitor;
};

// The data every trial trains and validates on: x [n, 64] in [0, 1], y [n] int64.
struct Split {
  Tensor train_x, train_y, val_x, val_y;
  std::int64_t classes = 10;
  bool generated = false;
};

// scikit-learn's digits.csv: per line 64 pixels (0..16) and the label; nullopt when the file is
// missing (the generated set takes its place), an error naming the line when it is malformed.
std::optional<std::pair<std::vector<float>, std::vector<std::int64_t>>> read_digits(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::vector<float> pixels;
  std::vector<std::int64_t> labels;
  std::string line;
  for (std::int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::vector<double> values;
    std::stringstream fields(line);
    for (std::string field; std::getline(fields, field, ',');) {
      const std::optional<double> v = base::parse_double(field);
      if (!v) throw std::invalid_argument(path + " line " + std::to_string(number) + ": \"" + field + "\" is not a number");
      values.push_back(*v);
    }
    if (values.size() != 65) {
      throw std::invalid_argument(path + " line " + std::to_string(number) + ": " + std::to_string(values.size()) +
                                  " values (expected 65: 64 pixels and the label)");
    }
    for (int p = 0; p < 64; ++p) {
      if (!(values[p] >= 0 && values[p] <= 16)) {
        throw std::invalid_argument(path + " line " + std::to_string(number) + ": pixel " + std::to_string(p) +
                                    " is not in 0..16");
      }
      pixels.push_back(static_cast<float>(values[p] / 16.0));
    }
    if (values[64] != std::floor(values[64]) || values[64] < 0 || values[64] > 9) {
      throw std::invalid_argument(path + " line " + std::to_string(number) + ": the label is not a digit 0..9");
    }
    labels.push_back(static_cast<std::int64_t>(values[64]));
  }
  if (labels.empty()) throw std::invalid_argument(path + ": no digits");
  return std::make_pair(std::move(pixels), std::move(labels));
}

// The same split in every process: the examples shuffled with a fixed seed, the last
// --val-fraction held out.
Split load(const Flags& f) {
  std::vector<float> x;
  std::vector<std::int64_t> y;
  Split s;
  if (auto d = read_digits(f.digits)) {
    x = std::move(d->first);
    y = std::move(d->second);
  } else {
    nn::BlobOptions o;
    o.samples = 2000;
    o.features = 64;
    o.classes = 10;
    o.seed = 5;
    const nn::ClassificationData b = nn::make_blobs(o);
    x = b.features.to_vector<float>();
    const Tensor labels = b.labels;
    if (labels.dtype() == DType::i64) {
      y = labels.to_vector<std::int64_t>();
    } else {
      for (auto v : labels.to_vector<std::int32_t>()) y.push_back(v);
    }
    s.generated = true;
  }
  const auto n = static_cast<std::int64_t>(y.size());
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(1234));
  const auto n_val = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::llround(f.val_fraction * n)));
  const std::int64_t n_train = n - n_val;
  if (n_train < f.batch) {
    throw std::invalid_argument(std::to_string(n_train) + " training examples, fewer than --batch " +
                                std::to_string(f.batch));
  }
  std::vector<float> xs;
  std::vector<std::int64_t> ys;
  xs.reserve(x.size());
  for (std::int64_t i : order) {
    xs.insert(xs.end(), x.begin() + i * 64, x.begin() + (i + 1) * 64);
    ys.push_back(y[static_cast<std::size_t>(i)]);
  }
  const Tensor all_x = Tensor::from_vector(xs, {n, 64}), all_y = Tensor::from_vector(ys, {n});
  s.train_x = all_x.slice(0, n_train);
  s.train_y = all_y.slice(0, n_train);
  s.val_x = all_x.slice(n_train, n);
  s.val_y = all_y.slice(n_train, n);
  return s;
}

constexpr int num_weights = 6;  // kernel and bias of 3 Dense layers
constexpr std::size_t max_trials = 1024;  // --trials, and the trials cloned by hand with them

// One trial: an MLP 64 -> hidden -> hidden -> 10 trained with SGD and momentum, its own
// hyperparameters, its own order of batches. Messages (tensors in, tensors out):
//   train [steps]     trains that many steps; answers [the mean training loss]
//   evaluate          answers [validation accuracy, validation loss]
//   get_state         answers [hparams (lr, momentum), [seed, steps done], the 6 weights]
//   set_state STATE   takes get_state's answer (exploit: another trial's weights, perturbed
//                     hyperparameters); the momentum starts again from zero
// Constructed from [hparams, [seed, steps]] and optionally the 6 weights (a respawn from a copy).
class Trial : public Actor {
 public:
  Trial(const Flags& f, std::shared_ptr<const Split> data, const std::vector<Tensor>& args)
      : f_(f), data_(std::move(data)) {
    if (args.size() != 2 && args.size() != 2 + num_weights) {
      throw std::invalid_argument("a trial takes [hparams, [seed, steps]] and optionally its 6 weights, not " +
                                  std::to_string(args.size()) + " tensors");
    }
    set_state(args);
  }

  std::vector<Tensor> receive(const std::string& name, const std::vector<Tensor>& in) override {
    if (name == "train") return {Tensor::scalar(static_cast<float>(train(in.at(0).item<std::int64_t>())))};
    if (name == "evaluate") {
      const Tensor logits = forward(data_->val_x).back();
      const auto loss = nn::sparse_softmax_cross_entropy(logits, data_->val_y);
      return {Tensor::from_vector<float>({static_cast<float>(nn::accuracy(logits, data_->val_y)),
                                          loss.loss.item<float>()})};
    }
    if (name == "get_state") {
      std::vector<Tensor> out = {Tensor::from_vector<float>({lr_, momentum_}),
                                 Tensor::from_vector<std::int64_t>({seed_, steps_})};
      out.insert(out.end(), w_.begin(), w_.end());
      return out;
    }
    if (name == "set_state") {
      if (in.size() != 2 + num_weights) throw std::invalid_argument("set_state takes 8 tensors");
      set_state(in);
      return {};
    }
    throw std::invalid_argument("a trial has no message " + name + " (train, evaluate, get_state, set_state)");
  }

 private:
  void set_state(const std::vector<Tensor>& s) {
    const auto hp = s.at(0).to_vector<float>();
    const auto ints = s.at(1).to_vector<std::int64_t>();
    if (hp.size() != 2 || ints.size() != 2 || !(hp[0] > 0) || !(hp[1] >= 0 && hp[1] < 1)) {
      throw std::invalid_argument("a trial's hyperparameters are [lr > 0, momentum in [0, 1)] and [seed, steps]");
    }
    lr_ = hp[0];
    momentum_ = hp[1];
    seed_ = ints[0];
    steps_ = ints[1];
    const std::int64_t sizes[] = {64, f_.hidden, f_.hidden, data_->classes};
    if (s.size() == 2 + num_weights) {
      w_.assign(s.begin() + 2, s.end());
      for (int l = 0; l < 3; ++l) {
        if (w_[2 * l].shape() != Shape{sizes[l], sizes[l + 1]} || w_[2 * l + 1].shape() != Shape{sizes[l + 1]}) {
          throw std::invalid_argument("a trial's weights do not fit 64 -> " + std::to_string(f_.hidden) + " -> " +
                                      std::to_string(f_.hidden) + " -> 10 (another --hidden?)");
        }
      }
    } else {
      w_.clear();
      for (int l = 0; l < 3; ++l) {
        w_.push_back(nn::glorot_uniform(sizes[l], sizes[l + 1], static_cast<std::uint64_t>(seed_ * 10 + l)));
        w_.push_back(Tensor::zeros({sizes[l + 1]}));
      }
    }
    v_.clear();
    for (const Tensor& w : w_) v_.push_back(Tensor::zeros(w.shape()));
  }

  // The activations of every layer, the logits last.
  std::vector<Tensor> forward(const Tensor& x) const {
    const Tensor h1 = nn::dense_forward(x, w_[0], w_[1], nn::Activation::relu);
    const Tensor h2 = nn::dense_forward(h1, w_[2], w_[3], nn::Activation::relu);
    return {h1, h2, nn::dense_forward(h2, w_[4], w_[5], nn::Activation::none)};
  }

  double train(std::int64_t steps) {
    if (steps < 1 || steps > 1'000'000) throw std::invalid_argument("train: steps must be in 1..1000000");
    const std::int64_t n = data_->train_x.shape()[0];
    double sum = 0;
    for (std::int64_t s = 0; s < steps; ++s) {
      // The trial's own walk through the data: a fixed stride from an offset of its seed.
      const std::int64_t batches = n / f_.batch;
      const std::int64_t b = (seed_ * 7919 + steps_ * 31) % batches;
      const Tensor x = data_->train_x.slice(b * f_.batch, (b + 1) * f_.batch);
      const Tensor y = data_->train_y.slice(b * f_.batch, (b + 1) * f_.batch);
      const auto a = forward(x);
      const auto loss = nn::sparse_softmax_cross_entropy(a[2], y);
      const auto g3 = nn::dense_backward(a[1], w_[4], a[2], loss.gradient, nn::Activation::none);
      const auto g2 = nn::dense_backward(a[0], w_[2], a[1], g3.input, nn::Activation::relu);
      const auto g1 = nn::dense_backward(x, w_[0], a[0], g2.input, nn::Activation::relu, false);
      const Tensor grads[] = {g1.kernel, g1.bias, g2.kernel, g2.bias, g3.kernel, g3.bias};
      for (int i = 0; i < num_weights; ++i) {
        v_[i] = v_[i] * momentum_ - grads[i] * lr_;
        w_[i] = w_[i] + v_[i];
      }
      sum += loss.loss.item<float>();
      ++steps_;
      if (f_.step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(f_.step_delay_ms));
    }
    return sum / static_cast<double>(steps);
  }

  const Flags& f_;
  std::shared_ptr<const Split> data_;
  float lr_ = 0.01f;
  float momentum_ = 0;
  std::int64_t seed_ = 0;
  std::int64_t steps_ = 0;
  std::vector<Tensor> w_, v_;
};

// A trial as the chief keeps it.
struct TrialRecord {
  int index = 0;
  ActorHandle handle;
  std::vector<Tensor> copy;  // its last get_state, or its spawn arguments before the first
  double accuracy = -1;      // its newest validation accuracy; -1 before the first
  double loss = NAN;
  bool lost = false;
  bool stopped = false;  // by hand, from the dashboard: it trains no more
  float lr() const { return copy.at(0).to_vector<float>()[0]; }
  float momentum() const { return copy.at(0).to_vector<float>()[1]; }
};

// What the on_down hook heard, for the chief's thread.
struct Downs {
  std::mutex mutex;
  std::set<std::string> tasks;  // tasks whose actors went down for their host
};

std::string fixed(double v, int digits = 4) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << v;
  return out.str();
}

int run_chief(Runtime& runtime, const ClusterResolver& resolver, const Flags& f) {
  const auto jobs = resolver.cluster_spec().jobs();
  if (std::find(jobs.begin(), jobs.end(), "worker") == jobs.end() || resolver.cluster_spec().num_tasks("worker") < 1) {
    throw std::invalid_argument("TF_CONFIG's cluster names no worker task to host the trials (add \"worker\": "
                                "[\"host:port\", ...])");
  }
  const int workers = resolver.cluster_spec().num_tasks("worker");
  auto downs = std::make_shared<Downs>();
  ActorClusterOptions options = ActorClusterOptions::from_environment();
  options.on_down = [downs](const ActorDown& d) {
    std::lock_guard<std::mutex> lock(downs->mutex);
    if (d.task != "local" && d.cause.find("stopped by its spawner") == std::string::npos) downs->tasks.insert(d.task);
  };
  // The dashboard: the Actors card hears the ActorCluster through its hook.
  OneDeviceStrategy strategy(runtime, "CPU:0");
  std::unique_ptr<Monitor> monitor;
  if (f.monitor.enabled()) {
    MonitorOptions mo = f.monitor.options(0);
    mo.checkpoints = false;
    monitor = std::make_unique<Monitor>(strategy, nullptr, mo);
    options.on_event = monitor->actor_events();
    monitor->add_actor_action("stop", "stop this trial after this generation (never the last one running)");
    monitor->add_actor_action("clone", "a new trial from this one's last copy, its learning rate and momentum each x0.8 or "
                                       "x1.25, on the worker with the fewest trials");
  }
  ActorCluster actors(runtime, resolver, FunctionRegistry{}, options);
  const bool generated = !std::filesystem::exists(f.digits);
  if (!f.quiet) {
    std::cout << "pbt_search: " << f.trials << " trials on " << workers << " worker(s), " << f.generations
              << " generations of " << f.steps << " steps, "
              << (generated ? "generated data (" + f.digits + " is missing)" : "digits from " + f.digits) << std::endl;
  }

  std::mt19937_64 rng(f.seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<TrialRecord> trials(static_cast<std::size_t>(f.trials));
  const auto worker_task = [](int w) { return "/job:worker/replica:0/task:" + std::to_string(w); };
  for (int i = 0; i < f.trials; ++i) {
    TrialRecord& t = trials[static_cast<std::size_t>(i)];
    t.index = i;
    // Learning rates log-uniform in [lr_min, lr_max], momenta uniform in [0, 0.9].
    const double lr = f.lr_min * std::pow(f.lr_max / f.lr_min, unit(rng));
    const double momentum = 0.9 * unit(rng);
    t.copy = {Tensor::from_vector<float>({static_cast<float>(lr), static_cast<float>(momentum)}),
              Tensor::from_vector<std::int64_t>({static_cast<std::int64_t>(f.seed * 1000 + static_cast<std::uint64_t>(i)), 0})};
    // The workers start with the chief (troupe-launch starts every task at once): spawn waits for
    // a worker not listening yet, within TROUPE_START_TIMEOUT_MS.
    t.handle = actors.spawn("pbt_trial", "worker:" + std::to_string(i % workers), t.copy);
  }
  const auto label = [](const TrialRecord& t) { return "trial " + std::to_string(t.index); };
  // What the Actors card shows of a trial: its accuracy (once it has one) and hyperparameters.
  const auto numbers = [](const TrialRecord& t) {
    std::vector<std::pair<std::string, double>> v;
    if (t.accuracy >= 0) v.emplace_back("accuracy", t.accuracy);
    v.emplace_back("lr", t.lr());
    v.emplace_back("momentum", t.momentum());
    return v;
  };
  const auto timeout = std::chrono::seconds(f.request_timeout_s);
  int respawned = 0;
  std::set<std::string> lost_workers;
  // The worker still up that holds the fewest running trials (the first of a tie).
  const auto least_loaded = [&] {
    std::map<int, int> load;
    for (int w = 0; w < workers; ++w) {
      if (!lost_workers.count(worker_task(w))) load[w] = 0;
    }
    if (load.empty()) throw Error("pbt_search: every worker is lost; the search cannot go on");
    for (const TrialRecord& o : trials) {
      for (auto& [w, n] : load) {
        n += (!o.lost && !o.stopped && !o.handle.down() && o.handle.task() == worker_task(w)) ? 1 : 0;
      }
    }
    return std::min_element(load.begin(), load.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
  };
  // A trial whose actor is down (or whose request failed for it): started again on the worker
  // still up that holds the fewest trials, from its last copy, under its old label. A trial
  // stopped by hand stays stopped.
  const auto respawn_lost = [&](int generation) {
    {
      std::lock_guard<std::mutex> lock(downs->mutex);
      lost_workers.insert(downs->tasks.begin(), downs->tasks.end());
    }
    for (TrialRecord& t : trials) {
      if (t.stopped || (!t.lost && !t.handle.down())) continue;
      if (t.handle.down()) lost_workers.insert(t.handle.task());
      const int target = least_loaded();
      const std::string was = t.handle.task();
      if (!t.handle.down()) t.handle.stop();  // it failed to answer in time: its worker may still run it
      t.handle = actors.spawn("pbt_trial", "worker:" + std::to_string(target), t.copy);
      t.lost = false;
      ++respawned;
      if (monitor) monitor->describe_actor(t.handle.id(), label(t), generation, numbers(t));
      std::cout << "respawned " << label(t) << " on " << t.handle.task() << " from its last copy (it was on " << was
                << ")" << std::endl;
    }
  };
  const auto lose = [&](TrialRecord& t, const std::exception& e) {
    t.lost = true;
    if (!f.quiet) std::cout << label(t) << " is lost: " << e.what() << std::endl;
  };
  // Explore: `from`'s last copy with its learning rate and momentum each multiplied by 0.8 or 1.25,
  // under `seed` (the trial's own walk through the data).
  const auto explore = [&](const TrialRecord& from, std::int64_t seed) {
    const auto factor = [&] { return unit(rng) < 0.5 ? 0.8 : 1.25; };
    const float lr = static_cast<float>(std::clamp(from.lr() * factor(), 1e-5, 1.0));
    const float momentum = static_cast<float>(std::clamp(from.momentum() * factor(), 0.0, 0.99));
    std::vector<Tensor> state = from.copy;
    state[0] = Tensor::from_vector<float>({lr, momentum});
    state[1] = Tensor::from_vector<std::int64_t>({seed, from.copy[1].to_vector<std::int64_t>()[1]});
    return state;
  };

  std::vector<std::unique_ptr<nn::TensorBoard>> boards;
  const auto add_board = [&](const TrialRecord& t) {
    if (f.tensorboard_dir.empty()) return;
    boards.push_back(std::make_unique<nn::TensorBoard>(f.tensorboard_dir + "/trial_" + std::to_string(t.index)));
    nn::Logs none;
    boards.back()->on_train_begin(none);
  };
  for (const TrialRecord& t : trials) add_board(t);

  // The dashboard's Stop and Clone, taken after generation `generation`: each one applied or
  // refused, and said (printed, and shown on the Actors card).
  int stopped_by_hand = 0, cloned_by_hand = 0;
  const auto by_hand = [&](int generation) {
    const std::string after = " after generation " + std::to_string(generation);
    for (const ActorCommand& c : monitor->take_actor_commands()) {
      // The trial by its actor, else by its label (respawned since the click: a new actor).
      auto it = std::find_if(trials.begin(), trials.end(), [&](const TrialRecord& o) { return o.handle.id() == c.id; });
      if (it == trials.end()) {
        it = std::find_if(trials.begin(), trials.end(), [&](const TrialRecord& o) { return label(o) == c.label; });
      }
      TrialRecord* t = it == trials.end() ? nullptr : &*it;
      if (!t) {
        monitor->answer_actor_command(c, "by hand: no trial is actor #" + std::to_string(c.id), true);
        continue;
      }
      if (c.action == "stop") {
        const auto running = std::count_if(trials.begin(), trials.end(), [](const TrialRecord& o) { return !o.stopped; });
        if (t->stopped) {
          monitor->answer_actor_command(c, "by hand: " + label(*t) + " is stopped already", true);
        } else if (running == 1) {
          monitor->answer_actor_command(c, "by hand: " + label(*t) + " not stopped: it is the last trial running", true);
        } else {
          t->handle.stop();
          t->stopped = true;
          ++stopped_by_hand;
          monitor->answer_actor_command(c, "by hand: " + label(*t) + " stopped" + after);
        }
        continue;
      }
      // clone: a new trial of its own seed from this one's last copy, explored.
      if (trials.size() >= max_trials) {
        monitor->answer_actor_command(c, "by hand: " + label(*t) + " not cloned: the search holds " +
                                             std::to_string(max_trials) + " trials, the most it takes", true);
        continue;
      }
      TrialRecord clone;
      clone.index = static_cast<int>(trials.size());
      clone.copy = explore(*t, static_cast<std::int64_t>(f.seed * 1000 + static_cast<std::uint64_t>(clone.index)));
      const std::string from = label(*t);
      try {
        clone.handle = actors.spawn("pbt_trial", "worker:" + std::to_string(least_loaded()), clone.copy);
      } catch (const Error& e) {
        monitor->answer_actor_command(c, "by hand: " + from + " not cloned: " + e.what(), true);
        continue;
      }
      ++cloned_by_hand;
      monitor->describe_actor(clone.handle.id(), label(clone), generation, numbers(clone));
      add_board(clone);
      monitor->answer_actor_command(c, "by hand: " + label(clone) + " cloned from " + from + " on " +
                                           clone.handle.task() + after + ", lr " + fixed(clone.lr(), 5) +
                                           ", momentum " + fixed(clone.momentum(), 3));
      trials.push_back(std::move(clone));  // t points into trials: not used after
    }
  };
  double best_initial = -1, best_final = -1;
  int generation = 0;
  for (generation = 1; generation <= f.generations; ++generation) {
    // Train every trial at once (a one-way message each), then gather their accuracies and copies.
    const Tensor steps = Tensor::scalar<std::int64_t>(f.steps);
    for (TrialRecord& t : trials) {
      if (t.stopped) continue;
      try {
        t.handle.send("train", {steps});
      } catch (const Error& e) {
        lose(t, e);
      }
    }
    for (TrialRecord& t : trials) {
      if (t.lost || t.stopped) continue;
      try {
        const auto r = t.handle.request("evaluate", {}, timeout).at(0).to_vector<float>();
        t.accuracy = r[0];
        t.loss = r[1];
        t.copy = t.handle.request("get_state", {}, timeout);
      } catch (const Error& e) {
        lose(t, e);
      }
    }
    respawn_lost(generation);
    const TrialRecord* best = nullptr;
    double mean = 0;
    int counted = 0;
    for (const TrialRecord& t : trials) {
      if (t.accuracy < 0 || t.stopped) continue;
      mean += t.accuracy;
      ++counted;
      if (!best || t.accuracy > best->accuracy) best = &t;
    }
    if (!best) throw Error("pbt_search: no trial answered in generation " + std::to_string(generation));
    mean /= counted;
    if (generation == 1) best_initial = best->accuracy;
    best_final = best->accuracy;
    for (const TrialRecord& t : trials) {
      if (t.stopped) continue;  // its row keeps the numbers it stopped with
      if (monitor && t.accuracy >= 0) monitor->describe_actor(t.handle.id(), label(t), generation, numbers(t));
      if (!boards.empty() && t.accuracy >= 0) {
        nn::Logs logs = {{"accuracy", t.accuracy}, {"loss", t.loss}, {"learning_rate", t.lr()}, {"momentum", t.momentum()}};
        boards[static_cast<std::size_t>(t.index)]->on_epoch_end(generation, logs);
      }
    }
    if (!f.quiet) {
      std::cout << "generation " << generation << "/" << f.generations << ": best " << fixed(best->accuracy) << " ("
                << label(*best) << ", lr " << fixed(best->lr(), 5) << ", momentum " << fixed(best->momentum(), 3)
                << "), mean " << fixed(mean) << ", respawned " << respawned << std::endl;
    }
    if (monitor && monitor->on_step_end(generation, best->loss) == StepDecision::stop) break;
    if (generation == f.generations) break;
    if (monitor) by_hand(generation);

    // Exploit and explore: the worst take a best trial's weights, its hyperparameters perturbed.
    // Among the trials running that have an accuracy (a clone has none before its first
    // generation).
    std::vector<TrialRecord*> ranked;
    for (TrialRecord& t : trials) {
      if (!t.stopped && t.accuracy >= 0) ranked.push_back(&t);
    }
    std::stable_sort(ranked.begin(), ranked.end(), [](auto* a, auto* b) { return a->accuracy > b->accuracy; });
    const int n = static_cast<int>(ranked.size());
    const int q = std::max(1, static_cast<int>(std::floor(f.exploit_fraction * n)));
    for (int k = 0; k < q && k < n - q; ++k) {
      TrialRecord& loser = *ranked[static_cast<std::size_t>(n - 1 - k)];
      const TrialRecord& winner = *ranked[static_cast<std::size_t>(rng() % static_cast<std::uint64_t>(q))];
      // The loser keeps its own seed (its own walk through the data) and takes the winner's steps.
      const std::vector<Tensor> state = explore(winner, loser.copy[1].to_vector<std::int64_t>()[0]);
      loser.copy = state;
      loser.accuracy = winner.accuracy;
      if (!f.quiet) {
        std::cout << "exploit: " << label(loser) << " takes " << label(winner) << "'s weights, lr " << fixed(loser.lr(), 5)
                  << ", momentum " << fixed(loser.momentum(), 3) << std::endl;
      }
      try {
        loser.handle.request("set_state", state, timeout);
      } catch (const Error& e) {
        lose(loser, e);  // respawned from the state it was to take
      }
    }
    respawn_lost(generation);
  }
  for (auto& b : boards) {
    nn::Logs none;
    b->on_train_end(none);
  }
  std::cout << "result: trials=" << f.trials << " generations=" << std::min(generation, f.generations)
            << " best_initial=" << fixed(best_initial) << " best_final=" << fixed(best_final)
            << " respawned=" << respawned << " workers_lost=" << lost_workers.size()
            << " stopped_by_hand=" << stopped_by_hand << " cloned_by_hand=" << cloned_by_hand << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Population-based training over an actor cluster: every trial an actor on a worker "
               "(one binary for every role).",
               "pbt_search"};
  troupe::examples::show_defaults(app);
  app.add_option("--trials", f.trials, "the population: trials, spread over the workers")
      ->check(in_range(2, static_cast<int>(max_trials)));
  app.add_option("--generations", f.generations, "rounds of train, evaluate, exploit and explore")
      ->check(in_range(1, 1 << 20));
  app.add_option("--steps", f.steps, "training steps of every trial in each generation")
      ->check(in_range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--batch", f.batch, "batch of each step")->check(in_range(std::int64_t{1}, std::int64_t{1} << 16));
  app.add_option("--hidden", f.hidden, "units of each of the 2 hidden layers")->check(in_range(1, 1 << 14));
  app.add_option("--exploit-fraction", f.exploit_fraction,
                 "the worst fraction of trials that take a best one's weights each generation (as many best)")
      ->check(in_range(0.01, 0.5));
  app.add_option("--lr-min", f.lr_min, "the initial learning rates are log-uniform from here")->check(in_range(1e-6, 1.0));
  app.add_option("--lr-max", f.lr_max, "... to here")->check(in_range(1e-6, 1.0));
  app.add_option("--seed", f.seed, "the initial hyperparameters' and the trials' seed");
  app.add_option("--digits", f.digits, "scikit-learn's digits.csv (64 pixels 0..16 and the label per line) on every "
                                       "worker; missing: generated data instead");
  app.add_option("--val-fraction", f.val_fraction, "the examples held out for the validation accuracy")
      ->check(in_range(0.05, 0.5));
  app.add_option("--step-delay-ms", f.step_delay_ms, "a pause per training step, as a heavier model would take")
      ->check(in_range(0, 60000));
  app.add_option("--request-timeout-s", f.request_timeout_s, "how long the chief waits for a trial's answer")
      ->check(in_range(1, 86400));
  app.add_option("--tensorboard-dir", f.tensorboard_dir,
                 "each trial's accuracy, loss and hyperparameters per generation into DIR/trial_<i>");
  app.add_flag("--quiet", f.quiet, "print the result line only");
  troupe::examples::add_monitor_options(app, f.monitor);
  app.callback([&] {
    if (f.lr_min > f.lr_max) throw CLI::ValidationError("--lr-min", "is above --lr-max");
  });
  return troupe::examples::run_main(app, argc, argv, [&] {
    Runtime runtime;
    auto resolver = std::make_shared<TFConfigClusterResolver>();
    // Every role registers the trial; only the workers host trials (the data is loaded there once,
    // at the first trial).
    FunctionRegistry registry;
    auto data = std::make_shared<std::shared_ptr<const Split>>();
    auto data_mutex = std::make_shared<std::mutex>();
    registry.add_actor("pbt_trial", [&f, data, data_mutex](const std::vector<Tensor>& args) -> std::unique_ptr<Actor> {
      std::shared_ptr<const Split> split;
      {
        std::lock_guard<std::mutex> lock(*data_mutex);
        if (!*data) *data = std::make_shared<const Split>(load(f));
        split = *data;
      }
      return std::make_unique<Trial>(f, split, args);
    });
    if (serve_if_worker_or_ps(runtime, *resolver, registry)) return 0;
    if (resolver->task_type() != "chief") {
      throw std::invalid_argument("task type " + resolver->task_type() + " has no part here (expected chief or worker)");
    }
    return run_chief(runtime, *resolver, f);
  });
}
