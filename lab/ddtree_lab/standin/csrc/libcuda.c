/*
 * Lab stand-in for the NVIDIA driver library libcuda.so.1 (SONAME libcuda.so.1).
 * It answers the three calls that start-up code makes before touching a GPU,
 * with the driver's return codes:
 *   cuDriverGetVersion -> DRIVER_API_VERSION (13000 for an R580 driver, CUDA 13.0)
 *   cuInit             -> 0, or 100 (CUDA_ERROR_NO_DEVICE) when DEVICE_COUNT is 0
 *   cuDeviceGetCount   -> DEVICE_COUNT, or 3 (CUDA_ERROR_NOT_INITIALIZED) before cuInit
 */
#ifndef DRIVER_API_VERSION
#define DRIVER_API_VERSION 13000
#endif
#ifndef DEVICE_COUNT
#define DEVICE_COUNT 0
#endif

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100

static int initialized;

__attribute__((visibility("default"))) int cuDriverGetVersion(int *version)
{
    if (version == 0)
        return CUDA_ERROR_INVALID_VALUE;
    *version = DRIVER_API_VERSION;
    return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) int cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (DEVICE_COUNT == 0)
        return CUDA_ERROR_NO_DEVICE;
    initialized = 1;
    return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) int cuDeviceGetCount(int *count)
{
    if (count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    *count = DEVICE_COUNT;
    return CUDA_SUCCESS;
}
