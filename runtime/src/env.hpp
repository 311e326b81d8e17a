#pragma once

namespace troupe::detail {

/// The integer in environment variable `name`, or `fallback` when it is unset or empty; a value
/// that is not a number in min..max throws std::invalid_argument naming the variable.
int env_int(const char* name, int fallback, int min, int max);

}  // namespace troupe::detail
