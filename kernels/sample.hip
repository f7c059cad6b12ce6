// Token sampling on the device, one block per row of logits (a split row: `chunks` blocks, see sample_f32),
// so that only the chosen token ids (4 bytes a row) go back to the host instead of the whole vocabulary's logits.
//
//   sample_f32(out, logits, params, vocab, workspace, chunks, mask), grid = rows * chunks:
//   out[row] = the token hipcore/engine/sampler.py's Sampler picks from logits[row] with the row's params:
//   params[row] = {temperature, top_k, top_p, min_p, uniform}, float32 (top_k a whole number)
//   mask: null, or a grammar's allowed tokens, ceil(vocab / 32) uint32 words a row (llguidance's packed layout:
//   token t is bit t % 32 of word t / 32, 1 allows it); the forbidden logits become -inf before anything below
//   reads them (apply_token_mask), so every path (greedy, split or not, top-k, top-p, min-p, temperature) picks
//   among the allowed tokens only.
//
// temperature <= 0: greedy, numpy's argmax (lowest index among equal maxima, the first NaN wins).
// Otherwise llama.cpp's chain as the host sampler runs it, on the top_k (1 <= top_k <= kMaxTopK)
// largest logits:
//   1. top-k: the k-th largest logit by a radix select over the float bits (4 passes of 8 bits with
//      a 256-bin histogram), then the candidates: every logit above it, and as many equal to it as
//      k needs, the lowest token ids first; sorted in shared memory by (logit descending, id
//      ascending), a bitonic sort.
//   2. top-p (top_p < 1): keep the shortest prefix whose softmax mass (at temperature 1, over the k
//      candidates) reaches top_p.
//   3. min-p (min_p > 0): keep the candidates with logit >= max + log(min_p).
//   4. temperature: weights exp(l/T - max/T); the pick is the first candidate whose running sum
//      exceeds uniform * total (uniform in [0, 1), drawn on the host from the request's seeded
//      generator, so the same seed gives the same tokens as the host sampler).
// The host does steps 2 to 4 in float64 and here they run in float32: a pick can differ only when a
// running sum lies within rounding of its threshold. Penalties need the token history and stay on the
// host, as does a top_k above kMaxTopK, or of 0 with top_p < 1 (the launcher's caller checks; see
// device_samplable).
// top_k <= 0 with top_p >= 1 (no top-k, no top-p: OpenAI's defaults) is the whole vocabulary: min-p and
// temperature need only the largest logit and sums, so the draw runs over every token in id order with
// no sort and no candidate buffer (whole_vocabulary, sample_rows.h; the host sampler uses the same order). Without
// min-p too (what a request with no sampling options gets from rocmforge serve) such a row is split over the
// chunks as a greedy row is (split_whole_vocabulary).
// Block size: any multiple of 64 up to 1024.
#include "hip_compat.h"
#include "sample_rows.h"  // one workgroup's rows and the helpers the split rows share

