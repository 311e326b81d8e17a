#include "troupe/nn/saving.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <typeinfo>
#include <utility>

#include <nlohmann/json.hpp>

#include "distribute/collectives/worker_group.hpp"
#include "nn/layer_registry.hpp"
#include "nn/model_config.hpp"
#include "troupe/checkpoint.hpp"
#include "troupe/distribute/context.hpp"
#include "troupe/distribute/strategy.hpp"
#include "troupe/nn/loss_scale_optimizer.hpp"
#include "troupe/nn/model.hpp"
#include "troupe/nn/optimizers.hpp"

namespace troupe::nn {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* model_file = "model.json";
constexpr const char* weights_prefix = "variables";  // variables.ckpt (a directory under ParameterServerStrategy)
constexpr const char* format_name = "troupe-model";
constexpr int format_version = 1;

// The text of a JSON value for a message, cut short.
std::string shown(const json& value) {
  std::string text = value.dump();
  if (text.size() > 64) text = text.substr(0, 61) + "...";
  return text;
}

// ----- reading model.json: every access names the file and the field -----

// A JSON object being read, with the path of fields that led to it ("compile_config.optimizer").
class Reader {
 public:
  Reader(const json& value, std::string file, std::string path)
      : value_(value), file_(std::move(file)), path_(std::move(path)) {
    if (!value_.is_object()) throw error("", "is " + shown(value_) + " (expected an object)");
  }

  SavedModelError error(const std::string& field, const std::string& problem) const {
    std::string at = path_;
    if (!field.empty()) at += (at.empty() ? "" : ".") + field;
    return SavedModelError("load_model: " + file_ + ": " + (at.empty() ? std::string("the document") : "field \"" + at + "\"") +
                           " " + problem);
  }
  const json& need(const std::string& field) const {
    auto it = value_.find(field);
    if (it == value_.end()) throw error(field, "is missing");
    return *it;
  }
  bool has(const std::string& field) const { return value_.contains(field) && !value_.at(field).is_null(); }
  std::string string(const std::string& field) const {
    const json& v = need(field);
    if (!v.is_string()) throw error(field, "is " + shown(v) + " (expected a string)");
    return v.get<std::string>();
  }
  std::int64_t integer(const std::string& field) const {
    const json& v = need(field);
    if (!v.is_number_integer()) throw error(field, "is " + shown(v) + " (expected an integer)");
    return v.get<std::int64_t>();
  }
  double number(const std::string& field) const {
    const json& v = need(field);
    if (!v.is_number()) throw error(field, "is " + shown(v) + " (expected a number)");
    return v.get<double>();
  }
  bool boolean(const std::string& field) const {
    const json& v = need(field);
    if (!v.is_boolean()) throw error(field, "is " + shown(v) + " (expected true or false)");
    return v.get<bool>();
  }
  const json& array(const std::string& field) const {
    const json& v = need(field);
    if (!v.is_array()) throw error(field, "is " + shown(v) + " (expected an array)");
    return v;
  }
  Reader object(const std::string& field) const {
    const json& v = need(field);
    if (!v.is_object()) throw error(field, "is " + shown(v) + " (expected an object)");
    return Reader(v, file_, path_.empty() ? field : path_ + "." + field);
  }
  const json& value() const noexcept { return value_; }
  const std::string& file() const noexcept { return file_; }
  const std::string& path() const noexcept { return path_; }

