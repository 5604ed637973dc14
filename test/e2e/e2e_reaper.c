/*
 * e2e_reaper - run one test script as a child subreaper.
 *
 *   e2e_reaper SCRIPT [ARGS...]
 *
 * PID 1 on the test machines does not reap orphans, and CRIU needs the
 * dumped pids free again before it can restore them; restored trees are
 * reparented here when `criu restore --restore-detached` exits. So every
 * e2e script runs under this subreaper, which reaps every orphan as it
 * dies, and when the script ends SIGKILLs whatever is left below it.
 * Exits with the script's status.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* SIGKILL every child of ours (orphans were reparented to us). */
static int kill_children(void)
{
	char path[64];
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", getpid(), getpid());
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	long c;
	while (fscanf(f, "%ld", &c) == 1) {
		kill((pid_t)c, SIGKILL);
		n++;
	}
	fclose(f);
	return n;
}

int main(int argc, char **argv)
{
	int status = 0, code = 1;
	pid_t script;

	if (argc < 2) {
		fprintf(stderr, "usage: e2e_reaper SCRIPT [ARGS...]\n");
		return 2;
	}
	if (prctl(PR_SET_CHILD_SUBREAPER, 1)) {
		perror("PR_SET_CHILD_SUBREAPER");
		return 1;
	}
	script = fork();
	if (script == 0) {
		execvp(argv[1], argv + 1);
		perror(argv[1]);
		_exit(127);
	}
	for (;;) {
		pid_t w = waitpid(-1, &status, 0);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			break;
		if (w == script) {
			code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
			/* leftovers: kill and reap them */
			while (kill_children()) {
				while (waitpid(-1, NULL, WNOHANG) > 0)
					;
				usleep(10000);
			}
			while (waitpid(-1, NULL, 0) > 0)
				;
			break;
		}
	}
	return code;
}
