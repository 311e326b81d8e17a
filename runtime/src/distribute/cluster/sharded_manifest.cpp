// A sharded checkpoint on disk (sharded_manifest.hpp): the manifest, the shard files checked
// against it, a saved variable's shards joined.
#include "distribute/cluster/sharded_manifest.hpp"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <system_error>

#include <nlohmann/json.hpp>

#include "elements.hpp"
#include "troupe/actors/cluster_task_types.hpp"
#include "troupe/base/quote.hpp"
#include "troupe/checkpoint.hpp"

namespace troupe::distribute::detail {

namespace fs = std::filesystem;
namespace tf = troupe::format;

namespace {

constexpr const char* manifest_format = "troupe sharded checkpoint";
constexpr int manifest_version = 1;
constexpr std::uintmax_t max_manifest_bytes = 64u << 20;

std::optional<std::uint64_t> parse_hex64(const std::string& s) {
  if (s.size() != 16) return std::nullopt;
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<DType> dtype_from(const std::string& s) {
  for (DType d : {DType::f32, DType::f64, DType::i32, DType::i64, DType::f16, DType::bf16}) {
    if (s == dtype_text(d)) return d;
  }
  return std::nullopt;
}

}  // namespace

std::string dtype_text(DType d) { return std::string(dtype_name(d)); }

std::string hex64(std::uint64_t v) {
  char buf[17];
  for (int i = 15; i >= 0; --i) {
    buf[i] = "0123456789abcdef"[v & 0xf];
    v >>= 4;
  }
  buf[16] = '\0';
  return buf;
}

std::optional<std::pair<std::uint64_t, std::uint64_t>> hash_file(const std::string& path, std::string& problem) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    problem = "missing or unreadable (" + std::string(std::strerror(errno)) + ")";
    return std::nullopt;
  }
  tf::xxhash64_stream h;
  std::vector<char> buf(1 << 20);
  std::uint64_t total = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    h.update(buf.data(), n);
    total += n;
  }
  if (in.bad()) {
    problem = "read failed";
    return std::nullopt;
  }
  return std::make_pair(total, h.digest());
}



