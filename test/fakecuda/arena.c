/*
 * The device arenas as this process sees them: devd's memfd of each device,
 * mapped as a whole, once, into a PROT_NONE reservation of the process's
 * address space, so that an allocation's bytes are simply base + offset.
 * Creating, importing or releasing an allocation costs no mmap/munmap (no
 * VMA work, no TLB shootdown between threads); the mapping only grows, when
 * an offset beyond the mapped part shows up (devd grows the arena with
 * ftruncate in large steps, so that is rare).  Freed ranges are punched out by
 * devd, which zaps their pages in every process's mapping.
 *
 * Offsets are never reused, so the reservation is large (FK_ARENA_SPAN,
 * halved until the kernel grants it; FAKECUDA_ARENA_SPAN_MB for tests) and
 * costs no memory (PROT_NONE, MAP_NORESERVE).  An offset beyond it is
 * refused (the callers answer CUDA_ERROR_OUT_OF_MEMORY).  The reservation is
 * MADV_DONTFORK: a forked child never sees device memory.
 *
 * G.arena[phys] under G.lock; the restore thread uses its own fk_arena
 * array while it reconnects, and only system calls here (no malloc, no
 * stdio, no lock): it runs while other threads may be frozen.
 */
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake.h"

#define FK_ARENA_SPAN (16ull << 40)
#define FK_ARENA_MIN  (1ull << 30)

static uint64_t span_want = FK_ARENA_SPAN;

void arena_setup(void)
{
	const char *v = getenv("FAKECUDA_ARENA_SPAN_MB");
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);

	if (v && *v && strtoull(v, NULL, 10) > 0)
		span_want = (strtoull(v, NULL, 10) << 20) / pg * pg;
}

void arena_reset(struct fk_arena *ar, int n)
{
	for (int i = 0; i < n; i++) {
		ar[i].fd = -1;
		ar[i].base = NULL;
		ar[i].span = 0;
		ar[i].mapped = 0;
	}
}

static int arena_reserve(struct fk_arena *ar)
{
	uint64_t span = span_want;

	for (;;) {
		void *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		if (p != MAP_FAILED) {
			madvise(p, span, MADV_DONTFORK);
			ar->base = p;
			ar->span = span;
			ar->mapped = 0;
			return 0;
		}
		if (span <= FK_ARENA_MIN || span / 2 < FK_ARENA_MIN)
			return -1;
		span /= 2;
	}
}

/* Maps [mapped, file size) of the arena at base + mapped. */
static int arena_grow(struct fk_arena *ar, uint64_t end)
{
	struct stat st;
	uint64_t to;
	void *p;

	if (fstat(ar->fd, &st) < 0)
		return -1;
	to = (uint64_t)st.st_size < ar->span ? (uint64_t)st.st_size : ar->span;
	if (to < end)
		return -1;
	p = mmap(ar->base + ar->mapped, to - ar->mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, ar->fd,
		 (off_t)ar->mapped);
	if (p == MAP_FAILED)
		return -1;
	madvise(p, to - ar->mapped, MADV_DONTFORK);
	ar->mapped = to;
	return 0;
}

unsigned char *arena_ptr(struct fk_arena *ar, uint64_t off, size_t size)
{
	uint64_t end = off + size;

	if (ar->fd < 0 || end < off)
		return NULL;
	if (!ar->base && arena_reserve(ar) < 0)
		return NULL;
	if (end > ar->span)
		return NULL; /* beyond the reservation: refused, never mapped elsewhere */
	if (end > ar->mapped && arena_grow(ar, end) < 0)
		return NULL;
	return ar->base + off;
}

void arena_drop(struct fk_arena *ar, int n)
{
	for (int i = 0; i < n; i++) {
		if (ar[i].base)
			munmap(ar[i].base, ar[i].span);
		if (ar[i].fd >= 0)
			close(ar[i].fd);
	}
	arena_reset(ar, n);
}

unsigned char *arena_at(unsigned dev, uint64_t off, size_t size)
{
	return dev < FKW_MAX_DEV ? arena_ptr(&G.arena[dev], off, size) : NULL;
}
