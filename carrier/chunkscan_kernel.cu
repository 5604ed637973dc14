/*
 * The chunk scan kernel (issue #46): THE FUNCTION of chunkscan.h, per chunk,
 * on the GPU.  Built to PTX by clang without the CUDA toolkit (clang
 * builtins only; carrier/Makefile.am) and embedded in libcuipcarrier as
 * cuip_chunkscan_ptx.  Launch contract: chunkscan.h.
 *
 * Block c, thread t of T = CUIP_CHUNKSCAN_THREADS: the chunk is read as
 * 16-byte elements e = t, t + T, t + 2T, ... (element e holds words
 * 4e .. 4e+3); word 4e+q contributes w * k^(4e+q+1) = w * k^(4t+q+1) *
 * K^m with e = t + mT and K = k^(4T).  So each thread runs, per key, four
 * Horner chains in K over its elements, last element first, and multiplies
 * chain q by k^(4t+q+1) at the end; the block sums the threads' values
 * mod p and ORs their words in shared memory.  Two multiplications per word.
 * A chunk whose start is 16-byte aligned is read with 16-byte loads
 * (coalesced: consecutive threads, consecutive elements); any other with
 * byte loads.
 */
#include "chunkscan.h"

#define CS_GLOBAL __attribute__((global))
#define CS_DEV	  static __attribute__((device)) inline
#define CS_SHARED __attribute__((shared))
#define T	  CUIP_CHUNKSCAN_THREADS

struct cs_u4 {
	unsigned int x, y, z, w;
} __attribute__((aligned(16)));

/* Element e of the chunk at c (len bytes), bytes past len as 0. */
template <bool ALIGNED> CS_DEV cs_u4 cs_load(const unsigned char *c, cuip_u64 len, cuip_u64 e)
{
	cs_u4 v;

	if (ALIGNED && 16 * e + 16 <= len)
		return *(const cs_u4 *)(c + 16 * e);
	unsigned int b[16];
	for (int i = 0; i < 16; i++)
		b[i] = 16 * e + i < len ? c[16 * e + i] : 0;
	v.x = b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24;
	v.y = b[4] | b[5] << 8 | b[6] << 16 | b[7] << 24;
	v.z = b[8] | b[9] << 8 | b[10] << 16 | b[11] << 24;
	v.w = b[12] | b[13] << 8 | b[14] << 16 | b[15] << 24;
	return v;
}

/* This thread's part: chains x (key 0) and y (key 1), or of its words. */
template <bool ALIGNED>
CS_DEV void cs_thread(const unsigned char *c, cuip_u64 len, unsigned int t, cuip_u64 K0, cuip_u64 K1, cuip_u64 x[4],
		      cuip_u64 y[4], unsigned int *orw)
{
	cuip_u64 ne = (len + 15) / 16; /* elements, the last maybe partial */
	unsigned int o = 0;

	for (int q = 0; q < 4; q++)
		x[q] = y[q] = 0;
	if (t >= ne) {
		*orw = 0;
		return;
	}
	/* Elements t + mT, m = 0 .. M-1, last first. */
	cuip_u64 M = (ne - 1 - t) / T + 1;
	cuip_u64 e = t + (M - 1) * T;
#pragma unroll 4
	for (cuip_u64 m = 0; m < M; m++, e -= T) {
		cs_u4 v = cs_load<ALIGNED>(c, len, e);

		o |= v.x | v.y | v.z | v.w;
		x[0] = cuip_cs_step(x[0], K0, v.x);
		x[1] = cuip_cs_step(x[1], K0, v.y);
		x[2] = cuip_cs_step(x[2], K0, v.z);
		x[3] = cuip_cs_step(x[3], K0, v.w);
		y[0] = cuip_cs_step(y[0], K1, v.x);
		y[1] = cuip_cs_step(y[1], K1, v.y);
		y[2] = cuip_cs_step(y[2], K1, v.z);
		y[3] = cuip_cs_step(y[3], K1, v.w);
	}
	*orw = o;
}

extern "C" CS_GLOBAL void cuip_chunkscan(const unsigned char *base, unsigned long long size, unsigned int chunk_size,
					 unsigned long long key0, unsigned long long key1, unsigned long long *out)
{
	CS_SHARED static cuip_u64 s0[T], s1[T];
	CS_SHARED static unsigned int so[T];
	unsigned int t = __nvvm_read_ptx_sreg_tid_x();
	cuip_u64 cidx = __nvvm_read_ptx_sreg_ctaid_x();
	cuip_u64 start = cidx * chunk_size;
	cuip_u64 len = size - start < chunk_size ? size - start : chunk_size;
	const unsigned char *c = base + start;
	cuip_u64 k0 = cuip_mod61(key0), k1 = cuip_mod61(key1);
	cuip_u64 x[4], y[4];
	unsigned int o;

	if (start >= size) /* a launch past the contract: nothing to scan */
		len = 0;
	if (((unsigned long long)c & 15) == 0)
		cs_thread<true>(c, len, t, powmod61(k0, 4 * T), powmod61(k1, 4 * T), x, y, &o);
	else
		cs_thread<false>(c, len, t, powmod61(k0, 4 * T), powmod61(k1, 4 * T), x, y, &o);
	/* Chain q of thread t weighs k^(4t+q+1). */
	cuip_u64 h0 = 0, h1 = 0;
	if (o) {
		cuip_u64 p0 = powmod61(k0, 4 * t + 1), p1 = powmod61(k1, 4 * t + 1);

		for (int q = 0; q < 4; q++) {
			h0 = addmod61(h0, mulmod61(cuip_mod61(x[q]), p0));
			h1 = addmod61(h1, mulmod61(cuip_mod61(y[q]), p1));
			p0 = mulmod61(p0, k0);
			p1 = mulmod61(p1, k1);
		}
	}
	s0[t] = h0;
	s1[t] = h1;
	so[t] = o;
	__syncthreads();
	for (unsigned int n = T / 2; n > 0; n /= 2) {
		if (t < n) {
			s0[t] = addmod61(s0[t], s0[t + n]);
			s1[t] = addmod61(s1[t], s1[t + n]);
			so[t] |= so[t + n];
		}
		__syncthreads();
	}
	if (t == 0 && start < size) {
		out[3 * cidx + 0] = s0[0];
		out[3 * cidx + 1] = s1[0];
		out[3 * cidx + 2] = so[0] != 0;
	}
}
