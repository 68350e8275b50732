// train_mlp_cuda's fp32 engines (every stage and element-wise optimizer), one of its three translation units.
#include "train_mlp_cuda_train.cuh"

void train_mlp_cuda::dispatch_fp32(comm_type& comm, const trainer::options& o, trainer::summary& out, roofline& rl) {
  dispatch_precision<zero::precision::fp32>(comm, o, out, rl);
}
