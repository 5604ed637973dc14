/*
 * Chunk scan (issue #46): per chunk of a device allocation, two 61-bit
 * polynomial hashes and a nonzero flag, computed where the bytes are (a
 * kernel on the GPU), so that a checkpoint copies to the host only the chunks
 * that are nonzero and differ from the parent checkpoint's.  This header is
 * the one definition shared by the host reference (cuip_chunkscan_host,
 * below), the kernel (chunkscan_kernel.cu, built to PTX and embedded as
 * cuip_chunkscan_ptx) and the fake driver's implementation of that kernel
 * (test/fakecuda/module.c runs cuip_chunkscan_host).
 *
 * THE FUNCTION (a contract: host and device must agree bit for bit)
 *
 *   p = 2^61 - 1 (a Mersenne prime).  A chunk of len bytes is read as the
 *   32-bit little-endian words w_i = bytes [4i, 4i+4), i = 0 .. n-1 with
 *   n = ceil(len/4); bytes past len read as 0.  For a key k in [1, p-1]
 *   (a key >= p is reduced mod p first, by both versions):
 *
 *       H_k = sum_{i=0}^{n-1} w_i * k^(i+1)  mod p,   a value in [0, p).
 *
 *   out[0] = H_key[0], out[1] = H_key[1], out[2] = 1 if any byte of the
 *   chunk is nonzero, else 0.  An all-zero chunk gives (0, 0, 0); a chunk
 *   with a nonzero byte may still hash to 0 (with the probability below),
 *   which is why the flag is separate.  len = 0 gives (0, 0, 0).
 *
 * COLLISION BOUND.  Two different chunks of the same length n words: the
 * difference H_k - H'_k = sum (w_i - w'_i) k^(i+1) is a polynomial in k of
 * degree <= n whose coefficients w_i - w'_i lie in (-2^32, 2^32), so are
 * nonzero mod p wherever the words differ: it is not the zero polynomial
 * and has at most n roots in GF(p).  For a key drawn uniformly from
 * [1, p-1], independently of the data, Pr[H_k = H'_k] <= n/(p-1); with two
 * independent keys, Pr[both equal] <= (n/(p-1))^2: <= 2^-86 for 1 MiB
 * chunks (n = 2^18) and <= 2^-70 for the largest chunk, 256 MiB (n = 2^26).
 * The keys must be secret from whoever chooses the data only if the data
 * may be adversarial; they are never derived from the data.  Chunks of
 * different lengths are not compared (a trailing zero word does not change
 * H: the length is part of what the caller compares).
 *
 * THE KERNEL: extern "C" __global__ void cuip_chunkscan(
 *         const unsigned char *base, unsigned long long size,
 *         unsigned int chunk_size, unsigned long long key0,
 *         unsigned long long key1, unsigned long long *out)
 * launch contract: chunk_size > 0; gridDim = (ceil(size / chunk_size), 1, 1);
 * blockDim = (CUIP_CHUNKSCAN_THREADS, 1, 1) exactly (the block reduction
 * assumes it); no dynamic shared memory (sharedMemBytes = 0); any stream.
 * Block c scans bytes [c*chunk_size, min((c+1)*chunk_size, size)) of base
 * and writes out[3c+0] = h0, out[3c+1] = h1, out[3c+2] = nonzero: out is
 * device memory of 24 * gridDim.x bytes, 8-byte aligned.  Any alignment of
 * base and chunk_size works; chunks whose start is 16-byte aligned take
 * the vectorized path.  Parameters in PTX: .u64, .u64, .u32, .u64, .u64,
 * .u64 (kernelParams: pointers to a CUdeviceptr, an unsigned long long, an
 * unsigned int, two unsigned long long and a CUdeviceptr).
 */
#ifndef CUIP_CHUNKSCAN_H
#define CUIP_CHUNKSCAN_H

#define CUIP_CHUNKSCAN_THREADS 256
#define CUIP_CHUNKSCAN_KERNEL  "cuip_chunkscan"
/* The modulus, 2^61 - 1. */
#define CUIP_P61 0x1fffffffffffffffull

#if defined(__CUDA__)
/* clang CUDA, no toolkit headers: the helpers are for both sides. */
#define CUIP_CS_FN static inline __attribute__((host, device))
typedef unsigned long long cuip_u64;
typedef unsigned int cuip_u32;
#else
#include <stdint.h>
#include <string.h>
#define CUIP_CS_FN static inline
typedef uint64_t cuip_u64;
typedef uint32_t cuip_u32;
#endif

/* x mod p for any 64-bit x. */
CUIP_CS_FN cuip_u64 cuip_mod61(cuip_u64 x)
{
	x = (x & CUIP_P61) + (x >> 61);
	return x >= CUIP_P61 ? x - CUIP_P61 : x;
}

/* a + b mod p, a and b in [0, p). */
CUIP_CS_FN cuip_u64 addmod61(cuip_u64 a, cuip_u64 b)
{
	cuip_u64 s = a + b;

	return s >= CUIP_P61 ? s - CUIP_P61 : s;
}

/* Partial fold of x < 2^124: a value < 2^61 + 8 congruent to x mod p
 * (the first sum is < 2^61 + 2^63, the second < 2^61 + 4 + 4). */
CUIP_CS_FN cuip_u64 cuip_fold61(unsigned __int128 x)
{
	cuip_u64 r = ((cuip_u64)x & CUIP_P61) + (cuip_u64)(x >> 61);

	return (r & CUIP_P61) + (r >> 61);
}

