/*
 * devfiles.h - the driver's device files (/dev/nvidia*) held by processes
 * that are not CUDA processes: children forked after cuInit (DataLoader
 * workers, compile workers, helpers) inherit the parent's device mappings
 * and descriptors, but the driver does not know them (every CUDA call in
 * the child answers CUDA_ERROR_NOT_INITIALIZED) and no native checkpoint
 * removes them. CRIU stops on such mappings ("Can't handle non-regular
 * mapping") and descriptors. The plugin claims them through CRIU's
 * device-VMA and external-file hooks, saves none of their contents, and
 * restores them inert: a mapping becomes /dev/zero memory of the same
 * address, size, protection and sharing; a descriptor becomes /dev/null.
 *
 * A driver device is a character device whose major /proc/devices lists
 * under a name starting "nvidia" (nvidia-frontend, nvidia-uvm, nvidia-caps,
 * nvidia-nvswitch, ...), or a device file learned during a dump: one the
 * tree's CUDA processes mapped before their native checkpoint and no
 * longer map after it (what the checkpoint removes is the driver's; the
 * fake driver's device node is known this way). Owns: the cached majors,
 * the learned devices, the paths claimed by the current dump (one criu
 * process, single-threaded hooks).
 *
 * Images (in criu's image directory): cuinterpose-devmaps.img, the device
 * paths whose mappings were claimed, one per line; cuinterpose-devfile-ID.img
 * per claimed descriptor (ID: criu's external file id, hex), its path.
 */
#ifndef CUIP_PLUGIN_DEVFILES_H
#define CUIP_PLUGIN_DEVFILES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define CUIP_DEVMAPS_IMG	 "cuinterpose-devmaps.img"
#define CUIP_DEVFILE_IMG_FMT	 "cuinterpose-devfile-%x.img"
#define CUIP_DEVFILES_MAX_MAJORS 16

/* Majors of the character devices /proc/devices (path: a file of that
 * format) names "nvidia*". Returns how many (<= max), or -errno. */
int cuip_devfiles_parse_majors(const char *path, unsigned *majors, size_t max);

/* Use these majors instead of /proc/devices' (tests; n = 0 forgets them). */
void cuip_devfiles_set_majors(const unsigned *majors, size_t n);

/* Is st a driver device? (Reads /proc/devices once.) */
bool cuip_devfiles_is_driver(const struct stat *st);

/* Is rdev a character device of a driver major? */
bool cuip_devfiles_driver_major(dev_t rdev);

/* Learned devices: block or character devices (st_rdev) the driver owns. */
int cuip_devfiles_learn(dev_t rdev);
void cuip_devfiles_forget(dev_t rdev);

/* The distinct devices (st_rdev of block and character device files, but
 * /dev/zero, which criu maps itself) that pid maps, into v (at most max).
 * Returns how many, or -errno. */
int cuip_devfiles_mapped(pid_t pid, dev_t *v, size_t max);

/* What a process holds of the driver's devices. */
struct cuip_devscan {
	unsigned maps;	      /* mappings of a driver device */
	unsigned fds;	      /* descriptors of a driver device */
	uint64_t map_bytes;   /* summed size of those mappings */
	uint64_t first_start; /* address of the first mapping */
	char first[64];	      /* path of the first mapping or descriptor */
	unsigned other_maps;  /* mappings of other devices (not /dev/zero) */
	uint64_t other_start; /* the first of them */
	char other[64];	      /* its path */
};

/* Scan /proc/PID/map_files and /proc/PID/fd. 0, or -errno. */
int cuip_devfiles_scan(pid_t pid, struct cuip_devscan *out);

/* ---- the hooks' work, on criu's image directory (dirfd) ---- */

/* Dump: a mapping of fd's file is CRIU's to skip; records its path once.
 * 0 when claimed, -ENOTSUP when not a driver device, other -errno. */
int cuip_devfiles_claim_map(int dirfd, int fd, const struct stat *st);

/* Dump: descriptor fd, CRIU's external file id. 0, -ENOTSUP, -errno. */
int cuip_devfiles_claim_fd(int dirfd, int fd, uint32_t id);

/* Restore: a descriptor in place of external file id: /dev/null opened
 * O_RDWR, or -ENOTSUP when the id is not one this plugin claimed. */
int cuip_devfiles_restore_fd(int dirfd, uint32_t id);

/* Restore: 1 with *fd (/dev/zero, O_RDWR) and *pgoff 0 when path is a
 * claimed device, 0 when it is not ours, -errno. */
int cuip_devfiles_update_map(int dirfd, const char *path, int *fd, uint64_t *pgoff);

/* Forget the claimed paths (the next dump or restore starts afresh). */
void cuip_devfiles_reset(void);

#endif /* CUIP_PLUGIN_DEVFILES_H */