std::string manifest_json(const Manifest& m) {
  nlohmann::json j;
  j["format"] = manifest_format;
  j["version"] = manifest_version;
  j["step"] = m.step;
  j["num_ps"] = m.num_ps;
  j["files"] = nlohmann::json::array();
  for (const auto& f : m.files) j["files"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", hex64(f.xxh64)}});
  j["variables"] = nlohmann::json::array();
  for (const auto& v : m.variables) {
    nlohmann::json shards = nlohmann::json::array();
    for (const auto& s : v.shards) shards.push_back({{"key", s.key}, {"ps", s.ps}, {"rows", s.rows}});
    nlohmann::json jv{{"name", v.name}, {"dtype", dtype_text(v.dtype)}, {"shape", v.shape}, {"shards", shards}};
    if (auto it = m.checkpoint_names.find(v.name); it != m.checkpoint_names.end()) jv["checkpoint_name"] = it->second;
    j["variables"].push_back(std::move(jv));
  }
  return j.dump(1) + "\n";
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / manifest_name).string();
  auto bad = [&](const std::string& what) {
    return CheckpointError("sharded checkpoint " + path + ": " + what);
  };
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) throw bad("missing or unreadable (" + ec.message() + "): not a checkpoint, or one whose save did not finish");
  if (size > max_manifest_bytes) throw bad(std::to_string(size) + " bytes, more than a manifest holds");
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw bad(std::string("not valid JSON (truncated or damaged?): ") + e.what());
  }
  Manifest m;
  try {
    if (j.at("format").get<std::string>() != manifest_format || j.at("version").get<int>() != manifest_version) {
      throw bad("format " + j.at("format").dump() + " version " + j.at("version").dump() + " (expected \"" +
                manifest_format + "\" version " + std::to_string(manifest_version) + ")");
    }
    m.step = j.at("step").get<std::int64_t>();
    m.num_ps = j.at("num_ps").get<int>();
    if (m.step < 0 || m.num_ps < 1 || m.num_ps > 65536) {
      throw bad("step " + std::to_string(m.step) + ", num_ps " + std::to_string(m.num_ps) + " out of range");
    }
    const auto& files = j.at("files");
    if (!files.is_array() || files.size() != static_cast<std::size_t>(m.num_ps)) {
      throw bad("it lists " + std::to_string(files.size()) + " shard files for " + std::to_string(m.num_ps) + " ps tasks");
    }
    for (std::size_t i = 0; i < files.size(); ++i) {
      Manifest::File f;
      f.name = files[i].at("name").get<std::string>();
      f.bytes = files[i].at("bytes").get<std::uint64_t>();
      const auto h = parse_hex64(files[i].at("xxh64").get<std::string>());
      if (f.name != actors::shard_file_name(static_cast<int>(i), m.num_ps) || !h) {
        throw bad("shard file " + std::to_string(i) + " is " + base::quoted(f.name) + " with xxh64 " +
                  files[i].at("xxh64").dump() + " (expected " + actors::shard_file_name(static_cast<int>(i), m.num_ps) +
                  " and 16 hex digits)");
      }
      f.xxh64 = *h;
      m.files.push_back(std::move(f));
    }
    std::set<std::string> names, keys, checkpoint_names;
    for (const auto& jv : j.at("variables")) {
      ShardedVariable v;
      v.name = jv.at("name").get<std::string>();
      if (jv.contains("checkpoint_name")) {
        const auto name = jv.at("checkpoint_name").get<std::string>();
        if (name.empty() || !checkpoint_names.insert(name).second) {
          throw bad("variable " + base::quoted(v.name) + "'s checkpoint name " + base::quoted(name) +
                    " is empty or listed twice");
        }
        m.checkpoint_names[v.name] = name;
      }
      const auto dt = dtype_from(jv.at("dtype").get<std::string>());
      if (!dt) throw bad("variable " + base::quoted(v.name) + " has dtype " + jv.at("dtype").dump());
      v.dtype = *dt;
      v.shape = jv.at("shape").get<Shape>();
      if (v.shape.empty() || !names.insert(v.name).second) {
        throw bad("variable " + base::quoted(v.name) + " is listed twice or has no rows");
      }
      std::uint64_t elements = 1;
      for (std::size_t a = 0; a < v.shape.size(); ++a) {
        const std::int64_t d = v.shape[a];
        if (d < (a == 0 ? 1 : 0) || d > (std::int64_t{1} << 40)) {
          throw bad("variable " + base::quoted(v.name) + " has shape " + shape_to_string(v.shape));
        }
        elements *= static_cast<std::uint64_t>(d == 0 ? 1 : d);
        if (elements > (std::uint64_t{1} << 40)) {
          throw bad("variable " + base::quoted(v.name) + " has shape " + shape_to_string(v.shape) + " (too large)");
        }
      }
      std::int64_t rows = 0;
      for (const auto& js : jv.at("shards")) {
        ShardedVariable::Shard s{js.at("ps").get<int>(), js.at("rows").get<std::int64_t>(), js.at("key").get<std::string>()};
        if (s.ps < 0 || s.ps >= m.num_ps || s.rows < 1 || s.rows > v.shape[0] || !keys.insert(s.key).second) {
          throw bad("variable " + base::quoted(v.name) + "'s shard " + base::quoted(s.key) + " (ps " +
                    std::to_string(s.ps) + ", " + std::to_string(s.rows) + " rows) is out of range or listed twice");
        }
        rows += s.rows;
        v.shards.push_back(std::move(s));
      }
      if (rows != v.shape[0]) {
        throw bad("variable " + base::quoted(v.name) + "'s shards hold " + std::to_string(rows) + " rows of " +
                  std::to_string(v.shape[0]));
      }
      m.variables.push_back(std::move(v));
    }
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw bad(std::string("malformed: ") + e.what());
  }
  return m;
}

std::vector<tf::checkpoint_contents> read_shard_files(const std::string& dir, const Manifest& m) {
  std::vector<tf::checkpoint_contents> out;
  for (const auto& f : m.files) {
    const std::string path = (fs::path(dir) / f.name).string();
    std::string problem;
    const auto got = hash_file(path, problem);
    if (!got) throw CheckpointError("sharded checkpoint " + dir + ": shard file " + path + " is " + problem);
    if (got->first != f.bytes || got->second != f.xxh64) {
      throw CheckpointError("sharded checkpoint " + dir + ": shard file " + path + " has " +
                            std::to_string(got->first) + " bytes with XXH64 " + hex64(got->second) +
                            ", the manifest says " + std::to_string(f.bytes) + " bytes with " + hex64(f.xxh64) +
                            " (damaged or replaced)");
    }
    try {
      out.push_back(tf::read_checkpoint_file(path));
    } catch (const tf::checkpoint_file_error& e) {
      throw CheckpointError(e.what());
    }
  }
  return out;
}

