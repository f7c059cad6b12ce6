// Part of the matmul_mma op (kernels/matmul_mma.hip includes it inside its NVIDIA section, after the shared-tile
// entries; built and hashed with it: hipcore/runtime/kernels.py source_files): the entry points of NVIDIA's fragment
// path for decode batches: each K-quant product (matmul_mma_fragments_<type>, matmul_mma_direct_<type>), a batch's
// q, k and v in one launch (matmul_mma_qkv_*) and its SwiGLU gate and up in one launch (matmul_mma_swiglu_fragments_*,
// matmul_mma_swiglu_direct_*), and the entry macros the 32-element formats' fragment entries use.
#pragma once

// The decode batches' fragment path (NVIDIA): matmul_mma_fragments_<format> (32-token tiles, x
// staged) and matmul_mma_direct_<format> (a batch of at most 8 tokens, x from memory), the same arguments;
// tile_tokens is the launcher's 32 for both (hipcore/ops/matmul_mma.py entry_name picks). Entries of their
// own, so that their registers are counted apart from the shared-tile path's. BOUNDS: their launch bounds;
// Q5_K's direct entry says two workgroups per SM, without which nvcc held it to 80 registers and spilled 8-16
// bytes (the others keep the bounds they were measured with).
#define RF_MATMUL_MMA_FRAGMENT_ENTRY(name, Step, TN, kXsHalves, BOUNDS)                                          \
  extern "C" __global__ BOUNDS void name(float* __restrict__ y, const void* __restrict__ W,                       \
                                                         const float* __restrict__ x, void* workspace, int rows,    \
                                                         int cols, int n_tokens, int tile_tokens, int splits,       \
                                                         int accumulate) {                                         \
    __shared__ __attribute__((aligned(16))) unsigned short xs[kXsHalves];                                         \
    __shared__ int last;                                                                                          \
    rf_grid_dependency_deferred(); /* waits in fragment_item */                                                   \
    const mmq::Launch a = {y, static_cast<const unsigned char*>(W), x, static_cast<unsigned char*>(workspace),     \
                           rows, cols, n_tokens, splits, accumulate};                                             \
    (void)tile_tokens;                                                                                            \
    mmq::fragment_tiles<typename mmq::Fragments<Step>::Format, TN>(a, xs, &last);                                \
  }

// The 32-element formats' fragment entries: wait first (fragment_tiles' waited).
#define RF_MATMUL_MMA_FRAGMENT_ENTRY_WAIT_FIRST(name, Step, TN, kXsHalves, BOUNDS)                                          \
  extern "C" __global__ BOUNDS void name(float* __restrict__ y, const void* __restrict__ W,                       \
                                                         const float* __restrict__ x, void* workspace, int rows,    \
                                                         int cols, int n_tokens, int tile_tokens, int splits,       \
                                                         int accumulate) {                                         \
    __shared__ __attribute__((aligned(16))) unsigned short xs[kXsHalves];                                         \
    __shared__ int last;                                                                                          \
    rf_grid_dependency_sync(); /* a programmatic launch */                                                       \
    const mmq::Launch a = {y, static_cast<const unsigned char*>(W), x, static_cast<unsigned char*>(workspace),     \
                           rows, cols, n_tokens, splits, accumulate};                                             \
    (void)tile_tokens;                                                                                            \
    mmq::fragment_tiles<typename mmq::Fragments<Step>::Format, TN>(a, xs, &last);                                \
  }

#define RF_STAGED_X (mmq::kStreamTokens * mmq::kStreamStride)
#define RF_BOUNDS __launch_bounds__(256)
#define RF_BOUNDS_TWO_PER_SM __launch_bounds__(256, 2)
RF_MATMUL_MMA_FRAGMENT_ENTRY(matmul_mma_fragments_q4_k, mmq::Wide<false>, mmq::kStreamTokens, RF_STAGED_X, RF_BOUNDS)
RF_MATMUL_MMA_FRAGMENT_ENTRY(matmul_mma_fragments_q5_k, mmq::Wide<true>, mmq::kStreamTokens, RF_STAGED_X, RF_BOUNDS)
RF_MATMUL_MMA_FRAGMENT_ENTRY(matmul_mma_fragments_q6_k, mmq::Wide6, mmq::kStreamTokens, RF_STAGED_X, RF_BOUNDS)
RF_MATMUL_MMA_FRAGMENT_ENTRY(matmul_mma_direct_q4_k, mmq::Wide<false>, mmq::kDirectTokens, 8, RF_BOUNDS)
RF_MATMUL_MMA_FRAGMENT_ENTRY(matmul_mma_direct_q5_k, mmq::Wide<true>, mmq::kDirectTokens, 8, RF_BOUNDS_TWO_PER_SM)
RF_MATMUL_MMA_FRAGMENT_ENTRY(matmul_mma_direct_q6_k, mmq::Wide6, mmq::kDirectTokens, 8, RF_BOUNDS)
// The attention input's q, k and v products of one x in one launch (mmq::qkv_fragment_tiles; K-quants, each of its
// own type): matmul_mma_qkv_fragments (32-token tiles, x staged) and matmul_mma_qkv_direct (at most 8 tokens),
// (y_q, y_k, y_v, W_q, W_k, W_v, x, workspace, rows_q, rows_k, rows_v, types, cols, n_tokens, splits); types holds
// the three type codes, 4 bits each, q's lowest (hipcore/ops/matmul_mma_qkv.py launch_qkv). Two workgroups per SM:
// within 128 registers, the most any of the three formats' entries takes.
#define RF_MATMUL_MMA_QKV_PARAMS                                                                                  \
  float* __restrict__ y_q, float* __restrict__ y_k, float* __restrict__ y_v, const void* __restrict__ W_q,         \
      const void* __restrict__ W_k, const void* __restrict__ W_v, const float* __restrict__ x, void* workspace,    \
      int rows_q, int rows_k, int rows_v, int types, int cols, int n_tokens, int splits
