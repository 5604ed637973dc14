/*
 * check_devfiles.c - the driver's device files in processes the driver
 * does not know (plugin/devfiles.c): which majors are the driver's, what a
 * process holds, the images the dump hooks write and what the restore
 * hooks make of them, bad images included. The machine has no NVIDIA
 * driver, so the tests declare the memory devices' major (1: /dev/null,
 * /dev/zero) the driver's where a real device is needed.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/loop.h>
#include <stdbool.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "devfiles.h"
#include "../../test/tmpname.h"

static char dir[64];
static int dfd = -1;

static void setup(void)
{
	test_tmpname(dir, sizeof(dir), "cuip-devfiles.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	dfd = open(dir, O_RDONLY | O_DIRECTORY);
	ck_assert_int_ge(dfd, 0);
	cuip_devfiles_reset();
}

static void teardown(void)
{
	char cmd[128];

	cuip_devfiles_reset();
	cuip_devfiles_set_majors(NULL, 0);
	close(dfd);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	ck_assert_int_eq(system(cmd), 0);
}

static void put(const char *name, const char *text)
{
	int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

static const char *get(const char *name)
{
	static char buf[4096];
	int fd = openat(dfd, name, O_RDONLY);
	ssize_t k;

	if (fd < 0)
		return NULL;
	k = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	buf[k > 0 ? k : 0] = 0;
	return buf;
}

/* A regular file of the scratch directory, opened. */
static int regular(void)
{
	put("regular", "x\n");
	return openat(dfd, "regular", O_RDONLY);
}

static void mem_is_driver(void)
{
	unsigned m = 1;

	cuip_devfiles_set_majors(&m, 1);
}

START_TEST(the_driver_majors_are_the_character_devices_named_nvidia)
{
	unsigned m[4];

	put("devices", "Character devices:\n  1 mem\n  4 /dev/vc/0\n195 nvidia-frontend\n"
		       "508 nvidia-uvm\n510 nvidia-caps\n\nBlock devices:\n  7 loop\n259 nvidia-blk\n");
	{
		char p[128];

		snprintf(p, sizeof(p), "%s/devices", dir);
		ck_assert_int_eq(cuip_devfiles_parse_majors(p, m, 4), 3);
		ck_assert_uint_eq(m[0], 195);
		ck_assert_uint_eq(m[1], 508);
		ck_assert_uint_eq(m[2], 510);
		ck_assert_int_eq(cuip_devfiles_parse_majors(p, m, 2), 2);
		snprintf(p, sizeof(p), "%s/absent", dir);
		ck_assert_int_eq(cuip_devfiles_parse_majors(p, m, 4), -ENOENT);
	}
}
END_TEST

START_TEST(only_character_devices_of_those_majors_are_the_drivers)
{
	struct stat st;
	unsigned other = 195;

	ck_assert_int_eq(stat("/dev/null", &st), 0);
	cuip_devfiles_set_majors(&other, 1);
	ck_assert(!cuip_devfiles_is_driver(&st));
	ck_assert(!cuip_devfiles_driver_major(st.st_rdev));
	mem_is_driver();
	ck_assert(cuip_devfiles_is_driver(&st));
	ck_assert(cuip_devfiles_driver_major(st.st_rdev));
	ck_assert_int_eq(stat("/", &st), 0);
	ck_assert(!cuip_devfiles_is_driver(&st));
}
END_TEST

/* A free loop device, opened: a block device that can be mapped (with
 * PROT_NONE nothing is read), as the fake driver's device node is. */
static int loop_node(char *path, size_t len)
{
	int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC), n, fd;

	ck_assert_msg(ctl >= 0, "/dev/loop-control: %s (the fake driver's device node needs a loop device)",
		      strerror(errno));
	n = ioctl(ctl, LOOP_CTL_GET_FREE);
	close(ctl);
	ck_assert_int_ge(n, 0);
	snprintf(path, len, "/dev/loop%d", n);
	fd = open(path, O_RDWR | O_CLOEXEC);
	ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
	return fd;
}

