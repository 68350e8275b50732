// Compiles zero/sys/cuda.cuh on its own: a header that needs anything it does not include fails here.
#include "zero/sys/cuda.cuh"

int main() { return 0; }
