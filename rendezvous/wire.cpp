#include "rendezvous/wire.h"

#include <vector>

namespace bt::rendezvous {

std::string EncodeFrame(const Message& message) {
  std::vector<uint8_t> body = Message::to_msgpack(message);
  const uint32_t length = uint32_t(body.size() + 1);
  std::string frame;
  frame.reserve(kFrameHeaderBytes + length);
  frame.push_back(char(length >> 24));
  frame.push_back(char(length >> 16));
  frame.push_back(char(length >> 8));
  frame.push_back(char(length));
  frame.push_back(char(kProtocolVersion));
  frame.append(reinterpret_cast<const char*>(body.data()), body.size());
  return frame;
}

void FrameDecoder::Feed(const char* data, size_t size) {
  if (consumed_ > 0 && consumed_ == buffer_.size()) {
    buffer_.clear();
    consumed_ = 0;
  }
  buffer_.append(data, size);
}

bool FrameDecoder::Next(Message& message) {
  if (buffer_.size() - consumed_ < kFrameHeaderBytes) return false;
  const auto* header = reinterpret_cast<const uint8_t*>(buffer_.data() + consumed_);
  const uint32_t length = uint32_t(header[0]) << 24 | uint32_t(header[1]) << 16 | uint32_t(header[2]) << 8 | header[3];
  if (length == 0) throw FrameError("empty frame");
  if (length > max_frame_bytes_) {
    throw FrameError("frame of " + std::to_string(length) + " bytes exceeds the limit of " +
                     std::to_string(max_frame_bytes_));
  }
  if (buffer_.size() - consumed_ - kFrameHeaderBytes < length) return false;
  message = DecodePayload(std::string_view(buffer_).substr(consumed_ + kFrameHeaderBytes, length));
  consumed_ += kFrameHeaderBytes + length;
  if (consumed_ > (1u << 16) && consumed_ * 2 > buffer_.size()) {  // keep the buffer from growing forever
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  return true;
}

Message DecodePayload(std::string_view payload) {
  if (payload.empty()) throw FrameError("empty frame");
  if (uint8_t(payload[0]) != kProtocolVersion) {
    throw FrameError("protocol version " + std::to_string(uint8_t(payload[0])) + " (this build speaks " +
                     std::to_string(kProtocolVersion) + ")");
  }
  Message message;
  try {
    message = Message::from_msgpack(payload.begin() + 1, payload.end(), true, true);
  } catch (const Message::exception& error) {
    throw FrameError(std::string("malformed MessagePack: ") + error.what());
  }
  if (!message.is_object()) throw FrameError("message is not a map");
  StringField(message, "op");
  return message;
}

std::string StringField(const Message& message, const char* name) {
  auto it = message.find(name);
  if (it == message.end() || !it->is_string()) throw FrameError(std::string("field \"") + name + "\": expected a string");
  return it->get<std::string>();
}

int64_t IntField(const Message& message, const char* name) {
  auto it = message.find(name);
  if (it == message.end() || !it->is_number_integer()) {
    throw FrameError(std::string("field \"") + name + "\": expected an integer");
  }
  return it->get<int64_t>();
}

std::string BytesField(const Message& message, const char* name) {
  auto it = message.find(name);
  if (it == message.end() || !it->is_binary()) throw FrameError(std::string("field \"") + name + "\": expected bytes");
  const auto& bytes = it->get_binary();
  return std::string(bytes.begin(), bytes.end());
}

Message BytesValue(std::string_view bytes) {
  return Message::binary(std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

}  // namespace bt::rendezvous
