// File helpers of the emulation harnesses (harness.cpp, harness_mma.cpp, harness_prompt_attention.cpp, ...): inputs
// and outputs are raw little-endian arrays in files the tests write and read.
//
// Every buffer a harness hands a kernel is a Bytes: its end (rounded up to 16 bytes, the widest load's alignment)
// abuts a page the process may not touch, so a kernel that reads or writes past a buffer's end dies of SIGSEGV
// here, as it would fault on a GPU when the buffer ends at the end of its mapping (a Q8_0 tensor whose size is a
// multiple of 2 MiB did, on an NVIDIA H100).
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

template <class T>
struct EndGuarded {
  using value_type = T;
  EndGuarded() = default;
  template <class U>
  EndGuarded(const EndGuarded<U>&) {}
  static size_t padded(size_t n) { return (n * sizeof(T) + 15) / 16 * 16; }
  static size_t span(size_t n) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (padded(n) + page - 1) / page * page + page;
  }
  T* allocate(size_t n) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void* base = mmap(nullptr, span(n), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) throw std::bad_alloc();
    char* guard = (char*)base + span(n) - page;
    if (mprotect(guard, page, PROT_NONE) != 0) std::exit(5);
    return (T*)(guard - padded(n));
  }
  void deallocate(T* p, size_t n) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    munmap((char*)p + padded(n) + page - span(n), span(n));
  }
  template <class U>
  bool operator==(const EndGuarded<U>&) const { return true; }
};

using Bytes = std::vector<char, EndGuarded<char>>;

static Bytes read_file(const char* path) {
  FILE* f = std::fopen(path, "rb");
  if (!f || std::fseek(f, 0, SEEK_END) != 0) std::exit(3);
  const long size = std::ftell(f);
  std::rewind(f);
  Bytes data((size_t)(size > 0 ? size : 0));
  if (size > 0 && std::fread(data.data(), 1, data.size(), f) != data.size()) std::exit(3);
  std::fclose(f);
  return data;
}

static void write_file(const char* path, const void* data, size_t bytes) {
  FILE* f = std::fopen(path, "wb");
  if (!f || (bytes && std::fwrite(data, 1, bytes, f) != bytes)) std::exit(4);
  std::fclose(f);
}

template <class T>
using Guarded = std::vector<T, EndGuarded<T>>;  // an output or workspace of T, guarded as Bytes are
