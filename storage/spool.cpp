#include "storage/spool.h"

#include "storage/destination.h"
#include "storage/json_bytes.h"
#include "storage/paths.h"

namespace bt::storage {
namespace {

// An ack is shown in an error message: a few lines of it are enough to recognise it.
constexpr size_t kAckShownBytes = 200;

std::string Shown(const std::string& text) {
  const std::string shown = text.size() > kAckShownBytes ? text.substr(0, kAckShownBytes) + "..." : text;
  return nlohmann::json(shown).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

nlohmann::json SpoolCheckpointRecord(const Manifest& manifest, const std::string& local_dir, const std::string& rank_dir) {
  return {{"type", "checkpoint"},
          {"job_id", manifest.job_id},
          {"node_rank", manifest.node_rank},
          {"name", BytesToJson(manifest.name)},
          {"local_dir", BytesToJson(local_dir)},
          {"remote_dir", BytesToJson(JoinPath(rank_dir, manifest.base()))},
          {"manifest_path", BytesToJson(JoinPath(rank_dir, ManifestName(manifest.name)))},
          {"manifest", manifest.ToJson()}};
}

nlohmann::json SpoolCommitRecord(const CommitRecord& commit, bool move_latest) {
  return {{"type", "latest"},
          {"job_id", commit.job_id},
          {"name", BytesToJson(commit.name)},
          {"commit_path", CommitRecordPath(commit.job_id, commit.name)},
          {"commit", commit.ToText()},
          {"move_latest", move_latest},
          {"remote_path", commit.job_id + "/latest"}};
}

std::optional<std::string> ReadSpoolAck(const std::string& text, const std::string& ack_path) {
  const nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
  if (!value.is_object()) {
    throw DestinationError("the spool's acknowledgement " + ack_path + " is not a JSON object ({} for a success, "
                           "{\"error\": \"...\"} for a failure; write it atomically): " + Shown(text));
  }
  const auto error = value.find("error");
  if (error == value.end()) return std::nullopt;
  return error->is_string() ? error->get<std::string>() : error->dump();
}

}  // namespace bt::storage
