#include "storage/json_bytes.h"

#include <cstdint>

namespace bt::storage {
namespace {

constexpr const char* kHexField = "bytes_hex";
constexpr char kHexDigits[] = "0123456789abcdef";

// Length of the UTF-8 sequence at `at`, or 0 when it is not a well-formed one (overlong
// forms, surrogates and code points past U+10FFFF are not: nlohmann refuses them too).
size_t SequenceLength(const std::string& text, size_t at) {
  const auto byte = [&](size_t index) { return uint8_t(text[index]); };
  const uint8_t lead = byte(at);
  if (lead < 0x80) return 1;
  size_t length = 0;
  uint32_t code = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    code = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    code = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    code = lead & 0x07;
  } else {
    return 0;
  }
  if (at + length > text.size()) return 0;
  for (size_t index = at + 1; index < at + length; ++index) {
    if ((byte(index) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(index) & 0x3F);
  }
  if (length == 3 && (code < 0x800 || (code >= 0xD800 && code <= 0xDFFF))) return 0;
  if (length == 4 && (code < 0x10000 || code > 0x10FFFF)) return 0;
  return length;
}

int HexValue(char digit) {
  if (digit >= '0' && digit <= '9') return digit - '0';
  if (digit >= 'a' && digit <= 'f') return digit - 'a' + 10;
  return -1;
}

}  // namespace

bool IsValidUtf8(const std::string& text) {
  for (size_t at = 0; at < text.size();) {
    const size_t length = SequenceLength(text, at);
    if (length == 0) return false;
    at += length;
  }
  return true;
}

nlohmann::json BytesToJson(const std::string& bytes) {
  if (IsValidUtf8(bytes)) return bytes;
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (char c : bytes) {
    hex += kHexDigits[uint8_t(c) >> 4];
    hex += kHexDigits[uint8_t(c) & 0x0F];
  }
  return {{kHexField, hex}};
}

std::string BytesFromJson(const nlohmann::json& value) {
  if (!value.is_object()) return value.get<std::string>();
  const std::string hex = value.at(kHexField).get<std::string>();
  std::string bytes;
  bytes.reserve(hex.size() / 2);
  for (size_t at = 0; at < hex.size(); at += 2) {
    const int high = HexValue(hex[at]);
    const int low = at + 1 < hex.size() ? HexValue(hex[at + 1]) : -1;
    if (high < 0 || low < 0) throw nlohmann::json::other_error::create(501, std::string(kHexField) + " is not hex", &value);
    bytes += char(high << 4 | low);
  }
  return bytes;
}

nlohmann::json BytesMapToJson(const std::map<std::string, std::string>& map) {
  bool keys_are_text = true;
  for (const auto& [key, content] : map) keys_are_text = keys_are_text && IsValidUtf8(key);
  if (keys_are_text) {
    nlohmann::json object = nlohmann::json::object();
    for (const auto& [key, content] : map) object[key] = BytesToJson(content);
    return object;
  }
  nlohmann::json pairs = nlohmann::json::array();
  for (const auto& [key, content] : map) pairs.push_back({BytesToJson(key), BytesToJson(content)});
  return pairs;
}

std::map<std::string, std::string> BytesMapFromJson(const nlohmann::json& value) {
  std::map<std::string, std::string> map;
  if (value.is_object()) {
    for (const auto& [key, content] : value.items()) map[key] = BytesFromJson(content);
    return map;
  }
  for (const auto& pair : value) map[BytesFromJson(pair.at(0))] = BytesFromJson(pair.at(1));
  return map;
}

}  // namespace bt::storage