/* a * b mod p, a and b in [0, p) (a product < 2^122). */
CUIP_CS_FN cuip_u64 mulmod61(cuip_u64 a, cuip_u64 b)
{
	unsigned __int128 x = (unsigned __int128)a * b;
	cuip_u64 r = ((cuip_u64)x & CUIP_P61) + (cuip_u64)(x >> 61);

	return r >= CUIP_P61 ? r - CUIP_P61 : r;
}

/* k^e mod p, k in [0, p). */
CUIP_CS_FN cuip_u64 powmod61(cuip_u64 k, cuip_u64 e)
{
	cuip_u64 r = 1;

	while (e) {
		if (e & 1)
			r = mulmod61(r, k);
		k = mulmod61(k, k);
		e >>= 1;
	}
	return r;
}

/* One Horner step a * K + w, partially folded: a < 2^61 + 8 (or < 2^32)
 * gives a product < 2^123 (hi < 2^59) and a result < 2^61 + 8. */
CUIP_CS_FN cuip_u64 cuip_cs_step(cuip_u64 a, cuip_u64 K, cuip_u32 w)
{
	unsigned __int128 x = (unsigned __int128)a * K + w;
	cuip_u64 lo = (cuip_u64)x, hi = (cuip_u64)(x >> 64);
	cuip_u64 r = (lo & CUIP_P61) + (lo >> 61) + (hi << 3);

	return (r & CUIP_P61) + (r >> 61);
}

#if !defined(__CUDA__)
/* The PTX text of chunkscan_kernel.cu (sm_80), NUL-terminated, for
 * cuModuleLoadData; entry CUIP_CHUNKSCAN_KERNEL. Generated at build time
 * (carrier/Makefile.am, chunkscan_ptx.c in libcuipcarrier). */
extern const char cuip_chunkscan_ptx[];

/* Lanes of the host version: independent Horner chains per key, kept in
 * scalars (an array of them is kept in memory by the compiler, 4x slower). */
#define CUIP_CS_LANES 4

/* 1 if the len bytes at d are all zero. */
static inline int cuip_chunkscan_zero(const unsigned char *d, uint64_t len)
{
	uint64_t i = 0;

	for (; i + 64 <= len; i += 64) {
		uint64_t v[8], o = 0;

		memcpy(v, d + i, sizeof(v));
		for (int j = 0; j < 8; j++)
			o |= v[j];
		if (o)
			return 0;
	}
	for (; i < len; i++)
		if (d[i])
			return 0;
	return 1;
}

/*
 * The host reference of THE FUNCTION above: out[0] = h0, out[1] = h1,
 * out[2] = nonzero for the len bytes at data.  An all-zero chunk is found
 * by a plain OR pass (H(0) = 0 exactly) and costs no multiplication; else
 * Horner in K = k^L over L interleaved lanes (word i in lane i mod L,
 * H = sum_j k^(j+1) * sum_m w_(mL+j) K^m), walking the words backwards,
 * one multiplication per word and key with partially folded residues.
 */
static inline void cuip_chunkscan_host(const void *data, uint64_t len, const uint64_t key[2], uint64_t out[3])
{
	const unsigned char *d = (const unsigned char *)data;
	const uint64_t blk = 4 * CUIP_CS_LANES; /* bytes per block of L words */
	uint64_t k[2], K0, K1, x0, x1, x2, x3, y0, y1, y2, y3, off;
	uint32_t w[CUIP_CS_LANES] = {0};

	out[0] = out[1] = out[2] = 0;
	if (cuip_chunkscan_zero(d, len))
		return;
	out[2] = 1;
	k[0] = cuip_mod61(key[0]);
	k[1] = cuip_mod61(key[1]);
	K0 = powmod61(k[0], CUIP_CS_LANES);
	K1 = powmod61(k[1], CUIP_CS_LANES);
	/* The last block, zero-padded, starts the chains. */
	off = (len - 1) / blk * blk;
	memcpy(w, d + off, len - off);
	x0 = y0 = w[0];
	x1 = y1 = w[1];
	x2 = y2 = w[2];
	x3 = y3 = w[3];
	while (off > 0) {
		off -= blk;
		memcpy(w, d + off, sizeof(w));
		x0 = cuip_cs_step(x0, K0, w[0]);
		x1 = cuip_cs_step(x1, K0, w[1]);
		x2 = cuip_cs_step(x2, K0, w[2]);
		x3 = cuip_cs_step(x3, K0, w[3]);
		y0 = cuip_cs_step(y0, K1, w[0]);
		y1 = cuip_cs_step(y1, K1, w[1]);
		y2 = cuip_cs_step(y2, K1, w[2]);
		y3 = cuip_cs_step(y3, K1, w[3]);
	}
	/* H = sum_j k^(j+1) * lane_j */
	for (int h = 0; h < 2; h++) {
		uint64_t a[CUIP_CS_LANES] = {x0, x1, x2, x3}, kp = k[h], s = 0;

		if (h)
			a[0] = y0, a[1] = y1, a[2] = y2, a[3] = y3;
		for (int j = 0; j < CUIP_CS_LANES; j++) {
			s = addmod61(s, mulmod61(cuip_mod61(a[j]), kp));
			kp = mulmod61(kp, k[h]);
		}
		out[h] = s;
	}
}
#endif /* !__CUDA__ */

#endif
