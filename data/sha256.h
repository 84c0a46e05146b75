// data/sha256.h: SHA-256 (FIPS 180-4), to name a data file by its contents: a checkpoint keeps
// the sha256 of the text it was trained on, and a resumed run checks it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace data {

// The SHA-256 of n bytes as 64 lowercase hex digits: sha256_hex("abc", 3) is
// "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".
std::string sha256_hex(const void* bytes, size_t n);

}  // namespace data
