#pragma once

// The flight recorder: every process keeps its last RuntimeOptions::flight_recorder_entries
// collectives and steps (docs/diagnosis.md has the dump's format). What an application may do with
// it: label the steps and collectives it starts, and read or write the record.

#include <string>

namespace troupe {

/// Labels what this thread starts while the label lives: the steps it runs through a strategy's
/// `run` and every collective inside them are recorded with `label` (cut at 31 bytes), as the call
/// site of a stack trace would. Labels nest; the innermost wins. `label` must outlive the scope
/// (a string literal is the usual argument). Model::fit labels its phases ("fit:train_step", ...).
class CallSiteLabel {
 public:
  explicit CallSiteLabel(const char* label) noexcept;
  ~CallSiteLabel();
  CallSiteLabel(const CallSiteLabel&) = delete;
  CallSiteLabel& operator=(const CallSiteLabel&) = delete;

 private:
  const char* previous_;
};

/// The process's flight recorder as JSON (docs/diagnosis.md), oldest entry first; `reason` is
/// copied into the dump. Throws std::logic_error when no Runtime with a recorder exists.
std::string flight_recorder_json(const std::string& reason = "requested");

/// Writes the dump into RuntimeOptions::flight_recorder_dir (or the temporary directory when none
/// is set) and returns the file's path; the same file is replaced on every dump. Throws
/// std::logic_error when no Runtime with a recorder exists and std::runtime_error when the file
/// cannot be written.
std::string write_flight_recorder(const std::string& reason = "requested");

}  // namespace troupe
