#include "rendezvous/wire.h"

#include <sys/ioctl.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace bt::rendezvous {

std::string EncodeFrame(const Message& message) {
  // The MessagePack goes straight after a header whose length is filled in last: one
  // buffer, no copy of a body that may hold megabytes of values.
  std::string frame(kFrameHeaderBytes, '\0');
  frame.push_back(char(kProtocolVersion));
  Message::to_msgpack(message, nlohmann::detail::output_adapter<char>(frame));
  const uint32_t length = uint32_t(frame.size() - kFrameHeaderBytes);
  frame[0] = char(length >> 24);
  frame[1] = char(length >> 16);
  frame[2] = char(length >> 8);
  frame[3] = char(length);
  return frame;
}

namespace {

void AppendBigEndian(std::string& out, uint64_t value, int bytes) {
  for (int shift = 8 * (bytes - 1); shift >= 0; shift -= 8) out.push_back(char(value >> shift));
}

// A MessagePack integer, in the shortest form.
void AppendInt(std::string& out, int64_t value) {
  if (value >= 0) {
    if (value <= 0x7f) return out.push_back(char(value));
    if (value <= 0xff) return out.push_back(char(0xcc)), AppendBigEndian(out, uint64_t(value), 1);
    if (value <= 0xffff) return out.push_back(char(0xcd)), AppendBigEndian(out, uint64_t(value), 2);
    if (value <= 0xffffffffll) return out.push_back(char(0xce)), AppendBigEndian(out, uint64_t(value), 4);
    return out.push_back(char(0xcf)), AppendBigEndian(out, uint64_t(value), 8);
  }
  if (value >= -32) return out.push_back(char(value));
  if (value >= INT8_MIN) return out.push_back(char(0xd0)), AppendBigEndian(out, uint64_t(value), 1);
  if (value >= INT16_MIN) return out.push_back(char(0xd1)), AppendBigEndian(out, uint64_t(value), 2);
  if (value >= INT32_MIN) return out.push_back(char(0xd2)), AppendBigEndian(out, uint64_t(value), 4);
  return out.push_back(char(0xd3)), AppendBigEndian(out, uint64_t(value), 8);
}

}  // namespace

std::string EncodeBin(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() + 5);
  if (bytes.size() <= 0xff) {
    out.push_back(char(0xc4));
    AppendBigEndian(out, bytes.size(), 1);
  } else if (bytes.size() <= 0xffff) {
    out.push_back(char(0xc5));
    AppendBigEndian(out, bytes.size(), 2);
  } else {
    out.push_back(char(0xc6));
    AppendBigEndian(out, bytes.size(), 4);
  }
  out.append(bytes);
  return out;
}

