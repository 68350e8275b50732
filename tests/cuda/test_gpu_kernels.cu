// sys::cuda's kernels against sys::host's loops: bit-identical updates, accumulation and casts; a deterministic norm; the allocator.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "zero/zero_cuda.cuh"

namespace {

// (Not `cuda`: that would clash with libcu++'s namespace ::cuda.)
using device = zero::sys::cuda;
using host = zero::sys::host;

// Lengths around the vector width (8) and the block size, and offsets that misalign every operand
// (the scalar path) or keep them aligned (the 128-bit path plus a ragged tail).
constexpr std::size_t lengths[] = {0, 1, 7, 8, 9, 255, 256, 257, 4099, 100003};
constexpr std::size_t offsets[] = {0, 1, 8};

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Values over several binades, both signs, some exactly zero, so roundings differ element to element.
float sample(std::uint64_t salt, std::size_t i) {
  const std::uint64_t h = mix(salt * 0x100000001b3ull + i);
  if (h % 97 == 0) return 0.0f;
  const float m = static_cast<float>(h >> 40) / static_cast<float>(1ull << 24);
  return std::ldexp((h & 1) ? -m : m, static_cast<int>((h >> 8) % 12) - 8);
}
template <class T>
std::vector<T> samples(std::uint64_t salt, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(sample(salt, i));
  return v;
}
// AdamW's second moment is never negative in training; the special-value runs below also feed it
// negative ones (sqrt's NaN).
std::vector<float> positive_samples(std::uint64_t salt, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::fabs(sample(salt, i)) + 1e-3f;
  return v;
}

// Every fifth element replaced by +Inf, -Inf, a signed payload NaN or a negative value: inputs
// whose results are NaNs made differently by the host (0xffc00000, payloads propagated) and the
// device (0x7fffffff). Both must store the canonical NaN, so the bits still agree.
template <class T>
void add_specials(std::vector<T>& v, std::uint64_t salt) {
  float payload_nan;
  const std::uint32_t bits = 0xffc00001u;
  std::memcpy(&payload_nan, &bits, sizeof bits);
  const float specials[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            payload_nan, -0.5f};
  for (std::size_t i = salt % 5; i < v.size(); i += 5) v[i] = static_cast<T>(specials[(i / 5 + salt) % 4]);
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// A device copy of a host vector, `offset` elements into its allocation; freed with the object.
template <class T>
class device_vector {
 public:
  device_vector(const std::vector<T>& v, std::size_t offset)
      : n_(v.size()), offset_(offset), bytes_((v.size() + offset) * sizeof(T) + 16) {
    base_ = static_cast<T*>(device::allocate(bytes_));
    device::copy(data(), v.data(), n_ * sizeof(T));
  }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  ~device_vector() { device::deallocate(base_, bytes_); }
  T* data() const { return base_ + offset_; }
  std::vector<T> read() const {
    std::vector<T> v(n_);
    device::copy(v.data(), data(), n_ * sizeof(T));
    return v;
  }

 private:
  std::size_t n_, offset_, bytes_;
  T* base_ = nullptr;
};

// A bound context for the test's thread, as a comm backend provides for each rank.
struct device_fixture {
  zero::gpu::context ctx{0};
  zero::gpu::context::binding bind{ctx};
  device sys{ctx};
};

// The engine's accumulation and cast steps through a system's one loop, as the engine runs them.
template <class System, class D, class S>
void accumulate(const System& sys, D* dst, const S* src, std::size_t n, bool first) {
  sys.for_each(n, zero::elementwise::accumulate_rule{first}, zero::elementwise::operand<D>{dst, !first, true},
               zero::elementwise::in(src));
}
template <class System, class D>
void cast_from_float(const System& sys, D* dst, const float* src, std::size_t n) {
  sys.for_each(n, zero::elementwise::cast_rule{}, zero::elementwise::out(dst), zero::elementwise::in(src));
}

template <class Opt, class G, class P>
void check_update(Opt opt, bool separate_copy, bool specials = false) {
  device_fixture f;
  for (std::uint64_t t : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{7}}) {
    const auto c = opt.constants(t);
    for (std::size_t n : lengths)
      for (std::size_t off : offsets) {
        CAPTURE(t);
        CAPTURE(n);
        CAPTURE(off);
        auto g = samples<G>(1, n);
        auto w = samples<float>(2, n);
        std::vector<std::vector<float>> s;
        for (int k = 0; k < Opt::slots; ++k)
          s.push_back(k == 1 ? positive_samples(3 + static_cast<std::uint64_t>(k), n)
                             : samples<float>(3 + static_cast<std::uint64_t>(k), n));
        std::vector<P> p(n, static_cast<P>(0.0f));
        if (specials) {
          add_specials(g, 21);
          add_specials(w, 22);
          for (std::size_t k = 0; k < s.size(); ++k) add_specials(s[k], 23 + k);
        }
        // The host reference.
        auto hw = w;
        auto hs = s;
        auto hp = p;
        float* hslots[Opt::slots > 0 ? Opt::slots : 1] = {};
        for (int k = 0; k < Opt::slots; ++k) hslots[k] = hs[static_cast<std::size_t>(k)].data();
        zero::elementwise::update<Opt>(host{}, c, g.data(), 3.0f, 0.75f, hw.data(), hslots, separate_copy ? hp.data() : nullptr, n);
        // The device.
        device_vector<G> dg(g, off);
        device_vector<float> dw(w, off);
        std::vector<std::unique_ptr<device_vector<float>>> ds;
        float* dslots[Opt::slots > 0 ? Opt::slots : 1] = {};
        for (int k = 0; k < Opt::slots; ++k) {
          ds.push_back(std::make_unique<device_vector<float>>(s[static_cast<std::size_t>(k)], off));
          dslots[k] = ds.back()->data();
        }
        device_vector<P> dp(p, off);
        zero::elementwise::update<Opt>(f.sys, c, dg.data(), 3.0f, 0.75f, dw.data(), dslots, separate_copy ? dp.data() : nullptr, n);
        CHECK(same_bits(dw.read(), hw));
        for (int k = 0; k < Opt::slots; ++k)
          CHECK(same_bits(ds[static_cast<std::size_t>(k)]->read(), hs[static_cast<std::size_t>(k)]));
        CHECK(same_bits(dp.read(), hp));
      }
  }
}

}  // namespace

