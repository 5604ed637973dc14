/*
 * resolve.h - every resolution path to the wrappers (resolve.c): ELF
 * symbols, dlsym, cuGetProcAddress*, cudaGetDriverEntryPoint*. Its table
 * is written once and read-only afterwards; no lock.
 */
#ifndef CUIP_RESOLVE_H
#define CUIP_RESOLVE_H

#include <cuda.h>

/* Replace *pfn by our wrapper when it is a real entry point we replace. */
void cuip_substitute(const char *symbol, int version, cuuint64_t flags, void **pfn);

#endif /* CUIP_RESOLVE_H */
