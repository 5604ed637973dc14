/*
 * launchlist.h - the launch-class entry points (kernel and graph launches,
 * copies, memsets, host functions, stream memory operations). Their
 * wrappers (launch.c) do nothing but pass the API gate, so that a
 * checkpoint can stop new device work without the application's help. One
 * list, used by driver.h (the real entry points), launch.c (the wrappers)
 * and resolve.c (the resolution table). Declarations only, no state.
 *
 * L(name, base, first CUDA version of this variant, per-thread-stream variant,
 *   (parameters), (arguments))
 */
#ifndef CUIP_LAUNCHLIST_H
#define CUIP_LAUNCHLIST_H

#include <cuda.h>

#define CUIP_P_LAUNCH                                                                                       \
	(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
	 unsigned int bz, unsigned int sh, CUstream s, void **kp, void **ex)
#define CUIP_A_LAUNCH (f, gx, gy, gz, bx, by, bz, sh, s, kp, ex)
#define CUIP_P_COOP                                                                                         \
	(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
	 unsigned int bz, unsigned int sh, CUstream s, void **kp)
#define CUIP_A_COOP	(f, gx, gy, gz, bx, by, bz, sh, s, kp)
#define CUIP_P_LAUNCHEX (const CUlaunchConfig *c, CUfunction f, void **kp, void **ex)
#define CUIP_A_LAUNCHEX (c, f, kp, ex)
#define CUIP_P_HOSTFN	(CUstream s, CUhostFn fn, void *ud)
#define CUIP_A_HOSTFN	(s, fn, ud)
#define CUIP_P_GRAPH	(CUgraphExec g, CUstream s)
#define CUIP_A_GRAPH	(g, s)
#define CUIP_P_CPY	(CUdeviceptr d, CUdeviceptr sr, size_t n)
#define CUIP_A_CPY	(d, sr, n)
#define CUIP_P_CPYA	(CUdeviceptr d, CUdeviceptr sr, size_t n, CUstream s)
#define CUIP_A_CPYA	(d, sr, n, s)
#define CUIP_P_HTOD	(CUdeviceptr d, const void *h, size_t n)
#define CUIP_A_HTOD	(d, h, n)
#define CUIP_P_HTODA	(CUdeviceptr d, const void *h, size_t n, CUstream s)
#define CUIP_A_HTODA	(d, h, n, s)
#define CUIP_P_DTOH	(void *h, CUdeviceptr d, size_t n)
#define CUIP_A_DTOH	(h, d, n)
#define CUIP_P_DTOHA	(void *h, CUdeviceptr d, size_t n, CUstream s)
#define CUIP_A_DTOHA	(h, d, n, s)
#define CUIP_P_PEER	(CUdeviceptr d, CUcontext dc, CUdeviceptr sr, CUcontext sc, size_t n)
#define CUIP_A_PEER	(d, dc, sr, sc, n)
#define CUIP_P_PEERA	(CUdeviceptr d, CUcontext dc, CUdeviceptr sr, CUcontext sc, size_t n, CUstream s)
#define CUIP_A_PEERA	(d, dc, sr, sc, n, s)
#define CUIP_P_SET8	(CUdeviceptr d, unsigned char v, size_t n)
#define CUIP_P_SET8A	(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
#define CUIP_P_SET16	(CUdeviceptr d, unsigned short v, size_t n)
#define CUIP_P_SET16A	(CUdeviceptr d, unsigned short v, size_t n, CUstream s)
#define CUIP_P_SET32	(CUdeviceptr d, unsigned int v, size_t n)
#define CUIP_P_SET32A	(CUdeviceptr d, unsigned int v, size_t n, CUstream s)
#define CUIP_A_SET	(d, v, n)
#define CUIP_A_SETA	(d, v, n, s)
#define CUIP_P_VAL32	(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int fl)
#define CUIP_P_VAL64	(CUstream s, CUdeviceptr a, cuuint64_t v, unsigned int fl)
#define CUIP_A_VAL	(s, a, v, fl)
#define CUIP_P_BATCH	(CUstream s, unsigned int n, CUstreamBatchMemOpParams *p, unsigned int fl)
#define CUIP_A_BATCH	(s, n, p, fl)

