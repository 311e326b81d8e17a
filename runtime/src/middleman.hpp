#pragma once

#include <string>

#include "troupe/runtime.hpp"

namespace troupe::detail {

/// Throws std::invalid_argument when `runtime`'s actor system has no middleman (an application's
/// own system that did not load caf::io::middleman); `operation` names who needs it.
void require_middleman(Runtime& runtime, const std::string& operation);

}  // namespace troupe::detail