namespace {
namespace sampling {

// Greedy rows split over `chunks` workgroups (the row's chunk-th span of logits each): one workgroup alone
// reads 128,256 logits at ~32 GB/s (16 us, a 1B's decode step's 2%), latency-bound on one SM. Each publishes
// its pick in the workspace; the last of the row's to arrive (a fence and a per-row counter, as paged
// attention's splits) picks among the chunks' picks and sets the counter back to zero. The pick is the
// whole row's: argmax_wins is a total order, so picking among the chunks' picks gives the same token.
// Workspace (hipcore/ops/sample.py: workspace_bytes): int counters[rows] padded to kCounterBytesAlignment,
// then float value[rows * chunks], int id[rows * chunks] (and float sum[rows * chunks]: split_whole_vocabulary;
// then float value[rows * chunks * kSplitTopK], int id[rows * chunks * kSplitTopK]: split_top_k).
constexpr int kCounterBytesAlignment = 256;

static __device__ void split_greedy(int* out, const float* x, int vocab, int row, int chunk, int chunks, int rows,
                                    unsigned char* workspace, Shared& sh) {
  const int span = ((vocab + chunks - 1) / chunks + 3) / 4 * 4;  // whole float4s: every chunk stays 16-byte aligned
  const int first = chunk * span;
  const int n = first < vocab ? min(span, vocab - first) : 0;
  float best;
  int best_index;
  block_argmax(x + (first < vocab ? first : 0), first, n, sh, best, best_index);
  int* counters = reinterpret_cast<int*>(workspace);
  const int counter_bytes = (rows * 4 + kCounterBytesAlignment - 1) / kCounterBytesAlignment * kCounterBytesAlignment;
  float* values = reinterpret_cast<float*>(workspace + counter_bytes);
  int* ids = reinterpret_cast<int*>(values + (unsigned long long)rows * chunks);
  const unsigned long long picks = (unsigned long long)row * chunks;
  if (threadIdx.x == 0) {
    values[picks + chunk] = best;
    ids[picks + chunk] = best_index;
    __threadfence();  // the pick is seen before the count
    sh.count_above = atomicAdd(counters + row, 1) == chunks - 1;  // count_above: free in the greedy path
  }
  __syncthreads();
  if (!sh.count_above) return;
  __threadfence();
  // The last: the chunks' picks, one a thread. Volatile: other workgroups wrote them during this kernel.
  best = -RF_INFINITY;
  best_index = 0x7fffffff;
  for (int c = (int)threadIdx.x; c < chunks; c += (int)blockDim.x) {
    const float v = reinterpret_cast<const volatile float*>(values)[picks + c];
    const int id = reinterpret_cast<const volatile int*>(ids)[picks + c];
    if (argmax_wins(v, id, best, best_index)) best = v, best_index = id;
  }
  block_best(sh, best, best_index);
  if (threadIdx.x == 0) {
    *out = best_index;
    counters[row] = 0;  // ready for the next launch
  }
}

// Whole-vocabulary rows without min-p split over `chunks` workgroups, as greedy rows are: one workgroup walking
// a row's 49,152 logits (the demo model's) several times took ~0.24 ms a decode step at 32 rows on an NVIDIA
// H200, 11% of the engine's decode rate against greedy rows. Each chunk publishes its largest logit m, its
// weights' sum relative to m, s = sum exp(v/T - m/T), and its last id with a weight (NaNs have none, as in
// whole_vocabulary); the row's last workgroup to arrive puts the chunks on the row's scale (the largest m, M:
// s * exp(m/T - M/T)), finds the chunk whose running sum crosses uniform * total, and walks that chunk's logits
// again, in id order, with the weights the host sampler uses (exp(v/T - M/T)). The sums group differently
// from the host's and from whole_vocabulary's, so a pick can differ only where a running sum lies within
// rounding of the draw. Min-p needs the row's largest logit before any weight: such rows stay one workgroup's.
static __device__ void split_whole_vocabulary(int* out, const float* x, int vocab, float temperature, float uniform,
                                              int row, int chunk, int chunks, int rows, unsigned char* workspace,
                                              Shared& sh) {
  const int t = (int)threadIdx.x, threads = (int)blockDim.x;
  const int span = ((vocab + chunks - 1) / chunks + 3) / 4 * 4;
  const int first = chunk * span;
  const int n = first < vocab ? min(span, vocab - first) : 0;
  const float* xc = x + (first < vocab ? first : 0);
  // The chunk's largest logit (NaNs ignored, as row_max ignores them), its weights' sum and last kept id.
  float m = -RF_INFINITY;
  for (int i = t; i < n; i += threads) m = fmaxf(m, xc[i]);
#pragma unroll
  for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor(m, offset));
  const int lane = t % WARP_SIZE, warp = t / WARP_SIZE, warps = threads / WARP_SIZE;
  if (lane == 0) sh.best_value[warp] = m;
  __syncthreads();
  m = sh.best_value[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, sh.best_value[w]);
  const float scaled_m = m / temperature;
  float sum = 0.0f;
  int last_kept = -1;
  for (int i = t; i < n; i += threads) {
    const float v = xc[i];
    if (!(v >= -RF_INFINITY)) continue;  // NaN
    last_kept = first + i;
    if (m > -RF_INFINITY) sum += expf(v / temperature - scaled_m);
  }
#pragma unroll
  for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
    sum += __shfl_xor(sum, offset);
    last_kept = max(last_kept, __shfl_xor(last_kept, offset));
  }
  __syncthreads();  // every thread has read best_value
  if (lane == 0) sh.best_value[warp] = sum, sh.best_id[warp] = last_kept;
  __syncthreads();
  int* counters = reinterpret_cast<int*>(workspace);
  const int counter_bytes = (rows * 4 + kCounterBytesAlignment - 1) / kCounterBytesAlignment * kCounterBytesAlignment;
  float* maxima = reinterpret_cast<float*>(workspace + counter_bytes);
  int* last_ids = reinterpret_cast<int*>(maxima + (unsigned long long)rows * chunks);
  float* sums = reinterpret_cast<float*>(last_ids + (unsigned long long)rows * chunks);
  const unsigned long long at = (unsigned long long)row * chunks;
  if (t == 0) {
    for (int w = 1; w < warps; ++w) sum += sh.best_value[w], last_kept = max(last_kept, sh.best_id[w]);
    maxima[at + chunk] = m;
    sums[at + chunk] = sum;
    last_ids[at + chunk] = last_kept;
    __threadfence();  // the chunk's figures are seen before the count
    sh.count_above = atomicAdd(counters + row, 1) == chunks - 1;
  }
  __syncthreads();
  if (!sh.count_above) return;
  __threadfence();
  // The last: the chunks in id order on the row's scale (thread 0; 64 chunks at most). Volatile: other
  // workgroups wrote them during this kernel.
  if (t == 0) {
    const volatile float* vm = maxima + at;
    const volatile float* vs = sums + at;
    const volatile int* vl = last_ids + at;
    float row_m = -RF_INFINITY;
    int row_last = -1;
    for (int c = 0; c < chunks; ++c) row_m = fmaxf(row_m, vm[c]), row_last = max(row_last, vl[c]);
    const float scaled_row_m = row_m / temperature;
    float total = 0.0f;
    for (int c = 0; c < chunks; ++c)
      if (vm[c] > -RF_INFINITY) total += vs[c] * expf(vm[c] / temperature - scaled_row_m);
    const float target = uniform * total;
    float before = 0.0f;
    int crossing = -1;
    for (int c = 0; c < chunks; ++c) {
      if (!(vm[c] > -RF_INFINITY)) continue;
      const float weight = vs[c] * expf(vm[c] / temperature - scaled_row_m);
      if (weight > 0.0f && before <= target && target < before + weight) {
        crossing = c;
        break;
      }
      before += weight;
    }
    sh.digit_and_need[0] = crossing;
    sh.digit_and_need[1] = crossing >= 0 ? vl[crossing] : row_last;  // where no run claims the draw
    sh.total = target - before;  // the draw within the crossing chunk
    sh.scan[0] = 0x7fffffff;     // the pick (atomicMin below)
    sh.best_value[0] = scaled_row_m;
    counters[row] = 0;  // ready for the next launch
  }
  __syncthreads();
  const int crossing = sh.digit_and_need[0];
  if (crossing < 0) {  // uniform * total rounded to (or past) the total: the last token with a weight
    if (t == 0) *out = max(sh.digit_and_need[1], 0);
    return;
  }
  // The crossing chunk again, a contiguous run of ids a thread, the runs' sums scanned in thread order, and the
  // thread whose run holds the draw walks it to the first id whose running sum exceeds it.
  const float scaled_row_m = sh.best_value[0], target = sh.total;
  const int c_first = crossing * span, c_n = min(span, vocab - c_first);
  const float* xs = x + c_first;
  const int run = (c_n + threads - 1) / threads;
  const int lo = min(t * run, c_n), hi = min(lo + run, c_n);
  float run_sum = 0.0f;
  int run_last = -1;
  for (int i = lo; i < hi; ++i) {
    const float v = xs[i];
    if (!(v >= -RF_INFINITY)) continue;
    run_sum += expf(v / temperature - scaled_row_m);
    run_last = i;
  }
  float run_before, run_total;
  scan_sums(run_sum, sh, run_before, run_total);
  if (run_sum > 0.0f && run_before <= target && target < run_before + run_sum) {
    float running = run_before;
    int found = run_last;  // rounding may leave the crossing past the run's end: its last kept token
    for (int i = lo; i < hi; ++i) {
      const float v = xs[i];
      if (!(v >= -RF_INFINITY)) continue;
      running += expf(v / temperature - scaled_row_m);
      if (running > target) {
        found = i;
        break;
      }
    }
    atomicMin(&sh.scan[0], c_first + found);  // two runs can both claim it at a rounding edge: lowest id
  }
  __syncthreads();
  if (t == 0) {
    const int found = sh.scan[0];
    // None claimed: the chunk's sum came out below the draw in this grouping; the crossing is at its end.
    *out = found != 0x7fffffff ? found : max(sh.digit_and_need[1], 0);
  }
}

