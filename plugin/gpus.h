/*
 * gpus.h - which GPUs a restore needs and which this machine has: the
 * images record every GPU each participant saw (ordinal, UUID, model); a
 * restore onto other GPUs needs CUINTERPOSE_GPU_REMAP pairs for the
 * driver's native restore. Checked when criu starts the restore, before it
 * creates any process: a GPU of the images that is neither here nor
 * paired is refused naming the images' GPUs, this machine's, and the exact
 * CUINTERPOSE_GPU_REMAP value to use; `auto` pairs by ordinal where that is
 * unambiguous (no GPU of the images here, same count, same models).
 * Stateless.
 */
#ifndef CUIP_PLUGIN_GPUS_H
#define CUIP_PLUGIN_GPUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "images.h"
#include "options.h"

#define CUIP_MAX_GPUS 64

struct cuip_gpu {
	int ordinal;
	uint8_t uuid[16];
	char name[64]; /* "" when not known */
};

/* The GPUs the images' participants saw, each once (by UUID), in ordinal
 * order. Returns how many (<= max). */
size_t cuip_gpus_of_images(const struct cuip_ckpt *c, struct cuip_gpu *v, size_t max);

/* This machine's GPUs, asked of driver library `lib` in a child process
 * (cuInit starts threads; criu must stay single-threaded). Returns how
 * many, or -errno with err set. */
int cuip_gpus_present(const char *lib, struct cuip_gpu *v, size_t max, char *err, size_t errlen);

/* This machine's GPUs as NVIDIA's kernel module lists them (dir: the
 * /proc/driver/nvidia/gpus of a machine: one directory per PCI address,
 * each with an `information` file naming "Model" and "GPU UUID"), in PCI
 * order: no driver call, so a restore onto the same GPUs costs nothing
 * (asking the driver takes a cuInit: 0.23 s on the H200). Returns how
 * many; 0 when there is no such directory (no NVIDIA module). */
int cuip_gpus_listed(const char *dir, struct cuip_gpu *v, size_t max);

/*
 * The pairs the native restore gets: the given ones (pairs[0..*n_pairs),
 * from CUINTERPOSE_GPU_REMAP) when they cover every GPU of the images that
 * is not here and each points at a GPU that is; with auto_, pairs by
 * ordinal where unambiguous. 0 (pairs and *n_pairs set), or -ENODEV with
 * err saying what is missing and what to set.
 */
int cuip_gpus_plan(const struct cuip_gpu *img, size_t n_img, const struct cuip_gpu *here, size_t n_here, bool auto_,
		   struct cuip_gpu_pair *pairs, unsigned *n_pairs, unsigned max, char *err, size_t errlen);

#endif /* CUIP_PLUGIN_GPUS_H */
