// Read-only memory-mapped file (model weights). Move-only RAII.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace dhs {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws dhs::Error if the file cannot be opened or mapped.
  static MappedFile open(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace dhs
