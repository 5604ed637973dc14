# lib-proc.sh - helpers for the tests that run e2e_proc (a job shaped like
# torch.multiprocessing: a creator, a pidfd_getfd importer, a preloaded
# child without CUDA, optionally a child held inside cuInit and one without
# the interposer). Sourced after lib.sh.

PROCWL=$B/test/e2e/e2e_proc
[ -x "$PROCWL" ] || skip "workload not built ($PROCWL)"

# start_proc NRANKS [--held] [--plain]
start_proc() {
	NR=$1
	shift
	rm -f "$T"/w/*
	setsid env LD_PRELOAD="$SAN_PRELOAD$INTERPOSER" CUINTERPOSE_LOG=2 "$FAKERUN" "$PROCWL" "$T/w" "$@" \
		</dev/null >"$T/job.log" 2>&1 &
	JOB=$!
	wait_ready "$NR"
}

rank_pid() { awk '{print $2}' "$T/w/r$1.ready"; }

# post VERB [ARGS]: send a command without waiting for the answers.
post() {
	SEQ=$((SEQ + 1))
	echo "$SEQ $*" >"$T/w/cmd.tmp" && mv "$T/w/cmd.tmp" "$T/w/cmd"
}

# answered RANK [SEQ]: wait until RANK answered command SEQ (default the
# last), fail unless the answer is "ok...".
answered() {
	local s=${2:-$SEQ} i=0 ans

	waiting "rank $1's answer to command $s"
	while [ ! -f "$T/w/r$1.$s" ]; do
		failed_ranks && fail "rank failed: $(cat "$T"/w/*.failed)"
		i=$((i + 1))
		[ $i -gt 1200 ] && fail "rank $1 did not answer command $s in $(elapsed "$WAIT_US") s: $(missing_answers $(($1 + 1)))"
		nap 0.05
	done
	waited
	read -r ans <"$T/w/r$1.$s"
	case "$ans" in
	ok*) ;;
	*) fail "rank $1, command $s: $ans" ;;
	esac
}

# has_line FILE PATTERN MESSAGE
has_line() { grep -qE "$2" "$1" || fail "$3 (no /$2/ in $1)"; }

# wait_file PATH: wait until PATH exists.
wait_file() {
	local i=0

	waiting "$1 to appear"
	while [ ! -e "$1" ]; do
		i=$((i + 1))
		[ $i -gt 1200 ] && fail "$1 did not appear in $(elapsed "$WAIT_US") s"
		nap 0.05
	done
	waited
}
