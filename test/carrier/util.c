/*
 * util.c - see util.h.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

static inline uint8_t pattern_byte(uint32_t seed, size_t i)
{
	uint64_t v = (i / 8 + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32 | seed);

	v ^= v >> 29;
	v *= 0xBF58476D1CE4E5B9ull;
	v ^= v >> 32;
	return (uint8_t)(v >> (8 * (i % 8)));
}

void pattern_fill(void *p, size_t n, uint32_t seed)
{
	uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		b[i] = pattern_byte(seed, i);
}

long pattern_check(const void *p, size_t n, uint32_t seed)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		if (b[i] != pattern_byte(seed, i))
			return (long)i;
	return -1;
}

long bytes_check(const void *p, size_t n, uint8_t v)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		if (b[i] != v)
			return (long)i;
	return -1;
}

/* Byte-at-a-time table, built from the polynomial bit by bit:
 * still independent of the carrier's own CRC code, but 8x faster than the
 * bitwise loop (the round trips check tens of MiB; the bitwise loop made
 * roundtrip_mixed_sizes_every_byte_and_crc take over a second). */
static uint32_t ref_table[256];

/* before main: no thread can see a half-built table */
__attribute__((constructor)) static void ref_table_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t x = i;

		for (int k = 0; k < 8; k++)
			x = (x >> 1) ^ (0x82F63B78u & (0u - (x & 1)));
		ref_table[i] = x;
	}
}

uint32_t ref_crc32c(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint32_t c = 0xFFFFFFFFu;

	for (size_t i = 0; i < n; i++)
		c = (c >> 8) ^ ref_table[(c ^ b[i]) & 0xFF];
	return ~c;
}

int scratch_fd(void)
{
	const char *dir = getenv("TMPDIR");
	char path[4096];
	int fd;

	snprintf(path, sizeof(path), "%s/carrier-test-XXXXXX", dir && *dir ? dir : "/tmp");
	fd = mkstemp(path);
	if (fd >= 0)
		unlink(path);
	return fd;
}

int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own descriptor */
}

/*
 * AddressSanitizer's allocator keeps its heap in [0x600000000000,
 * 0x640000000000) on x86-64 and splits a region's reservation each time it
 * grows, which adds a mapping without anything being leaked: those are not
 * counted (the test's own mmaps land elsewhere).
 */
static int allocator_region(unsigned long start)
{
#if defined(__SANITIZE_ADDRESS__) && defined(__x86_64__)
	return start >= 0x600000000000ul && start < 0x640000000000ul;
#else
	(void)start;
	return 0;
#endif
}

int count_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += !strstr(line, "[heap]") && !allocator_region(strtoul(line, NULL, 16));
	fclose(f);
	return n;
}

static uint64_t status_kb(const char *key)
{
	FILE *f = fopen("/proc/self/status", "re");
	char line[256];
	size_t kl = strlen(key);
	uint64_t v = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, kl) && line[kl] == ':') {
			v = strtoull(line + kl + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v * 1024;
}

uint64_t rss_now(void)
{
	return status_kb("VmRSS");
}

uint64_t rss_peak(void)
{
	return status_kb("VmHWM");
}

int reset_peak_rss(void)
{
	int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
	int ok;

	if (fd < 0)
		return 0;
	ok = write(fd, "5", 1) == 1;
	close(fd);
	return ok;
}
