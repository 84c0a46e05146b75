// model/formats/ckpt_io.cpp: CRC-32, atomic streamed writes, whole-file reads (see model/formats/ckpt_io.h).
#include "ckpt_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "../../data/errors.h"

namespace tg {
namespace ckpt {
namespace fs = std::filesystem;

namespace {

std::string dir_of(const std::string& path) {
  std::string d = fs::path(path).parent_path().string();
  return d.empty() ? "." : d;
}

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const unsigned char* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

AtomicFile::AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("creating " + tmp_, errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::fail(const std::string& op, int err) {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
    fd_ = -1;
  }
  throw RuntimeError("cannot write " + path_ + ": " + op + " failed: " + std::strerror(err) +
                     "; expected a writable directory with free space; check the permissions and free space of " +
                     dir_of(path_));
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  crc_ = crc32(p, n, crc_);
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::write(fd_, p + done, std::min<size_t>(n - done, (size_t)1 << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("writing " + tmp_, w < 0 ? errno : ENOSPC);  // a write of 0 bytes: the disk is full
    done += (size_t)w;
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail("fsync of " + tmp_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp_.c_str());
    fail("closing " + tmp_, e);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp_.c_str());
    fail("renaming " + tmp_, e);
  }
  fsync_dir(dir_of(path_));
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int e = fd < 0 ? errno : 0;
  if (fd >= 0) {
    if (::fsync(fd) != 0 && errno != EINVAL) e = errno;  // EINVAL: the filesystem cannot sync directories
    ::close(fd);
  }
  if (e)
    throw RuntimeError("cannot fsync directory " + dir + ": " + std::strerror(e) +
                       "; expected a writable directory on a working disk; check the disk and --out-dir");
}

std::string read_file(const std::string& path, size_t max_bytes, uint64_t* file_size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO's open returns at once
  struct stat st = {};
  if (fd >= 0 && (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
    ::close(fd);
    throw InputError("checkpoint file " + path + " is not a regular file (a directory, device or FIFO); expected a "
                     "file written by train_gpt or a model's file; pass the path of one");
  }
  if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT)
      throw InputError("checkpoint file " + path +
                       " does not exist; expected model.safetensors and state.bin in a checkpoint directory; pass "
                       "a ckpt-<step> directory written by train_gpt");
    throw InputError("cannot open checkpoint file " + path + ": " + std::strerror(e) +
                     "; expected a readable file; check its permissions");
  }
  if (file_size) *file_size = (uint64_t)st.st_size;
  std::string out;
  char buf[1 << 16];
  while (out.size() < max_bytes) {
    ssize_t r = ::read(fd, buf, std::min(sizeof buf, max_bytes - out.size()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      ::close(fd);
      throw InputError("cannot read checkpoint file " + path + ": " + std::strerror(e) +
                       "; expected a readable regular file; pass a ckpt-<step> directory written by train_gpt");
    }
    if (r == 0) break;
    out.append(buf, (size_t)r);
  }
  ::close(fd);
  return out;
}

void damaged(const std::string& path, const std::string& what, const std::string& expected) {
  throw InputError("checkpoint file " + path + " " + what + "; expected " + expected +
                   "; the file is damaged: delete its checkpoint directory to resume from an older one");
}

void refused_config(const std::string& path, const std::string& refusal, const std::string& fix) {
  // refusal is "<what>; expected <expected>; <how to fix a flag>": the last part does not apply
  const size_t a = refusal.find("; expected ");
  const std::string what = refusal.substr(0, a);
  std::string expected = a == std::string::npos ? "a config that passes validation" : refusal.substr(a + 11);
  expected = expected.substr(0, expected.find("; "));
  throw InputError(path + " holds a config train_gpt refuses: " + what + "; expected " + expected + "; " + fix);
}

void another_model(const std::string& path, const std::string& what, const std::string& expected) {
  throw InputError("checkpoint " + path + " was written for another model: " + what + ", expected " + expected +
                   "; pass the same --n-layer/--n-head/--n-embd/--block-size/--bias (and --data) as the run "
                   "that wrote it");
}

}  // namespace ckpt
}  // namespace tg
