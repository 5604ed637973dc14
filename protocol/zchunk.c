/*
 * zchunk.c - compressed carrier chunks (contract in zchunk.h).
 */
#define ZSTD_STATIC_LINKING_ONLY /* static contexts: no allocation in LOAD */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "wire.h"
#include "zchunk.h"

#define PAGE 4096u

/*
 * zstd calls these tracing hooks where someone defines them (weak
 * references in its archive). libcuinterpose.so links the archive and must
 * need nothing outside glibc, nor call into whatever a job happens to
 * define under these names: ours say "no tracing" (0), and end is never
 * called then. zstd's own declarations are in a header it does not install.
 */
unsigned long long ZSTD_trace_compress_begin(const void *cctx);
void ZSTD_trace_compress_end(unsigned long long ctx, const void *trace);
unsigned long long ZSTD_trace_decompress_begin(const void *dctx);
void ZSTD_trace_decompress_end(unsigned long long ctx, const void *trace);

unsigned long long ZSTD_trace_compress_begin(const void *cctx)
{
	return 0;
}

void ZSTD_trace_compress_end(unsigned long long ctx, const void *trace)
{
}

unsigned long long ZSTD_trace_decompress_begin(const void *dctx)
{
	return 0;
}

void ZSTD_trace_decompress_end(unsigned long long ctx, const void *trace)
{
}

int cuip_zchunk_parse(const char *v, int *level, int *on)
{
	char *end;
	long n;

	*level = 0;
	*on = 0;
	if (!v || !*v || !strcmp(v, "off"))
		return 0;
	if (!strcmp(v, "zstd")) {
		*level = 1;
		*on = 1;
		return 0;
	}
	if (strncmp(v, "zstd:", 5) || !v[5])
		return -EINVAL;
	errno = 0;
	n = strtol(v + 5, &end, 10);
	if (errno || *end || n < CUIP_ZCHUNK_LEVEL_MIN || n > CUIP_ZCHUNK_LEVEL_MAX)
		return -EINVAL;
	*level = (int)n;
	*on = 1;
	return 0;
}

size_t cuip_zchunk_cctx_size(int level, size_t chunk)
{
	/* zstd picks its parameters by each input's own length, from one table
	 * for inputs up to 16 KiB, 128 KiB, 256 KiB and one beyond, each then
	 * cut down to the length: within a table the largest input needs the
	 * most, but a smaller table can need more than a larger one (level 4:
	 * a 128 KiB input more than a 256 KiB one). So the most over the
	 * tables' top lengths below the chunk and the chunk itself: at level
	 * 19, 17 MiB per thread for 1 MiB chunks against the 81 MiB of an
	 * unbounded input. */
	static const size_t top[] = {16u << 10, 128u << 10, 256u << 10};
	size_t need = ZSTD_estimateCCtxSize_usingCParams(ZSTD_getCParams(level, chunk, 0));

	for (size_t i = 0; i < sizeof(top) / sizeof(top[0]); i++)
		if (top[i] < chunk) {
			size_t n = ZSTD_estimateCCtxSize_usingCParams(ZSTD_getCParams(level, top[i], 0));

			need = n > need ? n : need;
		}
	return need;
}

size_t cuip_zchunk_dctx_size(void)
{
	return ZSTD_estimateDCtxSize();
}

size_t cuip_zchunk_bound(size_t len)
{
	return ZSTD_compressBound(len);
}

void *cuip_zchunk_cctx(void *ws, size_t len)
{
	return ZSTD_initStaticCCtx(ws, len);
}

void *cuip_zchunk_dctx(void *ws, size_t len)
{
	return ZSTD_initStaticDCtx(ws, len);
}

size_t cuip_zchunk_compress(void *cctx, int level, void *dst, size_t cap, const void *src, size_t len)
{
	size_t z = ZSTD_compressCCtx(cctx, dst, cap, src, len, level);

	/* Worth a page and a sixteenth: less would save no block, or cost
	 * the restore a decompression for nothing. */
	if (ZSTD_isError(z) || z + PAGE > len || z > len - len / 16)
		return 0;
	return z;
}

int cuip_zchunk_decompress(void *dctx, void *dst, size_t len, const void *src, size_t z)
{
	size_t r = ZSTD_decompressDCtx(dctx, dst, len, src, z);

	return ZSTD_isError(r) || r != len ? -EBADMSG : 0;
}

int cuip_zchunk_read(int fd, uint64_t foff, size_t len, uint32_t stored, void *out, void *scratch, void *dctx,
		     uint64_t *got)
{
	ZSTD_DCtx *own = NULL;
	int ret;

	if (!stored)
		return cuip_pread_all(fd, out, len, foff, got);
	if (!cuip_zchunk_stored_ok(stored, len))
		return -EBADMSG;
	ret = cuip_pread_all(fd, scratch, stored, foff, got);
	if (ret)
		return ret;
	if (!dctx) {
		own = ZSTD_createDCtx();
		if (!own)
			return -ENOMEM;
		dctx = own;
	}
	ret = cuip_zchunk_decompress(dctx, out, len, scratch, stored);
	ZSTD_freeDCtx(own);
	return ret;
}
