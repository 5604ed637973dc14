/*
 * zchunk.h - compressed carrier chunks: one zstd frame per chunk, stored
 * at the start of the chunk's place in its carrier file (the rest of the
 * place a hole), its length in CarrierEntry.stored.
 *
 * A chunk is stored compressed only where that saves at least a page and
 * a sixteenth of it; otherwise raw (stored length 0). CRCs and hashes stay
 * those of the raw bytes, so a compressed chunk is checked after it is
 * decompressed, and an incremental dump compares contents, not frames.
 *
 * Contexts live in caller-provided memory (zstd's static contexts): the
 * carrier's LOAD runs while the application's threads are frozen, maybe
 * inside malloc, and must not allocate. The readers outside the carrier
 * (verification, cuinterpose show) use cuip_zchunk_read with a buffer of
 * their own.
 */
#ifndef CUIP_ZCHUNK_H
#define CUIP_ZCHUNK_H

#include <stddef.h>
#include <stdint.h>

/* zstd's levels that CUINTERPOSE_CARRIER_COMPRESS accepts. */
#define CUIP_ZCHUNK_LEVEL_MIN (-7)
#define CUIP_ZCHUNK_LEVEL_MAX 19

/*
 * Parse CUINTERPOSE_CARRIER_COMPRESS's value: "off" or empty (0 in
 * *level, with *on false), "zstd" (level 1) or "zstd:N" (N within the
 * bounds above, 0 meaning zstd's default level). Returns 0 or -EINVAL.
 */
int cuip_zchunk_parse(const char *v, int *level, int *on);

/* Bytes of workspace a compressing context for `level` needs for chunks of
 * at most `chunk` bytes, and one decompressing context. */
size_t cuip_zchunk_cctx_size(int level, size_t chunk);
size_t cuip_zchunk_dctx_size(void);
/* Room a compressed chunk of len bytes may need before it is judged. */
size_t cuip_zchunk_bound(size_t len);

/* A context in ws[0..len) (8-byte aligned), or NULL when it does not fit. */
void *cuip_zchunk_cctx(void *ws, size_t len);
void *cuip_zchunk_dctx(void *ws, size_t len);

/*
 * Compress src[0..len) into dst[0..cap): the frame's length when storing
 * it compressed is worth it (see above), else 0 (store raw).
 */
size_t cuip_zchunk_compress(void *cctx, int level, void *dst, size_t cap, const void *src, size_t len);

/*
 * Decompress the frame src[0..z) into dst, which must come out exactly len
 * bytes. Returns 0, or -EBADMSG (not a frame, corrupt, or another length).
 */
int cuip_zchunk_decompress(void *dctx, void *dst, size_t len, const void *src, size_t z);

/* Whether a stored length is possible for a chunk of len bytes. */
static inline int cuip_zchunk_stored_ok(uint32_t stored, uint64_t len)
{
	return stored < len;
}

/*
 * Read one chunk of len bytes whose place starts at foff of fd, stored
 * `stored` bytes (0: raw), into out[0..len); scratch holds at least
 * `stored` bytes (unused when raw). Allocates a decompressing context per
 * call when dctx is NULL. Returns 0, -ENODATA (the file ends first; *got
 * the bytes it had), -EBADMSG (the frame is corrupt) or a read's -errno.
 */
int cuip_zchunk_read(int fd, uint64_t foff, size_t len, uint32_t stored, void *out, void *scratch, void *dctx,
		     uint64_t *got);

#endif
