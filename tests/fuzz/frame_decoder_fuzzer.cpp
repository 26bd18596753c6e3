// libFuzzer target: arbitrary bytes from an unauthenticated or authenticated peer must
// only ever yield messages or FrameError, never a crash, a hang or a huge allocation.
#include <cstddef>
#include <cstdint>

#include "rendezvous/node_info.h"
#include "rendezvous/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace bt::rendezvous;
  for (uint32_t limit : {kMaxUnauthenticatedFrameBytes, kMaxFrameBytes}) {
    FrameDecoder decoder(limit);
    // Feed in two pieces, as a stream would arrive.
    const size_t split = size / 2;
    try {
      Message message;
      decoder.Feed(reinterpret_cast<const char*>(data), split);
      while (decoder.Next(message)) {
      }
      decoder.Feed(reinterpret_cast<const char*>(data) + split, size - split);
      while (decoder.Next(message)) {
        // What the server does with a join: parse the node info it carries.
        if (message.contains("info")) NodeInfo::FromJson(message["info"]);
        if (message.contains("id")) IntField(message, "id");
        if (message.contains("value")) BytesField(message, "value");
      }
    } catch (const FrameError&) {
    }
  }
  return 0;
}
