/*
 * util.h - helpers shared by the carrier tests: byte patterns, an
 * independent bitwise CRC32C, scratch files, and counters of descriptors,
 * mappings and resident memory for leak and bound checks.
 */
#ifndef CARRIER_TEST_UTIL_H
#define CARRIER_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Deterministic bytes: pattern_byte(seed, i) for buffer position i. */
void pattern_fill(void *p, size_t n, uint32_t seed);
/* Index of the first byte that differs from the pattern, or -1. */
long pattern_check(const void *p, size_t n, uint32_t seed);
/* Index of the first byte != v, or -1. */
long bytes_check(const void *p, size_t n, uint8_t v);

/* Bit-at-a-time CRC32C, independent of protocol/wire.c. */
uint32_t ref_crc32c(const void *p, size_t n);

/* An unlinked read/write scratch file in $TMPDIR (or /tmp). */
int scratch_fd(void);

int count_fds(void);
/* Mappings other than the brk heap (malloc splits and merges that freely). */
int count_maps(void);
/* Resident set and its peak (VmRSS, VmHWM) in bytes; reset_peak_rss()
 * restarts VmHWM from the current RSS (0 if unsupported). */
uint64_t rss_now(void);
uint64_t rss_peak(void);
int reset_peak_rss(void);

#endif