// Rows with 1 <= top_k <= kSplitTopK (llama.cpp's default 40, Hugging Face's 50) split over `chunks` workgroups,
// as greedy rows are: one workgroup's four radix passes over a whole row took ~0.24 ms a decode step at 32 rows
// of the demo model's 49,152 logits on an NVIDIA H200 (the engine's decode rate 11% below greedy rows'). Each
// chunk selects its own top k, sorted, into the workspace (padded to kSplitTopK, see below); the
// row's top k is among them (an id in the row's top k has fewer than k ids before it in the order, so fewer in
// its chunk too), and the row's last workgroup selects it from the chunks' candidates as the whole row would
// (the same order and tie rule), then draws. Larger top_k stay one workgroup's.
constexpr int kSplitTopK = 64;

static __device__ void split_top_k(int* out, const float* x, const float* p, int vocab, int row, int chunk, int chunks,
                                   int rows, unsigned char* workspace, Shared& sh) {
  const int t = (int)threadIdx.x, threads = (int)blockDim.x;
  const int span = ((vocab + chunks - 1) / chunks + 3) / 4 * 4;
  const int first = chunk * span;
  const int n = first < vocab ? min(span, vocab - first) : 0;
  const int k = max(1, min((int)p[1], vocab));  // <= kSplitTopK: the caller checks
  const int kept = min(k, n);
  if (kept > 0) top_k_sorted(RowSpan{x + first, first}, n, kept, sh);
  int* counters = reinterpret_cast<int*>(workspace);
  const int counter_bytes = (rows * 4 + kCounterBytesAlignment - 1) / kCounterBytesAlignment * kCounterBytesAlignment;
  const unsigned long long per_chunk = (unsigned long long)rows * chunks;
  // after split_whole_vocabulary's three arrays of a float or an int a chunk
  float* values = reinterpret_cast<float*>(workspace + counter_bytes + per_chunk * 12);
  int* ids = reinterpret_cast<int*>(values + per_chunk * kSplitTopK);
  const unsigned long long row_at = (unsigned long long)row * chunks * kSplitTopK, at = row_at + (unsigned long long)chunk * kSplitTopK;
  // Padding: the NaN with every bit set, whose order_key (0) is below every logit's but its own, so a pad is
  // never among the top k (the chunks hold at least min(k, vocab) real candidates).
  for (int i = t; i < kSplitTopK; i += threads) {
    values[at + i] = i < kept ? sh.value[i] : rf_uint_as_float(0xffffffffu);
    ids[at + i] = i < kept ? sh.id[i] : 0x7fffffff;
  }
  __threadfence();  // the candidates are seen before the count
  __syncthreads();
  if (t == 0) sh.last_arrival = atomicAdd(counters + row, 1) == chunks - 1;
  __syncthreads();
  if (!sh.last_arrival) return;
  __threadfence();
  if (t == 0) counters[row] = 0;  // ready for the next launch
  top_k_sorted(ChunkCandidates{values + row_at, ids + row_at}, chunks * kSplitTopK, k, sh);
  draw_from_sorted(out, k, p[0], p[2], p[3], p[4], sh);
}

