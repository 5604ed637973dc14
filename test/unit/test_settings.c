/*
 * test_settings.c - the settings table's numbers (protocol/settings.c,
 * cuip_setting_number): defaults when unset or empty, values in each
 * row's base, yes/no words, a row's own words ("auto"), values refused
 * with the table's message while the default stays in *out, names that
 * are no number row; then the table itself: every number row's default is
 * a number inside its range (or one the readers handle by name), every
 * range fits the readers' types, and the carrier's own limits are the
 * table's.
 */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "settings.h"
#include "xfer.h"

static uint64_t v;
static char err[256];

static int num(const char *name, const char *value)
{
	if (value)
		setenv(name, value, 1);
	else
		unsetenv(name);
	v = 12345;
	err[0] = 0;
	return cuip_setting_number(name, &v, err, sizeof(err));
}

START_TEST(unset_and_empty_take_the_rows_default)
{
	ck_assert_int_eq(num("CUINTERPOSE_STALL_TIMEOUT_MS", NULL), 0);
	ck_assert_uint_eq(v, 60000);
	ck_assert_int_eq(num("CUINTERPOSE_STALL_TIMEOUT_MS", ""), 0);
	ck_assert_uint_eq(v, 60000);
	/* "0 (CRIU's --timeout, 10 s)": the number it starts with */
	ck_assert_int_eq(num("CUINTERPOSE_LOCK_TIMEOUT_MS", NULL), 0);
	ck_assert_uint_eq(v, 0);
	ck_assert_int_eq(num("CUINTERPOSE_GUARDIAN_STOP_MS", NULL), 0);
	ck_assert_uint_eq(v, 10000);
	ck_assert_int_eq(num("CUINTERPOSE_VERIFY_BEFORE_RESTORE", NULL), 0);
	ck_assert_uint_eq(v, 0);
	/* "ask CRIU": no number; the reader keeps its own */
	ck_assert_int_eq(num("CUINTERPOSE_TEST_LEAVE_RUNNING", NULL), CUIP_SETTING_UNSET);
	ck_assert_uint_eq(v, 12345);
}
END_TEST

START_TEST(values_in_the_rows_base)
{
	ck_assert_int_eq(num("CUINTERPOSE_LOCK_TIMEOUT_MS", "2500"), 0);
	ck_assert_uint_eq(v, 2500);
	/* a HEX row takes 0x */
	ck_assert_int_eq(num("CUINTERPOSE_LOCK_TIMEOUT_MS", "0x10"), 0);
	ck_assert_uint_eq(v, 16);
	ck_assert_int_eq(num("CUINTERPOSE_LOG", "3"), 0);
	ck_assert_uint_eq(v, 3);
	ck_assert_int_eq(num("CUINTERPOSE_TEST_CHUNK_SIZE", "4096"), 0);
	ck_assert_uint_eq(v, 4096);
	ck_assert_int_eq(num("CUINTERPOSE_TEST_CHUNK_SIZE", "1073741824"), 0);
	ck_assert_uint_eq(v, 1073741824);
	ck_assert_int_eq(num("CUINTERPOSE_PREFETCH_MB", "512"), 0);
	ck_assert_uint_eq(v, 512);
	unsetenv("CUINTERPOSE_PREFETCH_MB");
}
END_TEST

START_TEST(yes_no_words)
{
	static const char *const on[] = {"1", "yes", "TRUE", "On"}, *const off[] = {"0", "no", "False", "OFF"};

	for (size_t i = 0; i < 4; i++) {
		ck_assert_int_eq(num("CUINTERPOSE_TEST_LEAVE_RUNNING", on[i]), 0);
		ck_assert_uint_eq(v, 1);
		ck_assert_int_eq(num("CUINTERPOSE_TEST_LEAVE_RUNNING", off[i]), 0);
		ck_assert_uint_eq(v, 0);
	}
	ck_assert_int_eq(num("CUINTERPOSE_TEST_LEAVE_RUNNING", "maybe"), -EINVAL);
	ck_assert_str_eq(err, "CUINTERPOSE_TEST_LEAVE_RUNNING=maybe: want 1|yes|true|on or 0|no|false|off");
	unsetenv("CUINTERPOSE_TEST_LEAVE_RUNNING");
}
END_TEST

START_TEST(a_rows_word_is_named_not_counted)
{
	ck_assert_int_eq(num("CUINTERPOSE_PREFETCH_MB", "auto"), CUIP_SETTING_WORD);
	ck_assert_uint_eq(v, 0); /* the default, "0 (off)" */
	unsetenv("CUINTERPOSE_PREFETCH_MB");
}
END_TEST