TEST_CASE("GPU kernels: AdamW updates are bit-identical to the host loop (fp32, bf16 and fp16 gradients and copies)") {
  zero::optim::adamw a;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  check_update<zero::optim::adamw, float, float>(a, false);
  check_update<zero::optim::adamw, zero::bf16, zero::bf16>(a, true);
  check_update<zero::optim::adamw, zero::fp16, zero::fp16>(a, true);
  check_update<zero::optim::adamw, float, zero::bf16>(a, true);
}

TEST_CASE("GPU kernels: updates that make NaNs store the same canonical NaN as the host (AdamW, SGD)") {
  zero::optim::adamw a;
  check_update<zero::optim::adamw, float, float>(a, false, true);
  check_update<zero::optim::adamw, zero::bf16, zero::bf16>(a, true, true);
  check_update<zero::optim::adamw, zero::fp16, zero::fp16>(a, true, true);
  zero::optim::sgd s;
  s.momentum = 0.9f;
  s.nesterov = true;
  check_update<zero::optim::sgd, float, zero::fp16>(s, true, true);
}

TEST_CASE("GPU kernels: SGD updates (momentum, Nesterov, decay) are bit-identical to the host loop") {
  zero::optim::sgd s;
  s.lr = 0.05f;
  s.weight_decay = 1e-2f;
  check_update<zero::optim::sgd, float, float>(s, false);
  s.nesterov = true;
  check_update<zero::optim::sgd, zero::bf16, zero::bf16>(s, true);
}

// Every optimizer of zero/catalog.hpp (a new one is tested here by being listed there), with its
// default settings: fp32 in place, and a bf16 gradient and copy with NaNs and infinities.
TEST_CASE_TEMPLATE_DEFINE("GPU kernels: every optimizer's update is bit-identical to the host loop", Opt,
                          gpu_update_per_optimizer) {
  CAPTURE(Opt::name);
  if constexpr (zero::ElementwiseOptimizer<Opt>) {  // the element-wise ones: the other kinds run on the host only
    check_update<Opt, float, float>(Opt{}, false);
    check_update<Opt, zero::bf16, zero::bf16>(Opt{}, true, true);
  }
}
TEST_CASE_TEMPLATE_APPLY(gpu_update_per_optimizer, zero::optimizers::tuple);

