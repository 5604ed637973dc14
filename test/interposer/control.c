/*
 * control.c - the interposer tests' own part of the harness (harness.h
 * here; the shared one is test/harness/harness.c): the real driver behind
 * the interposer, whether a symbol is the interposer's, and requests on a
 * process's control socket (INSPECT).  Test code, single-threaded: no locks.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

void *h_real(const char *name)
{
	static void *(*libc_dlsym)(void *, const char *);
	void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);

	if (!libc_dlsym)
		libc_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
	if (!libc_dlsym)
		libc_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
	ck_assert_ptr_nonnull(cuda);
	ck_assert_ptr_nonnull(libc_dlsym);
	void *p = libc_dlsym(cuda, name);
	dlclose(cuda);
	return p;
}

bool h_ours(void *p)
{
	Dl_info di;

	return p && dladdr(p, &di) && di.dli_fname && strstr(di.dli_fname, "libcuinterpose");
}

void *h_ours_sym(const char *name)
{
	void *p = dlsym(RTLD_DEFAULT, name);

	ck_assert_msg(h_ours(p), "%s is not the interposer's", name);
	return p;
}

int h_sock_path(pid_t pid, char *buf, size_t len)
{
	const char *dir = getenv("CUINTERPOSE_SOCKET_DIR");
	char prefix[32];
	struct dirent *de;
	DIR *d;
	int ret = -ENOENT;

	if (!pid)
		pid = getpid();
	ck_assert_ptr_nonnull(dir);
	snprintf(prefix, sizeof(prefix), "%d-", (int)pid);
	d = opendir(dir);
	while (d && (de = readdir(d))) {
		if (!strncmp(de->d_name, prefix, strlen(prefix)) && strstr(de->d_name, ".sock")) {
			snprintf(buf, len, "%s/%s", dir, de->d_name);
			ret = 0;
			break;
		}
	}
	if (d)
		closedir(d);
	return ret;
}

int h_connect(pid_t pid)
{
	char path[256], err[256];
	int s;

	ck_assert_int_eq(h_sock_path(pid, path, sizeof(path)), 0);
	s = cuip_client_connect(path);
	ck_assert_int_ge(s, 0);
	ck_assert_msg(cuip_client_handshake(s, "test", 0, NULL, err, sizeof(err)) == 0, "handshake: %s", err);
	return s;
}

int h_request(int sock, Cuip__Request *req, int fd_in, Cuip__Response **resp, int *fd_out)
{
	char err[256];

	return cuip_client_call(sock, req, fd_in, resp, fd_out, err, sizeof(err));
}

static Cuip__Response *held[64];

Cuip__ProcessState *h_state(pid_t pid)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Response *resp;
	int s = h_connect(pid);

	req.body_case = CUIP__REQUEST__BODY_INSPECT;
	req.inspect = 1;
	ck_assert_int_eq(h_request(s, &req, -1, &resp, NULL), 0);
	close(s);
	ck_assert_int_eq(resp->status, 0);
	ck_assert_int_eq(resp->body_case, CUIP__RESPONSE__BODY_STATE);
	for (int i = 0; i < 64; i++) {
		if (!held[i]) {
			held[i] = resp;
			break;
		}
	}
	return resp->state;
}

void h_state_free(Cuip__ProcessState *st)
{
	for (int i = 0; i < 64; i++) {
		if (held[i] && held[i]->state == st) {
			cuip__response__free_unpacked(held[i], NULL);
			held[i] = NULL;
		}
	}
}

/* ---- requests ------------------------------------------------------------ */

Cuip__Response *h_call(int s, Cuip__Request *req, int fd)
{
	Cuip__Response *resp = NULL;

	ck_assert_int_eq(h_request(s, req, fd, &resp, NULL), 0);
	return resp;
}

void h_ok_call(int s, Cuip__Request *req, int fd, const char *what)
{
	Cuip__Response *r = h_call(s, req, fd);

	ck_assert_msg(r->status == 0, "%s: %d %s", what, r->status, r->error ? r->error : "");
	cuip__response__free_unpacked(r, NULL);
}

void h_flag(int s, Cuip__Request__BodyCase bc, const char *what)
{
	Cuip__Request req = CUIP__REQUEST__INIT;

	req.body_case = bc;
	req.resume = 1; /* every flag body is a protobuf bool in the same union */
	h_ok_call(s, &req, -1, what);
}

Cuip__Response *h_inspect(int s)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Response *r;

	req.body_case = CUIP__REQUEST__BODY_INSPECT;
	req.inspect = 1;
	r = h_call(s, &req, -1);
	ck_assert_int_eq(r->status, 0);
	return r;
}