 private:
  const json& value_;
  std::string file_;
  std::string path_;
};

// ----- the optimizers and losses, as compile_config records them -----

json optimizer_config(const Optimizer& optimizer) {
  if (const auto* scaled = dynamic_cast<const LossScaleOptimizer*>(&optimizer)) {
    return json{{"class_name", "LossScaleOptimizer"},
                {"config",
                 {{"inner_optimizer", optimizer_config(*scaled->inner_optimizer())},
                  {"dynamic", scaled->dynamic()},
                  {"initial_scale", scaled->initial_scale()},
                  {"dynamic_growth_steps", scaled->dynamic_growth_steps()}}}};
  }
  // The exact classes: a subclass (AdamW over Adam) has a config of its own.
  if (typeid(optimizer) == typeid(SGD)) {
    const auto& sgd = static_cast<const SGD&>(optimizer);
    return json{{"class_name", "SGD"},
                {"config",
                 {{"name", sgd.name()},
                  {"learning_rate", sgd.learning_rate()},
                  {"momentum", sgd.momentum()},
                  {"nesterov", sgd.nesterov()}}}};
  }
  if (typeid(optimizer) == typeid(Adam)) {
    const auto& adam = static_cast<const Adam&>(optimizer);
    return json{{"class_name", "Adam"},
                {"config",
                 {{"name", adam.name()},
                  {"learning_rate", adam.learning_rate()},
                  {"beta_1", adam.beta_1()},
                  {"beta_2", adam.beta_2()},
                  {"epsilon", adam.epsilon()}}}};
  }
  if (typeid(optimizer) == typeid(AdamW)) {
    const auto& adamw = static_cast<const AdamW&>(optimizer);
    return json{{"class_name", "AdamW"},
                {"config",
                 {{"name", adamw.name()},
                  {"learning_rate", adamw.learning_rate()},
                  {"weight_decay", adamw.weight_decay()},
                  {"beta_1", adamw.beta_1()},
                  {"beta_2", adamw.beta_2()},
                  {"epsilon", adamw.epsilon()}}}};
  }
  throw SavedModelError("Model::save: the optimizer '" + optimizer.name() +
                        "' has no saved form (troupe saves SGD, Adam, AdamW and a LossScaleOptimizer over them)");
}

float as_float(const Reader& r, const std::string& field) { return static_cast<float>(r.number(field)); }

std::shared_ptr<Optimizer> optimizer_from_config(const Reader& spec) {
  const std::string class_name = spec.string("class_name");
  const Reader config = spec.object("config");
  try {
    if (class_name == "SGD") {
      return std::make_shared<SGD>(as_float(config, "learning_rate"), as_float(config, "momentum"),
                                   config.boolean("nesterov"));
    }
    if (class_name == "Adam") {
      return std::make_shared<Adam>(as_float(config, "learning_rate"), as_float(config, "beta_1"),
                                    as_float(config, "beta_2"), as_float(config, "epsilon"));
    }
    if (class_name == "AdamW") {
      return std::make_shared<AdamW>(as_float(config, "learning_rate"), as_float(config, "weight_decay"),
                                     as_float(config, "beta_1"), as_float(config, "beta_2"), as_float(config, "epsilon"));
    }
    if (class_name == "LossScaleOptimizer") {
      return std::make_shared<LossScaleOptimizer>(optimizer_from_config(config.object("inner_optimizer")),
                                                  config.boolean("dynamic"), config.number("initial_scale"),
                                                  config.integer("dynamic_growth_steps"));
    }
  } catch (const std::invalid_argument& e) {
    throw config.error("", std::string("is not a valid ") + class_name + ": " + e.what());
  }
  throw spec.error("class_name", "\"" + class_name + "\" is no optimizer troupe knows (expected SGD, Adam, AdamW or LossScaleOptimizer)");
}

json loss_config(const Loss& loss) { return json{{"name", loss.name}, {"from_logits", loss.from_logits}}; }

Loss loss_from_config(const Reader& spec) {
  const std::string name = spec.string("name");
  if (name == "sparse_categorical_crossentropy") return Loss::sparse_categorical_crossentropy();
  if (name == "categorical_crossentropy") return Loss::categorical_crossentropy(spec.boolean("from_logits"));
  if (name == "mean_squared_error") return Loss::mean_squared_error();
  throw spec.error("name", "\"" + name +
                               "\" is no loss troupe knows (expected sparse_categorical_crossentropy, "
                               "categorical_crossentropy or mean_squared_error)");
}

// ----- files -----

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

void write_file(const fs::path& path, const std::string& text) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw SavedModelError("Model::save: cannot write " + path.string() + ": " + std::strerror(errno));
  }
  fsync_path(path, false);
}

bool process_alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

// Removes what saves of `target` killed mid-way left beside it: "<name>.tmp-<pid>-<n>" of a
// process no longer running.
void remove_stale_temporaries(const fs::path& target) {
  const std::string stem = target.filename().string() + ".tmp-";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(target.parent_path().empty() ? "." : target.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, stem.size(), stem) != 0) continue;
    const std::string rest = name.substr(stem.size());
    const std::size_t dash = rest.find('-');
    long pid = 0;
    for (std::size_t i = 0; i < rest.size() && i < dash; ++i) {
      if (rest[i] < '0' || rest[i] > '9' || pid > 1'000'000'000) {
        pid = -1;
        break;
      }
      pid = pid * 10 + (rest[i] - '0');
    }
    if (pid <= 0 || process_alive(pid)) continue;
    std::error_code remove_ec;
    fs::remove_all(entry.path(), remove_ec);
  }
}

