// Reading a whole input file (a config, a model file, a checkpoint, a trace) into memory, bounded:
// every file mixkv reads goes through here, so a device (/dev/zero), a FIFO, a directory or a
// file larger than its kind's documented limit is refused before a byte is read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace mixkv {

// The bytes of `path`, which must be a regular file (symbolic links are followed) of at most
// `max_bytes` bytes (each kind of file has its own documented limit, beside its reader). Throws
// Error(kInvalidInput) naming `what` (e.g. "config file") and the path otherwise, or when it cannot
// be opened or read. A file that grows while it is read is cut off at max_bytes + 1 and refused, so
// the memory used never exceeds the limit by more than a byte.
std::string read_regular_file(const std::string& path, std::int64_t max_bytes,
                              std::string_view what);

}  // namespace mixkv