TEST_CASE_TEMPLATE("GPU kernels: accumulation and casts are bit-identical to the host loops", T, float, zero::bf16,
                   zero::fp16) {
  device_fixture f;
  for (std::size_t n : lengths)
    for (std::size_t off : offsets) {
      CAPTURE(n);
      CAPTURE(off);
      auto src = samples<T>(11, n);
      add_specials(src, 1);  // with Inf - Inf and payload NaNs: the canonical NaN on both sides
      for (bool first : {true, false}) {
        // Into the same type and into fp32 (fp32_grad_accumulation).
        auto dst = samples<T>(12, n);
        auto dst32 = samples<float>(13, n);
        add_specials(dst, 2);
        add_specials(dst32, 3);
        auto hdst = dst;
        auto hdst32 = dst32;
        accumulate(host{}, hdst.data(), src.data(), n, first);
        accumulate(host{}, hdst32.data(), src.data(), n, first);
        device_vector<T> dsrc(src, off), ddst(dst, off);
        device_vector<float> ddst32(dst32, off);
        accumulate(f.sys, ddst.data(), dsrc.data(), n, first);
        accumulate(f.sys, ddst32.data(), dsrc.data(), n, first);
        CHECK(same_bits(ddst.read(), hdst));
        CHECK(same_bits(ddst32.read(), hdst32));
      }
      auto master = samples<float>(14, n);
      add_specials(master, 4);
      std::vector<T> hcast(n), dcast0(n);
      cast_from_float(host{}, hcast.data(), master.data(), n);
      device_vector<float> dmaster(master, off);
      device_vector<T> dcast(dcast0, off);
      cast_from_float(f.sys, dcast.data(), dmaster.data(), n);
      CHECK(same_bits(dcast.read(), hcast));
    }
}

TEST_CASE_TEMPLATE("GPU kernels: the CUB norm is the same on every run and equals the host's to rounding", T, float,
                   zero::bf16, zero::fp16) {
  device_fixture f;
  for (std::size_t n : lengths) {
    CAPTURE(n);
    const auto g = samples<T>(21, n);
    device_vector<T> dg(g, 0);
    const double host_sum = host::sum_of_squares(g.data(), n, 4.0f);
    const double first = f.sys.sum_of_squares(dg.data(), n, 4.0f);
    for (int rep = 0; rep < 3; ++rep) {
      const double again = f.sys.sum_of_squares(dg.data(), n, 4.0f);
      CHECK(std::memcmp(&again, &first, sizeof(double)) == 0);
    }
    // Every square is exact in double (a float's square has at most 48 significant bits), so only
    // the order of the additions differs: n additions, each off by at most half an ulp.
    CHECK(std::fabs(first - host_sum) <= static_cast<double>(n + 1) * std::numeric_limits<double>::epsilon() * host_sum);
  }
  // A non-finite element makes the sum non-finite: the engine's overflow check.
  auto g = samples<T>(22, 1000);
  g[517] = static_cast<T>(std::numeric_limits<float>::infinity());
  device_vector<T> dg(g, 0);
  CHECK_FALSE(std::isfinite(f.sys.sum_of_squares(dg.data(), g.size(), 1.0f)));
}

TEST_CASE("GPU sys::cuda: allocations are counted by the rank's context and come from its pool") {
  device_fixture f;
  const auto before = f.ctx.memory();
  void* a = device::allocate(1000);
  void* b = device::allocate(1 << 20);
  const auto during = f.ctx.memory();
  CHECK(during.live == before.live + 1000 + (1 << 20));
  CHECK(during.pool_used >= before.pool_used + 1000 + (1 << 20));
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 16 == 0);
  device::fill_zero(b, 1 << 20);
  std::vector<unsigned char> back(1 << 20, 0xff);
  device::copy(back.data(), b, back.size());
  CHECK(std::all_of(back.begin(), back.end(), [](unsigned char x) { return x == 0; }));
  device::deallocate(a, 1000);
  device::deallocate(b, 1 << 20);
  f.sys.synchronize();
  CHECK(f.ctx.memory().live == before.live);
  CHECK(f.ctx.memory().peak >= during.live);
}

