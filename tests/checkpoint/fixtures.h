// Files as frameworks write them, for the checkpoint tests: valid and cut-short zips
// (torch.save's format) and safetensors, written step by step into a scratch directory.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "checkpoint/layout.h"
#include "checkpoint/tree.h"

namespace bt::testing {

// A zip with one stored entry, as torch.save writes (a "PK\3\4" local header first, the
// end-of-central-directory record last).
inline std::string ZipBytes(const std::string& entry_name, const std::string& data) {
  auto le16 = [](uint16_t v) { return std::string{char(v & 0xff), char(v >> 8)}; };
  auto le32 = [](uint32_t v) { return std::string{char(v & 0xff), char((v >> 8) & 0xff), char((v >> 16) & 0xff), char(v >> 24)}; };
  const uint16_t name_length = uint16_t(entry_name.size());
  const uint32_t size = uint32_t(data.size());
  std::string local = "PK\x03\x04" + le16(20) + le16(0) + le16(0) + le16(0) + le16(0) + le32(0) + le32(size) + le32(size) +
                      le16(name_length) + le16(0) + entry_name + data;
  std::string central = "PK\x01\x02" + le16(20) + le16(20) + le16(0) + le16(0) + le16(0) + le16(0) + le32(0) + le32(size) +
                        le32(size) + le16(name_length) + le16(0) + le16(0) + le16(0) + le16(0) + le32(0) + le32(0) + entry_name;
  std::string end = std::string("PK\x05\x06", 4) + le16(0) + le16(0) + le16(1) + le16(1) + le32(uint32_t(central.size())) +
                    le32(uint32_t(local.size())) + le16(0);
  return local + central + end;
}

inline std::string SafetensorsBytes(size_t data_bytes) {
  std::string header = R"({"w":{"dtype":"U8","shape":[)" + std::to_string(data_bytes) + R"(],"data_offsets":[0,)" +
                       std::to_string(data_bytes) + "]}}";
  std::string length(8, '\0');
  for (int i = 0; i < 8; ++i) length[i] = char((header.size() >> (8 * i)) & 0xff);
  return length + header + std::string(data_bytes, 'x');
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Sets a file's mtime to `seconds` after the epoch, for rules that compare times.
inline void SetMtime(const std::string& path, int64_t seconds) {
  timespec times[2] = {{seconds, 0}, {seconds, 0}};
  utimensat(AT_FDCWD, path.c_str(), times, 0);
}

// The one checkpoint found under `root` (marker ".complete").
inline checkpoint::Candidate OnlyCandidate(const std::string& root) {
  auto candidates = checkpoint::FindCandidates(checkpoint::ScanTree(root, ".complete"), root, ".complete");
  EXPECT_EQ(candidates.size(), 1u);
  return candidates.at(0);
}

}  // namespace bt::testing
