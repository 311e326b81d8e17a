#pragma once
// The dashboard's commands, as the HTTP thread queues them and as they travel in the chief's row of
// the step-boundary exchange (a custom training loop under MultiWorkerMirroredStrategy).

namespace troupe::detail {

enum Command : int { none = 0, pause = 1, resume = 2, set_learning_rate = 3, checkpoint = 4, stop = 5, trace = 6,
                     stop_without_checkpoint = 7 };

/// A command as the training thread takes it: more says whether others wait behind it.
struct Taken {
  int code = none;
  double argument = 0;
  bool more = false;
};

/// "pause", "resume", "learning_rate", "checkpoint", "stop", "trace"; "none" for anything else.
inline const char* command_name(int c) {
  switch (c) {
    case pause: return "pause";
    case resume: return "resume";
    case set_learning_rate: return "learning_rate";
    case checkpoint: return "checkpoint";
    case stop:
    case stop_without_checkpoint: return "stop";
    case trace: return "trace";
    default: return "none";
  }
}

}  // namespace troupe::detail
