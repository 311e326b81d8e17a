#include "kernels.hpp"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "env.hpp"
#include "troupe/log.hpp"

namespace troupe::detail::cpu {
namespace {

std::string list(const std::vector<isa>& paths) {
  std::string out;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    if (i > 0) out += i + 1 == paths.size() ? " and " : ", ";
    out += isa_name(paths[i]);
  }
  return out;
}

bool cpu_has(isa path, cpu_features f) {
  switch (path) {
    case isa::baseline: return true;
    case isa::avx2: return f.avx2_fma;
    case isa::avx512: return f.avx512 && f.avx2_fma;
  }
  return false;
}

std::vector<isa> runnable(cpu_features f) {
  std::vector<isa> out;
  for (isa p : {isa::baseline, isa::avx2, isa::avx512}) {
    if (table_for(p) != nullptr && cpu_has(p, f)) out.push_back(p);
  }
  return out;
}

const char* describe(isa path) {
  switch (path) {
    case isa::baseline: return "the x86-64 baseline (SSE2)";
    case isa::avx2: return "AVX2 and FMA";
    case isa::avx512: return "AVX-512 F, VL, BW and DQ";
  }
  return "?";
}

// The chosen path, or the error that choosing it gave (thrown again at every use).
struct choice {
  const kernel_table* table = nullptr;
  std::string error;
  cpu_features features;
  std::string setting;
};

const choice& chosen() {
  // Process-wide like the CPU it describes: chosen once, on first use, from the environment.
  static const choice c = [] {
    choice out;
    out.features = detect_features();
    const char* env = troupe::detail::cpu_path_from_environment();
    out.setting = env == nullptr ? "" : env;
    try {
      out.table = table_for(choose_isa(env, out.features));
    } catch (const std::invalid_argument& e) {
      out.error = e.what();
    }
    return out;
  }();
  return c;
}

}  // namespace

const char* isa_name(isa path) {
  switch (path) {
    case isa::baseline: return "baseline";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
  }
  return "?";
}

cpu_features detect_features() {
  cpu_features f;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // __builtin_cpu_supports also asks the OS (XGETBV) whether it saves the wide registers.
  __builtin_cpu_init();
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
#endif
  return f;
}

isa choose_isa(const char* troupe_cpu, cpu_features features) {
  const std::vector<isa> here = runnable(features);
  if (troupe_cpu == nullptr || *troupe_cpu == '\0') return here.back();
  for (isa p : {isa::baseline, isa::avx2, isa::avx512}) {
    if (std::strcmp(troupe_cpu, isa_name(p)) != 0) continue;
    if (table_for(p) == nullptr) {
      throw std::invalid_argument(std::string("TROUPE_CPU=") + troupe_cpu + ": this build of troupe has no " +
                                  isa_name(p) + " kernels (it has " + list(runnable(cpu_features{true, true})) + ")");
    }
    if (!cpu_has(p, features)) {
      throw std::invalid_argument(std::string("TROUPE_CPU=") + troupe_cpu + ": this CPU lacks " + describe(p) +
                                  " (it runs " + list(here) + ")");
    }
    return p;
  }
  throw std::invalid_argument(std::string("TROUPE_CPU=\"") + troupe_cpu +
                              "\" names no CPU kernel path (expected baseline, avx2 or avx512)");
}

std::vector<isa> runnable_isas() { return runnable(detect_features()); }

const kernel_table* table_for(isa path) {
  switch (path) {
    case isa::baseline: return &baseline::table();
#if defined(TROUPE_CPU_HAVE_X86_PATHS)
    case isa::avx2: return &avx2::table();
    case isa::avx512: return &avx512::table();
#else
    default: return nullptr;
#endif
  }
  return nullptr;
}

const kernel_table& kernels() {
  const choice& c = chosen();
  if (c.table == nullptr) throw std::invalid_argument(c.error);
  return *c.table;
}

void announce() {
  const kernel_table& k = kernels();
  static std::once_flag once;
  std::call_once(once, [&] {
    const choice& c = chosen();
    troupe::log(LogLevel::info, std::string("CPU kernels: ") + isa_name(k.path) + " (" +
                                    (c.setting.empty() ? "the widest this CPU runs" : "TROUPE_CPU=" + c.setting) +
                                    "; this CPU runs " + list(runnable(c.features)) + ")");
  });
}

}  // namespace troupe::detail::cpu