// Puts the finished `staged` directory at `target`: atomically swapped with an existing one
// (renameat2's RENAME_EXCHANGE), then the old one removed; or renamed into place.
void install_directory(const fs::path& staged, const fs::path& target) {
  std::error_code ec;
  if (fs::exists(target, ec)) {
    if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
      // A filesystem without the exchange: the old save moves aside for the instant of the swap.
      const fs::path aside = staged.string() + ".previous";
      if (::rename(target.c_str(), aside.c_str()) != 0 || ::rename(staged.c_str(), target.c_str()) != 0) {
        throw SavedModelError("Model::save: cannot move " + staged.string() + " to " + target.string() + ": " +
                              std::strerror(errno));
      }
      fs::remove_all(aside, ec);
    } else {
      fs::remove_all(staged, ec);  // the previous save, now under the temporary name
    }
  } else if (::rename(staged.c_str(), target.c_str()) != 0) {
    throw SavedModelError("Model::save: cannot move " + staged.string() + " to " + target.string() + ": " +
                          std::strerror(errno));
  }
  fsync_path(target.parent_path().empty() ? fs::path(".") : target.parent_path(), true);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw SavedModelError("load_model: cannot read " + path.string() + ": " + std::strerror(errno) +
                          " (expected a directory that Model::save wrote)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

// ----- LayerConfig -----

struct LayerConfig::Impl {
  json value;
  // The application's factories (LoadOptions::custom_objects) while load_model runs; null for a
  // LayerConfig made elsewhere (troupe's factories only).
  const std::map<std::string, LayerFactory>* custom = nullptr;
  int depth = 0;  // container layers around this one
};

// Makes one layer from its class name and config through the factories (the application's
// first), for load_model and for container layers (LayerConfig::get_layers). `where` names the
// config in messages; `unknown` is the error for a class no factory knows.
struct detail::LayerBuilder {
  static std::shared_ptr<Layer> build(const std::string& class_name, const json& config, const std::string& where,
                                      const std::map<std::string, LayerFactory>* custom, int depth,
                                      const std::function<SavedModelError(const std::string&)>& unknown) {
    LayerFactory factory;
    if (custom != nullptr) {
      if (auto it = custom->find(class_name); it != custom->end()) factory = it->second;
    }
    if (!factory) {
      if (auto known = layer_factories().find(class_name); known != layer_factories().end()) factory = known->second;
    }
    if (!factory) {
      std::string names;
      for (const std::string& name : known_layer_classes()) names += (names.empty() ? "" : ", ") + name;
      throw unknown("\"" + class_name + "\" is no layer troupe knows (known: " + names +
                    "; give an application's own layers in LoadOptions::custom_objects)");
    }
    LayerConfig view(config.dump(), where + " (" + class_name + ")");
    view.impl_->custom = custom;
    view.impl_->depth = depth;
    std::shared_ptr<Layer> layer;
    try {
      layer = factory(view);
    } catch (const SavedModelError&) {
      throw;
    } catch (const std::invalid_argument& e) {
      throw SavedModelError(view.where() + ": " + e.what());
    }
    if (!layer) throw SavedModelError(view.where() + ": its factory made no layer");
    return layer;
  }
};

LayerConfig::LayerConfig(const std::string& text, std::string where)
    : impl_(std::make_unique<Impl>()), where_(std::move(where)) {
  try {
    impl_->value = json::parse(text);
  } catch (const json::parse_error& e) {
    throw SavedModelError(where_ + ": the config is not JSON: " + e.what());
  }
  if (!impl_->value.is_object()) {
    throw SavedModelError(where_ + ": the config is " + shown(impl_->value) + " (expected an object)");
  }
}

LayerConfig::~LayerConfig() = default;
LayerConfig::LayerConfig(const LayerConfig& other)
    : impl_(std::make_unique<Impl>(*other.impl_)), where_(other.where_) {}
LayerConfig& LayerConfig::operator=(const LayerConfig& other) {
  if (this != &other) {
    impl_ = std::make_unique<Impl>(*other.impl_);
    where_ = other.where_;
  }
  return *this;
}

SavedModelError LayerConfig::error(const std::string& field, const std::string& problem) const {
  return SavedModelError(where_ + ": field \"" + field + "\" " + problem);
}

bool LayerConfig::has(const std::string& field) const { return impl_->value.contains(field); }

namespace {
const json& field_of(const json& object, const LayerConfig& config, const std::string& field) {
  auto it = object.find(field);
  if (it == object.end()) throw config.error(field, "is missing");
  return *it;
}
}  // namespace

std::string LayerConfig::get_string(const std::string& field) const {
  const json& v = field_of(impl_->value, *this, field);
  if (!v.is_string()) throw error(field, "is " + shown(v) + " (expected a string)");
  return v.get<std::string>();
}

int LayerConfig::get_int(const std::string& field) const {
  const json& v = field_of(impl_->value, *this, field);
  if (!v.is_number_integer()) throw error(field, "is " + shown(v) + " (expected an integer)");
  const std::int64_t n = v.get<std::int64_t>();
  if (n < std::numeric_limits<int>::min() || n > std::numeric_limits<int>::max()) {
    throw error(field, "is " + shown(v) + " (out of range for an int)");
  }
  return static_cast<int>(n);
}

std::uint64_t LayerConfig::get_uint64(const std::string& field) const {
  const json& v = field_of(impl_->value, *this, field);
  if (!v.is_number_unsigned()) throw error(field, "is " + shown(v) + " (expected a non-negative integer)");
  return v.get<std::uint64_t>();
}

double LayerConfig::get_double(const std::string& field) const {
  const json& v = field_of(impl_->value, *this, field);
  if (!v.is_number()) throw error(field, "is " + shown(v) + " (expected a number)");
  return v.get<double>();
}

bool LayerConfig::get_bool(const std::string& field) const {
  const json& v = field_of(impl_->value, *this, field);
  if (!v.is_boolean()) throw error(field, "is " + shown(v) + " (expected true or false)");
  return v.get<bool>();
}

Size2 LayerConfig::get_size2(const std::string& field) const {
  const json& v = field_of(impl_->value, *this, field);
  auto positive = [&](const json& n) {
    if (!n.is_number_integer() || n.get<std::int64_t>() <= 0 || n.get<std::int64_t>() > std::numeric_limits<int>::max()) {
      throw error(field, "is " + shown(v) + " (expected [height, width], positive integers)");
    }
    return static_cast<int>(n.get<std::int64_t>());
  };
  if (v.is_number()) return Size2(positive(v));
  if (!v.is_array() || v.size() != 2) throw error(field, "is " + shown(v) + " (expected [height, width], positive integers)");
  return Size2(positive(v[0]), positive(v[1]));
}

DType LayerConfig::get_dtype(const std::string& field) const {
  const std::string name = get_string(field);
  try {
    return dtype_from_name(name);
  } catch (const std::invalid_argument& e) {
    throw error(field, std::string("is \"") + name + "\": " + e.what());
  }
}

std::vector<std::shared_ptr<Layer>> LayerConfig::get_layers(const std::string& field) const {
  const json& list = field_of(impl_->value, *this, field);
  if (!list.is_array()) throw error(field, "is " + shown(list) + " (expected an array of {\"class_name\", \"config\"})");
  if (impl_->depth >= max_nesting) {
    throw error(field, "nests layers " + std::to_string(impl_->depth + 1) + " deep (at most " +
                           std::to_string(max_nesting) + ")");
  }
  std::vector<std::shared_ptr<Layer>> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string at = field + "[" + std::to_string(i) + "]";
    const json& spec = list[i];
    if (!spec.is_object()) throw error(at, "is " + shown(spec) + " (expected {\"class_name\", \"config\"})");
    const auto class_name = spec.find("class_name");
    if (class_name == spec.end()) throw error(at + ".class_name", "is missing");
    if (!class_name->is_string()) throw error(at + ".class_name", "is " + shown(*class_name) + " (expected a string)");
    const auto config = spec.find("config");
    if (config == spec.end()) throw error(at + ".config", "is missing");
    if (!config->is_object()) throw error(at + ".config", "is " + shown(*config) + " (expected an object)");
    out.push_back(detail::LayerBuilder::build(
        class_name->get<std::string>(), *config, where_ + ": " + at + ".config", impl_->custom, impl_->depth + 1,
        [&](const std::string& problem) { return error(at + ".class_name", problem); }));
  }
  return out;
}

