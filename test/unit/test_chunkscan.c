/*
 * test_chunkscan.c - carrier/chunkscan.h's host reference, cuip_chunkscan_host:
 * values computed outside C (Python's integers), a slow step-by-step
 * reference (one __int128 multiplication and remainder per word) over every
 * length to 300 bytes and large random buffers, zero chunks, keys at the
 * edges, and single-bit flips: at every bit position of a 64 KiB random
 * chunk and of a 64 KiB zero chunk, and at sampled positions of 1 MiB, the
 * hashes change (and for the zero chunk are exactly 2^b * k^(i+1), with the
 * nonzero flag set).
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chunkscan.h"

static const uint64_t keys[2] = {0x0123456789abcdefull, 0x1ffffffffffff0f1ull};

/* The definition, word by word: sum w_i k^(i+1) mod p. */
static uint64_t slow_hash(const unsigned char *d, uint64_t len, uint64_t key)
{
	const unsigned __int128 p = CUIP_P61;
	unsigned __int128 acc = 0, pw = 1, k = key % CUIP_P61;

	for (uint64_t i = 0; 4 * i < len; i++) {
		uint64_t w = 0;

		for (int b = 0; b < 4; b++)
			if (4 * i + b < len)
				w |= (uint64_t)d[4 * i + b] << (8 * b);
		pw = pw * k % p;
		acc = (acc + w * pw) % p;
	}
	return (uint64_t)acc;
}

static void slow(const unsigned char *d, uint64_t len, const uint64_t key[2], uint64_t out[3])
{
	out[0] = slow_hash(d, len, key[0]);
	out[1] = slow_hash(d, len, key[1]);
	out[2] = 0;
	for (uint64_t i = 0; i < len; i++)
		out[2] |= d[i] != 0;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static void fill_random(unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		rng ^= rng << 13;
		rng ^= rng >> 7;
		rng ^= rng << 17;
		p[i] = (unsigned char)(rng >> 29);
	}
}

static void check_same(const unsigned char *d, uint64_t len, const uint64_t key[2])
{
	uint64_t got[3], want[3];

	cuip_chunkscan_host(d, len, key, got);
	slow(d, len, key, want);
	ck_assert_msg(got[0] == want[0] && got[1] == want[1] && got[2] == want[2],
		      "len %llu: (%llx %llx %llu), reference (%llx %llx %llu)", (unsigned long long)len,
		      (unsigned long long)got[0], (unsigned long long)got[1], (unsigned long long)got[2],
		      (unsigned long long)want[0], (unsigned long long)want[1], (unsigned long long)want[2]);
}

START_TEST(values_computed_outside_c)
{
	/* Python: sum(int.from_bytes(b[4i:4i+4], 'little') * pow(k, i+1, p)) % p, zero-padded */
	static const struct {
		uint64_t len, h0, h1;
	} v[] = {
		{1, 0x07f6e5d4c3b2a189ull, 0x1fffffffffff969dull},
		{3, 0x11a2b3c4d5d8f2c5ull, 0x1fffffff342c0a9dull},
		{4, 0x0f13579b4af7ab17ull, 0x1ffff787542c0a9dull},
		{5, 0x1027e350cbd4632dull, 0x1ffff78764fe4529ull},
		{64, 0x02fd1632f3d5499eull, 0x076da39c29b2f508ull},
		{100, 0x1c4f5267100e1f5dull, 0x01e9f5ad8183e03aull},
		{1000, 0x04bee6c7dfe5380dull, 0x1b4d3c7e70bf8f39ull},
		{65536, 0x00e03a21a5d064c6ull, 0x1cdca72624e4a6edull},
		{65537, 0x10370b013aaed61bull, 0x1245ed28cc6d8249ull},
	};
	unsigned char *d = malloc(65537);
	uint64_t out[3];

	ck_assert_ptr_nonnull(d);
	for (int i = 0; i < 65537; i++)
		d[i] = (unsigned char)(((i * 131 + 7) ^ (i >> 8)) & 255);
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		cuip_chunkscan_host(d, v[i].len, keys, out);
		ck_assert_msg(out[0] == v[i].h0 && out[1] == v[i].h1 && out[2] == 1, "len %llu",
			      (unsigned long long)v[i].len);
	}
	/* "abc" with k = 2: 0x636261 * 2; k = p + 2 is k = 2 */
	{
		const uint64_t k2[2] = {2, CUIP_P61 + 2};

		cuip_chunkscan_host("abc", 3, k2, out);
		ck_assert_uint_eq(out[0], 0xc6c4c2);
		ck_assert_uint_eq(out[1], 0xc6c4c2);
	}
	/* a nonzero chunk can hash to 0 (here with k = p - 1): hence the flag */
	{
		const uint64_t km[2] = {CUIP_P61 - 1, CUIP_P61 - 1};

		memset(d, 0xff, 8);
		cuip_chunkscan_host(d, 8, km, out);
		ck_assert(out[0] == 0 && out[1] == 0 && out[2] == 1);
	}
	free(d);
}
END_TEST

