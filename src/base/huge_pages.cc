#include "base/huge_pages.h"

#include <sys/mman.h>

#include <utility>

namespace kvllm {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

HugePageBuffer HugePageBuffer::Allocate(size_t bytes) {
  // One spare huge page leaves room to start on a 2 MiB boundary wherever mmap puts it.
  const size_t map_bytes = (bytes + kHugePage - 1) / kHugePage * kHugePage + kHugePage;
  void* map = ::mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
  HugePageBuffer buffer;
  if (map == MAP_FAILED) return buffer;
  const uintptr_t base = reinterpret_cast<uintptr_t>(map);
  buffer.map_ = map;
  buffer.map_bytes_ = map_bytes;
  buffer.data_ = reinterpret_cast<uint8_t*>((base + kHugePage - 1) / kHugePage * kHugePage);
  buffer.size_ = bytes;
  // Best effort: fails where transparent huge pages are off, and 4 KiB pages remain.
  ::madvise(buffer.data_, map_bytes - (buffer.data_ - static_cast<uint8_t*>(map)),
            MADV_HUGEPAGE);
  return buffer;
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept { *this = std::move(other); }

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this == &other) return *this;
  Release();
  map_ = std::exchange(other.map_, nullptr);
  map_bytes_ = std::exchange(other.map_bytes_, 0);
  data_ = std::exchange(other.data_, nullptr);
  size_ = std::exchange(other.size_, 0);
  return *this;
}

HugePageBuffer::~HugePageBuffer() { Release(); }

void HugePageBuffer::MakeReadOnly() {
  if (map_ != nullptr) ::mprotect(map_, map_bytes_, PROT_READ);
}

void HugePageBuffer::Release() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  data_ = nullptr;
  size_ = 0;
}

}  // namespace kvllm
