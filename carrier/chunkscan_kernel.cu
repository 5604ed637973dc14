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

/* Byte i of the chunk at c (len bytes), 0 past len. */
CS_DEV unsigned int cs_byte(const unsigned char *c, cuip_u64 len, cuip_u64 i)
{
	return i < len ? c[i] : 0;
}

/* Word i (bytes 4i .. 4i+3, little-endian) of the chunk at c, byte by byte. */
CS_DEV unsigned int cs_word(const unsigned char *c, cuip_u64 len, cuip_u64 i)
{
	return cs_byte(c, len, 4 * i) | cs_byte(c, len, 4 * i + 1) << 8 | cs_byte(c, len, 4 * i + 2) << 16 |
	       cs_byte(c, len, 4 * i + 3) << 24;
}

/* Element e of the chunk at c (len bytes), bytes past len as 0: one
 * 16-byte load where aligned and whole, else byte loads. */
template <bool ALIGNED> CS_DEV cs_u4 cs_load(const unsigned char *c, cuip_u64 len, cuip_u64 e)
{
	cs_u4 v;

	if (ALIGNED && 16 * e + 16 <= len)
		return *(const cs_u4 *)(c + 16 * e);
	v.x = cs_word(c, len, 4 * e);
	v.y = cs_word(c, len, 4 * e + 1);
	v.z = cs_word(c, len, 4 * e + 2);
	v.w = cs_word(c, len, 4 * e + 3);
	return v;
}

/* This thread's part: chains x (key 0) and y (key 1), the OR of its words.
 * Scalars, not arrays: an array passed by address lands in local memory. */
struct cs_acc {
	cuip_u64 x0, x1, x2, x3, y0, y1, y2, y3;
	unsigned int o;
};

template <bool ALIGNED>
CS_DEV cs_acc cs_thread(const unsigned char *c, cuip_u64 len, unsigned int t, cuip_u64 K0, cuip_u64 K1)
{
	cuip_u64 ne = (len + 15) / 16; /* elements, the last maybe partial */
	cs_acc a = {0, 0, 0, 0, 0, 0, 0, 0, 0};

	if (t >= ne)
		return a;
	/* Elements t + mT, m = 0 .. M-1, last first. */
	cuip_u64 M = (ne - 1 - t) / T + 1;
	cuip_u64 e = t + (M - 1) * T;
#pragma unroll 4
	for (cuip_u64 m = 0; m < M; m++, e -= T) {
		cs_u4 v = cs_load<ALIGNED>(c, len, e);

		a.o |= v.x | v.y | v.z | v.w;
		a.x0 = cuip_cs_step(a.x0, K0, v.x);
		a.x1 = cuip_cs_step(a.x1, K0, v.y);
		a.x2 = cuip_cs_step(a.x2, K0, v.z);
		a.x3 = cuip_cs_step(a.x3, K0, v.w);
		a.y0 = cuip_cs_step(a.y0, K1, v.x);
		a.y1 = cuip_cs_step(a.y1, K1, v.y);
		a.y2 = cuip_cs_step(a.y2, K1, v.z);
		a.y3 = cuip_cs_step(a.y3, K1, v.w);
	}
	return a;
}

/* sum_q a_q * k^(4t+q+1) mod p: chain q of thread t weighs k^(4t+q+1). */
CS_DEV cuip_u64 cs_weigh(cuip_u64 a0, cuip_u64 a1, cuip_u64 a2, cuip_u64 a3, cuip_u64 k, unsigned int t)
{
	cuip_u64 p = powmod61(k, 4 * t + 1), h;

	h = mulmod61(cuip_mod61(a0), p);
	p = mulmod61(p, k);
	h = addmod61(h, mulmod61(cuip_mod61(a1), p));
	p = mulmod61(p, k);
	h = addmod61(h, mulmod61(cuip_mod61(a2), p));
	p = mulmod61(p, k);
	return addmod61(h, mulmod61(cuip_mod61(a3), p));
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
	cuip_u64 k0 = cuip_mod61(key0), k1 = cuip_mod61(key1), h0 = 0, h1 = 0;
	cs_acc a;

	if (start >= size) /* a launch past the contract: nothing to scan */
		len = 0;
	if (((unsigned long long)c & 15) == 0)
		a = cs_thread<true>(c, len, t, powmod61(k0, 4 * T), powmod61(k1, 4 * T));
	else
		a = cs_thread<false>(c, len, t, powmod61(k0, 4 * T), powmod61(k1, 4 * T));
	if (a.o) { /* else every word was 0, so is every chain */
		h0 = cs_weigh(a.x0, a.x1, a.x2, a.x3, k0, t);
		h1 = cs_weigh(a.y0, a.y1, a.y2, a.y3, k1, t);
	}
	s0[t] = h0;
	s1[t] = h1;
	so[t] = a.o;
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