std::vector<std::string> known_layer_classes() {
  std::vector<std::string> out;
  for (const auto& [name, factory] : detail::layer_factories()) out.push_back(name);
  return out;
}

namespace {

// The layers of a model_config object (Sequential's config with its build_input_shape), built:
// load_model's model, and the model a worker rebuilds for fit under ParameterServerStrategy.
Model model_from_config(const Reader& model, const LoadOptions& options) {
  if (model.string("class_name") != "Sequential") {
    throw model.error("class_name", "is \"" + model.string("class_name") + "\" (expected \"Sequential\")");
  }
  const Reader config = model.object("config");
  const json& layer_list = config.array("layers");

  Sequential layers;
  for (std::size_t i = 0; i < layer_list.size(); ++i) {
    const Reader spec(layer_list[i], model.file(), config.path() + ".layers[" + std::to_string(i) + "]");
    const std::string class_name = spec.string("class_name");
    const Reader layer_config = spec.object("config");
    const std::string where = "load_model: " + model.file() + ": " + layer_config.path();
    std::shared_ptr<Layer> layer = detail::LayerBuilder::build(
        class_name, layer_config.value(), where, &options.custom_objects, 0,
        [&](const std::string& problem) { return spec.error("class_name", problem); });
    try {
      layers.add(std::move(layer));
    } catch (const std::invalid_argument& e) {
      throw SavedModelError(where + " (" + class_name + "): " + e.what());
    }
  }
  if (layers.layers().empty()) throw config.error("layers", "is empty (expected the model's layers)");

  Model out(std::move(layers));
  if (config.has("build_input_shape")) {
    Shape shape;
    const json& dims = config.array("build_input_shape");
    for (const json& d : dims) {
      if (!d.is_number_integer()) throw config.error("build_input_shape", "holds " + shown(d) + " (expected integers)");
      shape.push_back(d.get<std::int64_t>());
    }
    try {
      out.build(shape);
    } catch (const std::invalid_argument& e) {
      throw config.error("build_input_shape", std::string("does not fit the layers: ") + e.what());
    }
  }
  if (!out.layers().built()) {
    throw config.error("build_input_shape", "is missing and the layers take sizes from their input (expected the shape "
                                            "the model was built for)");
  }
  return out;
}

// model_config as Model::save writes it: the Sequential's config and the shape it was built for.
json model_config(const Sequential& layers) {
  json model = json::parse(layers.config());
  model["config"]["build_input_shape"] = layers.input_shape().empty() ? json(nullptr) : json(layers.input_shape());
  return model;
}

}  // namespace

