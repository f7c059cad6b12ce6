// Runs kernels/block_formats.h's decode primitives on the host (tests/test_block_formats.py):
//   harness_block_formats <type> <blocks file> <output file>     every block of <type> dequantized (float32)
//   harness_block_formats mxfp4_int8 <words file> <output file>  MXFP4::int8_values of each word of codes
// Inputs and outputs are raw little-endian arrays; hip_compat.h is the emulation's (emulation.h).
#include <cstring>
#include <string>

#include "harness_io.h"
#include "hip_compat.h"
#include "block_formats.h"

template <class F>
static void dequantize(const Bytes& in, const char* out) {
  const size_t blocks = in.size() / F::kBytes;
  Guarded<float> y(blocks * F::kValues);
  for (size_t b = 0; b < blocks; ++b) {
    rf_blocks::dequantize_block<F>(reinterpret_cast<const unsigned char*>(in.data()) + b * F::kBytes, y.data() + b * F::kValues);
  }
  write_file(out, y.data(), y.size() * 4);
}

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  const std::string type = argv[1];
  const Bytes in = read_file(argv[2]);
  if (type == "mxfp4_int8") {
    Guarded<unsigned int> words(in.size() / 4);
    std::memcpy(words.data(), in.data(), words.size() * 4);
    for (unsigned int& w : words) w = rf_blocks::MXFP4::int8_values(w);
    write_file(argv[3], words.data(), words.size() * 4);
  } else if (type == "f16") dequantize<rf_blocks::F16>(in, argv[3]);
  else if (type == "bf16") dequantize<rf_blocks::BF16>(in, argv[3]);
  else if (type == "q4_0") dequantize<rf_blocks::Q4_0>(in, argv[3]);
  else if (type == "q4_1") dequantize<rf_blocks::Q4_1>(in, argv[3]);
  else if (type == "q5_0") dequantize<rf_blocks::Q5_0>(in, argv[3]);
  else if (type == "q5_1") dequantize<rf_blocks::Q5_1>(in, argv[3]);
  else if (type == "q8_0") dequantize<rf_blocks::Q8_0>(in, argv[3]);
  else if (type == "q4_k") dequantize<rf_blocks::Q4_K>(in, argv[3]);
  else if (type == "q5_k") dequantize<rf_blocks::Q5_K>(in, argv[3]);
  else if (type == "q6_k") dequantize<rf_blocks::Q6_K>(in, argv[3]);
  else if (type == "mxfp4") dequantize<rf_blocks::MXFP4>(in, argv[3]);
  else return 2;
  return 0;
}
