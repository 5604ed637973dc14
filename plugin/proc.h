/*
 * proc.h - what the plugin learns about processes from /proc: the process
 * tree under a root, whether the interposer is mapped, the pid a process
 * sees for itself, threads by name, who traces a thread.
 *
 * Pids here are "real": as seen by criu (the caller's pid namespace), which
 * is what CRIU passes to every device hook (pid->real). Stateless.
 */
#ifndef CUIP_PLUGIN_PROC_H
#define CUIP_PLUGIN_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Basename prefix of the interposer library in /proc/PID/maps. */
#define CUIP_INTERPOSER_LIB "libcuinterpose.so"
/* comm prefix of the interposer's own threads ("cuip-ctl", "cuip-op"). */
#define CUIP_THREAD_PREFIX "cuip-"

/* Collect root and every descendant (depth first, root first) into a
 * malloc'd array. Returns the count or a negative errno. */
int cuip_proc_tree(pid_t root, pid_t **out);

/* 1 if the process maps the interposer, 0 if not, negative errno. */
int cuip_proc_has_interposer(pid_t pid);

/* 1 if the process maps a file whose basename starts with lib (e.g.
 * "libcuda.so"), 0 if not, negative errno. */
int cuip_proc_maps_lib(pid_t pid, const char *lib);

/* The pid the process sees for itself (last NSpid field), or -errno. */
pid_t cuip_proc_vpid(pid_t pid);

/* Threads of pid whose comm starts with prefix. Returns count or -errno. */
int cuip_proc_threads(pid_t pid, const char *prefix, pid_t **out);

/* TracerPid of a thread, or -errno. */
pid_t cuip_proc_tracer(pid_t pid, pid_t tid);

/* comm of a process, "?" when unreadable. */
void cuip_proc_comm(pid_t pid, char *buf, size_t len);

/* Inode of /proc/PID/ns/NAME, 0 on error. */
unsigned long cuip_proc_ns_ino(pid_t pid, const char *ns);

/* Socket inodes open in the process (/proc/PID/fd -> socket:[ino]).
 * Returns count or -errno. */
int cuip_proc_socket_inodes(pid_t pid, unsigned long **out);

/*
 * Start state of a process that maps the interposer, from its start marker
 * (protocol/startmark.h, read through /proc/PID/mem): CUIP_MARK_NONE when
 * it has none, another CUIP_MARK_* value, or -errno. *err: the errno its
 * control socket failed with (NOSOCKET).
 */
int cuip_proc_start_state(pid_t pid, int *err);
const char *cuip_proc_start_state_name(int s);

/* The interposer's library file as pid maps it, opened O_RDONLY (through
 * /proc/PID/map_files, else /proc/PID/root + its path): fd or -errno; its
 * path inside the process in `path`. */
int cuip_proc_open_interposer(pid_t pid, char *path, size_t len);

/* /dev/shm files pid maps or holds open under a path that is gone while
 * the file lives on under another name (multiprocessing's semaphores): what
 * criu dump needs --link-remap for. The count, the first path in buf, or
 * -errno. */
int cuip_proc_unlinked_shm(pid_t pid, char *buf, size_t len);

/* link_remap.N files in pid's /dev/shm (through /proc/PID/root): each is the
 * hard link an earlier `criu dump --link-remap` made there and only a restore
 * from those images removes. criu numbers its links from a per-dump counter,
 * so a new dump fails "Can't link remap to ...: File exists" when its link
 * takes a name that is still there. The count, the first name in buf, or
 * -errno. */
int cuip_proc_stale_link_remaps(pid_t pid, char *buf, size_t len);

/* Whether pid holds an io_uring instance, which criu cannot dump (CRIU 4.2.1
 * knows no io_uring: "Unknown shit" for its mapping): 1 with what it holds in
 * buf ("maps an io_uring ring at 0xLO-0xHI" or "holds an io_uring instance
 * as fd N"), 0 when it holds none, or -errno. */
int cuip_proc_io_uring(pid_t pid, char *buf, size_t len);

/* In a process forked from criu (the guardian, the prefetch reader): close
 * every descriptor but keep[0..n), standard ones pointed at /dev/null, so
 * that nothing criu had open is held (a container runtime waits for EOF
 * on criu's sockets and pipes). */
void cuip_proc_close_inherited(const int *keep, size_t n);

/* SIGKILL every process in `pids`. */
void cuip_proc_kill_all(const pid_t *pids, size_t n);

#endif /* CUIP_PLUGIN_PROC_H */
