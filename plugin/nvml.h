/*
 * nvml.h - what NVIDIA's management library (libnvidia-ml.so.1) says about
 * the processes that hold a CUDA context: a process the driver's checkpoint
 * API knows but NVML lists on no GPU has no context and no memory (it only
 * initialized NVML, e.g. a metrics exporter), and the native checkpoint is
 * all it needs. Stateless; each call asks in a child process of its own,
 * which loads the library (dump time only): NVML's threads never live in
 * criu.
 */
#ifndef CUIP_PLUGIN_NVML_H
#define CUIP_PLUGIN_NVML_H

#include <stdbool.h>
#include <sys/types.h>

/* 1 if pid holds a compute context on some GPU, 0 if on none, -ENOENT
 * when NVML is not installed, other -errno when it fails (err says why). */
int cuip_nvml_has_context(pid_t pid, char *err, size_t errlen);

#endif /* CUIP_PLUGIN_NVML_H */
