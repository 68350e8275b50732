// Compiles zero/gpu/context.cuh on its own: a header that needs anything it does not include fails here.
#include "zero/gpu/context.cuh"

int main() { return 0; }
