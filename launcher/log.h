// Logging: spdlog to stderr, the node rank in every line, text or one JSON object a line.
#pragma once

#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

namespace bt::log {

enum class Format { kText, kJson };

// Installs the default logger. Safe to call again (e.g. once the format flag is parsed).
void Init(Format format, spdlog::level::level_enum level);

// The rank is known only after identity resolution; until then lines say "node ?".
void SetNodeRank(int rank);

Format ParseFormat(const std::string& text);  // throws std::invalid_argument

// Whether `line` (without its newline) is a line some bt-launch wrote: a log line in either
// format, of any node, or a line that starts with "bt-launch" (a fatal error, the upload
// worker's last words). The watchdog reads back a job's output file that launchers also
// write to, and only the other lines are the job's progress.
bool IsLauncherLine(std::string_view line);
// Whether `start`, the beginning of a line whose newline has not arrived, may still become
// such a line (a launcher's write the reader saw only part of).
bool MayBecomeLauncherLine(std::string_view start);

// Every later log line has `value` replaced by "<secret>", whatever put it there (a start
// command that embeds a token, an error that quotes a value). The rule: values of at least
// kMinRedactedBytes are redacted; shorter ones are not (masking "1" everywhere would hide
// more than it protects) and RegisterSecret returns false so the caller can warn.
inline constexpr size_t kMinRedactedBytes = 4;
bool RegisterSecret(const std::string& value);

}  // namespace bt::log
