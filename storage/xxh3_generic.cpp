#include "storage/xxh3_impl.h"
#include "storage/xxh3_variant.inc"

namespace bt::storage::detail {
const Xxh3Functions kXxh3Generic = {Create, Destroy, Update, Digest};
}