START_TEST(every_length_and_random_buffers_as_the_definition)
{
	const size_t big = 3 * 65536 + 13;
	unsigned char *d = malloc(big + 64);
	const uint64_t edge[][2] = {
		{1, CUIP_P61 - 1}, {CUIP_P61 - 2, 3}, {0x1000000000000001ull, 0xfffffffffffffff0ull}};

	ck_assert_ptr_nonnull(d);
	fill_random(d, big + 64);
	for (uint64_t len = 0; len <= 300; len++) {
		check_same(d, len, keys);
		check_same(d + 1, len, keys); /* unaligned */
		check_same(d + 7, len, edge[len % 3]);
	}
	check_same(d, big, keys);
	check_same(d + 3, big - 5, keys);
	check_same(d, 65536, edge[0]);
	/* zero runs inside random data, then a chunk nonzero only at its ends */
	memset(d + 1000, 0, 70000);
	check_same(d, big, keys);
	memset(d, 0, big);
	d[big - 1] = 1;
	check_same(d, big, keys);
	d[big - 1] = 0;
	d[0] = 0x80;
	check_same(d, big, keys);
	free(d);
}
END_TEST

START_TEST(zero_chunks_are_zero)
{
	unsigned char *d = calloc(1, 4 << 20);
	uint64_t out[3] = {1, 1, 1};

	ck_assert_ptr_nonnull(d);
	for (uint64_t len = 0; len < 70; len++) {
		cuip_chunkscan_host(d + 1, len, keys, out);
		ck_assert(out[0] == 0 && out[1] == 0 && out[2] == 0);
	}
	cuip_chunkscan_host(d, 4 << 20, keys, out);
	ck_assert(out[0] == 0 && out[1] == 0 && out[2] == 0);
	free(d);
}
END_TEST

/* Bit flips of a 64 KiB chunk, bits [from, to) of it, on a thread. */
struct flips {
	const unsigned char *orig;
	size_t len, from, to;
	int zero; /* the original is zero: the result is known exactly */
	size_t bad;
	char why[160];
};

static void *flip_range(void *arg)
{
	struct flips *f = arg;
	unsigned char *d = malloc(f->len);
	uint64_t base[3], out[3];

	if (!d) {
		f->bad = 1;
		return NULL;
	}
	memcpy(d, f->orig, f->len);
	cuip_chunkscan_host(d, f->len, keys, base);
	for (size_t bit = f->from; bit < f->to && !f->bad; bit++) {
		size_t byte = bit / 8;

		d[byte] ^= (unsigned char)(1u << (bit % 8));
		cuip_chunkscan_host(d, f->len, keys, out);
		d[byte] ^= (unsigned char)(1u << (bit % 8));
		if (out[2] != 1 || (out[0] == base[0] && out[1] == base[1])) {
			f->bad = bit + 1;
		} else if (f->zero) {
			/* word byte/4 holds 2^(8(byte%4) + bit%8) */
			for (int h = 0; h < 2 && !f->bad; h++) {
				uint64_t k = keys[h] % CUIP_P61;
				uint64_t want = mulmod61(powmod61(k, byte / 4 + 1), 1ull << (8 * (byte % 4) + bit % 8));

				if (out[h] != want)
					f->bad = bit + 1;
			}
		}
	}
	if (f->bad)
		snprintf(f->why, sizeof(f->why), "bit %zu of %zu bytes (zero original: %d)", f->bad - 1, f->len,
			 f->zero);
	free(d);
	return NULL;
}

/* Every bit of len bytes, over two threads. */
static void flip_every_bit(const unsigned char *orig, size_t len, int zero)
{
	struct flips f[2] = {{orig, len, 0, 4 * len, zero, 0, ""}, {orig, len, 4 * len, 8 * len, zero, 0, ""}};
	pthread_t t;

	ck_assert_int_eq(pthread_create(&t, NULL, flip_range, &f[1]), 0);
	flip_range(&f[0]);
	pthread_join(t, NULL);
	ck_assert_msg(!f[0].bad, "%s", f[0].why);
	ck_assert_msg(!f[1].bad, "%s", f[1].why);
}

START_TEST(every_bit_flip_of_64k_changes_the_hashes)
{
	unsigned char *d = malloc(65536);

	ck_assert_ptr_nonnull(d);
	fill_random(d, 65536);
	flip_every_bit(d, 65536, 0);
	free(d);
}
END_TEST

START_TEST(every_bit_set_in_64k_of_zeros_is_exact)
{
	unsigned char *d = calloc(1, 65536);

	ck_assert_ptr_nonnull(d);
	flip_every_bit(d, 65536, 1);
	free(d);
}
END_TEST

START_TEST(sampled_bit_flips_of_1m_change_the_hashes)
{
	const size_t len = 1 << 20;
	unsigned char *d = malloc(len);
	struct flips f = {d, len, 0, 0, 0, 0, ""};

	ck_assert_ptr_nonnull(d);
	fill_random(d, len);
	/* the first and last 256 bits, and 600 spread over the rest */
	for (int i = 0; i < 856; i++) {
		size_t bit = i < 256 ? (size_t)i : i < 512 ? 8 * len - 512 + (size_t)i : (size_t)(rng % (8 * len));

		rng ^= rng << 13;
		rng ^= rng >> 7;
		rng ^= rng << 17;
		f.from = bit;
		f.to = bit + 1;
		flip_range(&f);
		ck_assert_msg(!f.bad, "%s", f.why);
	}
	free(d);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("chunkscan");
	TCase *tc = tcase_create("host");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, values_computed_outside_c);
	tcase_add_test(tc, every_length_and_random_buffers_as_the_definition);
	tcase_add_test(tc, zero_chunks_are_zero);
	tcase_add_test(tc, every_bit_flip_of_64k_changes_the_hashes);
	tcase_add_test(tc, every_bit_set_in_64k_of_zeros_is_exact);
	tcase_add_test(tc, sampled_bit_flips_of_1m_change_the_hashes);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
