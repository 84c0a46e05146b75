// model/formats/ckpt_io.h: the file plumbing checkpoint files share (model/formats/checkpoint.h's state.bin,
// model/formats/safetensors.h's weights, model/run/run_dir.h's run files): CRC-32, reading a whole file,
// writing a file atomically and streamed (straight from the caller's memory, no copy), and
// the one-line messages for files that read back damaged.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tg {
namespace ckpt {

// CRC-32, IEEE 802.3 (reflected polynomial 0xEDB88320, as zlib's crc32): crc32("123456789")
// is 0xCBF43926. Pass the previous result as crc to continue over more bytes.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

// A file written atomically. The constructor creates path + ".tmp"; write() appends bytes to it
// as they come (and to crc()); commit() fsyncs it, renames it over path and fsyncs the
// directory, so path holds either its old content or all of the new. Destroyed without
// commit(), after a failure on the way, it removes the temp file and leaves path untouched.
// Every failure (no space, no permission, short write, ...) throws RuntimeError naming the
// path and the OS error.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t n);
  void write(const std::string& s) { write(s.data(), s.size()); }
  uint32_t crc() const { return crc_; }  // CRC-32 of every byte written so far
  void commit();

 private:
  [[noreturn]] void fail(const std::string& op, int err);
  std::string path_, tmp_;
  int fd_ = -1;
  uint32_t crc_ = 0;
};

// AtomicFile for bytes held in memory.
void write_file_atomic(const std::string& path, const std::string& bytes);

// fsyncs a directory (its entries: renames, creations). Throws RuntimeError.
void fsync_dir(const std::string& dir);

// The content of a checkpoint file: all of it, or its first max_bytes; its size in bytes goes
// to file_size when given. Throws InputError (missing, unreadable, not a regular file: a FIFO
// would block the open, /dev/zero never end) saying what and how to fix.
std::string read_file(const std::string& path, size_t max_bytes = SIZE_MAX, uint64_t* file_size = nullptr);

// A checkpoint file read back is damaged: InputError with what, what was expected, and the way
// out (delete the checkpoint directory to resume from an older one).
[[noreturn]] void damaged(const std::string& path, const std::string& what, const std::string& expected);

// A file read back holds a config validate() refuses (its message in refusal): InputError
// "<path> holds a config train_gpt refuses: <what>; expected <expected>; <fix>".
[[noreturn]] void refused_config(const std::string& path, const std::string& refusal, const std::string& fix);

// A checkpoint file belongs to a model of another shape than the one asked for: InputError.
[[noreturn]] void another_model(const std::string& path, const std::string& what, const std::string& expected);

}  // namespace ckpt
}  // namespace tg
