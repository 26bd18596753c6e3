// Linux file names (and the pointer files that name checkpoints) are bytes, not text; JSON
// strings must be UTF-8, and nlohmann throws type_error when asked to dump anything else.
// These carry any byte string through the JSON records (journal, snapshot, manifest, the
// uploader's requests and events) without loss: valid UTF-8 stays a plain string, so every
// ordinary record reads as before, and anything else becomes {"bytes_hex": "<hex>"}.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace bt::storage {

bool IsValidUtf8(const std::string& text);

nlohmann::json BytesToJson(const std::string& bytes);
// Throws nlohmann::json::exception (type_error, or other_error for bad hex).
std::string BytesFromJson(const nlohmann::json& value);

// A path → content map: an object when every key is UTF-8 (the usual case), else an array
// of [key, content] pairs. Reads both.
nlohmann::json BytesMapToJson(const std::map<std::string, std::string>& map);
std::map<std::string, std::string> BytesMapFromJson(const nlohmann::json& value);

// A field of a record another process wrote (a lease on a shared volume, a marker a job's
// process wrote, a line of rclone's log): `fallback` when the field is absent or of another
// type. nlohmann's own value() throws type_error for the latter, which no such reader expects.
template <class T>
T FieldOr(const nlohmann::json& record, const char* key, T fallback) {
  if (!record.is_object()) return fallback;
  const auto field = record.find(key);
  if (field == record.end()) return fallback;
  try {
    return field->template get<T>();
  } catch (const nlohmann::json::exception&) {
    return fallback;
  }
}

}  // namespace bt::storage