// A constrained row's forbidden logits set to -inf, in place, over [first, first + n): the span this workgroup
// reads next (its chunk of a split row; the whole row for a row that chunk 0 samples alone). In place: the logits
// are the step's own scratch, read by nothing after the sampler but the host rows' read-back, and a masked copy
// would need a second buffer the size of the logits. The split rows' last workgroup reads only its own chunk's
// logits and the workspace, except split_whole_vocabulary's crossing chunk, whose writes its fence publishes.
static __device__ void apply_token_mask(float* x, const unsigned* row_mask, int first, int n) {
  for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x) {
    const int token = first + i;
    if (!((row_mask[token >> 5] >> (token & 31)) & 1u)) x[token] = -RF_INFINITY;
  }
  __syncthreads();  // the block's writes are seen by its own reads
}

}  // namespace sampling
}  // namespace

// grid = rows * chunks, workgroup row * chunks + chunk. With a workspace and chunks > 1 a greedy row is split
// (split_greedy), and so are a row with 1 <= top_k <= kSplitTopK (split_top_k) and a whole-vocabulary row
// without min-p (split_whole_vocabulary); any other row is chunk 0's alone, and its other chunks' workgroups
// return at once.
// (1024, 1): one workgroup a multiprocessor at least, so the compiler may take the 64 registers a thread of 1,024
// can have (without it nvcc held sample_f32 to 32, spilling 48 bytes, once the split top-k path was in).
extern "C" __global__ __launch_bounds__(1024, 1) void sample_f32(int* out, float* logits, const float* params,
                                                              int vocab, void* workspace, int chunks,
                                                              const unsigned* mask) {
  __shared__ sampling::Shared sh;
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/sample.py)
  rf_check_wave_size();
  const int row = (int)blockIdx.x / chunks, chunk = (int)blockIdx.x - row * chunks;
  float* x = logits + (unsigned long long)row * vocab;
  const float* p = params + (unsigned long long)row * sampling::kParams;
  const bool split = chunks > 1 && workspace != nullptr;
  const bool greedy_split = split && !(p[0] > 0.0f);
  const bool top_k_split = split && p[0] > 0.0f && (int)p[1] >= 1 && (int)p[1] <= sampling::kSplitTopK;
  const bool whole_vocabulary_split = split && (int)p[1] <= 0 && !(p[2] < 1.0f) && !(p[3] > 0.0f);
  if (mask != nullptr) {
    const unsigned* row_mask = mask + (unsigned long long)row * ((vocab + 31) / 32);
    if (greedy_split || top_k_split || whole_vocabulary_split) {
      const int span = ((vocab + chunks - 1) / chunks + 3) / 4 * 4;  // the split paths' chunk span
      const int first = chunk * span;
      if (first < vocab) sampling::apply_token_mask(x, row_mask, first, min(span, vocab - first));
    } else if (chunk == 0) {
      sampling::apply_token_mask(x, row_mask, 0, vocab);
    }
  }
  if (greedy_split) {
    sampling::split_greedy(out + row, x, vocab, row, chunk, chunks, (int)gridDim.x / chunks,
                           static_cast<unsigned char*>(workspace), sh);
    return;
  }
  if (top_k_split) {
    sampling::split_top_k(out + row, x, p, vocab, row, chunk, chunks, (int)gridDim.x / chunks,
                          static_cast<unsigned char*>(workspace), sh);
    return;
  }
  if (whole_vocabulary_split) {
    sampling::split_whole_vocabulary(out + row, x, vocab, p[0], p[4], row, chunk, chunks, (int)gridDim.x / chunks,
                                     static_cast<unsigned char*>(workspace), sh);
    return;
  }
  if (chunk != 0) return;
  sampling::sample_row(out + row, x, p, vocab, sh);
}
