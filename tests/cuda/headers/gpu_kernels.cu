// Compiles zero/gpu/kernels.cuh on its own: a header that needs anything it does not include fails here.
#include "zero/gpu/kernels.cuh"

int main() { return 0; }
