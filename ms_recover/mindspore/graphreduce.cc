// ms_recover's in-graph gradient reduction: a MindSpore CPU "aot" custom op.
//
// MsrReduce(slot, g_1 .. g_k) -> (r_1 .. r_k), every tensor float32.
// It gathers the k gradients into the slot's flat buffer (owned by Python, registered with
// msr_register), calls the slot's callback once (a ctypes function that runs the Python
// reduction on that buffer), and scatters the result into the k outputs: from the buffer, or
// from the array the callback points it at (a reduction that returns a new array costs no
// extra copy).
// A nonzero return makes MindSpore abort the graph before anything after this op ran; the
// Python side then rebuilds the graph (MindSpore latches the failure in the old one).
//
// The callback runs with the floating-point environment (MXCSR) of the thread that
// registered the slot: MindSpore's kernel threads may have flush-to-zero set, and the
// reduction must give the same bits as when Python calls it on its own thread.
#include <cstdint>
#include <cstring>
#include <xmmintrin.h>

extern "C" {

typedef int (*msr_callback)(int64_t slot, const float **result);

struct MsrSlot {
  msr_callback cb;
  float *buf;
  int64_t n;
  unsigned int mxcsr;
};

static const int64_t kMsrSlots = 256;
static MsrSlot g_msr_slots[kMsrSlots];

int msr_slots() { return static_cast<int>(kMsrSlots); }

int msr_register(int64_t slot, msr_callback cb, float *buf, int64_t n) {
  if (slot < 0 || slot >= kMsrSlots) return 1;
  g_msr_slots[slot].cb = cb;
  g_msr_slots[slot].buf = buf;
  g_msr_slots[slot].n = n;
  g_msr_slots[slot].mxcsr = _mm_getcsr();
  return 0;
}

static int64_t msr_numel(int nd, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < nd; ++i) n *= shape[i];
  return n;
}

// Return codes: 0 ok; 2 unknown slot; 3 sizes do not add up to the buffer; 4 not float32;
// 5 the callback failed (the Python side holds the exception).
int MsrReduce(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
              void *stream, void *extra) {
  (void)stream;
  (void)extra;
  if (nparam < 3 || (nparam - 1) % 2 != 0) return 3;
  const int k = (nparam - 1) / 2;
  const int64_t slot = *static_cast<const int64_t *>(params[0]);
  if (slot < 0 || slot >= kMsrSlots || g_msr_slots[slot].cb == nullptr) return 2;
  const MsrSlot &s = g_msr_slots[slot];
  int64_t off = 0;
  for (int i = 1; i < nparam; ++i) {
    if (std::strcmp(dtypes[i], "float32") != 0) return 4;
  }
  for (int i = 0; i < k; ++i) {
    const int64_t n = msr_numel(ndims[1 + i], shapes[1 + i]);
    if (n != msr_numel(ndims[1 + k + i], shapes[1 + k + i]) || off + n > s.n) return 3;
    std::memcpy(s.buf + off, params[1 + i], static_cast<size_t>(n) * sizeof(float));
    off += n;
  }
  if (off != s.n) return 3;
  const unsigned int saved = _mm_getcsr();
  _mm_setcsr(s.mxcsr);
  const float *result = s.buf;
  const int rc = s.cb(slot, &result);
  _mm_setcsr(saved);
  if (rc != 0 || result == nullptr) return 5;
  off = 0;
  for (int i = 0; i < k; ++i) {
    const int64_t n = msr_numel(ndims[1 + k + i], shapes[1 + k + i]);
    std::memcpy(params[1 + k + i], result + off, static_cast<size_t>(n) * sizeof(float));
    off += n;
  }
  return 0;
}

}  // extern "C"
