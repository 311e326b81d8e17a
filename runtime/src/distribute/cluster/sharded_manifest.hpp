#pragma once

// A sharded checkpoint on disk (its layout: troupe/distribute/sharded_checkpoint.hpp): the manifest
// written and read (every field checked, nothing in it trusted), the shard files checked against
// it, and a saved variable's shards joined whole. The chief's save and restore, the inspection and
// read_sharded_checkpoint share them.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/distribute/parameter_server_strategy.hpp"
#include "troupe/format/checkpoint_file.hpp"

namespace troupe::distribute::detail {

inline constexpr const char* manifest_name = "manifest.json";

/// 16 lowercase hex digits.
std::string hex64(std::uint64_t v);

/// The whole file's size and XXH64, read in pieces; nullopt (and `problem`) when it cannot be read.
std::optional<std::pair<std::uint64_t, std::uint64_t>> hash_file(const std::string& path, std::string& problem);

/// What manifest.json says: the step, the variables and their shards, each shard file's size and
/// hash.
struct Manifest {
  std::int64_t step = 0;
  int num_ps = 0;
  std::vector<ShardedVariable> variables;
  // A variable's name in the Checkpoint that saved it ("dense_0/kernel"), by its name on the ps
  // tasks ("kernel"); empty for a ShardedCheckpointManager's.
  std::map<std::string, std::string> checkpoint_names;
  struct File {
    std::string name;
    std::uint64_t bytes = 0;
    std::uint64_t xxh64 = 0;
  };
  std::vector<File> files;
};

/// The manifest's name of a dtype ("float32").
std::string dtype_text(DType d);

/// manifest.json's text.
std::string manifest_json(const Manifest& m);

/// Reads and checks `dir`/manifest.json, trusting nothing in it (CheckpointError naming it).
Manifest read_manifest(const std::string& dir);

/// Every shard file checked against the manifest (size and XXH64), then read (every tensor's own
/// checksum). Throws CheckpointError naming the first bad file.
std::vector<format::checkpoint_contents> read_shard_files(const std::string& dir, const Manifest& m);

/// One saved shard's tensors, found in its ps task's file and checked against the manifest.
struct SavedShard {
  const format::checkpoint_entry* value = nullptr;
  std::vector<const format::checkpoint_entry*> slots;
  std::int64_t applied = 0;
  std::int64_t kind = -1;
  std::int64_t rows = 0;
};

/// A saved variable's shards laid end to end: its rows, its optimizer's slots (zeros for a shard no
/// optimizer touched yet) and, per saved shard, its first row and step.
struct JoinedVariable {
  std::string elements;
  std::vector<std::string> slots;
  std::int64_t kind = -1;  // the optimizer's code, -1 when none updated it
  std::vector<SavedShard> parts;
  std::vector<std::int64_t> first_row;
};

/// Joins `sv`'s saved shards from `files` (read_shard_files of the checkpoint `path`), each checked
/// against the manifest: CheckpointError naming the file, shard or variable.
JoinedVariable join_shards(const std::vector<format::checkpoint_contents>& files, const ShardedVariable& sv,
                           const std::string& path);

/// Keras's names of an optimizer's slots, in the order the ps tasks keep them (nn::SGD's and
/// nn::Adam's slot_names()); none for plain SGD or no optimizer (-1).
std::vector<std::string> shard_slot_names(std::int64_t kind);

}  // namespace troupe::distribute::detail