#define CUIP_LAUNCH_LIST(L)                                                                                  \
	L(cuLaunchKernel, "cuLaunchKernel", 4000, false, CUIP_P_LAUNCH, CUIP_A_LAUNCH)                       \
	L(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, true, CUIP_P_LAUNCH, CUIP_A_LAUNCH)                   \
	L(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, false, CUIP_P_LAUNCHEX, CUIP_A_LAUNCHEX)              \
	L(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, true, CUIP_P_LAUNCHEX, CUIP_A_LAUNCHEX)          \
	L(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, false, CUIP_P_COOP, CUIP_A_COOP)     \
	L(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, true, CUIP_P_COOP, CUIP_A_COOP) \
	L(cuLaunchHostFunc, "cuLaunchHostFunc", 10000, false, CUIP_P_HOSTFN, CUIP_A_HOSTFN)                  \
	L(cuLaunchHostFunc_ptsz, "cuLaunchHostFunc", 10000, true, CUIP_P_HOSTFN, CUIP_A_HOSTFN)              \
	L(cuGraphLaunch, "cuGraphLaunch", 10000, false, CUIP_P_GRAPH, CUIP_A_GRAPH)                          \
	L(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, true, CUIP_P_GRAPH, CUIP_A_GRAPH)                      \
	L(cuMemcpy, "cuMemcpy", 4000, false, CUIP_P_CPY, CUIP_A_CPY)                                         \
	L(cuMemcpy_ptds, "cuMemcpy", 7000, true, CUIP_P_CPY, CUIP_A_CPY)                                     \
	L(cuMemcpyAsync, "cuMemcpyAsync", 4000, false, CUIP_P_CPYA, CUIP_A_CPYA)                             \
	L(cuMemcpyAsync_ptsz, "cuMemcpyAsync", 7000, true, CUIP_P_CPYA, CUIP_A_CPYA)                         \
	L(cuMemcpyDtoD_v2, "cuMemcpyDtoD", 3020, false, CUIP_P_CPY, CUIP_A_CPY)                              \
	L(cuMemcpyDtoD_v2_ptds, "cuMemcpyDtoD", 7000, true, CUIP_P_CPY, CUIP_A_CPY)                          \
	L(cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync", 3020, false, CUIP_P_CPYA, CUIP_A_CPYA)                  \
	L(cuMemcpyDtoDAsync_v2_ptsz, "cuMemcpyDtoDAsync", 7000, true, CUIP_P_CPYA, CUIP_A_CPYA)              \
	L(cuMemcpyHtoD_v2, "cuMemcpyHtoD", 3020, false, CUIP_P_HTOD, CUIP_A_HTOD)                            \
	L(cuMemcpyHtoD_v2_ptds, "cuMemcpyHtoD", 7000, true, CUIP_P_HTOD, CUIP_A_HTOD)                        \
	L(cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync", 3020, false, CUIP_P_HTODA, CUIP_A_HTODA)                \
	L(cuMemcpyHtoDAsync_v2_ptsz, "cuMemcpyHtoDAsync", 7000, true, CUIP_P_HTODA, CUIP_A_HTODA)            \
	L(cuMemcpyDtoH_v2, "cuMemcpyDtoH", 3020, false, CUIP_P_DTOH, CUIP_A_DTOH)                            \
	L(cuMemcpyDtoH_v2_ptds, "cuMemcpyDtoH", 7000, true, CUIP_P_DTOH, CUIP_A_DTOH)                        \
	L(cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync", 3020, false, CUIP_P_DTOHA, CUIP_A_DTOHA)                \
	L(cuMemcpyDtoHAsync_v2_ptsz, "cuMemcpyDtoHAsync", 7000, true, CUIP_P_DTOHA, CUIP_A_DTOHA)            \
	L(cuMemcpyPeer, "cuMemcpyPeer", 4000, false, CUIP_P_PEER, CUIP_A_PEER)                               \
	L(cuMemcpyPeer_ptds, "cuMemcpyPeer", 7000, true, CUIP_P_PEER, CUIP_A_PEER)                           \
	L(cuMemcpyPeerAsync, "cuMemcpyPeerAsync", 4000, false, CUIP_P_PEERA, CUIP_A_PEERA)                   \
	L(cuMemcpyPeerAsync_ptsz, "cuMemcpyPeerAsync", 7000, true, CUIP_P_PEERA, CUIP_A_PEERA)               \
	L(cuMemsetD8_v2, "cuMemsetD8", 3020, false, CUIP_P_SET8, CUIP_A_SET)                                 \
	L(cuMemsetD8_v2_ptds, "cuMemsetD8", 7000, true, CUIP_P_SET8, CUIP_A_SET)                             \
	L(cuMemsetD16_v2, "cuMemsetD16", 3020, false, CUIP_P_SET16, CUIP_A_SET)                              \
	L(cuMemsetD16_v2_ptds, "cuMemsetD16", 7000, true, CUIP_P_SET16, CUIP_A_SET)                          \
	L(cuMemsetD32_v2, "cuMemsetD32", 3020, false, CUIP_P_SET32, CUIP_A_SET)                              \
	L(cuMemsetD32_v2_ptds, "cuMemsetD32", 7000, true, CUIP_P_SET32, CUIP_A_SET)                          \
	L(cuMemsetD8Async, "cuMemsetD8Async", 3020, false, CUIP_P_SET8A, CUIP_A_SETA)                        \
	L(cuMemsetD8Async_ptsz, "cuMemsetD8Async", 7000, true, CUIP_P_SET8A, CUIP_A_SETA)                    \
	L(cuMemsetD16Async, "cuMemsetD16Async", 3020, false, CUIP_P_SET16A, CUIP_A_SETA)                     \
	L(cuMemsetD16Async_ptsz, "cuMemsetD16Async", 7000, true, CUIP_P_SET16A, CUIP_A_SETA)                 \
	L(cuMemsetD32Async, "cuMemsetD32Async", 3020, false, CUIP_P_SET32A, CUIP_A_SETA)                     \
	L(cuMemsetD32Async_ptsz, "cuMemsetD32Async", 7000, true, CUIP_P_SET32A, CUIP_A_SETA)                 \
	L(cuStreamWriteValue32_v2, "cuStreamWriteValue32", 11070, false, CUIP_P_VAL32, CUIP_A_VAL)           \
	L(cuStreamWriteValue32_v2_ptsz, "cuStreamWriteValue32", 11070, true, CUIP_P_VAL32, CUIP_A_VAL)       \
	L(cuStreamWaitValue32_v2, "cuStreamWaitValue32", 11070, false, CUIP_P_VAL32, CUIP_A_VAL)             \
	L(cuStreamWaitValue32_v2_ptsz, "cuStreamWaitValue32", 11070, true, CUIP_P_VAL32, CUIP_A_VAL)         \
	L(cuStreamWriteValue64_v2, "cuStreamWriteValue64", 11070, false, CUIP_P_VAL64, CUIP_A_VAL)           \
	L(cuStreamWriteValue64_v2_ptsz, "cuStreamWriteValue64", 11070, true, CUIP_P_VAL64, CUIP_A_VAL)       \
	L(cuStreamWaitValue64_v2, "cuStreamWaitValue64", 11070, false, CUIP_P_VAL64, CUIP_A_VAL)             \
	L(cuStreamWaitValue64_v2_ptsz, "cuStreamWaitValue64", 11070, true, CUIP_P_VAL64, CUIP_A_VAL)         \
	L(cuStreamBatchMemOp_v2, "cuStreamBatchMemOp", 11070, false, CUIP_P_BATCH, CUIP_A_BATCH)             \
	L(cuStreamBatchMemOp_v2_ptsz, "cuStreamBatchMemOp", 11070, true, CUIP_P_BATCH, CUIP_A_BATCH)

/* Prototypes: most _ptsz/_ptds forms are only declared inside cuda.h's internal block. */
#define CUIP_LAUNCH_PROTO(name, base, ver, ptds, params, args) CUresult CUDAAPI name params;
CUIP_LAUNCH_LIST(CUIP_LAUNCH_PROTO)
#undef CUIP_LAUNCH_PROTO

#endif /* CUIP_LAUNCHLIST_H */