namespace detail {

std::string training_config(const Model& model) {
  return json{{"model_config", model_config(model.layers())},
              {"loss", loss_config(model.loss())},
              {"metrics", model.metrics()}}
      .dump();
}

Model model_from_training_config(const std::string& text, std::shared_ptr<Optimizer> optimizer,
                                 const std::string& where) {
  json document;
  try {
    document = json::parse(text);
  } catch (const json::parse_error& e) {
    throw SavedModelError("load_model: " + where + " is not valid JSON: " + e.what());
  }
  const Reader top(document, where, "");
  Model out = model_from_config(top.object("model_config"), LoadOptions{});
  std::vector<std::string> metrics;
  for (const json& m : top.array("metrics")) {
    if (!m.is_string()) throw top.error("metrics", "holds " + shown(m) + " (expected names)");
    metrics.push_back(m.get<std::string>());
  }
  out.compile(std::move(optimizer), loss_from_config(top.object("loss")), std::move(metrics));
  return out;
}

}  // namespace detail

// ----- Model::save -----

void Model::save(const std::string& dir) const {
  if (dir.empty()) throw std::invalid_argument("Model::save: empty directory name");
  if (distribute::has_strategy() && !distribute::in_cross_replica_context()) {
    throw std::logic_error("Model::save: call it in cross-replica context (outside strategy.run)");
  }
  if (!layers_.built()) {
    throw SavedModelError("Model::save: the model is not built (its layers have no weights yet): call build(input_shape) "
                          "or fit first");
  }
  const fs::path target = fs::absolute(fs::path(dir).lexically_normal());
  const fs::path target_dir = target.filename().empty() ? target.parent_path() : target;
  std::error_code ec;
  if (fs::exists(target_dir, ec)) {
    if (!fs::is_directory(target_dir, ec)) {
      throw SavedModelError("Model::save: " + target_dir.string() + " exists and is not a directory");
    }
    if (!fs::is_empty(target_dir, ec) && !fs::exists(target_dir / model_file, ec)) {
      throw SavedModelError("Model::save: " + target_dir.string() +
                            " exists and is not a saved model (no model.json): save into a new or empty directory");
    }
  }

  json model = model_config(layers_);
  json compile = nullptr;
  if (optimizer_) {
    compile = json{{"loss", loss_config(loss_)}, {"optimizer", optimizer_config(*optimizer_)}, {"metrics", metrics_}};
  }
  json document{{"format", format_name},
                {"format_version", format_version},
                {"model_config", std::move(model)},
                {"compile_config", std::move(compile)}};

  auto& workers = strategy_->backend().workers();
  const bool chief = workers.rank() == 0;
  static std::atomic<int> counter{0};
  const fs::path staged = target_dir.string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                          std::to_string(counter.fetch_add(1)) + (chief ? "" : "-worker-" + std::to_string(workers.rank()));
  fs::create_directories(target_dir.parent_path(), ec);
  if (chief) remove_stale_temporaries(target_dir);
  fs::remove_all(staged, ec);
  if (!fs::create_directory(staged, ec) || ec) {
    throw SavedModelError("Model::save: cannot create " + staged.string() + ": " + ec.message());
  }
  try {
    // A collective under multi-worker: every worker takes part, the chief writes the file. Under
    // ParameterServerStrategy a sharded checkpoint, the directory "variables", every ps task
    // writing its shards with their optimizer's slots.
    Checkpoint checkpoint(variables());
    if (optimizer_) checkpoint.set_step(optimizer_->iterations().value().to(Device()).item<std::int64_t>());
    const std::string weights = checkpoint.write((staged / weights_prefix).string());
    document["weights"] = fs::path(weights).filename().string();
    if (chief) write_file(staged / model_file, document.dump(2) + "\n");
  } catch (...) {
    fs::remove_all(staged, ec);
    throw;
  }
  if (!chief) {
    fs::remove_all(staged, ec);
    return;
  }
  fsync_path(staged, true);
  install_directory(staged, target_dir);
}

