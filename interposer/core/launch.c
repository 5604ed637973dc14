/*
 * launch.c - gated pass-through wrappers for the launch-class entry points
 * listed in launchlist.h. With the gate open a wrapper costs two atomic
 * operations and an indirect call; while a checkpoint holds the gate closed
 * it blocks until the gate reopens (or fails with CUDA_ERROR_NOT_READY after
 * a failure). The real pointers are driver.c's table (real.launch).
 * Callers: the application, through every resolution path (resolve.c). No
 * state, no lock but the gate's.
 */

#include "cuip.h"
#include "gate.h"
#include "driver.h"
#include "launchlist.h"

#define L(name, base, ver, ptds, params, args)       \
	CUIP_API CUresult CUDAAPI name params        \
	{                                            \
		CUresult r;                          \
		cuip_driver_init();                  \
		if (!real.launch.name)               \
			return CUDA_ERROR_NOT_FOUND; \
		r = cuip_gate_enter();               \
		if (r != CUDA_SUCCESS)               \
			return r;                    \
		r = real.launch.name args;           \
		cuip_gate_exit();                    \
		return r;                            \
	}
CUIP_LAUNCH_LIST(L)
#undef L
