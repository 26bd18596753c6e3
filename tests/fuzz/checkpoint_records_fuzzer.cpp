// libFuzzer target for what bt-launch reads back from a destination or a volume, and for
// names of arbitrary bytes: any input given as a manifest is a manifest or a ManifestError
// (never another exception, never a read outside a buffer), and any byte string carried
// through the JSON records comes back byte for byte, alone, as a map key or as a manifest's
// file path.
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "storage/json_bytes.h"
#include "storage/manifest.h"

namespace {

void ReadAsManifest(const std::string& text) {
  try {
    bt::storage::Manifest::FromJson(text, "fuzz");
  } catch (const bt::storage::ManifestError&) {
  }
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
  return 0;
}
