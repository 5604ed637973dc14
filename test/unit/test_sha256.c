/*
 * test_sha256.c - protocol/sha256.c: the FIPS 180-4 examples, and every
 * length from 0 to 300 bytes and large random buffers fed in uneven pieces
 * against OpenSSL's libcrypto (linked by this test only), under each
 * implementation this CPU can run (where it has no SHA extensions, only the
 * portable code runs here, and says so).
 */
#include <check.h>
#include <errno.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sha256.h"

static const char *impls[] = {"portable", "shani"};

static void hex(const uint8_t *d, char *out)
{
	for (int i = 0; i < CUIP_SHA256_LEN; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

static void reference(const void *p, size_t n, uint8_t out[CUIP_SHA256_LEN])
{
	unsigned len = 0;

	ck_assert(EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) == 1);
	ck_assert_uint_eq(len, CUIP_SHA256_LEN);
}

/* Select implementation i (main() loops only over those this CPU runs). */
static void use(int i)
{
	ck_assert_int_eq(cuip_sha256_select(impls[i]), 0);
	ck_assert_str_eq(cuip_sha256_impl(), impls[i]);
}

START_TEST(fips_examples)
{
	static const struct {
		const char *msg;
		const char *want;
	} v[] = {
		{"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
		 "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
	};
	char got[2 * CUIP_SHA256_LEN + 1];
	uint8_t d[CUIP_SHA256_LEN];

	use(_i);
	for (size_t k = 0; k < sizeof(v) / sizeof(v[0]); k++) {
		cuip_sha256(v[k].msg, strlen(v[k].msg), d);
		hex(d, got);
		ck_assert_str_eq(got, v[k].want);
	}
	/* A million 'a', in pieces of 1000. */
	{
		struct cuip_sha256 s;
		char a[1000];

		memset(a, 'a', sizeof(a));
		cuip_sha256_init(&s);
		for (int k = 0; k < 1000; k++)
			cuip_sha256_update(&s, a, sizeof(a));
		cuip_sha256_final(&s, d);
		hex(d, got);
		ck_assert_str_eq(got, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
	}
}
END_TEST

START_TEST(every_short_length)
{
	uint8_t buf[300], d[CUIP_SHA256_LEN], r[CUIP_SHA256_LEN];

	use(_i);
	for (size_t k = 0; k < sizeof(buf); k++)
		buf[k] = (uint8_t)(k * 131 + 7);
	for (size_t n = 0; n <= sizeof(buf); n++) {
		cuip_sha256(buf, n, d);
		reference(buf, n, r);
		ck_assert_msg(!memcmp(d, r, sizeof(d)), "%s: %zu bytes differ from libcrypto", impls[_i], n);
	}
}
END_TEST

START_TEST(large_random_in_pieces)
{
	size_t n = (4u << 20) + 37;
	uint8_t *buf = malloc(n), d[CUIP_SHA256_LEN], r[CUIP_SHA256_LEN];
	struct cuip_sha256 s;
	unsigned seed = 12345;

	ck_assert_ptr_nonnull(buf);
	use(_i);
	for (size_t k = 0; k < n; k++)
		buf[k] = (uint8_t)(rand_r(&seed) >> 7);
	reference(buf, n, r);
	cuip_sha256(buf, n, d);
	ck_assert(!memcmp(d, r, sizeof(d)));
	/* Uneven pieces cross the 64-byte blocks everywhere. */
	cuip_sha256_init(&s);
	for (size_t o = 0, step = 1; o < n; o += step, step = step * 7 % 100003 + 1)
		cuip_sha256_update(&s, buf + o, o + step > n ? n - o : step);
	cuip_sha256_final(&s, d);
	ck_assert(!memcmp(d, r, sizeof(d)));
	/* One bit changes the digest. */
	buf[n / 2] ^= 1;
	cuip_sha256(buf, n, d);
	ck_assert(memcmp(d, r, sizeof(d)));
	free(buf);
}
END_TEST

START_TEST(unknown_implementation_refused)
{
	ck_assert_int_eq(cuip_sha256_select("md5"), -ENOTSUP);
	ck_assert_int_eq(cuip_sha256_select("auto"), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("sha256");
	TCase *tc = tcase_create("sha256");
	SRunner *sr;
	int failed, n = cuip_sha256_select("shani") == 0 ? 2 : 1;

	if (n == 1)
		printf("this CPU has no SHA extensions: the portable implementation only\n");
	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, fips_examples, 0, n);
	tcase_add_loop_test(tc, every_short_length, 0, n);
	tcase_add_loop_test(tc, large_random_in_pieces, 0, n);
	tcase_add_test(tc, unknown_implementation_refused);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
