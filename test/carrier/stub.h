/*
 * stub.h - an in-process stand-in for the driver entry points the carrier
 * uses, for pipeline tests that need exact control: "device memory" is host
 * memory, asynchronous copies are deferred until the stream is synchronized
 * (so a carrier that touches a staging buffer before waiting for its copy
 * sees wrong bytes), every pinned byte and stream is counted, and the n-th
 * call of any entry point can be made to fail.
 */
#ifndef CARRIER_TEST_STUB_H
#define CARRIER_TEST_STUB_H

#include <stdint.h>
#include "carrier.h"

enum stub_fn {
	STUB_HOST_ALLOC,
	STUB_STREAM_CREATE,
	STUB_DTOH,
	STUB_HTOD,
	STUB_SYNC,
	STUB_SET_CTX,
	STUB_NFN,
};

struct stub_counts {
	int64_t pinned_bytes; /* outstanding */
	int64_t pinned_peak;
	int64_t host_allocs; /* outstanding */
	int64_t streams;     /* outstanding */
	int64_t calls[STUB_NFN];
};

extern const struct carrier_ops stub_ops;

/* Reset counters and faults. */
void stub_reset(void);
/* Make the n-th call (1-based, counted from now) of fn fail. */
void stub_fail(enum stub_fn fn, int n, CUresult rc);
void stub_get(struct stub_counts *c);
/* A fake context value for items; the stub checks copies run with it. */
#define STUB_CTX ((CUcontext)(uintptr_t)0x5157)

#endif
