#include "storage/commit_record.h"

#include <nlohmann/json.hpp>

#include "storage/hash.h"
#include "storage/json_bytes.h"
#include "storage/manifest.h"

namespace bt::storage {
namespace {

std::string RankRoot(const std::string& job_id, int rank) { return job_id + "/rank-" + std::to_string(rank); }

// `latest` is one line; anything after the name (a newline written with it) is not part of it.
std::string FirstLine(const std::string& text) { return text.substr(0, text.find_first_of("\r\n")); }

const nlohmann::json& Field(const nlohmann::json& value, const char* key, const std::string& origin) {
  if (!value.contains(key)) throw ManifestError(origin + ": the commit record has no `" + key + "`");
  return value.at(key);
}

}  // namespace

CommitRecord CommitRecord::Unversioned(const std::string& job_id, const std::string& name) {
  CommitRecord record;
  record.job_id = job_id;
  record.name = name;
  record.unversioned = true;
  return record;
}

std::string CommitRecord::ToText() const {
  nlohmann::json versions = nlohmann::json::object();
  for (const auto& [rank, version] : parts) versions[std::to_string(rank)] = version;
  nlohmann::json value = {{"format", kCommitFormat}, {"job_id", job_id}, {"name", BytesToJson(name)}, {"parts", versions}};
  return value.dump(2) + "\n";
}

CommitRecord CommitRecord::FromText(const std::string& text, const std::string& origin) {
  nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
  if (!value.is_object()) throw ManifestError(origin + ": the commit record is not a JSON object");
  if (value.value("format", std::string()) != kCommitFormat) {
    throw ManifestError(origin + ": format is not " + std::string(kCommitFormat));
  }
  CommitRecord record;
  try {
    record.job_id = Field(value, "job_id", origin).get<std::string>();
    record.name = BytesFromJson(Field(value, "name", origin));
    const nlohmann::json& parts = Field(value, "parts", origin);
    if (!parts.is_object()) throw ManifestError(origin + ": parts: not an object");
    for (const auto& [rank, version] : parts.items()) {
      const std::string id = version.get<std::string>();
      if (id.empty() || id.find('/') != std::string::npos || id.front() == '.') {
        throw ManifestError(origin + ": parts." + rank + ": not a version id: " + id);
      }
      record.parts[std::stoi(rank)] = id;
    }
  } catch (const nlohmann::json::exception& error) {
    throw ManifestError(origin + ": " + error.what());
  } catch (const std::logic_error&) {  // std::stoi: a key that is not a rank
    throw ManifestError(origin + ": parts: a key is not a node rank");
  }
  ValidateCheckpointName(record.name, origin + ": name");
  return record;
}

std::string CommitRecordPath(const std::string& job_id, const std::string& name) {
  return job_id + "/.bt-commits/" + HashBytes(name.data(), name.size()) + ".json";
}

std::string VersionRoot(const std::string& job_id, int node_rank, const std::string& version) {
  return RankRoot(job_id, node_rank) + "/.bt-versions/" + version;
}

std::optional<std::string> PartRoot(const CommitRecord& commit, int rank) {
  if (commit.unversioned) return RankRoot(commit.job_id, rank);
  auto part = commit.parts.find(rank);
  if (part == commit.parts.end()) return std::nullopt;
  return VersionRoot(commit.job_id, rank, part->second);
}

std::optional<CommitRecord> ReadCommit(Destination& destination, const std::string& job_id, const std::string& name) {
  const std::string path = CommitRecordPath(job_id, name);
  auto text = destination.ReadText(path);
  if (!text) return std::nullopt;
  CommitRecord record = CommitRecord::FromText(*text, destination.Describe() + "/" + path);
  record.job_id = job_id;  // where it was read: a job's tree copied under another id still loads
  if (record.name != name) {
    throw ManifestError(destination.Describe() + "/" + path + ": names checkpoint " + record.name + ", not " + name);
  }
  return record;
}

std::optional<CommitRecord> ReadLatestCommit(Destination& destination, const std::string& job_id) {
  auto latest = destination.ReadText(job_id + "/latest");
  if (!latest) return std::nullopt;
  const std::string name = FirstLine(*latest);
  ValidateCheckpointName(name, destination.Describe() + "/" + job_id + "/latest");
  if (auto record = ReadCommit(destination, job_id, name)) return record;
  return CommitRecord::Unversioned(job_id, name);
}

}  // namespace bt::storage
