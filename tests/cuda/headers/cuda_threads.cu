// Compiles zero/comm/backends/cuda_threads.cuh on its own: a header that needs anything it does not include fails here.
#include "zero/comm/backends/cuda_threads.cuh"

int main() { return 0; }
