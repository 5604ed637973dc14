# procstate.sh - what state a process is in, read from /proc/PID/stat once.
# Sourced by the e2e tests' lib.sh and by the GPU scripts (test/gpu/run.sh,
# jobs.sh; bundle.sh carries this file beside them), so that every script
# reads a state the same way.

# stat_state PID: the state letter of /proc/PID/stat, read once (empty when
# the process is gone). After the last ')': a comm may hold spaces and
# parentheses.
stat_state() {
	local st=
	[ -n "$1" ] && { read -r st <"/proc/$1/stat"; } 2>/dev/null
	st=${st##*) }
	echo "${st%% *}"
}
# live PID: the process runs (stopped or traced counts): neither gone nor a
# zombie nor dead while its parent reaps it (X). One read of its stat: a
# test of /proc/PID then a read of its stat races with the reaper, and a
# process reaped in between must not count as running.
live() {
	case $(stat_state "$1") in '' | Z | X) return 1 ;; esac
	return 0
}
