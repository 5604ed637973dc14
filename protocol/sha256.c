/*
 * sha256.c - SHA-256 (sha256.h): one compression function per
 * implementation behind a pointer chosen at first use; the buffering of
 * partial blocks and the padding are shared.
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "sha256.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_SHANI_BUILD 1
#endif

typedef void blocks_fn(uint32_t h[8], const uint8_t *p, size_t nblocks);

static const uint32_t K[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
			       0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

static inline uint32_t ror(uint32_t x, unsigned n)
{
	return (x >> n) | (x << (32 - n));
}

static inline uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void blocks_portable(uint32_t h[8], const uint8_t *p, size_t nblocks)
{
	for (; nblocks--; p += 64) {
		uint32_t w[64], v[8];

		for (int i = 0; i < 16; i++)
			w[i] = be32(p + 4 * i);
		for (int i = 16; i < 64; i++) {
			uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
			uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
			w[i] = w[i - 16] + s0 + w[i - 7] + s1;
		}
		memcpy(v, h, sizeof(v));
		for (int i = 0; i < 64; i++) {
			uint32_t S1 = ror(v[4], 6) ^ ror(v[4], 11) ^ ror(v[4], 25);
			uint32_t ch = (v[4] & v[5]) ^ (~v[4] & v[6]);
			uint32_t t1 = v[7] + S1 + ch + K[i] + w[i];
			uint32_t S0 = ror(v[0], 2) ^ ror(v[0], 13) ^ ror(v[0], 22);
			uint32_t maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);

			memmove(v + 1, v, 7 * sizeof(v[0]));
			v[4] += t1;
			v[0] = t1 + S0 + maj;
		}
		for (int i = 0; i < 8; i++)
			h[i] += v[i];
	}
}

#ifdef HAVE_SHANI_BUILD
/*
 * The SHA extensions keep the state as two vectors, ABEF and CDGH; each
 * SHA256RNDS2 runs two rounds, so a group of four rounds is two of them
 * with the message words in the low then the high half. The schedule
 * for group g+1 is finished (MSG2) during group g, from the words MSG1
 * started three groups earlier.
 */
__attribute__((target("sha,sse4.1,ssse3"))) static void blocks_shani(uint32_t h[8], const uint8_t *p, size_t nblocks)
{
	const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bll, 0x0405060700010203ll);
	__m128i t = _mm_loadu_si128((const __m128i *)&h[0]);  /* D C B A */
	__m128i s1 = _mm_loadu_si128((const __m128i *)&h[4]); /* H G F E */
	__m128i s0;

	t = _mm_shuffle_epi32(t, 0xb1);	   /* C D A B */
	s1 = _mm_shuffle_epi32(s1, 0x1b);  /* E F G H */
	s0 = _mm_alignr_epi8(t, s1, 8);	   /* A B E F */
	s1 = _mm_blend_epi16(s1, t, 0xf0); /* C D G H */
	for (; nblocks--; p += 64) {
		__m128i save0 = s0, save1 = s1, m[4], msg;

		for (int g = 0; g < 16; g++) {
			if (g < 4)
				m[g] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * g)), bswap);
			msg = _mm_add_epi32(m[g % 4], _mm_loadu_si128((const __m128i *)&K[4 * g]));
			s1 = _mm_sha256rnds2_epu32(s1, s0, msg);
			if (g >= 3 && g < 15) {
				__m128i x = _mm_alignr_epi8(m[g % 4], m[(g + 3) % 4], 4);
				m[(g + 1) % 4] = _mm_sha256msg2_epu32(_mm_add_epi32(m[(g + 1) % 4], x), m[g % 4]);
			}
			msg = _mm_shuffle_epi32(msg, 0x0e);
			s0 = _mm_sha256rnds2_epu32(s0, s1, msg);
			if (g >= 1 && g < 13)
				m[(g + 3) % 4] = _mm_sha256msg1_epu32(m[(g + 3) % 4], m[g % 4]);
		}
		s0 = _mm_add_epi32(s0, save0);
		s1 = _mm_add_epi32(s1, save1);
	}
	t = _mm_shuffle_epi32(s0, 0x1b);   /* F E B A */
	s1 = _mm_shuffle_epi32(s1, 0xb1);  /* D C H G */
	s0 = _mm_blend_epi16(t, s1, 0xf0); /* D C B A */
	s1 = _mm_alignr_epi8(s1, t, 8);	   /* H G F E */
	_mm_storeu_si128((__m128i *)&h[0], s0);
	_mm_storeu_si128((__m128i *)&h[4], s1);
}

