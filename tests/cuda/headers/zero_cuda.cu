// Compiles zero/zero_cuda.cuh on its own: a header that needs anything it does not include fails here.
#include "zero/zero_cuda.cuh"

int main() { return 0; }
