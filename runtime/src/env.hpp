#pragma once

// The one place troupe reads its environment (runtime/src/options.cpp): every TROUPE_* variable
// becomes a field of RuntimeOptions or MultiWorkerOptions there, and code elsewhere takes the
// options.

#include "troupe/log.hpp"
namespace troupe {
struct RuntimeOptions;
namespace distribute {
struct ClusterCoordinatorOptions;
struct CommunicationOptions;
struct MultiWorkerOptions;
}  // namespace distribute
}  // namespace troupe

namespace troupe::detail {

/// The integer in environment variable `name`, or `fallback` when it is unset or empty; a value
/// that is not a number in min..max throws std::invalid_argument naming the variable.
int env_int(const char* name, int fallback, int min, int max);

/// Refuses a RuntimeOptions field outside its range (a negative timeout, say) with
/// std::invalid_argument naming the field, its value and the range.
void check_runtime_options(const RuntimeOptions& options);

/// The same for the settings of a multi-worker strategy.
void check_multi_worker_options(const distribute::CommunicationOptions& options,
                                const distribute::MultiWorkerOptions& settings);

/// The elastic settings alone (min_workers, max_workers, commit_every_steps), each in its range.
void check_elastic_options(const distribute::MultiWorkerOptions& settings);

/// Under MultiWorkerOptions::elastic, refuses a min_workers above the cluster's `workers` at
/// start, or a max_workers (when set) below it, with std::invalid_argument naming both.
void check_elastic_size(const distribute::MultiWorkerOptions& settings, int workers);

/// The same for a ClusterCoordinator's settings (the heartbeat's ranges are MultiWorkerOptions').
void check_coordinator_options(const distribute::ClusterCoordinatorOptions& options);

/// TROUPE_FORCE_CPU=1: GPUs are hidden from troupe (0 or unset: they are not). Any other value
/// throws std::invalid_argument naming the variable.
bool force_cpu_from_environment();

/// TROUPE_CPU as set (nullptr when unset): the CPU kernel path to force (cpu/dispatch.cpp checks it).
const char* cpu_path_from_environment();

/// TROUPE_INTRA_OP_THREADS (0..64, 0 when unset: as many as the cores the replicas leave idle).
int intra_op_threads_from_environment();

/// TROUPE_LOG_LEVEL, or warning when it is unset or names no level (RuntimeOptions refuses such a
/// value with a clear error; the log itself never throws).
LogLevel log_level_from_environment();

}  // namespace troupe::detail
