// The rendezvous wire protocol (docs/PROTOCOL.md): a frame is a 4-byte big-endian
// payload length, then the payload: one protocol-version byte and one MessagePack map
// with at least a string "op". Lengths are checked before anything is allocated.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace bt::rendezvous {

using Message = nlohmann::json;

inline constexpr uint8_t kProtocolVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 4;
// Before authentication a peer may send only a small frame: an unauthenticated client
// must not make the leader allocate.
inline constexpr uint32_t kMaxUnauthenticatedFrameBytes = 4096;
inline constexpr uint32_t kMaxFrameBytes = 64u << 20;

// A frame that cannot be accepted; the connection that sent it is closed.
class FrameError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string EncodeFrame(const Message& message);

// `bytes` as a MessagePack bin (its header and the bytes), to be shared by several frames.
std::string EncodeBin(std::string_view bytes);
// Appends the frame {"op":"ok","id":id} or, with `encoded_value` (EncodeBin's), the frame
// {"op":"ok","id":id,"value":bin}: what a parked request gets when its key is set, the value
// encoded once for all of them. The same bytes as EncodeFrame of that message would decode to.
void AppendOkFrame(std::string& out, int64_t id, const std::string* encoded_value);

// Reassembles frames from a byte stream that arrives in arbitrary pieces.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_frame_bytes = kMaxUnauthenticatedFrameBytes) : max_frame_bytes_(max_frame_bytes) {}
  void set_max_frame_bytes(uint32_t max) { max_frame_bytes_ = max; }
  void Feed(const char* data, size_t size);
  // The next complete message, or false when more bytes are needed. Throws FrameError.
  bool Next(Message& message);

 private:
  std::string buffer_;
  size_t consumed_ = 0;
  uint32_t max_frame_bytes_;
};

// Parses one MessagePack value that fills `bytes` exactly (strict, as nlohmann's
// from_msgpack), copying bin/str/ext payloads in one piece. Throws FrameError.
Message DecodeMsgpack(std::string_view bytes);

// Parses one payload (version byte + MessagePack map). Throws FrameError.
Message DecodePayload(std::string_view payload);

// Field accessors that throw FrameError naming the field, so a malformed message from a
// peer is reported, never crashes the leader.
// Bytes the peer sent that this side has not read yet (0 when only a close is pending).
bool HasUnreadBytes(int fd);

std::string StringField(const Message& message, const char* name);
int64_t IntField(const Message& message, const char* name);
std::string BytesField(const Message& message, const char* name);
Message BytesValue(std::string_view bytes);

}  // namespace bt::rendezvous