START_TEST(a_scan_counts_the_mappings_and_descriptors_of_driver_devices)
{
	struct cuip_devscan ds;
	struct stat st;
	size_t len = 3 * 4096;
	char path[64];
	int fd = loop_node(path, sizeof(path)), z = open("/dev/zero", O_RDONLY);
	void *p, *zp;
	dev_t v[8];

	p = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(p, MAP_FAILED);
	zp = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, z, 0); /* criu's own business: never counted */
	ck_assert_ptr_ne(zp, MAP_FAILED);
	ck_assert_int_eq(fstat(fd, &st), 0);

	/* not learned: another device, which criu cannot dump */
	ck_assert_int_eq(cuip_devfiles_scan(getpid(), &ds), 0);
	ck_assert_uint_eq(ds.maps, 0);
	ck_assert_uint_eq(ds.fds, 0);
	ck_assert_uint_ge(ds.other_maps, 1);
	ck_assert_uint_le(ds.other_start, (uintptr_t)p);
	ck_assert_int_ge(cuip_devfiles_mapped(getpid(), v, 8), 1);
	{
		bool seen = false;

		for (int i = 0, n = cuip_devfiles_mapped(getpid(), v, 8); i < n; i++) {
			seen |= v[i] == st.st_rdev;
			ck_assert_msg(v[i] != makedev(1, 5), "/dev/zero listed");
		}
		ck_assert(seen);
	}

	/* learned: the driver's */
	ck_assert_int_eq(cuip_devfiles_learn(st.st_rdev), 0);
	ck_assert(cuip_devfiles_is_driver(&st));
	ck_assert_int_eq(cuip_devfiles_scan(getpid(), &ds), 0);
	ck_assert_uint_ge(ds.maps, 1);
	ck_assert_uint_ge(ds.map_bytes, len);
	ck_assert_uint_le(ds.first_start, (uintptr_t)p);
	ck_assert_uint_ge(ds.fds, 1);
	ck_assert_msg(!strcmp(ds.first, path), "first: %s, not %s", ds.first, path);

	cuip_devfiles_forget(st.st_rdev);
	ck_assert(!cuip_devfiles_is_driver(&st));
	munmap(p, len);
	munmap(zp, 4096);
	close(fd);
	close(z);
	ck_assert_int_eq(cuip_devfiles_scan(999999999, &ds), -ENOENT);
	ck_assert_int_eq(cuip_devfiles_mapped(999999999, v, 8), -ENOENT);
}
END_TEST

START_TEST(a_claimed_mapping_is_recorded_once_and_restored_from_dev_zero)
{
	struct stat st, zs;
	uint64_t pgoff = 77;
	int fd = open("/dev/null", O_RDONLY), r = regular(), zfd = -1;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_ge(r, 0);
	mem_is_driver();
	ck_assert_int_eq(fstat(r, &st), 0);
	ck_assert_int_eq(cuip_devfiles_claim_map(dfd, r, &st), -ENOTSUP);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(cuip_devfiles_claim_map(dfd, fd, &st), 0);
	ck_assert_int_eq(cuip_devfiles_claim_map(dfd, fd, &st), 0);
	ck_assert_str_eq(get(CUIP_DEVMAPS_IMG), "/dev/null\n");
	close(fd);
	close(r);

	cuip_devfiles_reset(); /* as a restore starts */
	ck_assert_int_eq(cuip_devfiles_update_map(dfd, "/dev/null", &zfd, &pgoff), 1);
	ck_assert_int_eq(fstat(zfd, &zs), 0);
	ck_assert(S_ISCHR(zs.st_mode));
	ck_assert_uint_eq(major(zs.st_rdev), 1);
	ck_assert_uint_eq(minor(zs.st_rdev), 5);
	ck_assert_uint_eq(pgoff, 0);
	close(zfd);
	/* a container's /dev names the same device */
	ck_assert_int_eq(cuip_devfiles_update_map(dfd, "/run/ctr/rootfs/dev/null", &zfd, &pgoff), 1);
	close(zfd);
	zfd = -1;
	ck_assert_int_eq(cuip_devfiles_update_map(dfd, "/dev/dri/renderD128", &zfd, &pgoff), 0);
	ck_assert_int_eq(zfd, -1);
}
END_TEST

