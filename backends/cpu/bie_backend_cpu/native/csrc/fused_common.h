// Helpers both translation units of the fused pybind11 module share (fused.cpp: the binary_linear entry;
// fused_plans.cpp: the layers' bound plans). Included inside each file's anonymous namespace.

// A scratch array: on the stack up to N elements (the tiny calls these entries are for allocate nothing), on
// the heap beyond.
template <typename T, size_t N>
class Scratch {
 public:
  explicit Scratch(size_t n) : heap_(n > N ? new T[n] : nullptr) {}
  T* data() { return heap_ ? heap_.get() : local_; }

 private:
  T local_[N];
  std::unique_ptr<T[]> heap_;
};

// bie_native.h's code of a float dtype, -1 for any other dtype.
inline int64_t dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return BIE_F32;
    case at::kHalf: return BIE_F16;
    case at::kBFloat16: return BIE_BF16;
    default: return -1;
  }
}

// The row and panel blocks of a prepared-weight GEMM over m rows and p panels, from (mb, pb) down (as
// kernels.py's _blocks): panels first, then rows, halved until every thread has several tasks.
inline void shrink_blocks(int64_t m, int64_t p, int64_t& mb, int64_t& pb) {
  const int64_t min_tasks = 4 * std::max<int64_t>(1, at::get_num_threads());
  auto tasks = [&] { return ((m + mb - 1) / mb) * ((p + pb - 1) / pb); };
  while (tasks() < min_tasks && pb > 1) pb = std::max<int64_t>(1, pb / 2);
  while (tasks() < min_tasks && mb > 4) mb = std::max<int64_t>(4, mb / 2);
}