// ----- load_model -----

Model load_model(const std::string& dir, const LoadOptions& options) {
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    throw SavedModelError("load_model: " + dir + " is not a directory (expected one that Model::save wrote)");
  }
  const std::string file = (root / model_file).string();
  const std::string text = read_file(file);
  json document;
  try {
    document = json::parse(text);
  } catch (const json::parse_error& e) {
    throw SavedModelError("load_model: " + file + " is not valid JSON (truncated or corrupted?): " + e.what());
  }
  const Reader top(document, file, "");
  if (top.string("format") != format_name) {
    throw top.error("format", "is \"" + top.string("format") + "\" (expected \"" + format_name + "\")");
  }
  if (top.integer("format_version") != format_version) {
    throw top.error("format_version", "is " + std::to_string(top.integer("format_version")) + " (this troupe reads " +
                                          std::to_string(format_version) + ")");
  }
  Model out = model_from_config(top.object("model_config"), options);
  if (options.compile && top.has("compile_config")) {
    const Reader compile = top.object("compile_config");
    std::vector<std::string> metrics;
    for (const json& m : compile.array("metrics")) {
      if (!m.is_string()) throw compile.error("metrics", "holds " + shown(m) + " (expected names)");
      metrics.push_back(m.get<std::string>());
    }
    try {
      out.compile(optimizer_from_config(compile.object("optimizer")), loss_from_config(compile.object("loss")),
                  std::move(metrics));
    } catch (const std::invalid_argument& e) {
      throw compile.error("", std::string("cannot compile the model: ") + e.what());
    }
  }

  const std::string weights = top.string("weights");
  if (weights.empty() || weights.find('/') != std::string::npos || weights == "." || weights == "..") {
    throw top.error("weights", "is \"" + weights + "\" (expected a file name inside the directory)");
  }
  // A checkpoint file, or the sharded checkpoint a save under ParameterServerStrategy wrote (its
  // ps tasks' files and manifest.json).
  const fs::path weights_path = root / weights;
  if (!fs::is_regular_file(weights_path, ec) && !fs::is_regular_file(weights_path / "manifest.json", ec)) {
    throw SavedModelError("load_model: " + weights_path.string() + " is missing (the weights of " + file + ")");
  }
  try {
    Checkpoint checkpoint(out.variables());
    auto scope = out.strategy().scope();
    checkpoint.restore(weights_path.string());
  } catch (const CheckpointError& e) {
    throw SavedModelError(std::string("load_model: the weights do not fit the model of ") + file + ": " + e.what());
  }
  return out;
}

}  // namespace troupe::nn
