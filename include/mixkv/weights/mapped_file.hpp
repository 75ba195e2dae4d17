// A whole file mapped read-only into memory, for weight readers (GGUF, safetensors) that hand out
// views into it instead of copies. The mapping lives as long as the MappedFile; views into it
// must not outlive it.
#pragma once

#include <cstddef>
#include <span>
#include <string>

namespace mixkv::weights {

class MappedFile {
 public:
  // Maps `path` read-only and shared (pages come from the page cache, so several processes
  // share them). Throws Error (invalid input) naming the path when it cannot be opened, is not a
  // regular file, or cannot be mapped. An empty file maps to an empty span.
  static MappedFile open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(const std::byte* data, std::size_t size, std::string path)
      : data_(data), size_(size), path_(std::move(path)) {}
  void release() noexcept;

  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::string path_;
};

}  // namespace mixkv::weights