#define RF_MATMUL_MMA_QKV_LAUNCH(TN, Single)                                                                        \
  const mmq::QkvLaunch q = {{y_q, y_k, y_v},                                                                      \
                            {static_cast<const unsigned char*>(W_q), static_cast<const unsigned char*>(W_k),      \
                             static_cast<const unsigned char*>(W_v)},                                            \
                            {rows_q, rows_k, rows_v},                                                             \
                            {types & 15, (types >> 4) & 15, (types >> 8) & 15},                                   \
                            x, static_cast<unsigned char*>(workspace), cols, n_tokens, splits};                  \
  mmq::qkv_fragment_tiles<TN, Single>(q, xs, &last)
#define RF_MATMUL_MMA_QKV_ENTRY(name, TN, kXsHalves)                                                              \
  extern "C" __global__ __launch_bounds__(256, 2) void name(RF_MATMUL_MMA_QKV_PARAMS) {                          \
    __shared__ __attribute__((aligned(16))) unsigned short xs[kXsHalves];                                         \
    __shared__ int last;                                                                                          \
    rf_grid_dependency_deferred(); /* waits in fragment_item */                                                   \
    RF_MATMUL_MMA_QKV_LAUNCH(TN, void);                                                                           \
  }
// The same for three products of one 32-element format (Single, its fragment format; `types` unused): these formats'
// entries wait first (fragment_tiles says why).
#define RF_MATMUL_MMA_QKV_SINGLE_ENTRY(name, TN, kXsHalves, Single, BOUNDS)                                       \
  extern "C" __global__ BOUNDS void name(RF_MATMUL_MMA_QKV_PARAMS) {                                              \
    __shared__ __attribute__((aligned(16))) unsigned short xs[kXsHalves];                                         \
    __shared__ int last;                                                                                          \
    rf_grid_dependency_sync(); /* a programmatic launch */                                                        \
    RF_MATMUL_MMA_QKV_LAUNCH(TN, Single);                                                                         \
  }
RF_MATMUL_MMA_QKV_ENTRY(matmul_mma_qkv_fragments, mmq::kStreamTokens, RF_STAGED_X)
RF_MATMUL_MMA_QKV_ENTRY(matmul_mma_qkv_direct, mmq::kDirectTokens, 8)
// A decode batch's SwiGLU feed-forward input in one launch (mmq::swiglu_fragment_tiles; gate and up of one K-quant
// type): matmul_mma_swiglu_fragments_<type> (32-token tiles, x staged) and matmul_mma_swiglu_direct_<type> (at most 8
// tokens), (gate, up, W_gate, W_up, x, workspace, rows, cols, n_tokens, splits): gate = silu(x W_gate^T) * (x W_up^T)
// as float32, up the up product's scratch (hipcore/ops/matmul_mma_swiglu.py launch_swiglu_fragments).
#define RF_MATMUL_MMA_SWIGLU_FRAGMENT_ENTRY(name, Step, TN, kXsHalves)                                            \
  extern "C" __global__ __launch_bounds__(256, 2) void name(                                                     \
      float* __restrict__ gate, float* __restrict__ up, const void* __restrict__ W_gate,                         \
      const void* __restrict__ W_up, const float* __restrict__ x, void* workspace, int rows, int cols,           \
      int n_tokens, int splits) {                                                                               \
    __shared__ __attribute__((aligned(16))) unsigned short xs[kXsHalves];                                         \
    __shared__ int last;                                                                                          \
    rf_grid_dependency_deferred(); /* waits in fragment_item */                                                   \
    const mmq::Launch a = {gate, static_cast<const unsigned char*>(W_gate), x, static_cast<unsigned char*>(workspace), \
                           rows, cols, n_tokens, splits, 0, up, static_cast<const unsigned char*>(W_up), nullptr}; \
    mmq::swiglu_fragment_tiles<typename mmq::Fragments<Step>::Format, TN>(a, xs, &last);                         \
  }
RF_MATMUL_MMA_SWIGLU_FRAGMENT_ENTRY(matmul_mma_swiglu_fragments_q4_k, mmq::Wide<false>, mmq::kStreamTokens, RF_STAGED_X)
RF_MATMUL_MMA_SWIGLU_FRAGMENT_ENTRY(matmul_mma_swiglu_fragments_q5_k, mmq::Wide<true>, mmq::kStreamTokens, RF_STAGED_X)
RF_MATMUL_MMA_SWIGLU_FRAGMENT_ENTRY(matmul_mma_swiglu_fragments_q6_k, mmq::Wide6, mmq::kStreamTokens, RF_STAGED_X)
RF_MATMUL_MMA_SWIGLU_FRAGMENT_ENTRY(matmul_mma_swiglu_direct_q4_k, mmq::Wide<false>, mmq::kDirectTokens, 8)
RF_MATMUL_MMA_SWIGLU_FRAGMENT_ENTRY(matmul_mma_swiglu_direct_q5_k, mmq::Wide<true>, mmq::kDirectTokens, 8)
RF_MATMUL_MMA_SWIGLU_FRAGMENT_ENTRY(matmul_mma_swiglu_direct_q6_k, mmq::Wide6, mmq::kDirectTokens, 8)
