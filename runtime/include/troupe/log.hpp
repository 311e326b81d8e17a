#pragma once

#include <functional>
#include <string>
#include <string_view>

/// What troupe reports that is neither a result nor an exception: a damaged checkpoint skipped,
/// an old checkpoint that cannot be deleted. By default such lines go to stderr as
/// "troupe: warning: ..."; an application that embeds troupe routes them into its own logging
/// with set_log_sink and chooses how much it wants with set_log_level (or TROUPE_LOG_LEVEL).
///
/// The sink and the level are process-wide: they are set up once by the application, like
/// spdlog's default logger, and messages come from threads that belong to no Runtime.
namespace troupe {

/// How much a message matters; `off` (as a level) silences everything.
enum class LogLevel { debug, info, warning, error, off };

/// "debug", "info", "warning", "error" or "off".
std::string_view log_level_name(LogLevel level);

/// The level named by `name` (as log_level_name writes it); anything else throws
/// std::invalid_argument naming the value and the names expected.
LogLevel parse_log_level(std::string_view name);

/// Receives every message at or above the level. Called from any of troupe's threads, one call at
/// a time; it must not throw (an exception from it is dropped).
using LogSink = std::function<void(LogLevel level, std::string_view message)>;

/// Replaces where messages go; an empty sink restores the default (stderr).
void set_log_sink(LogSink sink);

/// Drops messages below `level`. The default is TROUPE_LOG_LEVEL when it names a level, else
/// warning.
void set_log_level(LogLevel level);

/// The level in force.
LogLevel log_level();

/// Sends `message` to the sink when `level` is at or above log_level().
void log(LogLevel level, std::string_view message);

}  // namespace troupe