static bool cpu_has_shani(void)
{
	unsigned a, b, c, d;

	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSSE3) || !(c & bit_SSE4_1))
		return false;
	return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 29));
}
#endif

static blocks_fn *impl;

static blocks_fn *pick(void)
{
	blocks_fn *f = impl;

	if (f)
		return f;
#ifdef HAVE_SHANI_BUILD
	f = cpu_has_shani() ? blocks_shani : blocks_portable;
#else
	f = blocks_portable;
#endif
	__atomic_store_n(&impl, f, __ATOMIC_RELAXED);
	return f;
}

int cuip_sha256_select(const char *name)
{
	if (!strcmp(name, "auto")) {
		__atomic_store_n(&impl, NULL, __ATOMIC_RELAXED);
		pick();
		return 0;
	}
	if (!strcmp(name, "portable")) {
		__atomic_store_n(&impl, blocks_portable, __ATOMIC_RELAXED);
		return 0;
	}
#ifdef HAVE_SHANI_BUILD
	if (!strcmp(name, "shani") && cpu_has_shani()) {
		__atomic_store_n(&impl, blocks_shani, __ATOMIC_RELAXED);
		return 0;
	}
#endif
	return -ENOTSUP;
}

const char *cuip_sha256_impl(void)
{
	return pick() == blocks_portable ? "portable" : "shani";
}

void cuip_sha256_init(struct cuip_sha256 *s)
{
	memcpy(s->h, H0, sizeof(H0));
	s->bytes = 0;
	s->nbuf = 0;
}

void cuip_sha256_update(struct cuip_sha256 *s, const void *data, size_t n)
{
	const uint8_t *p = data;
	blocks_fn *f = pick();

	s->bytes += n;
	if (s->nbuf) {
		size_t m = 64 - s->nbuf < n ? 64 - s->nbuf : n;

		memcpy(s->buf + s->nbuf, p, m);
		s->nbuf += m;
		p += m;
		n -= m;
		if (s->nbuf < 64)
			return;
		f(s->h, s->buf, 1);
		s->nbuf = 0;
	}
	if (n >= 64) {
		f(s->h, p, n / 64);
		p += n / 64 * 64;
		n %= 64;
	}
	memcpy(s->buf, p, n);
	s->nbuf = n;
}

void cuip_sha256_final(struct cuip_sha256 *s, uint8_t out[CUIP_SHA256_LEN])
{
	uint64_t bits = s->bytes * 8;
	uint8_t pad[72] = {0x80};
	size_t padlen = (s->nbuf < 56 ? 56 : 120) - s->nbuf;

	for (int i = 0; i < 8; i++)
		pad[padlen + i] = (uint8_t)(bits >> (56 - 8 * i));
	cuip_sha256_update(s, pad, padlen + 8);
	for (int i = 0; i < 8; i++) {
		out[4 * i] = (uint8_t)(s->h[i] >> 24);
		out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
		out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
		out[4 * i + 3] = (uint8_t)s->h[i];
	}
}

void cuip_sha256(const void *p, size_t n, uint8_t out[CUIP_SHA256_LEN])
{
	struct cuip_sha256 s;

	cuip_sha256_init(&s);
	cuip_sha256_update(&s, p, n);
	cuip_sha256_final(&s, out);
}
