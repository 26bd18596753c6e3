#include "launcher/log.h"

#include <atomic>
#include <chrono>
#include <ctime>
#include <mutex>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_sinks.h>

namespace bt::log {
namespace {

std::atomic<int> g_node_rank{-1};
std::atomic<int> g_training_rank{kSameRank};
std::mutex g_secrets_mutex;
std::vector<std::string> g_secrets;

std::string Redact(std::string text) {
  std::lock_guard lock(g_secrets_mutex);
  for (const std::string& secret : g_secrets) {
    constexpr std::string_view kMask = "<secret>";
    for (size_t at = text.find(secret); at != std::string::npos; at = text.find(secret, at + kMask.size())) {
      text.replace(at, secret.size(), kMask);
    }
  }
  return text;
}

std::string Payload(const spdlog::details::log_msg& message) {
  return Redact(std::string(message.payload.data(), message.payload.size()));
}

std::string NodeLabel() {
  int rank = g_node_rank.load(std::memory_order_relaxed);
  if (rank < 0) return "?";
  const int training_rank = g_training_rank.load(std::memory_order_relaxed);
  if (training_rank == kSameRank) return std::to_string(rank);
  return std::to_string(rank) + (training_rank < 0 ? " spare" : " rank " + std::to_string(training_rank));
}

std::string Timestamp(spdlog::log_clock::time_point time) {
  auto since_epoch = time.time_since_epoch();
  std::time_t seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count();
  int millis = int(std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count() % 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[64];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, millis);
  return text;
}

class TextFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& message, spdlog::memory_buf_t& out) override {
    auto level = spdlog::level::to_string_view(message.level);
    std::string line = Timestamp(message.time) + " bt-launch[node " + NodeLabel() + "] " +
                       std::string(level.data(), level.size()) + ": " + Payload(message) + "\n";
    out.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<TextFormatter>(); }
};

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& message, spdlog::memory_buf_t& out) override {
    auto level = spdlog::level::to_string_view(message.level);
    nlohmann::json line = {{"ts", Timestamp(message.time)},
                           {"level", std::string(level.data(), level.size())},
                           {"node", g_node_rank.load(std::memory_order_relaxed)},
                           {"msg", Payload(message)}};
    if (const int training_rank = g_training_rank.load(std::memory_order_relaxed); training_rank != kSameRank) {
      line["rank"] = training_rank;  // -1: a spare
    }
    std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    out.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

}  // namespace

void Init(Format format, spdlog::level::level_enum level) {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  if (format == Format::kJson) {
    sink->set_formatter(std::make_unique<JsonFormatter>());
  } else {
    sink->set_formatter(std::make_unique<TextFormatter>());
  }
  auto logger = std::make_shared<spdlog::logger>("bt-launch", sink);
  logger->set_level(level);
  logger->flush_on(spdlog::level::trace);  // a launcher's last words must reach the log before exit
  spdlog::set_default_logger(logger);
}

void SetNodeRank(int rank, int training_rank) {
  g_training_rank.store(training_rank, std::memory_order_relaxed);
  g_node_rank.store(rank, std::memory_order_relaxed);
}

bool RegisterSecret(const std::string& value) {
  if (value.size() < kMinRedactedBytes) return false;
  std::lock_guard lock(g_secrets_mutex);
  g_secrets.push_back(value);
  return true;
}

Format ParseFormat(const std::string& text) {
  if (text == "text") return Format::kText;
  if (text == "json") return Format::kJson;
  throw std::invalid_argument("--log-format: expected text or json, got \"" + text + "\"");
}

}  // namespace bt::log
