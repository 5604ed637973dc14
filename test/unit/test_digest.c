/*
 * test_digest.c - protocol/digest.c: the digest VERIFY compares instead of
 * the whole state. It must not depend on record order and must change with
 * every field VERIFY compares.
 */
#include <check.h>
#include <stdlib.h>

#include "digest.h"

#define NA 5

struct fixture {
	Cuip__ProcessState st;
	Cuip__Allocation a[NA], *ap[NA];
	Cuip__AllocId id[NA];
	Cuip__AllocProps props[NA];
	Cuip__Mapping m[NA], *mp[NA];
	Cuip__Access acc[NA][2], *accp[NA][2];
};

static void build(struct fixture *f)
{
	cuip__process_state__init(&f->st);
	for (int i = 0; i < NA; i++) {
		cuip__alloc_id__init(&f->id[i]);
		f->id[i].creator = 0x1111 + (uint64_t)(i % 2);
		f->id[i].serial = (uint64_t)i + 1;
		cuip__alloc_props__init(&f->props[i]);
		f->props[i].size = (uint64_t)(i + 1) << 21;
		cuip__allocation__init(&f->a[i]);
		f->a[i].id = &f->id[i];
		f->a[i].owner = CUIP__OWNER__OWNER_SHARED;
		f->a[i].origin = CUIP__ORIGIN__ORIGIN_VMM_CREATE;
		f->a[i].props = &f->props[i];
		f->ap[i] = &f->a[i];
		cuip__mapping__init(&f->m[i]);
		f->m[i].va = 0x7f0000000000ull + ((uint64_t)i << 24);
		f->m[i].size = f->props[i].size;
		f->m[i].alloc = &f->id[i];
		for (int k = 0; k < 2; k++) {
			cuip__access__init(&f->acc[i][k]);
			f->acc[i][k].va = f->m[i].va;
			f->acc[i][k].size = f->m[i].size;
			f->acc[i][k].location_type = 1;
			f->acc[i][k].location_id = k;
			f->acc[i][k].flags = 3;
			f->accp[i][k] = &f->acc[i][k];
		}
		f->m[i].access = f->accp[i];
		f->m[i].n_access = 2;
		f->mp[i] = &f->m[i];
	}
	f->st.allocations = f->ap;
	f->st.n_allocations = NA;
	f->st.mappings = f->mp;
	f->st.n_mappings = NA;
}

static uint64_t digest(const struct fixture *f)
{
	uint64_t d = 0;

	ck_assert(cuip_state_digest(&f->st, &d));
	return d;
}

START_TEST(order_does_not_matter)
{
	struct fixture *f = calloc(1, sizeof(*f));
	uint64_t d;

	build(f);
	d = digest(f);
	/* reverse the records and the access entries of one mapping */
	for (int i = 0; i < NA / 2; i++) {
		Cuip__Allocation *a = f->ap[i];
		Cuip__Mapping *m = f->mp[i];
		f->ap[i] = f->ap[NA - 1 - i];
		f->ap[NA - 1 - i] = a;
		f->mp[i] = f->mp[NA - 1 - i];
		f->mp[NA - 1 - i] = m;
	}
	Cuip__Access *x = f->accp[2][0];
	f->accp[2][0] = f->accp[2][1];
	f->accp[2][1] = x;
	ck_assert_uint_eq(digest(f), d);
	/* and the state's own arrays were not reordered by hashing */
	ck_assert_ptr_eq(f->st.allocations[0], &f->a[NA - 1]);
	ck_assert_ptr_eq(f->st.mappings[2]->access[0], &f->acc[2][1]);
	free(f);
}
END_TEST

/* Every field VERIFY compares changes the digest. */
START_TEST(every_compared_field_counts)
{
	struct fixture *f = calloc(1, sizeof(*f));
	uint64_t base, seen[32];
	int n = 0;

	build(f);
	base = digest(f);
#define CHANGED(stmt, undo)                                               \
	do {                                                              \
		stmt;                                                     \
		seen[n] = digest(f);                                      \
		ck_assert_msg(seen[n] != base, "%s: same digest", #stmt); \
		for (int j = 0; j < n; j++)                               \
			ck_assert_uint_ne(seen[j], seen[n]);              \
		n++;                                                      \
		undo;                                                     \
		ck_assert_uint_eq(digest(f), base);                       \
	} while (0)
	CHANGED(f->id[1].serial = 99, f->id[1].serial = 2);
	CHANGED(f->id[3].creator = 0x2222, f->id[3].creator = 0x1112);
	CHANGED(f->a[0].owner = CUIP__OWNER__OWNER_NATIVE, f->a[0].owner = CUIP__OWNER__OWNER_SHARED);
	CHANGED(f->a[4].origin = CUIP__ORIGIN__ORIGIN_VMM_IMPORT, f->a[4].origin = CUIP__ORIGIN__ORIGIN_VMM_CREATE);
	CHANGED(f->props[2].size += 4096, f->props[2].size -= 4096);
	CHANGED(f->a[2].props = NULL, f->a[2].props = &f->props[2]);
	CHANGED(f->m[1].va += 4096, f->m[1].va -= 4096);
	CHANGED(f->m[1].size += 4096, f->m[1].size -= 4096);
	CHANGED(f->m[3].offset = 4096, f->m[3].offset = 0);
	CHANGED(f->acc[0][1].flags = 1, f->acc[0][1].flags = 3);
	CHANGED(f->acc[4][0].location_id = 7, f->acc[4][0].location_id = 0);
	CHANGED(f->acc[4][0].size = 4096, f->acc[4][0].size = f->m[4].size);
	CHANGED(f->m[2].n_access = 1, f->m[2].n_access = 2);
	CHANGED(f->st.n_mappings = NA - 1, f->st.n_mappings = NA);
	CHANGED(f->st.n_allocations = NA - 1, f->st.n_allocations = NA);
	/* A mapping pointing at another allocation of the same size. */
	CHANGED(f->m[0].alloc = &f->id[1], f->m[0].alloc = &f->id[0]);
#undef CHANGED
	/* What VERIFY does not compare does not count. */
	f->a[1].logical_handle = 42;
	f->a[1].has_logical_handle = 1;
	ck_assert_uint_eq(digest(f), base);
	free(f);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("digest");
	TCase *tc = tcase_create("digest");
	SRunner *sr;
	int failed;

	/* Pure computation over a few records: milliseconds; 10 s is for a
	 * sanitizer build on a loaded machine, not for the work. */
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, order_does_not_matter);
	tcase_add_test(tc, every_compared_field_counts);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
