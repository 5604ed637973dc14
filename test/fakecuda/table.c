/*
 * Tables that grow in place: the per-process tables of address
 * reservations, contexts, streams and events (fake.h, struct fk_table).  Each
 * is one reservation of address space (PROT_NONE, no memory) for cap entries,
 * made readable and writable a run of pages at a time as entries are needed,
 * and never moved or shrunk: an entry's address is a stable handle (CUcontext,
 * CUstream and CUevent are pointers to entries), and the restore thread walks
 * [0, n) with no allocator.  Only API calls grow a table, under G.lock;
 * table_index reads n without it (n only grows, after the pages it covers are
 * usable).
 */
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>

#include "fake.h"

#define STEP (64u << 10) /* bytes made usable at a time */

static int table_grow(struct fk_table *t)
{
	size_t span = ((size_t)t->cap * t->esize + STEP - 1) / STEP * STEP, n;

	if (atomic_load(&t->n) >= t->cap)
		return -1;
	if (!t->base) {
		void *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		if (p == MAP_FAILED)
			return -1;
		t->base = p;
		t->made = 0;
	}
	if (mprotect(t->base + t->made, STEP, PROT_READ | PROT_WRITE))
		return -1;
	t->made += STEP;
	n = t->made / t->esize;
	atomic_store(&t->n, n > (size_t)t->cap ? t->cap : (int)n);
	return 0;
}

int table_new(struct fk_table *t)
{
	int n = atomic_load(&t->n);

	for (int k = 0; k < n; k++) {
		int i = (t->hint + k) % n;
		unsigned char *e = t->base + (size_t)i * t->esize;

		if (!*(int *)(e + t->used_off)) {
			memset(e, 0, t->esize);
			t->hint = i + 1;
			return i;
		}
	}
	if (table_grow(t))
		return -1;
	t->hint = n + 1;
	return n; /* the first new entry: zero, as the kernel gives pages */
}

int table_index(const struct fk_table *t, const void *p)
{
	uintptr_t a = (uintptr_t)p, b = (uintptr_t)t->base;
	size_t n = (size_t)atomic_load(&t->n);

	if (!b || a < b || a - b >= n * t->esize || (a - b) % t->esize)
		return -1;
	return (int)((a - b) / t->esize);
}
