// File helpers of the emulation harnesses (harness.cpp, harness_mma.cpp, harness_prompt_attention.cpp): inputs
// and outputs are raw little-endian arrays in files the tests write and read.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <vector>

static std::vector<char> read_file(const char* path) {
  std::vector<char> data;
  FILE* f = std::fopen(path, "rb");
  if (!f) std::exit(3);
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + n);
  std::fclose(f);
  return data;
}

static void write_file(const char* path, const void* data, size_t bytes) {
  FILE* f = std::fopen(path, "wb");
  if (!f || (bytes && std::fwrite(data, 1, bytes, f) != bytes)) std::exit(4);
  std::fclose(f);
}
