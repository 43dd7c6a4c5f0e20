#include "kv/session_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <xxhash.h>

namespace kvllm {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'L', 'L', 'M', 'S', 'E', 'S'};

template <typename T>
void Put(std::vector<uint8_t>* out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64)
  out->insert(out->end(), b, b + sizeof(T));
}

// Reads from [pos, end) with bounds checks.
class Reader {
 public:
  Reader(const std::vector<uint8_t>& b, size_t end) : b_(b), end_(end) {}
  template <typename T>
  bool Get(T* v) {
    if (end_ - pos_ < sizeof(T)) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Bytes(uint64_t n, const uint8_t** p) {
    if (end_ - pos_ < n) return false;
    *p = b_.data() + pos_;
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == end_; }

 private:
  const std::vector<uint8_t>& b_;
  size_t end_;
  size_t pos_ = 0;
};

}  // namespace

Status SaveSessionFile(const std::string& path, const SessionData& session) {
  std::vector<uint8_t> out(kMagic, kMagic + sizeof kMagic);
  Put<uint32_t>(&out, kSessionFormatVersion);
  Put<uint64_t>(&out, session.metadata.size());
  out.insert(out.end(), session.metadata.begin(), session.metadata.end());
  Put<uint32_t>(&out, static_cast<uint32_t>(session.blocks.size()));
  for (const auto& b : session.blocks) {
    Put<uint64_t>(&out, b.size());
    out.insert(out.end(), b.begin(), b.end());
  }
  Put<uint64_t>(&out, XXH3_64bits(out.data(), out.size()));

  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::Error("cannot write session " + path + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = write(fd, out.data() + done, out.size() - done);
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      close(fd);
      unlink(tmp.c_str());
      return Status::Error("cannot write session " + path + ": " + why);
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = fsync(fd) == 0;
  close(fd);
  if (!synced || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return Status::Error("cannot save session " + path + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

StatusOr<SessionData> LoadSessionFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error("cannot read session " + path);
  const std::vector<uint8_t> b{std::istreambuf_iterator<char>(in), {}};
  const std::string bad = "session " + path + " is not a usable kvllm session: ";
  if (b.size() < sizeof kMagic + 4 + 8 + 4 + 8 || std::memcmp(b.data(), kMagic, sizeof kMagic)) {
    return Status::Error(bad + "no session header");
  }
  uint64_t checksum;
  std::memcpy(&checksum, b.data() + b.size() - 8, 8);
  if (checksum != XXH3_64bits(b.data(), b.size() - 8)) {
    return Status::Error(bad + "checksum mismatch (truncated or corrupt)");
  }
  Reader r(b, b.size() - 8);
  const uint8_t* p;
  uint32_t version = 0, count = 0;
  uint64_t meta_len = 0;
  if (!r.Bytes(sizeof kMagic, &p) || !r.Get(&version)) return Status::Error(bad + "truncated");
  if (version != kSessionFormatVersion) {
    return Status::Error(bad + "format version " + std::to_string(version) + ", this kvllm reads " +
                         std::to_string(kSessionFormatVersion));
  }
  SessionData s;
  if (!r.Get(&meta_len) || !r.Bytes(meta_len, &p)) return Status::Error(bad + "truncated");
  s.metadata.assign(reinterpret_cast<const char*>(p), meta_len);
  if (!r.Get(&count)) return Status::Error(bad + "truncated");
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t len = 0;
    if (!r.Get(&len) || !r.Bytes(len, &p)) return Status::Error(bad + "truncated block");
    s.blocks.emplace_back(p, p + len);
  }
  if (!r.done()) return Status::Error(bad + "trailing bytes");
  return s;
}

}  // namespace kvllm
