/*
 * sha256.h - SHA-256 (FIPS 180-4) of carrier chunks: the content identity
 * an incremental checkpoint compares with its parent's (a CRC32C tells a
 * damaged chunk, not that two chunks hold the same bytes).
 *
 * Written here, not taken from a crypto library: libcuinterpose.so is
 * preloaded into every process of a job and must not bring a libcrypto
 * that could shadow the framework's own. Uses the x86 SHA extensions where
 * the CPU has them (about 2 GB/s per core), else portable C.
 *
 * No global state but the implementation chosen once (thread-safe: the
 * choice is idempotent); each context is its caller's.
 */
#ifndef CUIP_SHA256_H
#define CUIP_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define CUIP_SHA256_LEN 32

struct cuip_sha256 {
	uint32_t h[8];
	uint64_t bytes; /* hashed so far */
	uint8_t buf[64];
	size_t nbuf;
};

void cuip_sha256_init(struct cuip_sha256 *s);
void cuip_sha256_update(struct cuip_sha256 *s, const void *p, size_t n);
void cuip_sha256_final(struct cuip_sha256 *s, uint8_t out[CUIP_SHA256_LEN]);
void cuip_sha256(const void *p, size_t n, uint8_t out[CUIP_SHA256_LEN]);

/* For tests and benchmarks: "shani" or "portable" from now on (0), or
 * -ENOTSUP when this CPU cannot run it; "auto" picks again. */
int cuip_sha256_select(const char *impl);
/* The implementation in use: "shani" or "portable". */
const char *cuip_sha256_impl(void);

#endif
