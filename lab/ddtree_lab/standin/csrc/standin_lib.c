/*
 * One tiny shared object that stands in for a big CUDA-era library in the
 * ddtree-deploy lab (torch's libc10.so, libtorch_cuda.so, an nvidia-* wheel's
 * libcublas.so.13, ...). What makes it useful is not this code but how it is
 * linked: the SONAME, the DT_NEEDED list and the RPATH are those of the real
 * library, so the dynamic loader fails (or succeeds) exactly as on a real host.
 *
 * Built with -nostdlib: every dependency is named on the link line.
 *   STANDIN_EXPORT  name of the exported function returning STANDIN_LABEL
 *   STANDIN_CUDART  if set, name of an exported function that asks the linked
 *                   CUDA runtime (libcudart) for its version
 */
#ifndef STANDIN_EXPORT
#error "define STANDIN_EXPORT"
#endif
#ifndef STANDIN_LABEL
#error "define STANDIN_LABEL"
#endif

__attribute__((visibility("default"))) const char *STANDIN_EXPORT(void)
{
    return STANDIN_LABEL;
}

#ifdef STANDIN_CUDART
extern int cudaRuntimeGetVersion(int *runtime_version);

__attribute__((visibility("default"))) int STANDIN_CUDART(void)
{
    int version = -1;
    if (cudaRuntimeGetVersion(&version) != 0)
        return -1;
    return version;
}
#endif