namespace {

SavedShard find_shard(const tf::checkpoint_contents& file, const ShardedVariable& v, const ShardedVariable::Shard& s) {
  auto bad = [&](const std::string& what) {
    return CheckpointError("sharded checkpoint file " + file.path() + ": shard " + base::quoted(s.key) + " of " +
                           base::quoted(v.name) + ": " + what);
  };
  SavedShard out;
  out.rows = s.rows;
  out.value = file.find(s.key);
  if (!out.value) throw bad("missing");
  const std::size_t row_bytes = [&] {
    std::size_t n = dtype_size(v.dtype);
    for (std::size_t d = 1; d < v.shape.size(); ++d) n *= static_cast<std::size_t>(v.shape[d]);
    return n;
  }();
  const std::size_t nbytes = row_bytes * static_cast<std::size_t>(s.rows);
  if (out.value->type != troupe::detail::to_scalar_type(v.dtype) || out.value->nbytes != nbytes) {
    throw bad("holds " + std::to_string(out.value->nbytes) + " bytes of another type, expected " +
              std::to_string(nbytes) + " bytes of " + dtype_text(v.dtype));
  }
  const auto* state = file.find(s.key + "/state");
  if (!state || state->type != base::scalar_type::i64 || state->nbytes != 16) throw bad("its state is missing or malformed");
  std::int64_t st[2];
  std::memcpy(st, state->data, 16);
  out.applied = st[0];
  out.kind = st[1];
  if (out.kind < -1 || out.kind > static_cast<std::int64_t>(actors::shard_optimizer::adamw) || out.applied < 0 ||
      (out.kind < 0 && out.applied != 0)) {
    throw bad("its state says optimizer " + std::to_string(out.kind) + " after " + std::to_string(out.applied) + " updates");
  }
  const int nslots = out.kind < 0 ? 0 : actors::slot_count(static_cast<actors::shard_optimizer>(out.kind));
  for (int k = 0; k < nslots; ++k) {
    const auto* slot = file.find(s.key + "/slot_" + std::to_string(k));
    if (!slot || slot->type != out.value->type || slot->nbytes != nbytes) throw bad("slot " + std::to_string(k) + " is missing or of another size");
    out.slots.push_back(slot);
  }
  return out;
}

}  // namespace

JoinedVariable join_shards(const std::vector<tf::checkpoint_contents>& files, const ShardedVariable& sv,
                           const std::string& path) {
  JoinedVariable out;
  for (const auto& s : sv.shards) {
    out.parts.push_back(find_shard(files[static_cast<std::size_t>(s.ps)], sv, s));  // the manifest checked s.ps
    if (out.parts.back().kind >= 0) {
      if (out.kind >= 0 && out.kind != out.parts.back().kind) {
        throw CheckpointError("sharded checkpoint " + path + ": variable " + base::quoted(sv.name) +
                              "'s shards were updated by different optimizers");
      }
      out.kind = out.parts.back().kind;
    }
  }
  const int nslots = out.kind < 0 ? 0 : actors::slot_count(static_cast<actors::shard_optimizer>(out.kind));
  out.slots.resize(static_cast<std::size_t>(nslots));
  std::int64_t row = 0;
  for (const auto& p : out.parts) {
    out.elements.append(static_cast<const char*>(p.value->data), p.value->nbytes);
    for (std::size_t k = 0; k < out.slots.size(); ++k) {
      if (p.slots.empty()) {
        out.slots[k].append(p.value->nbytes, '\0');
      } else {
        out.slots[k].append(static_cast<const char*>(p.slots[k]->data), p.value->nbytes);
      }
    }
    out.first_row.push_back(row);
    row += p.rows;
  }
  std::size_t expected = dtype_size(sv.dtype);
  for (std::int64_t d : sv.shape) expected *= static_cast<std::size_t>(d);
  if (out.elements.size() != expected) {
    throw CheckpointError("sharded checkpoint " + path + ": variable " + base::quoted(sv.name) + "'s shards hold " +
                          std::to_string(out.elements.size()) + " bytes, its shape " + shape_to_string(sv.shape) +
                          " needs " + std::to_string(expected));
  }
  return out;
}

std::vector<std::string> shard_slot_names(std::int64_t kind) {
  if (kind == static_cast<std::int64_t>(actors::shard_optimizer::momentum)) return {"momentum"};
  if (kind == static_cast<std::int64_t>(actors::shard_optimizer::adam) ||
      kind == static_cast<std::int64_t>(actors::shard_optimizer::adamw)) {
    return {"m", "v"};
  }
  return {};
}

}  // namespace troupe::distribute::detail