TEST_CASE("GPU launcher: every launch shape the bench sweeps gives the host's bits at every length") {
  device_fixture f;
  zero::optim::adamw opt;
  const auto c = opt.constants(3);
  auto run = [&]<class Shape>(std::size_t n, std::size_t off) {
    auto g = samples<zero::bf16>(31, n);
    auto w = samples<float>(32, n), m = samples<float>(33, n), v = positive_samples(34, n);
    std::vector<zero::bf16> p(n, zero::bf16(0.0f));
    auto hw = w, hm = m, hv = v;
    auto hp = p;
    float* hs[2] = {hm.data(), hv.data()};
    zero::elementwise::update<zero::optim::adamw>(host{}, c, g.data(), 2.0f, 1.0f, hw.data(), hs, hp.data(), n);
    device_vector<zero::bf16> dg(g, off), dp(p, off);
    device_vector<float> dw(w, off), dm(m, off), dv(v, off);
    zero::gpu::context& x = f.sys.context();
    zero::gpu::launch_elementwise<Shape>(x.compute(), x.multiprocessors(), n,
                                     zero::elementwise::update_rule<zero::optim::adamw>{{c, 2.0f, 1.0f}},
                                     zero::elementwise::in(static_cast<const zero::bf16*>(dg.data())), zero::elementwise::inout(dw.data()),
                                     zero::elementwise::out(dp.data()), zero::elementwise::inout(dm.data()), zero::elementwise::inout(dv.data()));
    CHECK(same_bits(dw.read(), hw));
    CHECK(same_bits(dm.read(), hm));
    CHECK(same_bits(dv.read(), hv));
    CHECK(same_bits(dp.read(), hp));
  };
  // Lengths that leave partial groups, single chunks and a scalar tail behind the grouped loop, and
  // one larger than a full wave of resident blocks.
  for (std::size_t n : {std::size_t{0}, std::size_t{9}, std::size_t{4099}, std::size_t{100003}, std::size_t{5000011}})
    for (std::size_t off : {std::size_t{0}, std::size_t{1}}) {
      CAPTURE(n);
      CAPTURE(off);
      using zero::gpu::launch_shape;
      run.template operator()<launch_shape<8, 1, false>>(n, off);
      run.template operator()<launch_shape<8, 2, false>>(n, off);
      run.template operator()<launch_shape<8, 4, false>>(n, off);
      run.template operator()<launch_shape<4, 2, false>>(n, off);
      run.template operator()<launch_shape<4, 4, false>>(n, off);
      run.template operator()<launch_shape<8, 2, true>>(n, off);
      run.template operator()<launch_shape<4, 2, true>>(n, off);
      run.template operator()<launch_shape<4, 4, true>>(n, off);
    }
}

// ---- the blockwise quantizer (core/quantize.hpp): the same rules through the device launcher ----

namespace {

template <class T>
void check_quantizer(zero::quant::format fmt, bool specials) {
  device_fixture f;
  namespace quant = zero::quant;
  for (std::size_t n : lengths) {
    CAPTURE(n);
    CAPTURE(fmt.bits);
    CAPTURE(fmt.block);
    auto x = samples<T>(41, n);
    if (specials) add_specials(x, 42);
    const std::size_t wb = quant::wire_bytes(n, fmt);
    std::vector<std::uint8_t> hw(wb, 0xab);
    quant::quantize(host{}, x.data(), n, fmt, hw.data());
    device_vector<T> dx(x, 0);
    device_vector<std::uint8_t> dw(std::vector<std::uint8_t>(wb, 0xcd), 0);
    quant::quantize(f.sys, dx.data(), n, fmt, dw.data());
    CHECK(same_bits(dw.read(), hw));  // scales, codes and padding, byte for byte
    std::vector<T> hy(n);
    quant::dequantize(host{}, hw.data(), n, fmt, hy.data());
    device_vector<T> dy(std::vector<T>(n), 0);
    quant::dequantize(f.sys, dw.data(), n, fmt, dy.data());
    CHECK(same_bits(dy.read(), hy));
    // Three sources summed in order (qgZ's reduction): the device's fp32 adds are the host's.
    std::vector<std::uint8_t> three;
    for (int k = 0; k < 3; ++k) three.insert(three.end(), hw.begin(), hw.end());
    for (std::size_t i = 0; i < wb; i += 7) three[wb + i] ^= 0x11;  // the sources differ
    std::vector<T> hs(n);
    quant::dequantize_sum(host{}, three.data(), wb, 3, n, fmt, hs.data());
    device_vector<std::uint8_t> d3(three, 0);
    device_vector<T> ds(std::vector<T>(n), 0);
    quant::dequantize_sum(f.sys, d3.data(), wb, 3, n, fmt, ds.data());
    CHECK(same_bits(ds.read(), hs));
  }
}

}  // namespace

TEST_CASE("GPU kernels: the blockwise quantizer writes the host's bytes and dequantizes to the host's bits") {
  for (const zero::quant::format fmt : {zero::quant::format{8, 256}, zero::quant::format{8, 1},
                                        zero::quant::format{4, 64}, zero::quant::format{4, 2}}) {
    check_quantizer<float>(fmt, false);
    check_quantizer<float>(fmt, true);
    check_quantizer<zero::bf16>(fmt, true);
    check_quantizer<zero::fp16>(fmt, false);
  }
}