START_TEST(no_devmaps_image_means_no_mapping_is_ours)
{
	uint64_t pgoff = 5;
	int zfd = -1;

	ck_assert_int_eq(cuip_devfiles_update_map(dfd, "/dev/nvidia0", &zfd, &pgoff), 0);
	ck_assert_int_eq(zfd, -1);
	ck_assert_uint_eq(pgoff, 5);
}
END_TEST

START_TEST(a_corrupt_devmaps_image_fails_the_restore)
{
	static const char *bad[] = {"dev/nvidia0\n", "/dev/nvidia0", "", "/dev/nv\0idia0\n"};
	uint64_t pgoff;
	int zfd;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int fd = openat(dfd, CUIP_DEVMAPS_IMG, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		size_t n = i == 3 ? 14 : strlen(bad[i]);

		ck_assert_int_eq(write(fd, bad[i], n), (ssize_t)n);
		close(fd);
		cuip_devfiles_reset();
		ck_assert_msg(cuip_devfiles_update_map(dfd, "/dev/nvidia0", &zfd, &pgoff) == -EBADMSG, "image %zu", i);
	}
}
END_TEST

START_TEST(a_claimed_descriptor_is_restored_as_dev_null)
{
	struct stat st;
	char name[64];
	int fd = open("/dev/zero", O_RDWR), r = regular(), nfd;

	ck_assert_int_ge(fd, 0);
	mem_is_driver();
	ck_assert_int_eq(cuip_devfiles_claim_fd(dfd, r, 0x2b), -ENOTSUP);
	ck_assert_int_eq(cuip_devfiles_claim_fd(dfd, fd, 0x2a), 0);
	snprintf(name, sizeof(name), CUIP_DEVFILE_IMG_FMT, 0x2a);
	ck_assert_str_eq(get(name), "/dev/zero\n");
	snprintf(name, sizeof(name), CUIP_DEVFILE_IMG_FMT, 0x2b);
	ck_assert_ptr_null(get(name));
	close(fd);
	close(r);

	nfd = cuip_devfiles_restore_fd(dfd, 0x2a);
	ck_assert_int_ge(nfd, 0);
	ck_assert_int_eq(fstat(nfd, &st), 0);
	ck_assert(S_ISCHR(st.st_mode));
	ck_assert_uint_eq(major(st.st_rdev), 1);
	ck_assert_uint_eq(minor(st.st_rdev), 3);
	ck_assert_int_eq(fcntl(nfd, F_GETFL) & O_ACCMODE, O_RDWR);
	close(nfd);
	ck_assert_int_eq(cuip_devfiles_restore_fd(dfd, 0x2b), -ENOTSUP);
}
END_TEST

START_TEST(a_corrupt_descriptor_image_fails_the_restore)
{
	char name[64];

	snprintf(name, sizeof(name), CUIP_DEVFILE_IMG_FMT, 7);
	put(name, "garbage");
	ck_assert_int_eq(cuip_devfiles_restore_fd(dfd, 7), -EBADMSG);
	put(name, "");
	ck_assert_int_eq(cuip_devfiles_restore_fd(dfd, 7), -EBADMSG);
}
END_TEST

Suite *devfiles_suite(void);

Suite *devfiles_suite(void)
{
	Suite *s = suite_create("devfiles");
	TCase *t = tcase_create("driver device files");

	tcase_set_timeout(t, 10);
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_add_test(t, the_driver_majors_are_the_character_devices_named_nvidia);
	tcase_add_test(t, only_character_devices_of_those_majors_are_the_drivers);
	tcase_add_test(t, a_scan_counts_the_mappings_and_descriptors_of_driver_devices);
	tcase_add_test(t, a_claimed_mapping_is_recorded_once_and_restored_from_dev_zero);
	tcase_add_test(t, no_devmaps_image_means_no_mapping_is_ours);
	tcase_add_test(t, a_corrupt_devmaps_image_fails_the_restore);
	tcase_add_test(t, a_claimed_descriptor_is_restored_as_dev_null);
	tcase_add_test(t, a_corrupt_descriptor_image_fails_the_restore);
	suite_add_tcase(s, t);
	return s;
}