void AppendOkFrame(std::string& out, int64_t id, const std::string* encoded_value) {
  const size_t start = out.size();
  out.append(kFrameHeaderBytes, '\0');
  out.push_back(char(kProtocolVersion));
  out.push_back(char(encoded_value ? 0x83 : 0x82));  // a map of 3 (2) entries
  out.append("\xa2" "id", 3);
  AppendInt(out, id);
  out.append("\xa2" "op" "\xa2" "ok", 6);
  if (encoded_value) {
    out.append("\xa5" "value", 6);
    out.append(*encoded_value);
  }
  const uint32_t length = uint32_t(out.size() - start - kFrameHeaderBytes);
  out[start] = char(length >> 24);
  out[start + 1] = char(length >> 16);
  out[start + 2] = char(length >> 8);
  out[start + 3] = char(length);
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

namespace {

// MessagePack into a Message, as nlohmann's strict reader does (the same values, the same
// refusals), but `bin`, `str` and `ext` payloads are copied in one piece: the leader decodes
// every node's inventory and node info, megabytes per phase at scale, and nlohmann's reader
// copies them a byte at a time. Nesting is bounded, so a hostile frame cannot exhaust the
// stack.
class MsgpackReader {
 public:
  explicit MsgpackReader(std::string_view bytes)
      : at_(reinterpret_cast<const uint8_t*>(bytes.data())), end_(at_ + bytes.size()) {}

  Message ReadDocument() {
    Message value;
    Read(value, 0);
    if (at_ != end_) Fail("trailing bytes after the value");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 256;

  [[noreturn]] static void Fail(const std::string& what) { throw FrameError("malformed MessagePack: " + what); }

  void Need(size_t bytes) const {
    if (size_t(end_ - at_) < bytes) Fail("unexpected end of input");
  }

  template <typename T>
  T Big() {
    Need(sizeof(T));
    std::make_unsigned_t<T> value = 0;
    for (size_t i = 0; i < sizeof(T); ++i) value = std::make_unsigned_t<T>(value << 8 | at_[i]);
    at_ += sizeof(T);
    return T(value);
  }

  std::string_view Take(size_t bytes) {
    Need(bytes);
    std::string_view taken(reinterpret_cast<const char*>(at_), bytes);
    at_ += bytes;
    return taken;
  }

  static std::vector<uint8_t> Bytes(std::string_view bytes) {
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    return std::vector<uint8_t>(data, data + bytes.size());  // one memmove
  }

  void Binary(Message& value, size_t size) { value = Message::binary(Bytes(Take(size))); }

  void Extension(Message& value, size_t size) {
    const auto subtype = Big<int8_t>();
    value = Message::binary(Bytes(Take(size)), uint8_t(subtype));
  }

  void Array(Message& value, size_t size, int depth) {
    value = Message::array();
    // Each element takes at least one byte: a declared size beyond what is left is a lie
    // that must not allocate.
    if (size > size_t(end_ - at_)) Fail("array longer than the input");
    auto& elements = value.get_ref<Message::array_t&>();
    elements.resize(size);
    for (auto& element : elements) Read(element, depth + 1);
  }

  void Map(Message& value, size_t size, int depth) {
    value = Message::object();
    if (size > size_t(end_ - at_) / 2) Fail("map longer than the input");
    auto& members = value.get_ref<Message::object_t&>();
    for (size_t i = 0; i < size; ++i) {
      std::string key(StringOnly());
      Read(members[std::move(key)], depth + 1);  // a repeated key: the last one wins, as in nlohmann
    }
  }

  // A map key: MessagePack strings only, as nlohmann accepts.
  std::string_view StringOnly() {
    Need(1);
    const uint8_t type = *at_++;
    if (type >= 0xa0 && type <= 0xbf) return Take(type & 0x1f);
    if (type == 0xd9) return Take(Big<uint8_t>());
    if (type == 0xda) return Take(Big<uint16_t>());
    if (type == 0xdb) return Take(Big<uint32_t>());
    Fail("a map key that is not a string");
  }

  void Read(Message& value, int depth) {
    if (depth > kMaxDepth) Fail("nested deeper than " + std::to_string(kMaxDepth));
    Need(1);
    const uint8_t type = *at_;
    if (type <= 0x7f) {
      ++at_;
      value = uint64_t(type);
      return;
    }
    if (type >= 0xe0) {
      ++at_;
      value = int64_t(int8_t(type));
      return;
    }
    if (type >= 0x80 && type <= 0x8f) return ++at_, Map(value, type & 0x0f, depth);
    if (type >= 0x90 && type <= 0x9f) return ++at_, Array(value, type & 0x0f, depth);
    if ((type >= 0xa0 && type <= 0xbf) || (type >= 0xd9 && type <= 0xdb)) {
      value = std::string(StringOnly());
      return;
    }
    ++at_;
    switch (type) {
      case 0xc0: value = nullptr; return;
      case 0xc2: value = false; return;
      case 0xc3: value = true; return;
      case 0xc4: return Binary(value, Big<uint8_t>());
      case 0xc5: return Binary(value, Big<uint16_t>());
      case 0xc6: return Binary(value, Big<uint32_t>());
      case 0xc7: return Extension(value, Big<uint8_t>());
      case 0xc8: return Extension(value, Big<uint16_t>());
      case 0xc9: return Extension(value, Big<uint32_t>());
      case 0xca: {
        const uint32_t bits = Big<uint32_t>();
        float number;
        std::memcpy(&number, &bits, sizeof number);
        value = double(number);
        return;
      }
      case 0xcb: {
        const uint64_t bits = Big<uint64_t>();
        double number;
        std::memcpy(&number, &bits, sizeof number);
        value = number;
        return;
      }
      case 0xcc: value = uint64_t(Big<uint8_t>()); return;
      case 0xcd: value = uint64_t(Big<uint16_t>()); return;
      case 0xce: value = uint64_t(Big<uint32_t>()); return;
      case 0xcf: value = Big<uint64_t>(); return;
      case 0xd0: value = int64_t(Big<int8_t>()); return;
      case 0xd1: value = int64_t(Big<int16_t>()); return;
      case 0xd2: value = int64_t(Big<int32_t>()); return;
      case 0xd3: value = Big<int64_t>(); return;
      case 0xd4: return Extension(value, 1);
      case 0xd5: return Extension(value, 2);
      case 0xd6: return Extension(value, 4);
      case 0xd7: return Extension(value, 8);
      case 0xd8: return Extension(value, 16);
      case 0xdc: return Array(value, Big<uint16_t>(), depth);
      case 0xdd: return Array(value, Big<uint32_t>(), depth);
      case 0xde: return Map(value, Big<uint16_t>(), depth);
      case 0xdf: return Map(value, Big<uint32_t>(), depth);
      default: Fail("invalid byte 0x" + Hex(type));  // 0xc1: never used
    }
  }

  static std::string Hex(uint8_t byte) {
    const char* digits = "0123456789abcdef";
    return {digits[byte >> 4], digits[byte & 15]};
  }

  const uint8_t* at_;
  const uint8_t* end_;
};

}  // namespace

Message DecodeMsgpack(std::string_view bytes) { return MsgpackReader(bytes).ReadDocument(); }

Message DecodePayload(std::string_view payload) {
  if (payload.empty()) throw FrameError("empty frame");
  if (uint8_t(payload[0]) != kProtocolVersion) {
    throw FrameError("protocol version " + std::to_string(uint8_t(payload[0])) + " (this build speaks " +
                     std::to_string(kProtocolVersion) + ")");
  }
  Message message = DecodeMsgpack(payload.substr(1));
  if (!message.is_object()) throw FrameError("message is not a map");
  StringField(message, "op");
  return message;
}

bool HasUnreadBytes(int fd) {
  int bytes = 0;
  return ioctl(fd, FIONREAD, &bytes) == 0 && bytes > 0;
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
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

Message BytesValue(std::string_view bytes) {
  std::vector<uint8_t> copy(bytes.size());
  if (!bytes.empty()) std::memcpy(copy.data(), bytes.data(), bytes.size());
  return Message::binary(std::move(copy));
}

}  // namespace bt::rendezvous
