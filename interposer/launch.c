/*
 * launch.c - gated pass-through wrappers for the launch-class entry points
 * listed in launch.h. With the gate open a wrapper costs two atomic
 * operations and an indirect call; while a checkpoint holds the gate closed
 * it blocks until the gate reopens (or fails with CUDA_ERROR_NOT_READY after
 * a failure). The real pointers are resolved once from libcuda.
 */
#include <pthread.h>

#include "cuip.h"
#include "launch.h"

static struct {
#define L(name, base, ver, ptds, params, args) CUresult(CUDAAPI *name) params;
	CUIP_LAUNCH_LIST(L)
#undef L
} lreal;
static pthread_once_t lreal_once = PTHREAD_ONCE_INIT;

static void lreal_init(void)
{
	if (cuip_driver_init())
		return;
#define L(name, base, ver, ptds, params, args) \
	lreal.name = (__typeof__(lreal.name))cuip_real_dlsym(cuip_driver_handle(), #name);
	CUIP_LAUNCH_LIST(L)
#undef L
}

#define L(name, base, ver, ptds, params, args)         \
	CUIP_API CUresult CUDAAPI name params          \
	{                                              \
		CUresult r;                            \
		pthread_once(&lreal_once, lreal_init); \
		if (!lreal.name)                       \
			return CUDA_ERROR_NOT_FOUND;   \
		r = cuip_gate_enter();                 \
		if (r != CUDA_SUCCESS)                 \
			return r;                      \
		r = lreal.name args;                   \
		cuip_gate_exit();                      \
		return r;                              \
	}
CUIP_LAUNCH_LIST(L)
#undef L
