// Compiles every collective of the device backends for every element type they take, with and without counted<>, behind any_backend, and in a mesh; and the activation store over them.
#include <cstdint>

#include "instantiate.cuh"
#include "zero/comm/any_backend.hpp"
#include "zero/comm/mesh.hpp"
#include "zero/engine/activation_store.hpp"

namespace {

template <class Comm, class T>
void every_collective(Comm& c, T* p) {
  c.all_reduce(p, p, 1, zero::reduce_op::sum);
  c.all_reduce(p, p + 1, 1, zero::reduce_op::max);
  c.reduce_scatter(p, p, 1, zero::reduce_op::sum);
  c.all_gather(p, p, 1);
  c.broadcast(p, p, 1, 0);
  c.barrier();
}

// activation_store's members for a checkpoint type: device copies, pinned host memory (Pa+cpu), the
// group's all-gather.
template <class T, class Comm>
void activation_store_members(Comm& c) {
  zero::activation_store<Comm> s(c, zero::activation_mode::partitioned_cpu);
  const T* p = nullptr;
  s.save(0, p, 1);
  s.template prefetch<T>(0);
  (void)s.template restore<T>(0);
  s.release(0);
  s.clear();
  (void)s.memory();
  (void)s.traffic();
  s.reset_traffic();
}

template <class Comm>
void every_type(Comm& c) {
  activation_store_members<float>(c);
  activation_store_members<zero::bf16>(c);
  activation_store_members<zero::fp16>(c);
  every_collective(c, static_cast<float*>(nullptr));
  every_collective(c, static_cast<double*>(nullptr));
  every_collective(c, static_cast<zero::bf16*>(nullptr));
  every_collective(c, static_cast<zero::fp16*>(nullptr));
  // ZeRO++: the byte all-gather (qwZ), all_to_all (qgZ), and the split (hpZ, two-hop qgZ).
  std::uint8_t* b = nullptr;
  c.all_gather(b, b, 1);
  c.all_to_all(b, b + 1, 1);
  if constexpr (zero::comm::nonblocking_all_to_all<Comm>) {
    auto r = c.start_all_to_all(b, b + 1, 1);
    c.wait(r);
  }
  if constexpr (zero::comm::splittable<Comm>) {
    (void)c.split(0);
    zero::comm::mesh<Comm> m(c, {1, 1});
    every_collective(m.dp(), static_cast<float*>(nullptr));
    every_collective(m.tp(), static_cast<float*>(nullptr));
  }
}

}  // namespace

// Referenced, never called: this executable only proves the instantiations compile and link.
void (*volatile instantiated[])(zero::comm::cuda_threads&) = {&every_type<zero::comm::cuda_threads>};
void (*volatile instantiated_counted[])(zero::comm::counted<zero::comm::cuda_threads>&) = {
    &every_type<zero::comm::counted<zero::comm::cuda_threads>>};
// The trainers' erased backend over each device backend.
void (*volatile instantiated_any[])(zero::comm::any_backend<zero::sys::cuda>&) = {
    &every_type<zero::comm::any_backend<zero::sys::cuda>>};
#if ZERO_WITH_NCCL
void (*volatile instantiated_nccl[])(zero::comm::nccl&) = {&every_type<zero::comm::nccl>};
void (*volatile instantiated_nccl_counted[])(zero::comm::counted<zero::comm::nccl>&) = {
    &every_type<zero::comm::counted<zero::comm::nccl>>};
#endif

int main() { return 0; }
