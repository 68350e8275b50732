// Compiles zero/sys/cuda/kernels.cuh on its own: a header that needs anything it does not include fails here.
#include "zero/sys/cuda/kernels.cuh"

int main() { return 0; }
