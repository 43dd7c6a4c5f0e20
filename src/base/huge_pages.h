// Memory for data that every token streams through (weights read with --no-mmap, the KV block
// pool): anonymous, starting on a 2 MiB boundary and marked MADV_HUGEPAGE. A 4 KiB page costs
// a TLB miss and restarts the hardware prefetcher every 4 KiB of a stream; a transparent huge
// page covers 2 MiB, and can only back a 2 MiB-aligned range.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvllm {

class HugePageBuffer {
 public:
  // At least `bytes` zero-filled bytes, faulted in as first touched (a pool sized for the
  // model's whole context costs only what is used). On failure data() is null and errno says
  // why. Where transparent huge pages are off the memory is still usable, in 4 KiB pages.
  static HugePageBuffer Allocate(size_t bytes);

  HugePageBuffer() = default;
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;
  ~HugePageBuffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Forbids writes from now on (a segfault, not a silent change), as a read-only file mapping.
  void MakeReadOnly();

 private:
  void Release();

  void* map_ = nullptr;  // the whole mapping, wider than [data_, data_ + size_) for alignment
  size_t map_bytes_ = 0;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvllm
