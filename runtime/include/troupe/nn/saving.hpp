#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "troupe/dtype.hpp"
#include "troupe/errors.hpp"
#include "troupe/nn/layer.hpp"

/// Saving a model and loading it back (Keras's model.save and tf.keras.models.load_model).
///
/// Model::save(dir) writes a directory:
///   dir/model.json      the architecture (Sequential's config with every layer's config and the
///                       input shape it was built for) and the compiled loss, optimizer and metrics;
///   dir/variables.ckpt  the layers' weights and the optimizer's state (slots, iterations) in
///                       troupe's checkpoint format (troupe/checkpoint.hpp).
/// load_model(dir) rebuilds the model from those files alone: each layer's class_name picks a
/// factory that reads its config. The factories of troupe's layers are one table
/// (runtime/src/nn/layer_registry.cpp, one line per layer class); an application's own layers
/// are given to load_model in LoadOptions::custom_objects, as Keras's custom_objects.
namespace troupe::nn {

class Model;
class LayerConfig;

/// Makes a layer from its saved config.
using LayerFactory = std::function<std::shared_ptr<Layer>(const LayerConfig& config)>;

namespace detail {
struct LayerBuilder;
}

/// A saved model that cannot be loaded (or a model that cannot be saved): a missing or truncated
/// file, JSON that does not parse, an unknown class_name, a field missing or of the wrong type,
/// weights missing or of another shape. what() names the file and the field.
class SavedModelError : public Error {
 public:
  using Error::Error;
};

/// The config of one layer as saved (the "config" object of {"class_name", "config"}), read by a
/// layer factory. Each getter throws SavedModelError naming the file, the layer and the field
/// when the field is missing or has another type, so a factory only says what it needs.
class LayerConfig {
 public:
  /// `json` is the config object's text; `where` names it in messages
  /// ("/tmp/m/model.json: layers[2] (Conv2D)"). Text that is not a JSON object throws.
  LayerConfig(const std::string& json, std::string where);
  ~LayerConfig();
  LayerConfig(const LayerConfig&);
  LayerConfig& operator=(const LayerConfig&);

  /// Where the config comes from, as messages start.
  const std::string& where() const noexcept { return where_; }
  /// Whether the field is present.
  bool has(const std::string& field) const;
  /// A string field.
  std::string get_string(const std::string& field) const;
  /// An integer field that fits an int.
  int get_int(const std::string& field) const;
  /// An unsigned 64-bit integer field (seeds).
  std::uint64_t get_uint64(const std::string& field) const;
  /// A number field.
  double get_double(const std::string& field) const;
  /// A boolean field.
  bool get_bool(const std::string& field) const;
  /// A [height, width] pair of positive integers, or one integer for both (kernel_size, strides).
  Size2 get_size2(const std::string& field) const;
  /// A dtype by name ("float32", "float64").
  DType get_dtype(const std::string& field) const;
  /// The layers a container layer holds (Residual's "layers"): an array of {"class_name",
  /// "config"}, each made by the same factories as the model's own layers
  /// (LoadOptions::custom_objects first). A malformed one is a SavedModelError naming the file and
  /// the nested field ("...layers[3].config (Residual): layers[1].config (Dense): field \"units\"
  /// is missing"); layers nested deeper than max_nesting are one too.
  std::vector<std::shared_ptr<Layer>> get_layers(const std::string& field) const;
  /// How deep container layers may nest in a saved model.
  static constexpr int max_nesting = 32;
  /// The layer's name ("name", a string).
  std::string name() const { return get_string("name"); }
  /// A SavedModelError for `field` with `problem` ("expected ...").
  SavedModelError error(const std::string& field, const std::string& problem) const;

 private:
  friend struct detail::LayerBuilder;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string where_;
};

/// The class names troupe's own factories know ("Conv2D", "Dense", ...), sorted.
std::vector<std::string> known_layer_classes();

/// How load_model rebuilds a model.
struct LoadOptions {
  /// Factories for class names troupe does not know (an application's own layers), by class_name;
  /// they take precedence over troupe's.
  std::map<std::string, LayerFactory> custom_objects;
  /// Whether to compile the model with the saved loss, optimizer and metrics and restore the
  /// optimizer's state (Keras's compile=True). False: the layers and their weights only.
  bool compile = true;
};

/// Rebuilds the model Model::save wrote into `dir`, in the current strategy's scope (its variables
/// mirrored there; any strategy, whatever the saving one was), with the saved weights and, when
/// compiled, the optimizer's slots and iterations, so that fit continues where the saved model
/// stood. A problem throws SavedModelError naming the file and the field. Under
/// MultiWorkerMirroredStrategy call it on every worker (restoring is a collective) with the
/// directory readable by all.
Model load_model(const std::string& dir, const LoadOptions& options = {});

}  // namespace troupe::nn
