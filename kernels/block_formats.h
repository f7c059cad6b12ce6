// The GGUF block formats the kernels read, one header each (block_format_<type>.h): a format's byte layout,
// its sizes as constants checked against a struct of that layout, and the decode primitives the ops share
// (an element, a whole block, the K-quants' scales and mins, the packed codes of the dp4a and matrix-core
// paths). Each op's own *_formats.h keeps only how its threads read a row (which words, in which order) and
// calls these; hipcore/ops/weight_formats.py is the host's reference of the same layouts. Every function is
// inline: an op built on them compiles to the code it had with its own copy.
#pragma once
#include "hip_compat.h"
#include "block_format_common.h"  // nibble masks, byte extraction, dequantize_block
#include "block_format_f16.h"     // F16, BF16 (GGML types 1, 30)
#include "block_format_q4_0.h"    // GGML type 2
#include "block_format_q4_1.h"    // 3
#include "block_format_q5_0.h"    // 6
#include "block_format_q5_1.h"    // 7
#include "block_format_q8_0.h"    // 8
#include "block_format_q4_k.h"    // 12
#include "block_format_q5_k.h"    // 13
#include "block_format_q6_k.h"    // 14
#include "block_format_mxfp4.h"   // 39