START_TEST(bad_values_are_refused_and_leave_the_default)
{
	ck_assert_int_eq(num("CUINTERPOSE_GUARDIAN_STOP_MS", "soon"), -EINVAL);
	ck_assert_str_eq(err, "CUINTERPOSE_GUARDIAN_STOP_MS=soon: want ms, 0 .. 3600000");
	ck_assert_uint_eq(v, 10000);
	/* no 0x where the row does not take it */
	ck_assert_int_eq(num("CUINTERPOSE_GUARDIAN_STOP_MS", "0x10"), -EINVAL);
	ck_assert_uint_eq(v, 10000);
	ck_assert_int_eq(num("CUINTERPOSE_GUARDIAN_STOP_MS", "3600001"), -EINVAL);
	ck_assert_int_eq(num("CUINTERPOSE_GUARDIAN_STOP_MS", "-1"), -EINVAL);
	ck_assert_int_eq(num("CUINTERPOSE_GUARDIAN_STOP_MS", "18446744073709551616"), -EINVAL);
	ck_assert_int_eq(num("CUINTERPOSE_STAGING_MB", "0"), -EINVAL);
	ck_assert_str_eq(err, "CUINTERPOSE_STAGING_MB=0: want MiB, 1 .. 1048576");
	ck_assert_uint_eq(v, 224);
	ck_assert_int_eq(num("CUINTERPOSE_TEST_CHUNK_SIZE", "12"), -EINVAL);
	ck_assert_str_eq(err, "CUINTERPOSE_TEST_CHUNK_SIZE=12: want bytes, 4096 .. 1073741824");
	ck_assert_int_eq(num("CUINTERPOSE_PREFETCH_MB", "automatic"), -EINVAL);
	unsetenv("CUINTERPOSE_GUARDIAN_STOP_MS");
	unsetenv("CUINTERPOSE_STAGING_MB");
	unsetenv("CUINTERPOSE_TEST_CHUNK_SIZE");
	unsetenv("CUINTERPOSE_PREFETCH_MB");
}
END_TEST

START_TEST(names_that_are_no_number_row)
{
	ck_assert_int_eq(num("CUINTERPOSE_RELEASE", "torch"), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "CUINTERPOSE_RELEASE is no number"));
	ck_assert_uint_eq(v, 12345);
	ck_assert_int_eq(num("CUINTERPOSE_NO_SUCH_THING", "1"), -ENOENT);
	ck_assert_int_eq(num("CUINTERPOSE_SOCKET_DIR", NULL), -ENOENT);
	unsetenv("CUINTERPOSE_RELEASE");
	unsetenv("CUINTERPOSE_NO_SUCH_THING");
}
END_TEST

/* The table: a number row's default is a number in its range, or one of
 * the rows whose readers handle "unset" by name. */
START_TEST(every_number_default_is_in_its_range)
{
	size_t numbers = 0;

	for (size_t i = 0; i < cuip_settings_count; i++) {
		const struct cuip_setting *s = &cuip_settings[i];
		char *end;
		unsigned long long d;

		if (s->type != CUIP_SETTING_INT && s->type != CUIP_SETTING_MIB && s->type != CUIP_SETTING_MS &&
		    s->type != CUIP_SETTING_BOOL)
			continue;
		numbers++;
		if (!strcmp(s->name, "CUINTERPOSE_TEST_LEAVE_RUNNING"))
			continue; /* unset: ask CRIU (plugin/options.c) */
		d = strtoull(s->dflt, &end, 10);
		ck_assert_msg(end != s->dflt, "%s: default \"%s\" is no number", s->name, s->dflt);
		ck_assert_msg(*end == 0 || *end == ' ', "%s: default \"%s\"", s->name, s->dflt);
		if (s->type == CUIP_SETTING_BOOL)
			ck_assert_msg(d <= 1, "%s: default %llu", s->name, d);
		else
			ck_assert_msg(d >= s->min && d <= s->max, "%s: default %llu outside %llu .. %llu", s->name, d,
				      (unsigned long long)s->min, (unsigned long long)s->max);
		/* the plugin and the interposer keep these in an unsigned */
		if (strcmp(s->name, "CUINTERPOSE_PREFETCH_MB"))
			ck_assert_msg(s->max <= UINT_MAX, "%s: max %llu", s->name, (unsigned long long)s->max);
		unsetenv(s->name);
		ck_assert_int_eq(num(s->name, NULL), 0);
		ck_assert_uint_eq(v, d);
	}
	ck_assert_uint_ge(numbers, 15);
}
END_TEST

START_TEST(the_carriers_limits_are_the_tables)
{
	ck_assert_uint_eq(cuip_setting_find("CUINTERPOSE_TEST_CARRIER_THREADS")->max, MAX_THREADS);
	ck_assert_uint_eq(cuip_setting_find("CUINTERPOSE_TEST_CHUNK_MB")->max, CARRIER_CHUNK_MAX / MIB);
	ck_assert_uint_eq(cuip_setting_find("CUINTERPOSE_TEST_CARRIER_FILES")->max, CARRIER_FILES_MAX);
	ck_assert_int_eq(num("CUINTERPOSE_STAGING_MB", NULL), 0);
	ck_assert_uint_eq(v * MIB, DEFAULT_STAGING);
	ck_assert_int_eq(num("CUINTERPOSE_TEST_CHUNK_MB", NULL), 0);
	ck_assert_uint_eq(v * MIB, DEFAULT_CHUNK);
	ck_assert_int_eq(num("CUINTERPOSE_TEST_CHUNK_SIZE", NULL), 0);
	ck_assert_uint_eq(v, DEFAULT_CHUNK);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("settings");
	TCase *tc = tcase_create("settings");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, unset_and_empty_take_the_rows_default);
	tcase_add_test(tc, values_in_the_rows_base);
	tcase_add_test(tc, yes_no_words);
	tcase_add_test(tc, a_rows_word_is_named_not_counted);
	tcase_add_test(tc, bad_values_are_refused_and_leave_the_default);
	tcase_add_test(tc, names_that_are_no_number_row);
	tcase_add_test(tc, every_number_default_is_in_its_range);
	tcase_add_test(tc, the_carriers_limits_are_the_tables);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
