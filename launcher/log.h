// Logging: spdlog to stderr, the node rank in every line, text or one JSON object a line.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

namespace bt::log {

enum class Format { kText, kJson };

// Installs the default logger. Safe to call again (e.g. once the format flag is parsed).
void Init(Format format, spdlog::level::level_enum level);

// The rank is known only after identity resolution; until then lines say "node ?". With hot
// spares (launcher.spares) a launcher's slot and the training rank it runs differ: lines then
// say both ("node 3 rank 1", "node 4 spare"; `training_rank` -1 for a spare).
inline constexpr int kSameRank = -2;
void SetNodeRank(int rank, int training_rank = kSameRank);

Format ParseFormat(const std::string& text);  // throws std::invalid_argument

// Every later log line has `value` replaced by "<secret>", whatever put it there (a start
// command that embeds a token, an error that quotes a value). The rule: values of at least
// kMinRedactedBytes are redacted; shorter ones are not (masking "1" everywhere would hide
// more than it protects) and RegisterSecret returns false so the caller can warn.
inline constexpr size_t kMinRedactedBytes = 4;
bool RegisterSecret(const std::string& value);

}  // namespace bt::log
