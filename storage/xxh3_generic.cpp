#include "checkpoint/xxh3_impl.h"
#include "checkpoint/xxh3_variant.inc"

namespace bt::checkpoint::detail {
const Xxh3Functions kXxh3Generic = {Create, Destroy, Update, Digest};
}
