// libFuzzer target for what bt-launch reads back from a destination or a volume, and for
// names of arbitrary bytes: any input given as a manifest or a commit record is one or a
// ManifestError (never another exception, never a read outside a buffer), and any byte
// string carried through the JSON records comes back byte for byte, alone, as a map key, as
// a manifest's file path or as a commit record's checkpoint name.
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "storage/commit_record.h"
#include "storage/json_bytes.h"
#include "storage/manifest.h"

namespace {

void ReadAsManifest(const std::string& text) {
  try {
    bt::storage::Manifest::FromJson(text, "fuzz");
  } catch (const bt::storage::ManifestError&) {
  }
}

void ReadAsCommitRecord(const std::string& text) {
  try {
    bt::storage::CommitRecord::FromText(text, "fuzz");
  } catch (const bt::storage::ManifestError&) {
  }
}

void CommitRecordRoundTrip(const std::string& bytes) {
  using namespace bt::storage;
  const CommitRecord record{"job", bytes, {{0, "aa"}, {7, "bb"}}};
  CommitRecord read;
  try {
    read = CommitRecord::FromText(record.ToText(), "fuzz");
  } catch (const ManifestError&) {
    return;  // a name that is no relative path: refused
  }
  if (read.name != bytes || read.parts != record.parts) std::abort();
}

void RoundTrip(const std::string& bytes) {
  using namespace bt::storage;
  const std::map<std::string, std::string> map = {{bytes, bytes}};
  const std::string text = nlohmann::json{{"value", BytesToJson(bytes)}, {"map", BytesMapToJson(map)}}.dump();
  const auto parsed = nlohmann::json::parse(text);
  if (BytesFromJson(parsed["value"]) != bytes || BytesMapFromJson(parsed["map"]) != map) std::abort();
}

void ManifestRoundTrip(const std::string& bytes) {
  using namespace bt::storage;
  Manifest manifest;
  manifest.name = "checkpoint-1";
  manifest.files = {{bytes, 1, "00"}};
  std::string path;
  try {
    path = Manifest::FromJson(manifest.ToJson().dump(), "fuzz").files.at(0).path;
  } catch (const ManifestError&) {
    return;  // not a relative path inside the checkpoint ("..", a leading '/', NUL): refused
  }
  if (path != bytes) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  ReadAsManifest(bytes);
  RoundTrip(bytes);
  ManifestRoundTrip(bytes);
  ReadAsCommitRecord(bytes);
  CommitRecordRoundTrip(bytes);
  return 0;
}
