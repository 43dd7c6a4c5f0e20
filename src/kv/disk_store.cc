#include "kv/disk_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <tuple>

namespace kvllm {
namespace {

constexpr char kSuffix[] = ".kvb";
constexpr char kTempSuffix[] = ".tmp";

std::string Errno(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

bool IsHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// The hash a block file is named by ("abcdef0123456789.kvb" inside "ab/"), or nullopt.
std::optional<BlockHash> HashOfFile(std::string_view folder, std::string_view file) {
  if (file.size() != 16 + std::strlen(kSuffix) || !file.ends_with(kSuffix)) return std::nullopt;
  const std::string_view hex = file.substr(0, 16);
  if (!IsHex(hex) || !hex.starts_with(folder)) return std::nullopt;
  BlockHash hash = 0;
  std::from_chars(hex.data(), hex.data() + hex.size(), hash, 16);
  return hash;
}

// The names in folder `path` (without "." and "..").
StatusOr<std::vector<std::string>> ListFolder(const std::string& path) {
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return Status::Error(Errno("cannot list", path));
  std::vector<std::string> names;
  while (const dirent* e = readdir(d)) {
    const std::string_view name = e->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  closedir(d);
  return names;
}

bool IsFolder(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Reads all of `fd` (opened from `path`) into `out`.
Status ReadAll(int fd, const std::string& path, std::vector<uint8_t>& out) {
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::Error(Errno("cannot stat", path));
  out.resize(st.st_size);
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::Error(Errno("cannot read", path));
    if (n == 0) break;  // shorter than fstat said: DecodeBlock will refuse it
    done += n;
  }
  out.resize(done);
  return Status::Ok();
}

Status WriteAll(int fd, std::span<const uint8_t> bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::Error(Errno("cannot write", path));
    bytes = bytes.subspan(n);
  }
  return Status::Ok();
}

// Writes `bytes` to a new file `path` and fsyncs it; on failure removes what it wrote.
Status WriteDurably(const std::string& path, std::span<const uint8_t> bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Status::Error(Errno("cannot create", path));
  Status s = WriteAll(fd, bytes, path);
  if (s.ok() && fsync(fd) != 0) s = Status::Error(Errno("cannot fsync", path));
  if (close(fd) != 0 && s.ok()) s = Status::Error(Errno("cannot close", path));
  if (!s.ok()) unlink(path.c_str());
  return s;
}

// Makes a rename inside `folder` durable.
Status SyncFolder(const std::string& folder) {
  const int fd = open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::Error(Errno("cannot open", folder));
  const bool ok = fsync(fd) == 0;
  close(fd);
  return ok ? Status::Ok() : Status::Error(Errno("cannot fsync", folder));
}

}  // namespace

StatusOr<std::unique_ptr<DiskStore>> DiskStore::Open(std::string dir, uint64_t max_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Error("cannot create KV store directory " + dir + ": " + ec.message());
  const std::string lock_path = dir + "/LOCK";
  const int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) return Status::Error(Errno("cannot open", lock_path));
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const bool busy = errno == EWOULDBLOCK;
    const std::string message =
        busy ? "KV store directory " + dir + " is in use by another disk store"
             : Errno("cannot lock", lock_path);
    close(lock_fd);
    return Status::Error(message);
  }
  std::unique_ptr<DiskStore> store(new DiskStore(std::move(dir), max_bytes, lock_fd));
  KVLLM_RETURN_IF_ERROR(store->Scan());
  return store;
}

DiskStore::DiskStore(std::string dir, uint64_t max_bytes, int lock_fd)
    : dir_(std::move(dir)), max_bytes_(max_bytes), lock_fd_(lock_fd) {}

DiskStore::~DiskStore() { close(lock_fd_); }

Status DiskStore::Scan() {
  // (mtime in ns, hash, bytes) of every block file, to seed the LRU oldest first.
  std::vector<std::tuple<int64_t, BlockHash, uint64_t>> found;
  KVLLM_ASSIGN_OR_RETURN(const std::vector<std::string> folders, ListFolder(dir_));
  for (const std::string& folder_name : folders) {
    const std::string folder = dir_ + "/" + folder_name;
    if (folder_name.size() != 2 || !IsHex(folder_name) || !IsFolder(folder)) continue;
    KVLLM_ASSIGN_OR_RETURN(const std::vector<std::string> files, ListFolder(folder));
    for (const std::string& file_name : files) {
      const std::string path = folder + "/" + file_name;
      if (file_name.ends_with(kTempSuffix)) {
        // The lock says no Put is in flight: this is a dead writer's leftover.
        if (unlink(path.c_str()) != 0) return Status::Error(Errno("cannot remove", path));
        continue;
      }
      const std::optional<BlockHash> hash = HashOfFile(folder_name, file_name);
      if (!hash) continue;
      struct stat st;
      if (stat(path.c_str(), &st) != 0) return Status::Error(Errno("cannot stat", path));
      found.emplace_back(st.st_mtim.tv_sec * int64_t{1000000000} + st.st_mtim.tv_nsec, *hash,
                         st.st_size);
    }
  }
  std::sort(found.begin(), found.end());
  std::lock_guard lock(mu_);
  for (const auto& [mtime, hash, size] : found) Insert(hash, size);
  EvictToFit(0);
  return Status::Ok();
}

