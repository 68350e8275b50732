// Compiles zero/gpu/check.cuh on its own: a header that needs anything it does not include fails here.
#include "zero/gpu/check.cuh"

int main() { return 0; }