std::string DiskStore::PathOf(BlockHash hash) const {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, hash);
  return dir_ + "/" + std::string(hex, 2) + "/" + hex + kSuffix;
}

StatusOr<std::optional<std::vector<uint8_t>>> DiskStore::Get(BlockHash hash) {
  const std::string path = PathOf(hash);
  // A block replaced or evicted meanwhile is fine: the open file keeps the bytes it had.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<std::vector<uint8_t>>();
    return Status::Error(Errno("cannot open", path));
  }
  std::vector<uint8_t> bytes;
  const Status s = ReadAll(fd, path, bytes);
  close(fd);
  if (!s.ok()) return s;
  std::lock_guard lock(mu_);
  Use(hash);
  return std::optional<std::vector<uint8_t>>(std::move(bytes));
}

Status DiskStore::Put(BlockHash hash, std::span<const uint8_t> encoded) {
  if (max_bytes_ != 0 && encoded.size() > max_bytes_) {
    return Status::Error("KV block of " + std::to_string(encoded.size()) +
                         " bytes exceeds the disk store's limit of " + std::to_string(max_bytes_));
  }
  const std::string path = PathOf(hash);
  const std::string folder = path.substr(0, path.rfind('/'));
  if (mkdir(folder.c_str(), 0755) == 0) {
    KVLLM_RETURN_IF_ERROR(SyncFolder(dir_));  // the new folder's name must outlive a crash too
  } else if (errno != EEXIST) {
    return Status::Error(Errno("cannot create", folder));
  }
  const std::string temp = path + "." + std::to_string(next_temp_++) + kTempSuffix;
  KVLLM_RETURN_IF_ERROR(WriteDurably(temp, encoded));
  {
    // Renames and removals happen under the lock so the index always matches the files.
    // Room is made before the rename, so that the files add up to at most max_bytes at every
    // moment, also for a process that lists the folders meanwhile. An older version of the
    // block still counts until the rename replaces it (Insert).
    std::lock_guard lock(mu_);
    EvictToFit(encoded.size());
    if (rename(temp.c_str(), path.c_str()) != 0) {
      const Status s = Status::Error(Errno("cannot rename into", path));
      unlink(temp.c_str());
      return s;
    }
    Insert(hash, encoded.size());
  }
  // Readers see the block from here on; a failure below only means a crash could lose it.
  return SyncFolder(folder);
}

Status DiskStore::Remove(BlockHash hash) {
  const std::string path = PathOf(hash);
  std::lock_guard lock(mu_);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Status::Error(Errno("cannot remove", path));
  }
  Forget(hash);
  return Status::Ok();
}

bool DiskStore::Contains(BlockHash hash) {
  std::lock_guard lock(mu_);
  return index_.count(hash) != 0;
}

uint64_t DiskStore::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

size_t DiskStore::num_blocks() const {
  std::lock_guard lock(mu_);
  return index_.size();
}

int64_t DiskStore::evictions() const {
  std::lock_guard lock(mu_);
  return evictions_;
}

void DiskStore::Insert(BlockHash hash, uint64_t bytes) {
  Forget(hash);
  lru_.push_back(hash);
  index_.emplace(hash, Entry{bytes, std::prev(lru_.end())});
  bytes_ += bytes;
}

void DiskStore::Use(BlockHash hash) {
  const auto it = index_.find(hash);
  if (it != index_.end()) lru_.splice(lru_.end(), lru_, it->second.lru_pos);
}

void DiskStore::Forget(BlockHash hash) {
  const auto it = index_.find(hash);
  if (it == index_.end()) return;
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru_pos);
  index_.erase(it);
}

void DiskStore::EvictToFit(uint64_t incoming) {
  while (max_bytes_ != 0 && !lru_.empty() && bytes_ + incoming > max_bytes_) {
    const BlockHash oldest = lru_.front();
    // A file that cannot be removed is forgotten anyway (the next Open finds it again), so
    // that a read-only file cannot stop eviction.
    unlink(PathOf(oldest).c_str());
    Forget(oldest);
    ++evictions_;
  }
}

}  // namespace kvllm
